"""Verify-width cost model: how wide a tree pays off on THIS device, and in which weight layout.

Contract: `verify_costs(target, widths, layout)` times one tree-verify forward of each
width w on top of a 128-token KV cache (median of 15, the widths taken in turn) with the target's
linear weights in `layout` (assistant.runtime.layout) and returns {w: seconds}, made `monotone`
(never cheaper for more nodes). `choose(costs)`
picks the (layout, width) that maximises expected tokens per second, E(w) / t(w), with
E(w) = 1 + 0.55 ln w (assistant.runtime.width.expected_tokens_per_pass). `calibrate(target, cap)`
does both once per model, dtype, device and machine, caches the measurement as JSON
under the user cache directory, and returns a `VerifyPlan`; `apply_plan` puts the
target in the plan's layout. Each engine (assistant.runtime.engine) has its own measurement;
`pick_engine(target, kind="auto")` builds the compiled engine and keeps whichever engine
expects more tokens per second, so "auto" is decided by the same cached numbers; `runtime_width(target,
cap)` is the width such a runtime starts at (assistant.runtime.width.plan_width over `runtime_plan`). A compiled
engine's measurement is cached under its `tag` (its saved forward's key: a changed engine is measured
again, and engines of several tags, e.g. heads that read other layers or two installs, keep a table each
instead of measuring again in turn: a table re-measured on a busy machine moves the widths, BENCHMARKS.md W1),
and a measurement taken while other processes kept a core busy (before it or during it) is used but not cached.
Why measure: on one 2-core CPU a 16-node verify cost x1.7 of a 1-token forward, on another x3.6 (w=3 cost x1.1
there), and the [in, out] layout cut fp32's x3.0 to x1.75 but was slower in bf16, so no fixed choice is right.
Why during it too: tables cached on machine E while other work ran that evening, past the check before them, read
x1.29 (bf16) and x1.53 (fp32) at 16 nodes, against x1.14 / x1.25 measured alone (BENCHMARKS.md S14, H10).
The target is left in the layout it came in.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from assistant.runtime.fetch import cache_dir
from assistant.runtime.layout import LAYOUTS, layout_of, set_layout
from assistant.runtime.width import DEFAULT_WIDTH, expected_tokens_per_pass, plan_width

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
CACHE_VERSION = 3                 # 3: tables made monotone (earlier ones are measured again)


@dataclass(frozen=True)
class VerifyPlan:
    width: int                                   # tree nodes per verify pass, root included
    layout: str                                  # assistant.runtime.layout of the target's linear weights
    costs: dict[str, dict[int, float]] = field(default_factory=dict)   # layout -> width -> seconds


@torch.inference_mode()
def verify_costs(target, widths: Sequence[int] = WIDTHS, layout: str | None = None, prefix: int = 128,
                 repeats: int = 15, engine=None) -> dict[int, float]:
    """{width: median seconds of one verify forward} in `layout` (None: as the target is) on `engine`
    (assistant.runtime.engine; None: eager). A compiled engine is measured in its own layout only."""
    from assistant.runtime.eager import EagerEngine
    from assistant.runtime.tree import build_tree

    engine = engine or EagerEngine(target.model)
    before = layout_of(target.model)
    if layout is not None and engine.name == "eager":
        set_layout(target.model, layout)
    try:
        vocab = int(target.model.config.vocab_size)
        lo, hi = min(100, vocab // 4), min(1000, vocab)
        ids = [int(t) for t in torch.randint(lo, hi, (prefix,), generator=torch.Generator().manual_seed(0))]
        cache = engine.new_cache(prefix + max(widths) + 1)
        root, _ = engine.prefill(cache, ids, ())
        trees = {w: build_tree(root, [[lo + i % (hi - lo) for i in range(w - 1)]]) for w in widths}
        samples: dict[int, list[float]] = {w: [] for w in widths}
        for _ in range(repeats):          # round-robin: a slow spell of a shared machine hits every width alike
            for w in widths:
                t0 = time.perf_counter()
                engine.verify(cache, trees[w], prefix, ())
                samples[w].append(time.perf_counter() - t0)
                engine.commit(cache, prefix, [])          # drop the tree's w positions again
        costs = monotone({w: sorted(s)[len(s) // 2] for w, s in samples.items()})
    finally:
        if engine.name == "eager":
            set_layout(target.model, before)
    return costs


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """The closest costs (least squares) that never fall as the width grows: a tree of more nodes does no less
    work (a 1-node pass runs as 2 rows), so a narrower width measured dearer than a wider one is noise of the
    shared machine, and it would steer the width controller (pool-adjacent-violators)."""
    blocks: list[list] = []                  # [mean, count, widths]
    for w in sorted(costs):
        blocks.append([costs[w], 1, [w]])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1, w1), (m2, n2, w2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2, w1 + w2])
    return {w: m for m, _, ws in blocks for w in ws}


def choose(costs: dict[str, dict[int, float]], cap: int = max(WIDTHS)) -> tuple[str, int]:
    """The (layout, width <= cap) with the most expected tokens per second."""
    options = [(lay, w) for lay, c in costs.items() for w in c if w <= cap]
    return max(options, key=lambda o: expected_tokens_per_pass(o[1]) / costs[o[0]][o[1]])


def _key(target, engine: str = "eager") -> str:
    from assistant.runtime import kernels

    native = (kernels.running() or "aten") if target.device.type == "cpu" else "gpu"
    if kernels.running() and target.dtype == "fp32" and kernels.blocks_enabled():
        native += "-blocks"        # a weight in block form costs another curve of widths than its fp32 copy
    return (f"{target.name}-{target.dtype}-{target.device}-{platform.machine()}-{torch.get_num_threads()}t-{engine}"
            f"-{native}")


def _read(path: Path, tag: str | None = None) -> dict[str, dict[int, float]] | None:
    try:
        data = json.loads(path.read_text())
        if data.get("version") != CACHE_VERSION or (tag is not None and data.get("tag", "") != tag):
            return None
        return {lay: {int(w): float(s) for w, s in c.items()} for lay, c in data["costs"].items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None


def layouts_for(target, engine=None) -> tuple[str, ...]:
    """Layouts worth measuring: all on a CPU (MKL repacks [out, in] weights; oneDNN packs once); on a
    GPU the BLAS reads either layout without a copy, and a re-stride would briefly need one more
    weight of device memory. A compiled engine runs in the one layout it was compiled for."""
    from assistant.runtime.layout import packing_supported

    if engine is not None and engine.name != "eager":
        return (engine.layout,)
    if target.device.type != "cpu":
        return ("out",)
    return LAYOUTS if packing_supported(target.model) else tuple(lay for lay in LAYOUTS if lay != "packed")


def calibrate(target, cap: int = DEFAULT_WIDTH, progress=None, refresh: bool = False, engine=None) -> VerifyPlan:
    """The plan to use (width <= cap) on `engine` (None: eager), from a cached or fresh measurement of
    this device; `refresh` measures again (a measurement taken while the machine was busy would
    otherwise stick)."""
    from assistant.runtime import threads

    name = engine.name if engine is not None else "eager"
    tag = getattr(engine, "tag", "") if engine is not None else ""
    path = Path(cache_dir()) / "costmodel" / f"{_key(target, name)}{'-' + tag if tag else ''}.json"
    costs = None if refresh else _read(path, tag)
    wanted = [w for w in WIDTHS if w <= max(cap, 1)]
    layouts = layouts_for(target, engine)
    if not costs or set(costs) != set(layouts) or any(max(c) < max(wanted) for c in costs.values()):
        before = threads.busy_cores(0.2)
        if progress:
            progress(f"measuring verify cost per tree width and weight layout on the {name} engine "
                     "(once per machine, a few seconds)", None)
        start = threads.snapshot()
        costs = {lay: verify_costs(target, wanted, lay, engine=engine) for lay in layouts}
        # a load that began during the measurement skews it as much as one that was there before
        during = threads.busy_cores(0.0, since=start) if start is not None else None
        busy = max((b for b in (before, during) if b is not None), default=None)
        if busy is not None and busy >= threads.BUSY_THRESHOLD:
            # other processes held a core: the ratios are skewed, so they serve this run only
            if progress:
                progress(f"other processes kept {busy:.1f} cores busy: the measurement is used now, not cached",
                         None)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            base = costs[layouts[0]][1]
            relative = {lay: {w: round(s / base, 3) for w, s in c.items()} for lay, c in costs.items()}
            tmp.write_text(json.dumps({"version": CACHE_VERSION, "tag": tag, "costs": costs,
                                       f"relative_to_{layouts[0]}_w1": relative,
                                       "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
            os.replace(tmp, path)
    layout, width = choose(costs, cap)
    return VerifyPlan(width=width, layout=layout, costs=costs)


def apply_plan(target, plan: VerifyPlan) -> None:
    set_layout(target.model, plan.layout)


def expected_speed(plan: VerifyPlan) -> float:
    """Expected tokens per second of the plan's (layout, width) choice, E(w) / t(w)."""
    return expected_tokens_per_pass(plan.width) / plan.costs[plan.layout][plan.width]


def runtime_plan(target, cap: int = DEFAULT_WIDTH) -> VerifyPlan:
    """The plan "auto" would use, from the cached measurements alone (nothing is compiled): the compiled
    engine's when it was measured on this machine and expects more tokens per second, else the eager
    one's (measured now if not cached)."""
    plan = calibrate(target, cap)
    found = sorted(Path(cache_dir(), "costmodel").glob(f"{_key(target, 'compiled')}-*.json"),
                   key=lambda p: p.stat().st_mtime)
    costs = _read(found[-1]) if found else None          # the compiled engine measured last here
    if costs:
        layout, width = choose(costs, cap)
        compiled = VerifyPlan(width=width, layout=layout, costs=costs)
        if expected_speed(compiled) >= expected_speed(plan):
            return compiled
    return plan


def runtime_width(target, cap: int = DEFAULT_WIDTH) -> int:
    """The verify width a session with auto engine and auto width starts at on this device (<= cap), from
    the cached measurements alone: what the adapter judges a head at."""
    return plan_width(cap, verify=runtime_plan(target, cap)).start


def pick_engine(target, cap: int = DEFAULT_WIDTH, progress=None, refresh: bool = False, kind: str = "auto",
                max_len: int | None = None, feature_layers=(-1,), threads: int | None = None):
    """(engine, plan): `kind` "eager" or "compiled", or "auto" = the one with the most expected tokens
    per second on this device by the cached cost measurements of both (the compiled engine is built,
    i.e. compiled, to measure it; a compiled engine that cannot be built is not a candidate). A fixed
    `threads` count is set first: the costs are measured and cached per thread count."""
    from assistant.runtime.engine import make_engine
    from assistant.runtime.threads import ThreadPolicy

    if threads:
        ThreadPolicy(fixed=threads).apply()

    if kind not in ("auto", "eager", "compiled"):
        raise ValueError(f"unknown engine {kind!r}: choose auto, eager or compiled")
    eager = make_engine(target, "eager")
    if kind == "eager":
        return eager, calibrate(target, cap, progress, refresh)
    before = layout_of(target.model)
    compiled = make_engine(target, "compiled", feature_layers=feature_layers, max_len=max_len, progress=progress)
    if compiled.name == "eager":          # fell back (the notice was printed)
        set_layout(target.model, before)
        return eager, calibrate(target, cap, progress, refresh)
    plan_c = calibrate(target, cap, progress, refresh, engine=compiled)
    if kind == "compiled":
        return compiled, plan_c
    plan_e = calibrate(target, cap, progress, refresh)
    if expected_speed(plan_c) >= expected_speed(plan_e):
        set_layout(target.model, compiled.layout)
        return compiled, plan_c
    return eager, plan_e
