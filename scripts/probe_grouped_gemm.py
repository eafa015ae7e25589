"""Verify-pass time with sibling linears grouped (assistant.runtime.layout.GROUPS: q/k/v and gate/up as one GEMM each)
against each linear on its own, both compiled in ONE process and timed in turn (BENCHMARKS.md, "Verify cost
per tree width"): timing them as separate processes on a shared machine swings more than the difference.

    python scripts/probe_grouped_gemm.py [ROUNDS]     (default 30; bf16 SmolLM2, 2 threads; run it alone)

Each variant loads its own copy of the default target and its own compiled engine (the first run compiles
both, ~1 min each).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import assistant.runtime.layout as layout
from assistant.runtime.engine import make_engine
from assistant.runtime.target import load_target
from assistant.runtime.tree import build_tree

WIDTHS = (1, 4, 16)


def main(rounds: int) -> None:
    torch.set_num_threads(2)
    engines = {}
    for name, groups in (("separate", ()), ("grouped", layout.GROUPS)):
        layout.GROUPS = groups          # read when the weights are packed, i.e. inside make_engine
        target = load_target(dtype="bf16", progress=lambda *a, **k: None)
        engines[name] = make_engine(target, "compiled", progress=lambda s, f: print(f"  {name}: {s}", flush=True))
        if engines[name].name != "compiled":
            raise SystemExit(f"{name}: no compiled engine")
    ids = list(range(100, 228))
    states, times = {}, {(n, w): [] for n in engines for w in WIDTHS}
    with torch.inference_mode():
        for n, eng in engines.items():
            cache = eng.new_cache(len(ids) + max(WIDTHS) + 8)
            root, _ = eng.prefill(cache, ids, ())
            states[n] = cache, {w: build_tree(root, [[100 + i for i in range(w - 1)]]) for w in WIDTHS}
        for r in range(rounds + 1):                 # round 0 warms up
            for w in WIDTHS:
                for n, eng in engines.items():
                    cache, trees = states[n]
                    for _ in range(5):
                        t0 = time.perf_counter()
                        eng.verify(cache, trees[w], len(ids), ())
                        eng.commit(cache, len(ids), [])
                        if r:
                            times[(n, w)].append(time.perf_counter() - t0)
    for w in WIDTHS:
        g, s = (statistics.median(times[(n, w)]) * 1e3 for n in ("grouped", "separate"))
        print(f"w={w}: grouped {g:.2f} ms, separate {s:.2f} ms, x{g / s:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
