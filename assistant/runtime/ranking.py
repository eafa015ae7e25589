"""One scale for every source's candidates: the chance that a node is accepted, learned online.

Contract:
- `Draft(tokens, key, prior)`: a candidate continuation (a list of token ids) that a drafter scores:
  `key` names its kind of evidence (("phrase", probability bucket), ("prompt", match length),
  ("history", match length)...), `prior[i]` is the drafter's own estimate that tokens[: i + 1] is
  accepted (non-increasing). A plain list is a Draft with a generic prior by rank.
- `Calibrator`: per (source, key, depth) how many tree nodes were verified and how many accepted
  (older observations fading, so a change of text shows within a few dozen passes);
  `value(source, key, depth, prior)` is the acceptance rate shrunk towards the prior by `strength`
  pseudo-counts: a source that is not paying off loses its nodes within a few passes, one that is
  gains them. It lives as long as its drafter (one chat session: this answer and the ones before).
- `select(drafts, budget, value)` merges the drafts into a prefix trie (a prefix two drafts of one
  source share keeps its best value; one that several sources propose is worth 1 - prod(1 - v) over
  their best values: it is missed only if all of them are wrong) and takes `budget` nodes best-first
  by value, a node only after its parent: the tree with the most expected accepted tokens the values
  allow. It returns each chosen node's path (its
  token prefix) in the order chosen, so assistant.runtime.tree.build_tree inserts the nodes in that
  order and the first w' nodes are the best tree of w' nodes (what assistant.runtime.width's
  controller assumes), and, per chosen node, which draft gave its value.

The expected number of drafted tokens a pass banks is the sum of its nodes' acceptance chances, so
taking nodes by that chance, across sources, is what the width the cost model allows should hold.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence


class Draft(list):
    """A candidate continuation (list of token ids) with the evidence to rank it (module contract)."""

    def __init__(self, tokens: Sequence[int], key: Hashable, prior: Sequence[float]):
        super().__init__(int(t) for t in tokens)
        self.key = key
        self.prior = list(prior)


def generic_prior(rank: int, length: int) -> list[float]:
    """The prior of an unscored candidate: the best-first order its drafter gave, decaying with depth."""
    return [0.5 / (1 + rank) * 0.85 ** i for i in range(length)]


def match_prior(match: int, length: int) -> list[float]:
    """The prior of a copy (prompt or history lookup) after a `match`-token match: longer matches are
    likelier to continue, and each further copied token a little less likely."""
    base = min(0.05 + 0.15 * match, 0.7)
    return [base * 0.9 ** i for i in range(length)]


MAX_DEPTH = 16


@dataclass
class Calibrator:
    strength: float = 16.0                      # pseudo-counts of the prior (4 banked 0.3-2% less per verify cost)
    decay: float = 0.98                         # older observations fade: ~50 of a kind make the rate
    counts: dict = field(default_factory=dict)  # (source, key, depth) -> [verified, accepted] (decayed)

    def value(self, source: int, key: Hashable, depth: int, prior: float) -> float:
        c = self.counts.get((source, key, min(depth, MAX_DEPTH)))
        if c is None:
            return prior
        return (c[1] + self.strength * prior) / (c[0] + self.strength)

    def record(self, source: int, key: Hashable, depth: int, accepted: bool) -> None:
        c = self.counts.setdefault((source, key, min(depth, MAX_DEPTH)), [0.0, 0.0])
        c[0] = c[0] * self.decay + 1.0
        c[1] = c[1] * self.decay + float(accepted)


@dataclass(frozen=True)
class Origin:
    """Which draft gave a chosen node its value: source (drafter index), draft index in that source's
    list, the draft's key, the node's depth inside the draft (1 = its first token) and the value."""

    source: int
    draft: int
    key: Hashable
    depth: int
    value: float


def select(drafts: Sequence[tuple[int, int, Sequence[int]]], budget: int,
           value: Callable[[int, int, Sequence[int], int], float]
           ) -> tuple[list[list[int]], dict[tuple[int, ...], Origin]]:
    """Best-first subtree of the drafts' prefix trie (module contract).

    drafts: (source, draft index, tokens); value(source, draft index, tokens, depth) -> chance that
    tokens[:depth] is accepted. Returns (the token prefix of every chosen node, in the order chosen;
    {token prefix: Origin} for each of them)."""
    best: dict[tuple[int, ...], tuple[float, Origin]] = {}
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    shared: dict[tuple[int, ...], dict[int, float]] = {}     # prefix -> {source: its best value}, if 2+ drafts
    for source, di, toks in drafts:
        v_prev = 1.0
        for d in range(1, len(toks) + 1):
            prefix = tuple(toks[:d])
            v = min(value(source, di, toks, d), v_prev)      # a node is never likelier than its parent
            v_prev = v
            old = best.get(prefix)
            if old is None:
                children.setdefault(prefix[:-1], []).append(prefix)
            else:
                by = shared.setdefault(prefix, {old[1].source: old[0]})
                by[source] = max(by.get(source, 0.0), v)
            if old is None or v > old[0]:
                key = getattr(toks, "key", None)
                best[prefix] = (v, Origin(source, di, key, d, v))
    for prefix, by in shared.items():
        if len(by) > 1:
            _agree(best, prefix, by.values())
    chosen: dict[tuple[int, ...], Origin] = {}
    order: list[tuple[int, ...]] = []
    heap = [(-best[c][0], n, c) for n, c in enumerate(children.get((), []))]
    heapq.heapify(heap)
    tie = len(heap)
    while heap and len(order) < budget:
        _, _, node = heapq.heappop(heap)
        chosen[node] = best[node][1]
        order.append(node)
        for c in children.get(node, []):
            tie += 1
            heapq.heappush(heap, (-best[c][0], tie, c))
    return [list(n) for n in order], chosen


def _agree(best: dict, prefix: tuple[int, ...], values) -> None:
    """A node that several sources propose (a copy the prompt and the user's history both hold, a phrase the
    lookup repeats) is missed only if every source is wrong: 1 - prod(1 - v), as if they erred apart."""
    miss = 1.0
    for v in values:
        miss *= 1.0 - v
    o = best[prefix][1]
    best[prefix] = (1.0 - miss, Origin(o.source, o.draft, o.key, o.depth, 1.0 - miss))


__all__ = ["Calibrator", "Draft", "Origin", "generic_prior", "match_prior", "select"]
