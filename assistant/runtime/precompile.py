"""Compiled verify forwards kept on disk, so no start waits on the compiler.

Contract: a compiled engine's verify forward is captured with torch's ahead-of-time API
(`torch.compile(...).aot_compile`) and saved as one artifact per (model config, dtype,
device, weight layout, packed-weight keys, feature layers, torch/transformers versions, the
engine's own source, CPU flags): `artifact_path(model, layout, feature_layers)` names it,
`save(fn, path)` writes it atomically, `load(path, f_globals)` returns the callable (bound to the
globals of the module that defined the forward) or None (missing, stale or unreadable; a bad file is
removed); the KEEP most recently used artifacts of a model and dtype stay, older ones (and their
build notes, `marker(path, suffix)`) go when a new one is saved. A later process loads the artifact
in ~2.5 s instead of re-tracing the model with dynamo (~10 s) or compiling it cold (70-140 s on a
2-core CPU). Inductor's kernels live beside it in the user cache directory. Building one in another
process, while the session answers: assistant.runtime.background.

Trust: an artifact is a pickle written by torch, like the inductor cache entries torch itself
unpickles from the same directory. It is read only from the user's own cache directory (0700),
only if the file is owned by this user and writable by no one else; never from a profile.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from assistant.runtime import cpuinfo
from assistant.runtime.fetch import cache_dir

FORMAT = 1
KEEP = 4          # artifacts kept per model and dtype, most recently used first


def compiled_dir() -> Path:
    d = cache_dir() / "compiled"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d

def _cpu_flags() -> str:
    return " ".join(sorted(cpuinfo.flags())) or platform.processor()


def _source_digest() -> str:
    """The code a graph bakes in: the compiled engine (and the eager one it is checked against), the weight
    layout and this module."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("compiled.py", "eager.py", "layout.py", "precompile.py", "kernels/__init__.py",
                 "kernels/cpu.cpp"):
        h.update((here / name).read_bytes())
    return h.hexdigest()


def artifact_key(model, layout: str, feature_layers: Sequence[int], options: dict[str, Any]) -> str:
    import transformers

    from assistant.runtime import kernels
    from assistant.runtime.layout import native_keys, packed_columns, packed_keys

    parts = {
        "format": FORMAT, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": sys.version.split()[0], "machine": platform.machine(), "cpu": _cpu_flags(),
        "config": model.config.to_json_string(use_diff=False), "dtype": str(model.dtype),
        "device": model.device.type, "layout": layout, "keys": packed_keys(model),
        "columns": packed_columns(model), "native": native_keys(model),
        # the native attention is in the graph where it loaded for this dtype (a CPU engine loads the kernels first)
        "kernels": kernels.attention(model.dtype) and model.device.type == "cpu",
        "features": list(feature_layers), "options": sorted(options.items()), "source": _source_digest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def artifact_path(model, layout: str, feature_layers: Sequence[int], options: dict[str, Any]) -> Path:
    name = getattr(model.config, "_name_or_path", "") or model.config.model_type
    stem = Path(str(name)).name or model.config.model_type
    dtype = str(model.dtype).replace("torch.", "")
    return compiled_dir() / f"{stem}-{dtype}-{artifact_key(model, layout, feature_layers, options)}.aot"


def _private(path: Path) -> bool:
    st = path.stat()
    return (not hasattr(os, "getuid") or st.st_uid == os.getuid()) and not st.st_mode & 0o022


def load(path: Path, f_globals: dict[str, Any], problem: Callable[[str], None] | None = None) -> Callable | None:
    """The saved compiled function at `path` with `f_globals` as its globals (those of the module that
    defined the forward), or None (missing, not private, or unreadable: removed, and `problem` told why in
    one line)."""
    try:
        if not path.is_file():
            return None
        if not _private(path):
            if problem:
                problem(f"{path.name} is writable by others: not read")
            return None
        with open(path, "rb") as f:
            fn = torch.compiler.load_compiled_function(f, f_globals=f_globals)
    except Exception as e:  # noqa: BLE001 - a stale or broken artifact only means: compile again
        path.unlink(missing_ok=True)
        if problem:
            text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            problem(f"{path.name} could not be loaded ({type(e).__name__}: {text}); removed")
        return None
    fn.disable_guard_check()       # validity is the artifact key's job; the engine checks the output once
    try:
        os.utime(path)             # recently used: kept by prune()
    except OSError:
        pass
    return fn


def prune(path: Path, keep: int = KEEP) -> list[Path]:
    """Remove all but the `keep` most recently used artifacts of `path`'s model and dtype (each new
    version of the engine, torch or a head's feature layers writes another ~5 MB); returns what went."""
    def used(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:        # another process removed it meanwhile
            return 0.0

    stem = path.name.rsplit("-", 1)[0]
    found = sorted(path.parent.glob(f"{glob.escape(stem)}-*.aot"), key=used, reverse=True)
    gone = [p for p in found if p != path][max(keep - 1, 0):]
    for p in gone:
        for q in (p, marker(p, ".log"), marker(p, ".failed")):
            q.unlink(missing_ok=True)
    return gone


def save(fn, path: Path) -> bool:
    """Write the artifact atomically (temp file, fsync, rename); False when torch cannot serialise it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fn.save_compiled_function(str(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        marker(path, ".failed").unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - the engine still runs; only the next start compiles again
        tmp.unlink(missing_ok=True)
        return False
    try:
        prune(path)
    except OSError:            # saved all the same; old artifacts go at the next save
        pass
    return True


def marker(path: Path, suffix: str) -> Path:
    """The note beside an artifact: ".lock" (a build is running), ".log", ".failed" (its reason)."""
    return path.with_name(path.name + suffix)
