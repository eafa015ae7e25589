"""Verify-width cost model: how wide a tree pays off on THIS device, and in which weight layout.

Contract: `verify_costs(target, widths, layout)` times one tree-verify forward of each
width w on top of a 128-token KV cache (median of a few repeats) with the target's
linear weights in `layout` (runtime.layout) and returns {w: seconds}. `choose(costs)`
picks the (layout, width) that maximises expected tokens per second, E(w) / t(w), with
E(w) = 1 + 0.55 ln w: tokens per pass of the phrase drafter measured on GSM8K test
prompts with 3, 5, 8 and 16 nodes (1.58, 1.88, 2.18, 2.5). `calibrate(target, cap)`
does both once per model, dtype, device and machine, caches the measurement as JSON
under the user cache directory, and returns a `VerifyPlan`; `apply_plan` puts the
target in the plan's layout. Why measure: on one 2-core CPU a 16-node verify cost
x1.7 of a 1-token forward, on another x3.6 (w=3 cost x1.1 there), and the [in, out]
layout cut fp32's x3.0 to x1.75 but was slower in bf16, so no fixed choice is right.
The target is left in the layout it came in.
"""
from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from runtime.fetch import cache_dir
from runtime.layout import LAYOUTS, layout_of, set_layout

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
CACHE_VERSION = 2


@dataclass(frozen=True)
class VerifyPlan:
    width: int                                   # tree nodes per verify pass, root included
    layout: str                                  # runtime.layout of the target's linear weights
    costs: dict[str, dict[int, float]] = field(default_factory=dict)   # layout -> width -> seconds


def expected_tokens_per_pass(width: int) -> float:
    return 1.0 + 0.55 * math.log(max(width, 1))


@torch.inference_mode()
def verify_costs(target, widths: Sequence[int] = WIDTHS, layout: str | None = None, prefix: int = 128,
                 repeats: int = 5) -> dict[int, float]:
    """{width: median seconds of one verify forward} in `layout` (None: as the target is)."""
    from runtime.decode import prefill, verify
    from runtime.tree import build_tree

    before = layout_of(target.model)
    if layout is not None:
        set_layout(target.model, layout)
    try:
        vocab = int(target.model.config.vocab_size)
        lo, hi = min(100, vocab // 4), min(1000, vocab)
        ids = [int(t) for t in torch.randint(lo, hi, (prefix,), generator=torch.Generator().manual_seed(0))]
        cache, root, _ = prefill(target.model, ids, ())
        costs: dict[int, float] = {}
        for w in widths:
            tree = build_tree(root, [[lo + i % (hi - lo) for i in range(w - 1)]])
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                verify(target.model, cache, tree, prefix, hidden=False)
                samples.append(time.perf_counter() - t0)
                cache.crop(prefix - cache.get_seq_length())   # drop the tree's w positions again
            costs[w] = sorted(samples)[len(samples) // 2]
    finally:
        set_layout(target.model, before)
    return costs


def choose(costs: dict[str, dict[int, float]], cap: int = max(WIDTHS)) -> tuple[str, int]:
    """The (layout, width <= cap) with the most expected tokens per second."""
    options = [(lay, w) for lay, c in costs.items() for w in c if w <= cap]
    return max(options, key=lambda o: expected_tokens_per_pass(o[1]) / costs[o[0]][o[1]])


def _key(target) -> str:
    return f"{target.name}-{target.dtype}-{target.device}-{platform.machine()}-{torch.get_num_threads()}t"


def _read(path: Path) -> dict[str, dict[int, float]] | None:
    try:
        data = json.loads(path.read_text())
        if data.get("version") != CACHE_VERSION:
            return None
        return {lay: {int(w): float(s) for w, s in c.items()} for lay, c in data["costs"].items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None


def layouts_for(target) -> tuple[str, ...]:
    """Layouts worth measuring: both on a CPU (MKL repacks [out, in] weights); on a GPU the BLAS reads
    either layout without a copy, and a re-stride would briefly need one more weight of device memory."""
    return LAYOUTS if target.device.type == "cpu" else ("out",)


def calibrate(target, cap: int = 16, progress=None, refresh: bool = False) -> VerifyPlan:
    """The plan to use (width <= cap), from a cached or fresh measurement of this device; `refresh`
    measures again (a measurement taken while the machine was busy would otherwise stick)."""
    path = Path(cache_dir()) / "costmodel" / f"{_key(target)}.json"
    costs = None if refresh else _read(path)
    wanted = [w for w in WIDTHS if w <= max(cap, 1)]
    layouts = layouts_for(target)
    if not costs or set(costs) != set(layouts) or any(max(c) < max(wanted) for c in costs.values()):
        if progress:
            progress("measuring verify cost per tree width and weight layout (once per machine)", None)
        costs = {lay: verify_costs(target, wanted, lay) for lay in layouts}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        base = costs["out"][1]
        relative = {lay: {w: round(s / base, 3) for w, s in c.items()} for lay, c in costs.items()}
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "costs": costs, "relative_to_out_w1": relative,
                                   "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
        tmp.replace(path)
    layout, width = choose(costs, cap)
    return VerifyPlan(width=width, layout=layout, costs=costs)


def apply_plan(target, plan: VerifyPlan) -> None:
    set_layout(target.model, plan.layout)
