"""Compiled verify forwards kept on disk, and built in the background, so no start waits on the compiler.

Contract: a compiled engine's verify forward is captured with torch's ahead-of-time API
(`torch.compile(...).aot_compile`) and saved as one artifact per (model config, dtype,
device, weight layout, packed-weight keys, feature layers, torch/transformers versions, the
engine's own source, CPU flags): `artifact_path(model, layout, feature_layers)` names it,
`save(fn, path)` writes it atomically, `load(path)` returns the callable or None (missing,
stale or unreadable; a bad file is removed); the KEEP most recently used artifacts of a model
and dtype stay, older ones go when a new one is saved. A later process loads the artifact in ~2.5 s
instead of re-tracing the model with dynamo (~10 s) or compiling it cold (70-140 s on a 2-core
CPU). Inductor's kernels live beside it in the user cache directory.

`start_build(target, feature_layers)` starts `python -m assistant.runtime.precompile` as a detached, niced
background process that loads the same checkpoint, compiles and saves the artifact, so a
session can answer on the eager engine at once and switch engines between answers once
`ready()` says so (assistant.session; it measures the compiled engine's verify costs then,
not in the build, which shares the CPU with the answers). One build runs at a time per artifact (a lock file); a build that
failed leaves a `.failed` note with its one-line reason, which stops further background tries
(`--engine compiled` still tries in the foreground). ASSISTANT_BACKGROUND_COMPILE=0 turns
background builds off: "auto" then compiles in the foreground, as tests need for determinism.

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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from assistant.runtime.fetch import cache_dir

FORMAT = 1
KEEP = 4          # artifacts kept per model and dtype, most recently used first


def compiled_dir() -> Path:
    d = cache_dir() / "compiled"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def background_allowed() -> bool:
    return os.environ.get("ASSISTANT_BACKGROUND_COMPILE", "1") != "0"


def _cpu_flags() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def _source_digest() -> str:
    """The code a graph bakes in: the engine, the weight layout and this module."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("engine.py", "layout.py", "precompile.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()


def artifact_key(model, layout: str, feature_layers: Sequence[int], options: dict[str, Any]) -> str:
    import transformers

    from assistant.runtime.layout import packed_columns, packed_keys

    parts = {
        "format": FORMAT, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": sys.version.split()[0], "machine": platform.machine(), "cpu": _cpu_flags(),
        "config": model.config.to_json_string(use_diff=False), "dtype": str(model.dtype),
        "device": model.device.type, "layout": layout, "keys": packed_keys(model),
        "columns": packed_columns(model),
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


def load(path: Path, problem: Callable[[str], None] | None = None) -> Callable | None:
    """The saved compiled function at `path`, or None (missing, not private, or unreadable: removed, and
    `problem` told why in one line)."""
    try:
        if not path.is_file():
            return None
        if not _private(path):
            if problem:
                problem(f"{path.name} is writable by others: not read")
            return None
        from assistant.runtime import engine

        with open(path, "rb") as f:     # the compiled forward's globals are assistant.runtime.engine's (torch, ...)
            fn = torch.compiler.load_compiled_function(f, f_globals=vars(engine))
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
        for q in (p, _marker(p, ".log"), _marker(p, ".failed")):
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
        _marker(path, ".failed").unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - the engine still runs; only the next start compiles again
        tmp.unlink(missing_ok=True)
        return False
    try:
        prune(path)
    except OSError:            # saved all the same; old artifacts go at the next save
        pass
    return True


# -- background builds -----------------------------------------------------------------------------------

def _marker(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def failed_reason(path: Path) -> str | None:
    try:
        return _marker(path, ".failed").read_text().strip() or "unknown error"
    except OSError:
        return None


def start_build(model_path: str, dtype: str, device: str, feature_layers: Sequence[int], artifact: Path,
                first_key: int = 0) -> subprocess.Popen | None:
    """Start the background build of `artifact` for the checkpoint at `model_path`, whose packed linears
    carry the keys `first_key`, `first_key + 1`, ... in the parent (assistant.runtime.layout; None when a build is
    already running or failed before). The child outlives the caller: it finishes the cache for the
    next start even after a one-shot `assistant ask` has exited."""
    if artifact.exists() or failed_reason(artifact) is not None:
        return None
    lock = _marker(artifact, ".lock")
    if not _take(lock):
        return None                         # a build is running
    cmd = [sys.executable, "-m", "assistant.runtime.precompile", "--model", model_path, "--dtype", dtype, "--device", device,
           "--features", ",".join(str(i) for i in feature_layers), "--artifact", str(artifact),
           "--first-key", str(first_key)]
    root = str(Path(__file__).resolve().parents[1])
    # one core: the session answers on the other one meanwhile (at 2 threads beside a busy core its OpenMP
    # team spun against the build, 1-4 tok/s; at one thread it keeps its idle one-thread speed)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               PYTHONPATH=os.pathsep.join([root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    try:
        with open(_marker(artifact, ".log"), "w") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, preexec_fn=_lower_priority if os.name == "posix" else None)
    except OSError:
        lock.unlink(missing_ok=True)
        raise
    lock.write_text(f"{proc.pid} {time.time():.0f}\n")      # the child removes it when it ends
    return proc


def _take(lock: Path) -> bool:
    """Create `lock` for this process (False while a live process holds it; a dead one's is taken over)."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                os.kill(int(lock.read_text().split()[0]), 0)
                return False
            except (OSError, ValueError, IndexError):
                lock.unlink(missing_ok=True)        # left by a killed build
                continue
        os.write(fd, f"{os.getpid()} {time.time():.0f}\n".encode())
        os.close(fd)
        return True
    return False


def _lower_priority() -> None:
    os.nice(10)


def background_state(target, feature_layers: Sequence[int]) -> tuple[str, Path | None]:
    """Where `target`'s compiled verify forward stands for a session on "auto": ("saved", path) when a
    later process can load it; ("missing", path) when it can be built in the background
    (`start_build(target.path, ...)`, or one is running); ("failed", path) after a build failed (its
    reason: `failed_reason(path)`); ("foreground", None) when it cannot be built in the background
    here (no checkpoint directory, not a CPU, background builds turned off): then the caller compiles
    in its own process as before."""
    from assistant.runtime.engine import CompiledEngine
    from assistant.runtime.layout import layout_of, set_layout

    if not background_allowed() or target.path is None or target.device.type != "cpu" \
            or target.dtype not in ("fp32", "bf16"):
        return "foreground", None
    before = layout_of(target.model)
    path = CompiledEngine(target.model, feature_layers=feature_layers).artifact_path(tuple(feature_layers))
    set_layout(target.model, before)
    if path.is_file():
        return "saved", path
    return ("failed" if failed_reason(path) is not None else "missing"), path


def ready(artifact: Path) -> bool:
    """The artifact is there and its build has ended."""
    return artifact.is_file() and not _marker(artifact, ".lock").exists()


def _build(args) -> int:
    from assistant.runtime.engine import CompiledEngine
    from assistant.runtime.layout import start_keys_at
    from assistant.runtime.target import load_model

    artifact = Path(args.artifact)
    lock = _marker(artifact, ".lock")
    if not lock.exists() and not _take(lock):      # run by hand; start_build takes the lock for its child
        return 0
    try:
        model = load_model(args.model, args.dtype, torch.device(args.device))
        start_keys_at(args.first_key)
        layers = tuple(int(x) for x in args.features.split(",") if x.strip())
        engine = CompiledEngine(model, feature_layers=layers, progress=lambda s, f=None: print(s, flush=True))
        want = engine.artifact_path(layers)
        if want != artifact:
            raise RuntimeError(f"this process would write {want.name}, not {artifact.name}")
        engine.warm_up()
        if not artifact.exists():
            raise RuntimeError("the compiled verify forward could not be saved")
        print("done", flush=True)
        return 0
    except Exception as e:  # noqa: BLE001 - recorded for the parent, which stays on the eager engine
        text = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        _marker(artifact, ".failed").write_text(f"{type(e).__name__}: {text}\n")
        print(f"failed: {type(e).__name__}: {text}", flush=True)
        return 1
    finally:
        lock.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m assistant.runtime.precompile",
                                description="Compile and save a target's verify forward (a background build).")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--dtype", required=True, choices=["fp32", "bf16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--features", default="-1", help="comma list of feature layers")
    p.add_argument("--artifact", required=True, help="where the parent expects the artifact")
    p.add_argument("--first-key", type=int, default=0, help="the parent's first packed-linear key")
    return _build(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
