"""The CPU's feature flags, read once: what the dtype choice, the native kernels, the compiled
forwards' cache key and the bench's machine line depend on. No torch here: the budget reads it too.

Contract: `flags(path)` is the set of words on the first "flags" line of `path` (/proc/cpuinfo), empty
where there is none or it cannot be read (not Linux). `KERNEL_BUILDS` maps each build of the native kernels
(assistant.runtime.kernels), best first, to the flags it needs; `kernel_build()` names the one this CPU takes,
or None (ASSISTANT_KERNELS=0, or none fits; ASSISTANT_KERNELS=<build> takes that one where the CPU has it);
`blocks_enabled()` says whether fp32 weights may run in the kernels' block form (off with ASSISTANT_BLOCKS=0).
"""
from __future__ import annotations

import functools
import os

KERNEL_BUILDS: dict[str, frozenset[str]] = {
    "amx": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"}),
    "avx512bf16": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}),
    "avx512": frozenset({"avx512f"}),
    "avx2": frozenset({"avx2", "fma"}),
}


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


def kernel_build() -> str | None:
    asked = os.environ.get("ASSISTANT_KERNELS", "1")
    if asked == "0":
        return None
    have = flags()
    fits = [name for name, needs in KERNEL_BUILDS.items() if needs <= have and asked in (name, "1")]
    return fits[0] if fits else None


def blocks_enabled() -> bool:
    return os.environ.get("ASSISTANT_BLOCKS", "1") != "0"
