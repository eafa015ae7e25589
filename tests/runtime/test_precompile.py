"""assistant.runtime.precompile and .background: a saved compiled forward is loaded by the next engine, one built
for other weights is caught before it answers, and a background build in another process produces what the parent
loads.

Tiny random Qwen3 targets with the user cache directory in tmp_path (each compile ~15-30 s on 2 cores:
marked slow)."""
import os
import time

import pytest
import torch

from assistant.runtime import background, compiled, precompile
from assistant.runtime.decode import DecodeConfig, run_to_end, speculative_generate
from assistant.runtime.drafters import OracleDrafter
from assistant.runtime.engine import CompiledEngine, EagerEngine, make_engine
from assistant.runtime.layout import packed_keys
from assistant.runtime.target import Target, load_model

from ..conftest import IdTokenizer, tiny_qwen3
from .test_decode_tiny import hf_greedy, prompts

pytestmark = pytest.mark.slow


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _decodes_like_generate(target, engine):
    for ids in prompts(k=2, seed=8):
        ref = hf_greedy(target, ids, 24)
        out, _ = run_to_end(speculative_generate(target, ids, OracleDrafter(ids + ref),
                                                 DecodeConfig(max_new_tokens=24, ignore_eos=True), engine=engine))
        assert out == ref


def test_saved_forward_is_loaded_by_the_next_engine(cache):
    target = tiny_qwen3(seed=21)
    notes = []
    first = make_engine(target, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(first, CompiledEngine), notes
    path = first.artifact_path(first.feature_layers)
    assert path.is_file() and path.parent == cache / "compiled"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    notes.clear()
    second = make_engine(target, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(second, CompiledEngine)
    assert not any("compiling" in n for n in notes) and any("loaded the compiled" in n for n in notes)
    assert second.check_error is not None and second.check_error < 1e-3
    _decodes_like_generate(target, second)


def test_artifact_that_does_not_fit_is_caught_and_removed(cache, monkeypatch):
    """Two models of one config in one process get different packed keys; a graph built for the first
    and handed to the second would read the first one's weights. The check against the eager forward
    refuses it, removes the file, and the engine falls back to eager with one line."""
    a, b = tiny_qwen3(seed=22), tiny_qwen3(seed=23)
    monkeypatch.setattr(precompile, "artifact_key", lambda *args, **kw: "same-for-both")
    assert isinstance(make_engine(a, "compiled"), CompiledEngine)
    path = cache / "compiled"
    assert [p.name for p in path.glob("*.aot")]
    notes = []
    engine = make_engine(b, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(engine, EagerEngine)
    assert len(notes) == 2 and "loaded the compiled" in notes[0]
    assert notes[1].startswith("compiled engine unavailable (EngineUnavailable: the compiled verify forward differs")
    assert not list(path.glob("*.aot"))


def test_unreadable_artifact_is_removed_and_recompiled(cache):
    target = tiny_qwen3(seed=24)
    engine = CompiledEngine(target.model)
    path = engine.artifact_path(engine.feature_layers)
    path.write_bytes(b"not a compiled function")
    os.chmod(path, 0o600)
    assert precompile.load(path, vars(compiled)) is None and not path.exists()
    path.write_bytes(b"x")
    os.chmod(path, 0o666)                       # writable by others: never read
    assert precompile.load(path, vars(compiled)) is None and path.exists()


def test_background_build_in_another_process(cache, tmp_path, monkeypatch):
    """What a session on "auto" does at a first start: the artifact is missing, a niced child process
    builds it with the parent's packed keys, and the parent's next engine loads it."""
    monkeypatch.setenv("ASSISTANT_BACKGROUND_COMPILE", "1")
    src = tiny_qwen3(seed=25)
    ckpt = tmp_path / "ckpt"
    src.model.save_pretrained(ckpt)
    model = load_model(str(ckpt), "fp32", torch.device("cpu"))
    target = Target(model=model, tokenizer=IdTokenizer(), name="tiny", dtype="fp32", device=torch.device("cpu"),
                    path=str(ckpt))
    state, path = background.background_state(target, (-1,))
    assert state == "missing" and not background.ready(path)
    proc = background.start_build(target.path, "fp32", "cpu", (-1,), path, first_key=min(packed_keys(model)))
    assert proc is not None
    assert background.start_build(target.path, "fp32", "cpu", (-1,), path) is None or proc.poll() is not None
    assert proc.wait(timeout=600) == 0, path.with_name(path.name + ".log").read_text()[-2000:]
    assert background.ready(path) and background.background_state(target, (-1,)) == ("saved", path)
    notes = []
    engine = make_engine(target, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(engine, CompiledEngine) and any("loaded the compiled" in n for n in notes), notes
    _decodes_like_generate(target, engine)


def test_failed_background_build_is_remembered(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_BACKGROUND_COMPILE", "1")
    target = tiny_qwen3(seed=26)
    target = Target(model=target.model, tokenizer=IdTokenizer(), name="tiny", dtype="fp32",
                    device=torch.device("cpu"), path=str(tmp_path / "no-such-checkpoint"))
    state, path = background.background_state(target, (-1,))
    assert state == "missing"
    proc = background.start_build(target.path, "fp32", "cpu", (-1,), path)
    assert proc.wait(timeout=120) == 1
    assert background.failed_reason(path).startswith("ModelFetchError: cannot load model")
    assert background.background_state(target, (-1,)) == ("failed", path)
    assert background.start_build(target.path, "fp32", "cpu", (-1,), path) is None


def test_background_builds_can_be_turned_off(cache, monkeypatch):
    monkeypatch.setenv("ASSISTANT_BACKGROUND_COMPILE", "0")
    target = tiny_qwen3(seed=27)
    target = Target(model=target.model, tokenizer=IdTokenizer(), name="tiny", dtype="fp32",
                    device=torch.device("cpu"), path="/nonexistent")
    assert background.background_state(target, (-1,)) == ("foreground", None)


def test_a_running_build_is_not_started_twice(cache, tmp_path):
    path = cache / "compiled" / "x.aot"
    path.parent.mkdir(parents=True)
    path.with_name("x.aot.lock").write_text(f"{os.getpid()} {time.time():.0f}\n")     # alive: this process
    assert background.start_build("/nonexistent", "fp32", "cpu", (-1,), path) is None
    path.with_name("x.aot.lock").write_text("999999999 0\n")                          # a dead build's lock
    proc = background.start_build("/nonexistent", "fp32", "cpu", (-1,), path)
    assert proc is not None and proc.wait(timeout=120) == 1


def test_old_artifacts_of_a_model_are_pruned(tmp_path):
    """Every engine, torch or feature-layer change writes another artifact: the KEEP most recently used of a
    model and dtype stay (with their notes), another model's are not touched."""
    d = tmp_path / "compiled"
    d.mkdir()
    old = []
    for i in range(6):
        p = d / f"Model-bfloat16-{i:024d}.aot"
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
        old.append(p)
    (d / (old[0].name + ".failed")).write_text("why")
    other = d / "Other-bfloat16-000000000000000000000000.aot"
    other.write_bytes(b"x")
    os.utime(other, (1, 1))
    new = d / "Model-bfloat16-ffffffffffffffffffffffff.aot"
    new.write_bytes(b"x")
    gone = precompile.prune(new, keep=3)
    assert sorted(gone) == sorted(old[:4])
    assert sorted(p.name for p in d.iterdir()) == sorted([old[4].name, old[5].name, new.name, other.name])
