"""Drafters: whatever proposes candidate continuations of the pending token.

Contract: a drafter has `feature_layers` (which target hidden states it wants),
`propose(ctx) -> list[list[int]]` (continuations after ctx.root, best first; a scoring
drafter returns assistant.runtime.ranking.Draft lists that carry its own estimate of each
token's chance) and `observe(tree, path)` (which of its nodes the target accepted). The
decode loop never trusts a proposal: correctness does not depend on the drafter.

- PhraseDrafter: the phrase head + draft vocabulary (+ an optional phrase-chain
  table, so a branch can hold several phrases in a row).
- PromptLookupDrafter: copies what followed the earlier places that end like the context
  (prompt + answer so far), longest match first, up to the tree's depth (prompt lookup,
  inside our tree).
- UnionDrafter: every source's candidates on one scale, the best nodes of all in one tree
  (assistant.runtime.ranking), calibrated online by what the target accepts.
- HistoryDrafter (assistant.runtime.history_lookup): lookup in the user's past answers.
- `artifact_drafter(art, embeddings, base=, **phrase)`: THE drafter the runtime builds from a head
  artifact (its phrase drafter with prompt lookup, in one tree; with `base`, the frozen head an
  adapted one came from drafts beside it); whatever judges a head (the adapter, tuning scripts)
  builds it here so it judges what will run.
- OracleDrafter / AdversarialDrafter: test drafters that know the reference answer.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np
import torch

from assistant.runtime.decode import DraftContext
from assistant.runtime.head import Artifact, PhraseHead
from assistant.runtime.lookup import continuations
from assistant.runtime.ranking import Calibrator, Draft, generic_prior, match_prior, select
from assistant.runtime.tree import Tree
from assistant.runtime.vocab import DraftVocab


class _Base:
    feature_layers: tuple[int, ...] = (-1,)

    def observe(self, tree: Tree, path: list[int]) -> None:
        pass


class OracleDrafter(_Base):
    """Proposes the true continuation (from a reference answer) plus a wrong sibling branch."""

    def __init__(self, reference: Sequence[int], depth: int = 6):
        self.reference = list(reference)
        self.depth = depth
        self._modulus = max(self.reference) + 1   # keeps made-up tokens inside the target vocabulary

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        n = len(ctx.ids)
        true = self.reference[n: n + self.depth]
        wrong = [(t + 1) % self._modulus for t in true[:2]]
        return [true, wrong] if true else []


class AdversarialDrafter(_Base):
    """Every proposal is wrong at its first token (it knows the reference answer)."""

    def __init__(self, reference: Sequence[int], width: int = 4, depth: int = 3):
        self.reference = list(reference)
        self.width, self.depth = width, depth
        self._modulus = max(self.reference) + 1

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        n = len(ctx.ids)
        nxt = self.reference[n] if n < len(self.reference) else -1
        out = []
        for k in range(1, self.width + 1):
            first = (nxt + k) % self._modulus if nxt >= 0 else k
            out.append([first] + [(first * 7 + j) % self._modulus for j in range(self.depth - 1)])
        return out


class PromptLookupDrafter(_Base):
    """Lookup in the context (prompt + answer so far): continuations of the earlier places that end like
    it, longest match first (assistant.runtime.lookup), up to `length` tokens or the tree's depth."""

    name = "prompt"

    def __init__(self, length: int = 16, matches: int = 4, min_match: int = 1):
        self.length, self.matches, self.min_match = length, matches, min_match

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        depth = max(1, min(self.length, ctx.max_nodes - 1))
        arr = np.asarray(ctx.ids, dtype=np.int32)
        return [Draft(c, ("prompt", min(m, 8)), match_prior(m, len(c)))
                for m, c in continuations(arr, ctx.ids, depth, self.matches, self.min_match)]


class PhraseDrafter(_Base):
    """Top-k phrases from the head, the best ones extended by a phrase-chain table."""

    def __init__(self, head: PhraseHead, vocab: DraftVocab, embeddings: torch.nn.Module,
                 top_k: int = 6, chain: torch.Tensor | None = None, chain_depth: int = 2, chain_width: int = 2,
                 chain_p: torch.Tensor | None = None, max_nodes: int | None = None, name: str = "phrase"):
        self.head, self.vocab, self.embeddings, self.name = head, vocab, embeddings, name
        self.feature_layers = head.config.feature_layers
        self.top_k = top_k
        self.chain = chain            # Long [capacity, S]: row -> most frequent next rows (-1 = none)
        self.chain_depth, self.chain_width = chain_depth, chain_width
        # Float [capacity, S]: P(next row | row). With it, proposals are chosen best-first by
        # path probability (head softmax x chain probabilities) until the tree budget is used.
        self.chain_p = chain_p.float() if chain_p is not None else None
        self.max_nodes = max_nodes    # node budget for best-first (None: ctx.max_nodes)
        self._live = torch.tensor([r is not None for r in vocab.rows], dtype=torch.bool)
        self._next: list[list[tuple[int, float]]] | None = None   # row -> its live chain successors, (row, P)
        self._last: list[list[int]] = []   # row ids making up each candidate of the last proposal
        self._prefixes: tuple[dict[tuple[int, ...], int], torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def from_artifact(cls, art: Artifact, embeddings: torch.nn.Module, **kw) -> "PhraseDrafter":
        kw.setdefault("chain_p", art.extra.get("chain_p"))
        # tree-shape settings measured for this head (artifact metadata "drafter"), unless given
        for key, value in (art.meta.get("drafter") or {}).items():
            if key in ("top_k", "chain_depth", "chain_width", "max_nodes"):
                kw.setdefault(key, value)
        return cls(art.head, art.vocab, embeddings, chain=art.extra.get("chain"), **kw)

    def refresh(self) -> None:
        """Re-read which rows are live after the vocabulary changed."""
        self._live = torch.tensor([r is not None for r in self.vocab.rows], dtype=torch.bool)
        self._prefixes = None
        self._next = None

    def _successors(self) -> list[list[tuple[int, float]]]:
        """Per row, the chain table's live successors with their probabilities (1 without a probability
        table), as Python lists built once per vocabulary: indexing the tables per heap pop cost ~0.1 ms a pass."""
        if self._next is None:
            rows = self.chain[:, : self.chain_width].tolist()
            probs = (self.chain_p[:, : self.chain_width].tolist() if self.chain_p is not None
                     else [[1.0] * len(rs) for rs in rows])
            live = self.vocab.rows
            self._next = [[(r, q) for r, q in zip(rs, qs) if r >= 0 and q > 0 and live[r] is not None]
                          for rs, qs in zip(rows, probs)]
        return self._next

    def _prefix_index(self) -> tuple[dict[tuple[int, ...], int], torch.Tensor, torch.Tensor]:
        """Every token prefix of a live row, numbered, and the (row, prefix number) pairs that sum the
        head's probabilities by prefix in one index_add (built once per vocabulary)."""
        if self._prefixes is None:
            number: dict[tuple[int, ...], int] = {}
            rows: list[int] = []
            of: list[int] = []
            for i, r in enumerate(self.vocab.rows):
                if r is not None:
                    for k in range(1, len(r.tokens) + 1):
                        rows.append(i)
                        of.append(number.setdefault(tuple(r.tokens[:k]), len(number)))
            self._prefixes = (number, torch.tensor(rows, dtype=torch.long), torch.tensor(of, dtype=torch.long))
        return self._prefixes

    @torch.inference_mode()
    def scores(self, ctx: DraftContext) -> torch.Tensor:
        emb = self.embeddings(torch.tensor([ctx.root], device=self.embeddings.weight.device))
        feats = ctx.features.reshape(1, -1).to(self.head.out.weight.device)
        logits = self.head(feats, emb.to(feats.device))[0]         # the head casts to its own dtype
        return logits.masked_fill(~self._live.to(logits.device), float("-inf"))

    def _chains(self, row: int) -> list[list[int]]:
        """Row-id sequences starting with `row`, extended through the chain table."""
        paths = [[row]]
        if self.chain is None:
            return paths
        frontier = [[row]]
        successors = self._successors()
        for _ in range(self.chain_depth - 1):
            nxt = []
            for p in frontier:
                nxt.extend(p + [r] for r, _ in successors[p[-1]])
            paths = nxt + paths if nxt else paths
            frontier = nxt
        return paths

    def _best_first(self, probs: torch.Tensor, budget: int) -> tuple[list[list[int]], list[list[float]]]:
        """Row paths in order of path probability until `budget` tree nodes are used, with the
        probability of each path's prefixes (one per row)."""
        import heapq

        k = min(self.top_k, len(self.vocab))
        p, idx = probs.topk(k)
        heap = [(-float(pi), n, [int(r)], [float(pi)]) for n, (pi, r) in enumerate(zip(p.tolist(), idx.tolist()))]
        heapq.heapify(heap)
        tie = len(heap)
        nodes: set[tuple[int, ...]] = set()
        successors = self._successors() if self.chain is not None else []
        out: list[list[int]] = []
        out_p: list[list[float]] = []
        while heap and len(nodes) < budget:
            neg, _, path, path_p = heapq.heappop(heap)
            toks: list[int] = []
            for r in path:
                toks.extend(self.vocab.rows[r].tokens)
            new = [tuple(toks[:i + 1]) for i in range(len(toks)) if tuple(toks[:i + 1]) not in nodes]
            if new:
                nodes.update(new)
                out.append(path)
                out_p.append(path_p)
            if len(path) < self.chain_depth and self.chain is not None:
                for r, q in successors[path[-1]]:
                    tie += 1
                    heapq.heappush(heap, (neg * q, tie, path + [r], path_p + [-neg * q]))
        return out, out_p

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        """Drafts keyed by the head's probability of their first token (bucketed by halvings). The prior
        of a token of the first phrase is the head's probability that the text starts with the phrase
        up to that token (the sum over every row sharing that prefix); of a later phrase, the phrase
        path's probability."""
        if ctx.features is None or len(self.vocab) == 0:
            return []
        probs = torch.softmax(self.scores(ctx).float(), -1)
        if self.chain_p is not None:
            row_paths, path_p = self._best_first(probs, min(self.max_nodes or ctx.max_nodes, ctx.max_nodes) - 1)
        else:
            k = min(self.top_k, len(self.vocab))
            p, top = probs.topk(k)
            row_paths, path_p = [], []
            for rank, (pr, r) in enumerate(zip(p.tolist(), top.tolist())):
                for chain in (self._chains(r) if rank < 2 else [[r]]):
                    row_paths.append(chain)
                    path_p.append([pr * 0.5 ** j for j in range(len(chain))])
        self._last = row_paths
        number, rows_of, prefix_of = self._prefix_index()
        probs = probs.cpu()
        mass = torch.zeros(len(number), dtype=probs.dtype).index_add_(0, prefix_of, probs[rows_of])
        drafts: list[tuple[list[int], list[float], int]] = []
        wanted: list[int] = []       # prefix numbers of every first-phrase token of every draft, in order
        for rows, path in zip(row_paths, path_p):
            toks: list[int] = []
            prior: list[float] = []
            for r, q in zip(rows, path):
                toks.extend(self.vocab.rows[r].tokens)
                prior.extend([q] * len(self.vocab.rows[r].tokens))
            first = len(self.vocab.rows[rows[0]].tokens)
            wanted.extend(number[tuple(toks[:i + 1])] for i in range(first))
            drafts.append((toks, prior, first))
        masses = iter(mass[torch.tensor(wanted, dtype=torch.long)].tolist())
        cands = []
        for toks, prior, first in drafts:
            prior[:first] = [next(masses) for _ in range(first)]   # >= the row's own probability
            bucket = min(int(-math.log2(max(prior[0], 1e-9))), 9)
            cands.append(Draft(toks, ("phrase", bucket), prior))
        return cands

    def observe(self, tree: Tree, path: list[int]) -> None:
        if not self._last:
            return
        proposed = {p[0] for p in self._last}
        banked: dict[int, int] = {}
        for node in path[1:]:
            src = tree.source[node]
            if 0 <= src < len(self._last):
                # credit the first row of the candidate that created the node
                banked[self._last[src][0]] = banked.get(self._last[src][0], 0) + 1
        for r in proposed:
            self.vocab.record(r, proposed=1, banked=banked.get(r, 0))


class UnionDrafter(_Base):
    """Candidates of several drafters ranked on one scale (assistant.runtime.ranking): each node's chance
    of being accepted, from its drafter's own estimate calibrated by what the target accepted so far;
    the tree takes the best nodes of all sources. `propose` returns one path per chosen node, best
    first, with their values in `node_values` (the width controller picks this pass's width from them,
    assistant.runtime.decode.propose). `banked` counts the accepted drafted tokens per source name."""

    def __init__(self, *drafters, calibrator: Calibrator | None = None):
        self.drafters = [d for d in drafters if d is not None]
        layers: list[int] = []
        for d in self.drafters:
            for l in d.feature_layers:
                if l not in layers:
                    layers.append(l)
        self.feature_layers = tuple(layers)
        self.names = [getattr(d, "name", type(d).__name__) for d in self.drafters]
        self.calibrator = calibrator or Calibrator()
        self.banked: Counter = Counter()
        self.node_values: list[float] = []   # the last proposal's node values, in its order (decode.propose)
        self._chosen: dict = {}

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        drafts = []
        for si, d in enumerate(self.drafters):
            sub = ctx
            if ctx.features is not None and tuple(d.feature_layers) != self.feature_layers:
                idx = [self.feature_layers.index(l) for l in d.feature_layers]
                sub = DraftContext(ctx.ids, ctx.root, ctx.features[idx], ctx.max_nodes)
            for di, c in enumerate(d.propose(sub)):
                if not isinstance(c, Draft):
                    c = Draft(c, ("rank", min(di, 7)), generic_prior(di, len(c)))
                drafts.append((si, di, c))
        cal = self.calibrator

        def value(si: int, di: int, toks: Draft, depth: int) -> float:
            return cal.value(si, toks.key, depth, toks.prior[min(depth, len(toks.prior)) - 1])

        paths, self._chosen = select(drafts, ctx.max_nodes - 1, value)
        self.node_values = [self._chosen[tuple(p)].value for p in paths]
        return paths

    def calibrate(self, tree: Tree, path: list[int]) -> list:
        """Learn from one verified tree what each source's nodes are worth (the ranking's calibration and
        `banked`); returns the Origin of every tree node (None for the root and unknown nodes)."""
        accepted = set(path)
        prefixes: list[tuple[int, ...]] = [()]
        for i in range(1, tree.size):
            prefixes.append(prefixes[tree.parents[i]] + (tree.tokens[i],))
        origin = [self._chosen.get(p) if i else None for i, p in enumerate(prefixes)]
        for i, o in enumerate(origin):
            if o is not None:
                self.calibrator.record(o.source, o.key, o.depth, i in accepted)
                if i in accepted:
                    self.banked[self.names[o.source]] += 1
        return origin

    def observe(self, tree: Tree, path: list[int]) -> None:
        origin = self.calibrate(tree, path)
        for si, d in enumerate(self.drafters):
            local = [o.draft if o is not None and o.source == si else -1 for o in origin]
            d.observe(Tree(tree.tokens, tree.parents, tree.depths, tree.children, local), path)


def artifact_drafter(art: Artifact, embeddings: torch.nn.Module, history=None, lookup: bool = True,
                     base: Artifact | None = None, **phrase) -> UnionDrafter:
    """The drafter the runtime runs for a head artifact: PhraseDrafter.from_artifact (the artifact's stored
    tree shape, unless `phrase` settings such as top_k override it) with the in-context lookup (unless
    `lookup` is False), with `history` (an AnswerIndex of the user's past answers) the lookup in them,
    and with `base` (the frozen head an adapted `art` was fine-tuned from) that head as a source of its
    own, "base": all ranked on one scale in one tree (UnionDrafter). The calibration gives the nodes of
    whichever head is right more often in this answer more of the tree, so a head adapted to one user's
    text does not cost the text the base head was trained on (BENCHMARKS.md, "Online adaptation")."""
    from assistant.runtime.history_lookup import HistoryDrafter

    return UnionDrafter(HistoryDrafter(history) if history is not None else None,
                        PhraseDrafter.from_artifact(base, embeddings, name="base", **phrase) if base is not None
                        else None,
                        PhraseDrafter.from_artifact(art, embeddings, **phrase),
                        PromptLookupDrafter() if lookup else None)
