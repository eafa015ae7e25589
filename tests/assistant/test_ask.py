"""`assistant ask`: answers, --json, --file, and the history records (fake session; one real-model test)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import assistant.session as session_mod
from assistant.cli import main
from assistant.profiles import Profile


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("ASSISTANT_HOME", str(h))
    monkeypatch.delenv("ASSISTANT_PROFILE", raising=False)
    return h


@dataclass
class FakeSession:
    """Answers 'echo: <prompt>' in two passes; raises ContextFullError for prompts containing 'LONG'."""
    config: session_mod.SessionConfig
    loads: list = field(default_factory=list)
    head_info: dict = field(default_factory=dict)

    def load(self, progress=None):
        self.loads.append(1)

    def info(self):
        return {"model": "fake", "target": self.config.target}

    def answer(self, messages, cancel=None, max_new_tokens=None):
        prompt = messages[-1]["content"]
        if "LONG" in prompt:
            raise session_mod.ContextFullError("the conversation uses 9 tokens and the context holds 8")
        yield SimpleNamespace(text="echo", tokens=[1], drafted=0, finish=None, seconds=0.01)
        yield SimpleNamespace(text=f": {prompt}", tokens=[2, 3, 4], drafted=2, finish="eos", seconds=0.01)


@pytest.fixture
def fake(monkeypatch):
    made = []

    class Factory(FakeSession):
        @classmethod
        def from_profile(cls, profile, **overrides):
            s = cls(session_mod.session_config_from_profile(profile, **overrides))
            made.append(s)
            return s

    monkeypatch.setattr(session_mod, "Session", Factory)
    return made


def test_one_prompt_prints_and_records(home, fake, capsys):
    assert main(["ask", "What is 2+2?"]) == 0
    out = capsys.readouterr()
    assert out.out == "echo: What is 2+2?\n"
    assert "4 tokens, 2 passes" in out.err
    h = Profile.open().history
    (conv,) = h.list_conversations()
    user, answer = h.messages(conv.id)
    assert (user.role, user.content, user.accepted) == ("user", "What is 2+2?", False)
    assert answer.accepted and answer.content == "echo: What is 2+2?"
    assert answer.stats.tokens == 4 and answer.stats.passes == 2
    assert answer.stats.tokens_per_pass == 2.0 and answer.stats.drafted == 2
    assert answer.stats.banked == [(4, len(answer.content))] and answer.stats.finish == "eos"
    assert (answer.stats.target, answer.stats.dtype) == ("fake", fake[0].config.dtype)
    assert h.accepted_answers() == [(answer.id, [{"role": "user", "content": "What is 2+2?"}], answer.content)]


def test_the_chat_shows_the_statistics_of_an_answer_recorded_by_ask(home, fake, capsys):
    from tests.tui.tui_fakes import make_app, settle, sync
    from assistant.tui.widgets.message import MessageView

    assert main(["ask", "What is 2+2?"]) == 0
    profile = Profile.open()
    (conv,) = profile.history.list_conversations()

    @sync
    async def open_in_the_chat() -> None:
        app = make_app(history=profile.history)
        async with app.run_test(size=(110, 34)) as pilot:
            await settle(app, pilot)
            await app.open_conversation(conv.id)
            await pilot.pause()
            answer = [v for v in app.query(MessageView) if v.role == "assistant"][0]
            assert (answer.stats.tokens, answer.stats.passes, answer.stats.drafted) == (4, 2, 2)
            header = answer.query_one(".msg-header").render().plain
            assert "4 tok" in header and "2.00 tok/pass" in header and "50% banked" in header

    open_in_the_chat()
    profile.close()


def test_json_and_profile_settings(home, fake, capsys):
    p = Profile.open("work")
    p.update_config(system_prompt="Be brief.", tree_width=8, dtype="fp32")
    assert main(["ask", "hi", "--profile", "work", "--json", "--max-new-tokens", "5"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["answer"] == "echo: hi" and d["profile"] == "work" and d["new_tokens"] == 4
    assert {"forward_passes", "tokens_per_pass", "seconds", "conversation_id", "message_id", "finish"} <= set(d)
    cfg = fake[0].config
    assert (cfg.system_prompt, cfg.tree_width, cfg.dtype) == ("Be brief.", 8, "fp32")
    conv = Profile.open("work").history.get_conversation(d["conversation_id"])
    assert conv.system_prompt == "Be brief."


def test_file_skips_bad_lines_and_loads_once(home, fake, tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"question": "q1"}\nnot json\n{"nothing": 1}\n\n{"turns": ["t1", "t2"], "id": "x"}\n'
                 '{"prompt": "LONG one"}\n')
    assert main(["ask", "--file", str(f), "--json"]) == 1
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [r["answer"] for r in rows] == ["echo: q1", "echo: t1"] and rows[1]["id"] == "x"
    assert f"{f}:2:" in out.err and f"{f}:3:" in out.err and f"{f}:6:" in out.err
    assert "[ask] 1/3" in out.err and "answered 2 of 3" in out.err
    assert len(fake) == 1 and fake[0].loads == [1]
    assert Profile.open().history.counts() == {"conversations": 2, "messages": 4, "accepted": 2}


def test_errors(home, fake, capsys, tmp_path):
    assert main(["ask"]) == 1
    assert "nothing to answer" in capsys.readouterr().err
    assert main(["ask", "hi", "--profile", "missing"]) == 1
    assert "no profile named 'missing'" in capsys.readouterr().err
    assert main(["ask", "LONG prompt"]) == 1
    assert "context holds 8" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("nope\n")
    assert main(["ask", "--file", str(tmp_path / "bad.jsonl")]) == 1
    assert Profile.open().history.counts()["messages"] == 0


def test_memory_budget_sets_context_or_refuses(home, fake, capsys):
    p = Profile.open()
    p.update_config(memory_budget="2GiB", dtype="bf16")
    cfg = session_mod.session_config_from_profile(p, device="cpu")
    assert cfg.max_context == 8192 and cfg.tree_width == 16
    p.update_config(memory_budget="500MiB", dtype="fp32")
    assert main(["ask", "hi"]) == 1
    assert "does not fit" in capsys.readouterr().err


def test_head_path_from_profile(home, fake, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(tmp_path / "h.safetensors"))
    p = Profile.open()
    v = p.heads.publish(tmp_path / "h.safetensors", {})
    cfg = session_mod.session_config_from_profile(p)
    assert cfg.head_path == str(p.heads.path_of(v))


@pytest.mark.slow
def test_real_model_answers_and_records(home, capsys, monkeypatch):
    """SmolLM2 answers with 8 new tokens; the answer is recorded as accepted with its statistics."""
    from assistant.runtime.fetch import ensure_default_model

    ensure_default_model()
    assert main(["ask", "What is 2+2?", "--json", "--max-new-tokens", "8"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 1 <= d["new_tokens"] <= 8 and d["forward_passes"] >= 1 and d["answer"].strip()
    h = Profile.open().history
    msgs = h.messages(d["conversation_id"])
    assert msgs[-1].accepted and msgs[-1].content == d["answer"] and msgs[-1].stats.tokens == d["new_tokens"]
