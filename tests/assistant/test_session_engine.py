"""A session on engine "auto" never waits on the compiler: the first answers run on the eager engine while
the compiled one builds in a background process, and the next answer after the build runs compiled, with
the same tokens (fp32). A small random Llama with SmolLM2's tokenizer stands in for the target, so the
build takes seconds, not minutes."""
import shutil
import time

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from assistant.runtime.fetch import ensure_default_model

    src = ensure_default_model()
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path / "cache"))     # after the real model was found
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    ckpt = tmp_path / "tiny-chat"
    LlamaForCausalLM(cfg).save_pretrained(ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, ckpt / name)
    return ckpt


def test_first_answers_eager_then_compiled_after_the_background_build(checkpoint, monkeypatch):
    from assistant.session import Session, SessionConfig

    monkeypatch.setenv("ASSISTANT_BACKGROUND_COMPILE", "1")
    notes = []
    s = Session(SessionConfig(target=str(checkpoint), dtype="fp32", device="cpu", engine="auto", max_new_tokens=12))
    s.load(lambda m, f=None: notes.append(m))
    assert s.engine.name == "eager" and s.pending_engine is not None, notes
    assert any("built in the background" in n for n in notes)
    msgs = [{"role": "user", "content": "Name three colours."}]
    first = [t for step in s.answer(msgs) for t in step.tokens]
    assert s.info()["engine_building"] or s.engine.name == "compiled"
    deadline = time.time() + 600
    from assistant.runtime.background import ready

    while not ready(s.pending_engine) and time.time() < deadline:
        time.sleep(1)
    assert ready(s.pending_engine), s.pending_engine.with_name(s.pending_engine.name + ".log").read_text()[-2000:]
    notes.clear()
    second = [t for step in s.answer(msgs) for t in step.tokens]
    assert s.pending_engine is None and not s.info()["engine_building"]
    assert any("loaded the compiled" in n for n in notes) and not any("compiling" in n for n in notes), notes
    assert second == first and len(first) == 12


START = r"""
import json, sys, time
t0 = time.perf_counter()
from assistant.session import Session, SessionConfig
notes = []
s = Session(SessionConfig(target=sys.argv[1], dtype="fp32", device="cpu", engine=sys.argv[2], max_new_tokens=8))
s.load(lambda m, f=None: notes.append(m))
tokens = [t for step in s.answer([{"role": "user", "content": "Hi"}]) for t in step.tokens]
print(json.dumps({"engine": s.engine.name, "notes": notes, "tokens": tokens, "seconds": time.perf_counter() - t0}))
"""


def _start(checkpoint, engine: str, background: str) -> dict:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, ASSISTANT_BACKGROUND_COMPILE=background)
    r = subprocess.run([sys.executable, "-c", START, str(checkpoint), engine], cwd=Path(__file__).resolve().parents[2],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_start_loads_the_saved_engine(checkpoint):
    """Two processes, as two starts of the assistant: the first compiles, the second ("auto", as chat and
    ask run) loads what the first saved, compiles nothing and starts no background build."""
    first = _start(checkpoint, "compiled", "0")
    assert first["engine"] == "compiled" and any("compiling" in n for n in first["notes"]), first["notes"]
    second = _start(checkpoint, "auto", "1")
    assert any("loaded the compiled" in n for n in second["notes"]) and not any("compiling" in n or "background" in n
                                                                                  for n in second["notes"])
    assert second["tokens"] == first["tokens"]
