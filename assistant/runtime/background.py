"""Background builds of the compiled verify forward: a session answers at once and switches engines later.

Contract: `start_build(model_path, dtype, device, feature_layers, artifact)` starts `python -m
assistant.runtime.background` as a detached, niced background process that loads the same checkpoint,
compiles the verify forward and saves it as `artifact` (assistant.runtime.precompile), so a session can
answer on the eager engine at once and switch engines between answers once `ready()` says so
(assistant.session; it measures the compiled engine's verify costs then, not in the build, which shares
the CPU with the answers). `background_state(target, feature_layers)` says where a target's artifact
stands. One build runs at a time per artifact (a lock file); a build that failed leaves a `.failed`
note with its one-line reason (`failed_reason`), which stops further background tries (`--engine
compiled` still tries in the foreground). ASSISTANT_BACKGROUND_COMPILE=0 turns background builds off:
"auto" then compiles in the foreground, as tests need for determinism.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from assistant.runtime.compiled import CompiledEngine
from assistant.runtime.precompile import marker


def background_allowed() -> bool:
    return os.environ.get("ASSISTANT_BACKGROUND_COMPILE", "1") != "0"


def failed_reason(path: Path) -> str | None:
    try:
        return marker(path, ".failed").read_text().strip() or "unknown error"
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
    lock = marker(artifact, ".lock")
    if not _take(lock):
        return None                         # a build is running
    cmd = [sys.executable, "-m", "assistant.runtime.background", "--model", model_path, "--dtype", dtype, "--device", device,
           "--features", ",".join(str(i) for i in feature_layers), "--artifact", str(artifact),
           "--first-key", str(first_key)]
    root = str(Path(__file__).resolve().parents[2])       # the directory holding the assistant package
    # one core: the session answers on the other one meanwhile (at 2 threads beside a busy core its OpenMP
    # team spun against the build, 1-4 tok/s; at one thread it keeps its idle one-thread speed)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               PYTHONPATH=os.pathsep.join([root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    try:
        with open(marker(artifact, ".log"), "w") as log:
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
    return artifact.is_file() and not marker(artifact, ".lock").exists()


def _build(args) -> int:
    from assistant.runtime.layout import start_keys_at
    from assistant.runtime.target import load_model

    artifact = Path(args.artifact)
    lock = marker(artifact, ".lock")
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
        marker(artifact, ".failed").write_text(f"{type(e).__name__}: {text}\n")
        print(f"failed: {type(e).__name__}: {text}", flush=True)
        return 1
    finally:
        lock.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m assistant.runtime.background",
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
