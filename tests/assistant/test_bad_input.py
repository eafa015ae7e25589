"""Bad input through the real command line: one line on stderr, a non-zero exit, no traceback, nothing
loaded that did not need to be (each case fails before the model would load)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assistant", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, timeout=timeout)


def _one_line_error(r: subprocess.CompletedProcess, code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stderr[-1500:])
    lines = [line for line in r.stderr.strip().splitlines() if line.strip() and not line.startswith("[")]  # not progress
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-1500:]
    return lines[0]


@pytest.fixture
def home(tmp_path):
    return {"ASSISTANT_HOME": str(tmp_path / "home")}


def test_a_directory_as_prompt_file(tmp_path, home):
    line = _one_line_error(_run("ask", "--file", str(tmp_path), env=home))
    assert str(tmp_path) in line and "directory" in line.lower()


def test_a_directory_as_dataset(tmp_path, home):
    line = _one_line_error(_run("bench", "--dataset", str(tmp_path), "--methods", "greedy", env=home))
    assert str(tmp_path) in line and "directory" in line.lower()


def test_home_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    line = _one_line_error(_run("adapt", "--status", env={"ASSISTANT_HOME": str(f)}))
    assert str(f) in line


def test_cache_that_is_a_file(tmp_path, home):
    f = tmp_path / "file"
    f.write_text("x")
    line = _one_line_error(_run("ask", "hi", "--max-new-tokens", "2", env={**home, "ASSISTANT_CACHE": str(f)}))
    assert str(f) in line


@pytest.mark.parametrize("n", ["0", "-3"])
def test_non_positive_lengths_are_refused(home, n):
    r = _run("ask", "hi", "--max-new-tokens", n, env=home)
    assert r.returncode == 2 and "expected a positive integer" in r.stderr and "Traceback" not in r.stderr


def test_a_second_adapter_cycle_at_once(tmp_path, home):
    from filelock import FileLock

    env = {**home}
    assert _run("profile", "create", "p1", env=env).returncode == 0
    adir = tmp_path / "home" / "profiles" / "p1" / "adapter"
    adir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(adir / ".lock")):
        line = _one_line_error(_run("adapt", "--once", "--profile", "p1", env=env))
    assert "another adapter cycle is running" in line


def test_a_prompt_past_the_models_context_is_refused_before_any_forward():
    """A 200 KB prompt ran prefill for minutes on the default profile (no memory budget): the model's own
    context now always applies, refused at once."""
    import time

    from assistant.session import ContextFullError, Session, SessionConfig
    from assistant.runtime.engine import EagerEngine

    from ..conftest import tiny_qwen3

    t = tiny_qwen3()                                   # max_position_embeddings 512
    forwards = []
    t.model.register_forward_hook(lambda *a: forwards.append(1))
    s = Session(SessionConfig(max_new_tokens=8))
    s.target, s.engine = t, EagerEngine(t.model)
    s.prompt_ids = lambda messages: list(range(3, 3 + 600))
    t0 = time.perf_counter()
    with pytest.raises(ContextFullError, match="uses 600 tokens and the context holds 512"):
        list(s.answer([{"role": "user", "content": "x" * 200_000}]))
    assert time.perf_counter() - t0 < 2 and forwards == []


def test_cancel_stops_a_long_prefill_between_chunks():
    from assistant.runtime.decode import DecodeConfig, greedy_generate
    from assistant.runtime.engine import EagerEngine

    from ..conftest import tiny_qwen3

    t = tiny_qwen3()
    chunks = []
    t.model.register_forward_hook(lambda *a: chunks.append(1))
    polls = []
    steps = list(greedy_generate(t, list(range(3, 3 + 400)), DecodeConfig(max_new_tokens=4),
                                 cancel=lambda: polls.append(1) or len(polls) > 1,
                                 engine=_ChunkedEager(t.model)))
    assert steps[-1].finish == "cancelled" and not any(s.tokens for s in steps)
    assert len(chunks) == 1                           # stopped after the first of 4 chunks


class _ChunkedEager:
    """The eager engine with 100-token prefill chunks (the real chunk is 512)."""

    def __init__(self, model):
        from assistant.runtime.engine import EagerEngine

        self._e = EagerEngine(model)
        self.name = "eager"

    def __getattr__(self, item):
        return getattr(self._e, item)

    def prefill(self, cache, ids, layers=(-1,), cancel=None, start=0):
        return self._e.prefill(cache, ids, layers, chunk=100, cancel=cancel, start=start)
