"""Verify-width cost model: how wide a tree pays off on THIS device.

Contract: `verify_costs(target, widths)` times one tree-verify forward of each
width w on top of a KV cache (median of a few repeats) and returns
{w: seconds}. `choose_width(costs)` picks the width that maximises expected
tokens per second, E(w) / t(w), with E(w) = 1 + 0.55 ln w: tokens per pass of
the phrase drafter measured on GSM8K test prompts with 3, 5, 8 and 16 nodes
(1.58, 1.88, 2.18, 2.5). `calibrated_width(target, cap)` does both once per
model, dtype, device and machine and caches the result as JSON under the user
cache directory. Why: on one 2-core CPU a 16-node verify cost x1.7 of a 1-token
forward, on another x3.6 (w=3 cost x1.1 there), so a fixed width is wrong somewhere.
"""
from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Sequence

import torch

from runtime.fetch import cache_dir

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)


def expected_tokens_per_pass(width: int) -> float:
    return 1.0 + 0.55 * math.log(max(width, 1))


@torch.inference_mode()
def verify_costs(target, widths: Sequence[int] = WIDTHS, prefix: int = 128, repeats: int = 5) -> dict[int, float]:
    from runtime.decode import prefill, verify
    from runtime.tree import build_tree

    ids = [int(t) for t in torch.randint(100, 1000, (prefix,), generator=torch.Generator().manual_seed(0))]
    costs: dict[int, float] = {}
    for w in widths:
        samples = []
        for _ in range(repeats):
            cache, root, _ = prefill(target.model, ids, ())
            tree = build_tree(root, [list(range(200, 200 + w - 1))])
            t0 = time.perf_counter()
            verify(target.model, cache, tree, prefix, hidden=False)
            samples.append(time.perf_counter() - t0)
        costs[w] = sorted(samples)[len(samples) // 2]
    return costs


def choose_width(costs: dict[int, float]) -> int:
    return max(costs, key=lambda w: expected_tokens_per_pass(w) / costs[w])


def _key(target) -> str:
    return f"{target.name}-{target.dtype}-{target.device}-{platform.machine()}-{torch.get_num_threads()}t"


def calibrated_width(target, cap: int = 16, progress=None) -> tuple[int, dict[int, float]]:
    """The width to use (<= cap), from a cached or fresh measurement of this device."""
    path = Path(cache_dir()) / "costmodel" / f"{_key(target)}.json"
    costs: dict[int, float] | None = None
    try:
        costs = {int(k): float(v) for k, v in json.loads(path.read_text())["costs"].items()}
    except (OSError, ValueError, KeyError):
        pass
    if not costs or max(costs) < min(cap, max(WIDTHS)):
        if progress:
            progress("measuring verify cost per tree width (once per machine)", None)
        costs = verify_costs(target, [w for w in WIDTHS if w <= max(cap, 1)])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"costs": costs, "relative": {w: c / costs[1] for w, c in costs.items()}}))
        tmp.replace(path)
    usable = {w: c for w, c in costs.items() if w <= cap}
    return choose_width(usable), costs
