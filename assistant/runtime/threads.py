"""How many intra-op threads the target's forwards use: measured per device and engine, fitted to the load.

Contract: `measure(target, engine)` times one verify pass at every thread count 1..cores
(median of a few, a 1-node and a 16-node tree, summed) and returns {n: seconds};
`calibrate(target, engine)` caches that under the user cache directory beside the cost
model. `busy_cores(window)` says how many cores OTHER processes keep busy right now
(/proc/stat minus this process's own CPU time over `window` seconds; None where /proc is
missing; since a `snapshot()` when one is given). `choose(times, cores, busy)` is pure: the fastest count measured on the idle
machine, capped at the cores the others leave free (at least one). A `ThreadPolicy` holds the
measurement and a fixed count (`--threads`, the profile's `threads`), which always wins
(`ThreadPolicy.for_engine(target, engine, fixed)` builds it, measuring only when nothing is fixed);
`policy.apply()` samples the load (~0.1 s), sets the calling thread's torch count and returns it.
Call it in the thread that runs the forwards, at the start of each answer.

Why: on a 2-core machine OpenMP's team spins waiting for a core another process holds, so two
threads beside one busy process ran phrase decoding at 22-25 tok/s against 52 with one thread,
while on the idle machine both counts were within 6% (BENCHMARKS.md, threads); a count fixed by
the number of cores is wrong as soon as anything else runs.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from assistant.runtime.fetch import cache_dir

CACHE_VERSION = 1
BUSY_THRESHOLD = 0.5      # another process's CPU use (in cores) that counts as taking a core


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _proc_times() -> tuple[float, float] | None:
    """(CPU seconds all cores were busy since boot, CPU seconds of this process) from /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)       # idle + iowait
    busy = sum(fields[:8]) - idle                                  # user nice system idle iowait irq softirq steal
    return busy / hz, (int(own[11]) + int(own[12])) / hz           # utime + stime


def busy_cores(window: float = 0.1, since: tuple[float, float, float] | None = None) -> float | None:
    """Cores other processes kept busy (None: not measurable here): since the snapshot `since` (from
    `snapshot()`) when it is at least `window` seconds old, else over the next `window` seconds."""
    a = since if since is not None and time.perf_counter() - since[2] >= window else snapshot()
    if a is None:
        return None
    if a is not since:
        time.sleep(window)
    b = snapshot()
    if b is None or b[2] <= a[2]:
        return None
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / (b[2] - a[2]))


def snapshot() -> tuple[float, float, float] | None:
    """(busy CPU seconds of all cores, CPU seconds of this process, perf_counter) now."""
    t = _proc_times()
    return None if t is None else (t[0], t[1], time.perf_counter())


def choose(times: dict[int, float], cores: int, busy: float | None) -> int:
    """The fastest idle thread count, at most the cores other processes leave free (>= 1)."""
    best = min(times, key=lambda n: (times[n], n)) if times else cores
    if busy is None:
        return max(1, min(best, cores))
    taken = int(busy + (1 - BUSY_THRESHOLD))            # 0.5 core busy or more takes a whole core
    return max(1, min(best, cores - taken))


@torch.inference_mode()
def measure(target, engine, counts: list[int] | None = None, prefix: int = 128, repeats: int = 5) -> dict[int, float]:
    """{threads: seconds of a 1-node plus a 16-node verify} on `engine`, each count set in this thread."""
    from assistant.runtime.tree import build_tree

    counts = counts or list(range(1, available_cores() + 1))
    vocab = int(target.model.config.vocab_size)
    lo, hi = min(100, vocab // 4), min(1000, vocab)
    ids = [int(t) for t in torch.randint(lo, hi, (prefix,), generator=torch.Generator().manual_seed(0))]
    before = torch.get_num_threads()
    out: dict[int, float] = {}
    try:
        cache = engine.new_cache(prefix + 17)
        root, _ = engine.prefill(cache, ids, ())
        trees = [build_tree(root, []), build_tree(root, [[lo + i % (hi - lo) for i in range(15)]])]
        for n in counts:
            torch.set_num_threads(n)
            total = 0.0
            for tree in trees:
                engine.verify(cache, tree, prefix, ())            # warm the team at this count
                engine.commit(cache, prefix, [])
                samples = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    engine.verify(cache, tree, prefix, ())
                    samples.append(time.perf_counter() - t0)
                    engine.commit(cache, prefix, [])
                total += sorted(samples)[len(samples) // 2]
            out[n] = total
    finally:
        torch.set_num_threads(before)
    return out


def _path(target, engine) -> Path:
    tag = getattr(engine, "tag", "")
    key = (f"{target.name}-{target.dtype}-{target.device}-{platform.machine()}-{available_cores()}c-{engine.name}"
           + (f"-{tag}" if tag else ""))
    return Path(cache_dir()) / "costmodel" / f"threads-{key}.json"


def calibrate(target, engine, progress=None, refresh: bool = False) -> dict[int, float]:
    """`measure` once per model, dtype, device, engine and core count; cached as JSON. A measurement taken
    while others kept a core busy is not trusted: the load is sampled first and, when busy, the cache is
    left alone and one thread is assumed best until an idle start measures."""
    path = _path(target, engine)
    if not refresh:
        try:
            data = json.loads(path.read_text())
            if data.get("version") == CACHE_VERSION:
                return {int(n): float(s) for n, s in data["seconds"].items()}
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            pass
    busy = busy_cores(0.2)
    if busy is not None and busy >= BUSY_THRESHOLD:
        return {}
    if progress:
        progress(f"measuring the speed of 1-{available_cores()} threads on the {engine.name} engine (once per "
                 "machine, a second)", None)
    times = measure(target, engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, "seconds": times,
                               "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    os.replace(tmp, path)
    return times


@dataclass
class ThreadPolicy:
    """The thread count of one session's answers (see the module docstring)."""

    times: dict[int, float] = field(default_factory=dict)   # idle measurement: threads -> seconds
    fixed: int | None = None                                # --threads / the profile: always wins
    cores: int = field(default_factory=available_cores)
    last: int = 0                                           # the count the last apply() set
    last_busy: float | None = None
    _mark: tuple[float, float, float] | None = field(default_factory=lambda: snapshot(), repr=False)

    def decide(self) -> int:
        if self.fixed:
            return max(1, self.fixed)
        self.last_busy = busy_cores(since=self._mark)
        self._mark = snapshot()
        return choose(self.times, self.cores, self.last_busy)

    def apply(self) -> int:
        """Set the calling thread's torch intra-op count for the next forwards; returns it. The load is
        what others used since the previous apply() (this process's own answers subtracted), or over
        0.1 s when that is too recent."""
        n = self.decide()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        self.last = n
        return n

    @classmethod
    def for_engine(cls, target, engine, fixed: int | None = None, progress=None) -> "ThreadPolicy":
        """The policy of a runtime's answers on `engine`: the `fixed` count, else this machine's idle
        measurement (`calibrate`, cached; not taken when the count is fixed)."""
        return cls(times={} if fixed else calibrate(target, engine, progress), fixed=fixed)
