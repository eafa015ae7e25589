"""Tree width: how many nodes a verify pass may hold, decided here for every caller.

Contract: `plan_width(asked, budget=, verify=, auto=, layout=)` returns the `WidthPlan` a runtime
uses: `cap` = the width asked for (a profile's tree_width, a --tree-width flag; None:
DEFAULT_WIDTH), lowered to what the memory budget fits (`budget`: assistant.runtime.budget's
plan.tree_width); with `auto` and a cost-model plan (`verify`: assistant.runtime.costmodel.VerifyPlan,
measured up to the cap) the width starts at the plan's choice (`start`) and a `WidthController` over
the measured costs (`controller()`) picks each pass's width online up to the cap; else every pass
uses the cap. `fit_width(asked, fits)` is the budget's search: the largest of asked, asked/2, ... 1
that fits. `expected_tokens_per_pass(w)` is the prior E(w) = 1 + 0.55 ln w both the cost model and the
controller use. A head artifact's stored `max_nodes` (assistant.runtime.drafters.PhraseDrafter) is
not a width: it bounds the phrase drafter's own nodes inside a tree of the width decided here.
No torch and nothing heavy is imported, so the budget planner and the profile settings use it too.

Online control: `WidthController(costs, cap)` takes the measured seconds of one verify forward
per width ({w: s}, assistant.runtime.costmodel, in the weight layout in use) and picks the width
of every pass: `next_width(values)` before it, `observe(path, width)` after it, with the
accepted path (tree node indices, root first) of a pass verified at `width`. With `values` (a
ranking drafter's chance of acceptance for each node of this pass's tree, best first) the width is
the one with the most expected tokens per second for this very tree: a pass whose copy matches
eight tokens gets a wide tree, a pass with nothing likely gets none; without them, the width that
banked the most per second lately (below). The values are corrected by level: per tenth of value
(0-0.1, ..., 0.9-1), how many of the verified nodes valued there were accepted against the sum of
their values. Why by level, not by width: the weak nodes (valued < 0.2) are accepted 0.5-0.6x as
often as valued, the likely ones (0.5 and up) about as valued, so a correction per width (what this was until
session 26) scaled a 15-token copy valued 0.8 down with the weak nodes that usually fill wide trees,
and a user's long copies from their history ran at 8 nodes (BENCHMARKS.md, W4).

From one pass at width w it learns what every measured width w' <= w would have
banked: tree nodes are inserted best first and parents before children, so the first
w' nodes are the tree of width w', and the accepted nodes that lie below w' are what
it would have kept. It keeps decayed means of drafted tokens per width (the prior E(w)
counted as `prior_weight` observations) and picks the width with
the most expected tokens per second, (1 + drafted(w')) / t(w'). Why online: the prior
comes from GSM8K, where a 16-node tree banks 2.5 tokens a pass; on MT-Bench the same head
banked 1.46 at 16 nodes, and the fixed width that wins on one costs on the other.

Without node values, the first pass and every `explore_every`-th pass after it run at the cap so
wide widths keep fresh evidence. With them a pass never explores: the values already say what a
wide tree would hold, and a pass at the cap cost x3.95 of a 1-node pass on an AVX2 CPU (machine G);
replayed on the same answers, dropping those explorations banked 0.1% (a flat table) to 6-8% (G's)
more tokens per unit of verify cost on GSM8K, MT-Bench and a returning user's follow-ups
(BENCHMARKS.md, W6). An exploration after which the cap still does not pay doubles the gap
to the next one (up to `explore_max` passes); one after which it pays resets it; and
`start_answer()` (the decode loop calls it after every prefill) restarts the cadence,
keeping what was learned, because a new answer is new text (one that turns repetitive is
caught within 10-40 passes). Why back off: on text the head does not know (MT-Bench) each
exploration is a wide verify that banks nothing; at every 10th pass that added ~24% to
the time in bf16 on a CPU where a 16-node verify costs x3.4.
"""
from __future__ import annotations

import math
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

DEFAULT_WIDTH = 16        # most verify nodes per pass, root included, when nothing asks for another
VALUE_BINS = 10           # levels of node value (0-0.1, ..., 0.9-1) the controller corrects apart
VALUE_PRIOR = 2.0         # predicted tokens of prior in each level's correction (a ratio of 1)
VALUE_DECAY = 0.999       # per verified node of a level: ~1,000 make its correction


def _bin(value: float) -> int:
    return min(max(int(value * VALUE_BINS), 0), VALUE_BINS - 1)


def expected_tokens_per_pass(width: int) -> float:
    """The prior E(w): tokens per pass of the phrase drafter at width w, measured on GSM8K test prompts
    with 3, 5, 8 and 16 nodes (1.58, 1.88, 2.18, 2.5)."""
    return 1.0 + 0.55 * math.log(max(width, 1))


def fit_width(asked: int, fits: Callable[[int], bool]) -> int:
    """The largest of asked, asked // 2, ... that `fits`; 1 when none above 1 does."""
    width = max(1, asked)
    while width > 1 and not fits(width):
        width //= 2
    return width


class WidthController:
    def __init__(self, costs: dict[int, float], cap: int, decay: float = 0.98, prior_weight: float = 2.0,
                 explore_every: int = 10, explore_max: int = 80):
        self.costs = {int(w): float(s) for w, s in costs.items() if int(w) <= max(cap, 1)} or {1: 1.0}
        self.widths = sorted(self.costs)
        self.cap = self.widths[-1]
        self.decay, self.prior_weight = decay, prior_weight
        self.explore_every, self.explore_max = explore_every, max(explore_max, explore_every)
        self._gap = explore_every              # passes from one exploration to the next
        self._next_explore = 1                 # the first pass explores
        self._exploring = False
        self.n = {w: 0.0 for w in self.widths}        # decayed observation weight per width
        self.s = {w: 0.0 for w in self.widths}        # decayed drafted tokens per width
        self.seen = {w: 0 for w in self.widths}       # raw observation counts
        self.passes = 0
        # per bin of node value: decayed sums of the values of the verified nodes in it and of how many of
        # them were accepted (their ratio corrects the values of that level, `value_scale`)
        self.pred = [0.0] * VALUE_BINS
        self.real = [0.0] * VALUE_BINS
        self._values: list[float] | None = None

    def drafted(self, w: int) -> float:
        """Expected drafted tokens per pass at width w: the decayed mean of what it banked, with the
        prior counted as `prior_weight` observations."""
        prior = expected_tokens_per_pass(w) - 1.0
        return (self.s[w] + self.prior_weight * prior) / (self.n[w] + self.prior_weight)

    def best(self) -> int:
        return max(self.widths, key=lambda w: (1.0 + self.drafted(w)) / self.costs[w])

    def start_answer(self) -> None:
        """A new answer begins: explore at its first pass, then every explore_every, backing off again."""
        self._gap = self.explore_every
        self._next_explore = self.passes + 1

    def value_scale(self, value: float) -> float:
        """Accepted / predicted among the verified nodes valued like `value` so far (1 with no evidence;
        VALUE_PRIOR nodes' worth of prior)."""
        return self._level_scale(_bin(value))

    def _level_scale(self, b: int) -> float:
        return (self.real[b] + VALUE_PRIOR) / (self.pred[b] + VALUE_PRIOR)

    def best_for(self, values: Sequence[float]) -> int:
        """The width with the most expected tokens per second for THIS pass's tree: the sum of the chances
        of acceptance of its best w - 1 nodes (`values`, best first: the tree of w nodes is the first
        w - 1), i.e. the expected drafted tokens banked (assistant.runtime.ranking), each value corrected
        by how often nodes of its level were accepted so far."""
        csum = list(accumulate((v * self.value_scale(v) for v in values), initial=0.0))
        last = len(csum) - 1
        return max(self.widths, key=lambda w: (1.0 + csum[min(w - 1, last)]) / self.costs[w])

    def next_width(self, values: Sequence[float] | None = None) -> int:
        """The width of the next pass: with the drafter's node values for this pass, `best_for` them (kept
        for observe()); without them the cap when exploring, else the best width by what each width banked
        so far."""
        self.passes += 1
        self._values = None if values is None else list(values)
        if self._values is not None:
            return self.best_for(self._values)
        if self.passes == 1 or (self.explore_every and self.passes >= self._next_explore):
            self._exploring = True
            return self.cap
        return self.best()

    def observe(self, path: list[int], width: int) -> None:
        for w in self.widths:
            if w > width:
                break
            kept = 0
            for node in path[1:]:
                if node >= w:
                    break
                kept += 1
            self.n[w] = self.n[w] * self.decay + 1.0
            self.s[w] = self.s[w] * self.decay + kept
            self.seen[w] += 1
        if self._values is not None:
            accepted = set(path[1:])
            for k, v in enumerate(self._values[: width - 1]):     # node k + 1 of the tree
                b = _bin(v)
                self.pred[b] = self.pred[b] * VALUE_DECAY + v
                self.real[b] = self.real[b] * VALUE_DECAY + float(k + 1 in accepted)
        if self._exploring:
            self._exploring = False
            self._gap = self.explore_every if self.best() == self.cap else min(2 * self._gap, self.explore_max)
            self._next_explore = self.passes + self._gap

    def summary(self) -> dict[str, float]:
        """Tokens per pass expected at each width from what it banked (and, where node values were
        given, `scale@v`: accepted / predicted among the verified nodes valued v..v + 0.1)."""
        out = {str(w): round(self.drafted(w) + 1.0, 3) for w in self.widths}
        out.update({f"scale@{b / VALUE_BINS:.1f}": round(self._level_scale(b), 3)
                    for b in range(VALUE_BINS) if self.pred[b] > 0})
        return out


@dataclass(frozen=True)
class WidthPlan:
    cap: int                                   # most nodes a verify pass may hold, root included
    start: int                                 # the width in use before any online choice
    costs: Mapping[int, float] = field(default_factory=dict)   # seconds per width; empty: fixed at the cap

    def controller(self) -> WidthController | None:
        """A fresh online controller over the measured costs (None: every pass uses the cap)."""
        return WidthController(dict(self.costs), self.cap) if self.costs else None


def plan_width(asked: int | None = None, *, budget: int | None = None, verify: Any = None, auto: bool = True,
               layout: str | None = None) -> WidthPlan:
    """The tree width a runtime uses (see the module docstring). `verify` is a cost-model plan (width,
    layout, costs per layout); its costs are taken in `layout` (None: the plan's own)."""
    cap = DEFAULT_WIDTH if asked is None else asked
    if budget is not None:
        cap = min(cap, budget)
    if verify is None or not auto:
        return WidthPlan(cap=cap, start=cap)
    return WidthPlan(cap=cap, start=verify.width, costs=dict(verify.costs[layout or verify.layout]))
