"""Shared helpers for the profile tests (no torch)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[2]


def make_artifact(path: Path, seed: int = 0, n: int = 64) -> Path:
    """A small valid safetensors file (stands in for a head artifact)."""
    rng = np.random.default_rng(seed)
    save_file({"head.out.weight": rng.standard_normal((n, n)).astype(np.float32)}, str(path),
              metadata={"seed": str(seed)})
    return path


def child(script: str, home: Path, *args: str) -> subprocess.Popen:
    """Start `python -c script args...` with ASSISTANT_HOME=home; stdout is a pipe of lines."""
    env = {**os.environ, "ASSISTANT_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("ASSISTANT_PROFILE", None)
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_until(proc: subprocess.Popen, marker: str, timeout: float = 120.0) -> list[str]:
    """Complete lines printed by proc up to and including the first line starting with marker.

    A thread reads the pipe (select() on a buffered pipe misses lines already buffered)."""
    import queue
    import threading

    q = getattr(proc, "_lines", None)
    if q is None:
        q = proc._lines = queue.Queue()

        def pump() -> None:
            for line in proc.stdout:
                if line.endswith("\n"):   # a killed child's last line may be half-written
                    q.put(line[:-1])       # (PYTHONUNBUFFERED: print() writes piece by piece)
            q.put(None)

        threading.Thread(target=pump, daemon=True).start()
    lines: list[str] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            line = q.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            break
        lines.append(line)
        if line.startswith(marker):
            return lines
    err = proc.stderr.read() if proc.poll() is not None else ""
    raise AssertionError(f"child never printed {marker!r}; got {lines}; stderr: {err[-2000:]}")


def drain(proc: subprocess.Popen) -> list[str]:
    """The rest of what a finished proc printed (after read_until)."""
    import queue

    out = []
    q = proc._lines
    while True:
        try:
            line = q.get(timeout=5)
        except queue.Empty:
            break
        if line is None:
            break
        out.append(line)
    return out


def use_home(tmp_path: Path, monkeypatch) -> Path:
    """Point ASSISTANT_HOME at an empty folder for one test."""
    h = tmp_path / "home"
    monkeypatch.setenv("ASSISTANT_HOME", str(h))
    monkeypatch.delenv("ASSISTANT_PROFILE", raising=False)
    return h
