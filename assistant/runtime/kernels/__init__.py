"""Native kernels for decode passes on a CPU (AVX512-BF16), built for this machine at first use.

Contract: `load(progress)` returns True once `torch.ops.assistant_kernels` (cpu.cpp beside this file, AVX512-
BF16) is loaded, building it first with the C++ compiler torch.compile uses on a CPU (~10 s, once per machine
and torch version, into the user cache directory), or False where it cannot run: no AVX512-BF16, no compiler,
a failed build, ASSISTANT_KERNELS=0 (the reason is in `problem()`; oneDNN and aten run instead). `loaded()` says
whether it ran (never builds). The ops:
- `linear(x, key, n)`: x [..., K] @ W^T for the weight registered under `key` (`put`/`drop`; packed once by
  `pack`, bf16 as [N/16, K/2, 16, 2] and fp32 as [N/16, K, 16], `unpack` gives it back exactly), the packed
  layout's GEMM (assistant.runtime.layout) in both dtypes; `usable(w)` says whether a weight fits it;
- `attention(q, k, v, mask, scale)`: q [B, H, Q, D] over the keys/values [B, KVH, N, D] of a cache window with
  an additive mask [B|1, 1, Q, N] -> [B, Q, H, D], the engines' attention in bf16 (trees and prefill chunks).

Why: oneDNN's linear for 1-16 rows reads SmolLM2's layer weights at half the speed this loop does (bf16 576x576:
109 vs 46 us at 4 rows; 960x576 123 vs 66; 49152x576 2.17 vs 2.00 ms; 2 threads, machine E, cache swept between
calls; a whole fp32 verify pass 28.3 vs 16.4 ms at 1 node, 38.2 vs 20.3 at 16): a decode pass streams every
weight once, so the bytes a second decide. The attention's two aten::bmm cost ~40 us a call at a tree's sizes
whatever the work. fp32 stays exact where it was: the exactness tests against generate() run on this kernel.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch

from assistant.runtime import cpuinfo

SOURCE = Path(__file__).with_name("cpu.cpp")
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
         "-mavx512bf16")

_state: dict[str, object] = {}
_FAKE: list = []            # the shape function torch.compile traces the op with, registered once a process


def _compiler() -> str:
    return os.environ.get("CXX") or "c++"


def library_path() -> Path:
    """Where this machine's build lives: keyed by the source, torch's version and ABI, and the flags."""
    from assistant.runtime.fetch import cache_dir

    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__} {torch._C._GLIBCXX_USE_CXX11_ABI} {sys.version_info[:2]} {FLAGS}".encode())
    return cache_dir() / "kernels" / f"cpu-{h.hexdigest()[:16]}.so"


def _build(out: Path) -> None:
    from torch.utils.cpp_extension import include_paths, library_paths

    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    cmd = [_compiler(), *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *[f"-I{p}" for p in include_paths()], str(SOURCE), "-o", str(tmp),
           *[f"-L{p}" for p in library_paths()], "-lc10", "-ltorch_cpu"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        os.replace(tmp, out)
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or "").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"the C++ build failed: {tail[0][:200]}") from None
    finally:
        tmp.unlink(missing_ok=True)


def load(progress: Callable[[str, float | None], None] | None = None) -> bool:
    """Load (building once if needed) the bf16 kernel; False where it cannot run here (see problem())."""
    if "ok" in _state:
        return bool(_state["ok"])
    ok, why = False, None
    if os.environ.get("ASSISTANT_KERNELS", "1") == "0":
        why = "turned off (ASSISTANT_KERNELS=0)"
    elif not ("avx512_bf16" in cpuinfo.flags() and torch.backends.mkldnn.is_available()):
        why = "this CPU has no AVX512-BF16"
    else:
        try:
            path = library_path()
            if not path.is_file():
                if progress:
                    progress("building the native kernels (once per machine, ~10 s)", None)
                _build(path)
            torch.ops.load_library(str(path))
            ok = True
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    if ok and not _FAKE:
        @torch.library.register_fake("assistant_kernels::linear")
        def _(x: torch.Tensor, key: int, n: int) -> torch.Tensor:
            return x.new_empty(*x.shape[:-1], n)

        @torch.library.register_fake("assistant_kernels::attention")
        def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
            return q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3])

        _FAKE.extend((_, _attention))
    _state["ok"], _state["why"] = ok, why
    return ok


def loaded() -> bool:
    """load() ran in this process and the kernels are loaded (never builds)."""
    return bool(_state.get("ok"))


def problem() -> str | None:
    """Why load() is False (None before it ran or when it is True)."""
    return _state.get("why")  # type: ignore[return-value]


def usable(w: torch.Tensor) -> bool:
    """A weight the linear takes: [N, K] with N a multiple of 16, bf16 with K even or fp32."""
    return (w.dim() == 2 and w.shape[0] % 16 == 0
            and (w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and w.shape[1] % 2 == 0)))
