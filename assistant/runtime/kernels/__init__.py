"""Native kernels for decode passes on an x86 CPU, built for this machine at first use.

Contract: `load(progress)` returns True once `torch.ops.assistant_kernels` (cpu.cpp beside this file) is loaded,
building it first with the C++ compiler torch.compile uses on a CPU (~10 s, once per machine, torch version and
`isa()`, into the user cache directory), or False where it cannot run: neither AVX512 nor AVX2 + FMA, no
compiler, a failed build, ASSISTANT_KERNELS=0 (the reason is in `problem()`; oneDNN and aten run instead).
`isa()` names the build this CPU takes, without building: "amx" (Xeons since Sapphire Rapids: the avx512bf16
build whose bf16 linear runs on AMX tiles; a compiler without AMX builds avx512bf16 instead), "avx512bf16" (every
op, both dtypes), else the fp32 linear and attention, "avx512" (AVX512F: many cloud servers' CPUs) or "avx2"
(AVX2 + FMA: most laptops' CPUs), where oneDNN and aten ran the fp32 passes before;
ASSISTANT_KERNELS=avx512bf16|avx512|avx2 takes that build on a CPU that has more, as the tests do. `loaded()`
says whether it ran, `running()` which build, `bf16()` whether it has the bf16 ops (these never build). The ops:
- `linear(x, key, n)`: x [..., K] @ W^T for the weight registered under `key` (`put`/`drop`; packed once by
  `pack`, bf16 as [N/16, K/2, 16, 2] and fp32 as [N/16, K, 16], `unpack` gives it back exactly), the packed
  layout's GEMM (assistant.runtime.layout) in both dtypes; `usable(w)` says whether a weight fits it; an fp32
  weight dequantized from blocks of 32 inputs may be packed in that block form by `pack_blocks` instead
  (0.75-1.25 bytes a weight, the same products bit for bit: assistant.runtime.kernels.blocks; `blocks_enabled()`,
  off with ASSISTANT_BLOCKS=0);
- `attention(q, k, v, mask, scale)`: q [B, H, Q, D] over the keys/values [B, KVH, N, D] of a cache window with
  an additive mask [B|1, 1, Q, N] -> [B, Q, H, D], the engines' attention (trees and prefill chunks), bf16 in the
  AVX512-BF16 build and fp32 in every build (the AVX2 build's on 8-lane vectors, its outputs the AVX512 ones' bit
  for bit; `attention(dtype)` says which here).
  Row-invariant: a query row's output depends only on the keys its mask lets it see, in their order, not on the
  slots they sit at (the softmax denominator is summed in lanes by each seen key's rank), so a tree node whose
  ancestors are scattered through a tree equals, bit for bit, the one-token pass that later sees them in a row;
  with the linears (each output row summed alike at any row count) a verify pass gives every node exactly
  what greedy decoding on the same engine gives it, in bf16 and fp32.
- `commit_slots(kv, lengths, start, path)`: a verify pass's commit on a CPU static cache (the compiled engine's):
  slot start + path[i] of every [B, KVH, S, D] tensor in `kv` moved to slot start + i, every int64 length in
  `lengths` set to start + len(path), in one call (four tensor ops a layer took ~0.5 ms a pass).
Every build's fp32 linear sums each output in one order with the same fused multiply-adds: their results are
equal bit for bit, so the exactness measured on one holds on the others.

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
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp")
# build -> its compiler flags (the CPU flags each needs: cpuinfo.KERNEL_BUILDS)
ISAS = {"amx": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
        "avx512bf16": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"),
        "avx512": ("-mavx512f",),
        "avx2": ("-mavx2", "-mfma")}

BF16_BUILDS = tuple(b for b, needs in cpuinfo.KERNEL_BUILDS.items() if "avx512_bf16" in needs)   # with bf16 ops
_state: dict[str, object] = {}
_FAKE: list = []            # the shape function torch.compile traces the op with, registered once a process


def _compiler() -> str:
    return os.environ.get("CXX") or "c++"


def isa() -> str | None:
    """The build this CPU takes (see the module contract), or None: turned off, or no build fits this CPU.
    ASSISTANT_KERNELS names one to take instead of the best (where the CPU has its instructions)."""
    return cpuinfo.kernel_build() if torch.backends.mkldnn.is_available() else None


def library_path(target: str | None = None) -> Path:
    """Where this machine's build lives: keyed by the source, torch's version and ABI, and the flags."""
    from assistant.runtime.fetch import cache_dir

    target = target or isa() or "avx512bf16"
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__} {torch._C._GLIBCXX_USE_CXX11_ABI} {sys.version_info[:2]} {FLAGS} "
             f"{ISAS[target]}".encode())
    return cache_dir() / "kernels" / f"cpu-{target}-{h.hexdigest()[:16]}.so"


def _build(out: Path, target: str) -> None:
    from torch.utils.cpp_extension import include_paths, library_paths

    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    cmd = [_compiler(), *FLAGS, *ISAS[target],
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
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
    """Load (building once if needed) this CPU's build; False where it cannot run here (see problem())."""
    if "ok" in _state:
        return bool(_state["ok"])
    ok, why, target, asked = False, None, isa(), os.environ.get("ASSISTANT_KERNELS", "1")
    if asked == "0":
        why = "turned off (ASSISTANT_KERNELS=0)"
    elif target is None:
        why = ("this torch has no oneDNN" if not torch.backends.mkldnn.is_available()
               else f"this CPU cannot run the {asked} build" if asked in ISAS
               else "this CPU has neither AVX512 nor AVX2 with FMA")
    else:
        # a compiler too old for AMX (GCC < 11) still builds the AVX512-BF16 kernels
        for target in (target, "avx512bf16") if target == "amx" and asked != "amx" else (target,):
            try:
                path = library_path(target)
                if not path.is_file():
                    if progress:
                        progress("building the native kernels (once per machine, ~10 s)", None)
                    _build(path, target)
                torch.ops.load_library(str(path))
                ok, why = True, None
                break
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
    _state["ok"], _state["why"], _state["isa"] = ok, why, target if ok else None
    return ok


def loaded() -> bool:
    """load() ran in this process and the kernels are loaded (never builds)."""
    return bool(_state.get("ok"))


def running() -> str | None:
    """The build loaded in this process ("amx", "avx512bf16", "avx512", "avx2"), or None; never builds."""
    return _state.get("isa")  # type: ignore[return-value]


def bf16() -> bool:
    """The loaded build has the bf16 ops (the linear's bf16 path and the attention); never builds."""
    return running() in BF16_BUILDS


def attention(dtype: torch.dtype) -> bool:
    """The loaded build has the attention in `dtype`: bf16 in the AVX512-BF16 builds, fp32 in every build; never
    builds."""
    return (dtype == torch.bfloat16 and bf16()) or (dtype == torch.float32 and loaded())


def problem() -> str | None:
    """Why load() is False (None before it ran or when it is True)."""
    return _state.get("why")  # type: ignore[return-value]


def blocks_enabled() -> bool:
    """fp32 weights that have the block form (assistant.runtime.kernels.blocks) run in it, unless
    ASSISTANT_BLOCKS=0 (never builds)."""
    return cpuinfo.blocks_enabled()


def usable(w: torch.Tensor) -> bool:
    """A weight this CPU's build takes: [N, K] with N a multiple of 16, fp32, or bf16 with K even where the
    build has bf16 (never builds)."""
    return (w.dim() == 2 and w.shape[0] % 16 == 0
            and (w.dtype == torch.float32
                 or (w.dtype == torch.bfloat16 and w.shape[1] % 2 == 0
                     and (_state.get("isa") if "ok" in _state else isa()) in BF16_BUILDS)))
