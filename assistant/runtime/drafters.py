"""Drafters: whatever proposes candidate continuations of the pending token.

Contract: a drafter has `feature_layers` (which target hidden states it wants),
`propose(ctx) -> list[list[int]]` (continuations after ctx.root, best first) and
`observe(tree, path)` (which of its nodes the target accepted). The decode loop
never trusts a proposal: correctness does not depend on the drafter.

- PhraseDrafter: the phrase head + draft vocabulary (+ an optional phrase-chain
  table, so a branch can hold several phrases in a row).
- PromptLookupDrafter: copies what followed the latest earlier occurrence of the
  context's last n-gram (the prompt-lookup idea, inside our tree).
- UnionDrafter: merges several drafters' candidates into one tree.
- HistoryDrafter (assistant.runtime.history_lookup): lookup in the user's past answers.
- `artifact_drafter(art, embeddings, **phrase)`: THE drafter the runtime builds from a head
  artifact (its phrase drafter with prompt lookup, in one tree); whatever judges a head
  (the adapter, tuning scripts) builds it here so it judges what will run.
- OracleDrafter / AdversarialDrafter: test drafters that know the reference answer.
"""
from __future__ import annotations

from typing import Sequence

import torch

from assistant.runtime.decode import DraftContext
from assistant.runtime.head import Artifact, PhraseHead
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
    """n-gram lookup in the context: continuations of earlier matches of the last n tokens."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, length: int = 8, matches: int = 2):
        self.max_ngram, self.min_ngram, self.length, self.matches = max_ngram, min_ngram, length, matches

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        ids = ctx.ids
        out: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ids) <= n:
                continue
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):
                if ids[start: start + n] == tail:
                    cont = tuple(ids[start + n: start + n + self.length])
                    if cont and cont not in seen:
                        seen.add(cont)
                        out.append(list(cont))
                        if len(out) >= self.matches:
                            return out
            if out:
                return out
        return out


class PhraseDrafter(_Base):
    """Top-k phrases from the head, the best ones extended by a phrase-chain table."""

    def __init__(self, head: PhraseHead, vocab: DraftVocab, embeddings: torch.nn.Module,
                 top_k: int = 6, chain: torch.Tensor | None = None, chain_depth: int = 2, chain_width: int = 2,
                 chain_p: torch.Tensor | None = None, max_nodes: int | None = None):
        self.head, self.vocab, self.embeddings = head, vocab, embeddings
        self.feature_layers = head.config.feature_layers
        self.top_k = top_k
        self.chain = chain            # Long [capacity, S]: row -> most frequent next rows (-1 = none)
        self.chain_depth, self.chain_width = chain_depth, chain_width
        # Float [capacity, S]: P(next row | row). With it, proposals are chosen best-first by
        # path probability (head softmax x chain probabilities) until the tree budget is used.
        self.chain_p = chain_p.float() if chain_p is not None else None
        self.max_nodes = max_nodes    # node budget for best-first (None: ctx.max_nodes)
        self._live = torch.tensor([r is not None for r in vocab.rows], dtype=torch.bool)
        self._last: list[list[int]] = []   # row ids making up each candidate of the last proposal

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

    @torch.inference_mode()
    def scores(self, ctx: DraftContext) -> torch.Tensor:
        emb = self.embeddings(torch.tensor([ctx.root], device=self.embeddings.weight.device))
        feats = ctx.features.reshape(1, -1).float().to(self.head.out.weight.device)
        logits = self.head(feats, emb.float().to(feats.device))[0]
        return logits.masked_fill(~self._live.to(logits.device), float("-inf"))

    def _chains(self, row: int) -> list[list[int]]:
        """Row-id sequences starting with `row`, extended through the chain table."""
        paths = [[row]]
        if self.chain is None:
            return paths
        frontier = [[row]]
        for _ in range(self.chain_depth - 1):
            nxt = []
            for p in frontier:
                for r in self.chain[p[-1], : self.chain_width].tolist():
                    if r >= 0 and self.vocab.rows[r] is not None:
                        nxt.append(p + [r])
            paths = nxt + paths if nxt else paths
            frontier = nxt
        return paths

    def _best_first(self, scores: torch.Tensor, budget: int) -> list[list[int]]:
        """Row paths in order of path probability until `budget` tree nodes are used."""
        import heapq

        k = min(self.top_k, len(self.vocab))
        probs = torch.softmax(scores, -1)
        p, idx = probs.topk(k)
        heap = [(-float(pi), n, [int(r)]) for n, (pi, r) in enumerate(zip(p.tolist(), idx.tolist()))]
        heapq.heapify(heap)
        tie = len(heap)
        nodes: set[tuple[int, ...]] = set()
        out: list[list[int]] = []
        while heap and len(nodes) < budget:
            neg, _, path = heapq.heappop(heap)
            toks: list[int] = []
            for r in path:
                toks.extend(self.vocab.rows[r].tokens)
            new = [tuple(toks[:i + 1]) for i in range(len(toks)) if tuple(toks[:i + 1]) not in nodes]
            if new:
                nodes.update(new)
                out.append(path)
            if len(path) < self.chain_depth and self.chain is not None:
                last = path[-1]
                for r, q in zip(self.chain[last, : self.chain_width].tolist(),
                                self.chain_p[last, : self.chain_width].tolist()):
                    if r >= 0 and q > 0 and self.vocab.rows[r] is not None:
                        tie += 1
                        heapq.heappush(heap, (neg * q, tie, path + [r]))
        return out

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        if ctx.features is None or len(self.vocab) == 0:
            return []
        if self.chain_p is not None:
            row_paths = self._best_first(self.scores(ctx), min(self.max_nodes or ctx.max_nodes, ctx.max_nodes) - 1)
        else:
            k = min(self.top_k, len(self.vocab))
            top = self.scores(ctx).topk(k).indices.tolist()
            row_paths = []
            for rank, r in enumerate(top):
                row_paths.extend(self._chains(r) if rank < 2 else [[r]])
        self._last = row_paths
        cands = []
        for p in row_paths:
            toks: list[int] = []
            for r in p:
                toks.extend(self.vocab.rows[r].tokens)
            cands.append(toks)
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
    """Candidates of several drafters, interleaved best-first, in one tree."""

    def __init__(self, *drafters):
        self.drafters = [d for d in drafters if d is not None]
        layers: list[int] = []
        for d in self.drafters:
            for l in d.feature_layers:
                if l not in layers:
                    layers.append(l)
        self.feature_layers = tuple(layers)
        self._offsets: list[tuple[int, int, int]] = []

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        lists = []
        for d in self.drafters:
            sub = ctx
            if ctx.features is not None and tuple(d.feature_layers) != self.feature_layers:
                idx = [self.feature_layers.index(l) for l in d.feature_layers]
                sub = DraftContext(ctx.ids, ctx.root, ctx.features[idx], ctx.max_nodes)
            lists.append(d.propose(sub))
        out, origin = [], []
        for i in range(max((len(l) for l in lists), default=0)):
            for di, l in enumerate(lists):
                if i < len(l):
                    out.append(l[i])
                    origin.append((di, i))
        self._origin = origin
        return out

    def observe(self, tree: Tree, path: list[int]) -> None:
        for di, d in enumerate(self.drafters):
            local = [next((i for (dj, i) in [self._origin[s]] if dj == di), -1) if s >= 0 else -1
                     for s in tree.source]
            sub = Tree(tree.tokens, tree.parents, tree.depths, tree.children, local)
            d.observe(sub, path)


def artifact_drafter(art: Artifact, embeddings: torch.nn.Module, history=None, **phrase) -> UnionDrafter:
    """The drafter the runtime runs for a head artifact: PhraseDrafter.from_artifact (the artifact's stored
    tree shape, unless `phrase` settings such as top_k override it) with prompt lookup, in one tree; with
    `history` (an AnswerIndex of the user's past answers) their lookup comes first: it proposes only on a
    match of several tokens, and then its continuation is the likeliest text."""
    from assistant.runtime.history_lookup import HistoryDrafter

    return UnionDrafter(HistoryDrafter(history) if history is not None else None,
                        PhraseDrafter.from_artifact(art, embeddings, **phrase), PromptLookupDrafter())
