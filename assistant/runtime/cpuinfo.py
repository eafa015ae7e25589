"""The CPU's feature flags, read once: what the dtype choice, the native kernels, the compiled
forwards' cache key and the bench's machine line depend on.

Contract: `flags(path)` is the set of words on the first "flags" line of `path` (/proc/cpuinfo), empty
where there is none or it cannot be read (not Linux).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=8)
def flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
