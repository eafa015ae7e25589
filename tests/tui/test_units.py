"""The UI's pure parts: statistics, status and adapter text, errors, export, history fake."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from rich.text import Text

from tests.tui.tui_fakes import PARIS, ContextFullError, FakeStep, ModelFetchError
from assistant.tui.errors import explain
from assistant.tui.export import last_code_block, safe_filename, title_from_prompt, to_markdown
from assistant.tui.history import MemoryHistory
from assistant.tui.keymap import APP_BINDINGS, describe
from assistant.tui.stats import format_bytes, parse_bytes, rss_bytes
from assistant.tui.widgets.adapter import NOT_AVAILABLE, adapter_text
from assistant.tui.widgets.status import status_text
from assistant.types import AnswerStats


def test_turn_stats_rates_and_banked_spans() -> None:
    s = AnswerStats()
    for step in PARIS:
        s.add(step)
    text = "".join(st.text for st in PARIS)
    assert (s.tokens, s.drafted, s.passes, s.finish) == (8, 3, 5, "eos")
    assert s.tokens_per_pass == pytest.approx(8 / 5)
    assert s.accepted_rate == pytest.approx(3 / 8)
    assert s.tok_per_s == pytest.approx(8 / 0.05)
    assert [text[a:b] for a, b in s.banked] == [" is the", " of France"]
    back = AnswerStats.from_dict(s.to_dict(), text)
    assert back.banked == s.banked and back.tokens == 8 and back.finish == "eos"


def test_adjacent_banked_steps_merge_and_bad_spans_are_dropped() -> None:
    s = AnswerStats()
    s.add(FakeStep("ab", [1, 2], drafted=1))
    s.add(FakeStep("cd", [3, 4], drafted=2))
    assert s.banked == [(0, 4)]
    assert AnswerStats.from_dict({"banked": [[0, 99], [1, 2], "x"]}, "abc").banked == [(1, 2)]


def test_memory_helpers() -> None:
    assert rss_bytes() and rss_bytes() > 1_000_000
    assert parse_bytes("8GiB") == 8 * 1024**3
    assert parse_bytes("512 MB") == 512 * 1000**2
    assert parse_bytes(1024) == 1024
    assert parse_bytes(None) is None and parse_bytes("lots") is None
    assert format_bytes(3 * 1024**3) == "3.0 GiB"


def test_status_text() -> None:
    s = AnswerStats()
    for step in PARIS:
        s.add(step)
    info = {"model": "M", "device": "cuda:0", "dtype": "int8", "head": {"name": "/x/heads/v7", "parameters": 2_500_000},
            "engine": "compiled", "threads": 2}
    line = status_text(info, s, rss=2 * 1024**3, budget=8 * 1024**3)
    for part in ("160.0 tok/s", "1.60 tok/pass", "38% banked", "M", "cuda:0", "int8", "head v7 (2.50M params)",
                 "mem 2.0 GiB / 8.0 GiB", "compiled · 2t"):
        assert part in line
    assert "accepted" not in line                     # one name per figure: the message view says "banked" too
    assert "loading x 50%" in status_text(None, None, loading="loading x 50%")


@pytest.mark.parametrize("width", [80, 120])
def test_status_line_fits_its_width(width) -> None:
    s = AnswerStats()
    for step in PARIS:
        s.add(step)
    info = {"model": "SmolLM2-135M-Instruct", "device": "cpu", "dtype": "bf16", "engine": "eager",
            "engine_building": True, "threads": 1,
            "head": {"name": "/home/u/.local/share/assistant/SmolLM2-135M-Instruct.safetensors",
                     "parameters": 2_470_000, "rows": 4000}}
    line = status_text(info, s, rss=812 * 1024**2, budget=8 * 1024**3, width=width)
    plain = Text.from_markup(line).plain
    assert len(plain) <= width and plain.startswith("160.0 tok/s · 1.60 tok/pass · 38% banked")
    assert not plain.endswith((" ·", "(")) and "…" not in plain          # whole parts only
    assert "head" not in status_text(info, s, width=40)


def test_adapter_panel() -> None:
    assert NOT_AVAILABLE in adapter_text(None, available=False)
    idle = {"version": "v000003", "rows": 3817, "row_budget": 8000, "pending": 12, "enabled": True,
            "schedule": {"min_new_answers": 20, "interval_s": 300},
            "last_cycle": {"status": "published", "time": time.time() - 600,
                           "tokens_per_pass": {"user_before": 1.623, "user_after": 2.055,
                                               "anchor_before": 2.748, "anchor_after": 2.74}},
            "worker": "waiting"}
    text = Text.from_markup(adapter_text(idle)).plain
    for part in ("head     v000003", "rows     3,817 / 8,000", "pending  12 · cycle at 20", "published 10 min ago",
                 "you      1.62 → 2.06", "original 2.75 → 2.74", "worker   waiting"):
        assert part in text, text
    running = {**idle, "running": {"stage": "finetune step 300/1200", "pid": 1}, "worker": "running (finetune)"}
    assert "now      finetune step 300/1200" in Text.from_markup(adapter_text(running)).plain
    rejected = {**idle, "last_cycle": {"status": "rejected", "time": time.time() - 30,
                                       "reasons": ["anchor tokens/pass fell 2.75 -> 2.60 (more than 3%)"]}}
    text = Text.from_markup(adapter_text(rejected)).plain
    assert "rejected just now" in text and "anchor tokens/pass fell" in text
    failed = {**idle, "worker": "failed", "last_error": {"message": "OSError: disk full\ntraceback..."},
              "problems": ["heads/CURRENT: damaged pointer, using the newest good version"]}
    text = Text.from_markup(adapter_text(failed)).plain
    assert "failed   OSError: disk full" in text and "traceback" not in text and "damaged pointer" in text
    assert "\nnow " not in text and "worker   failed" not in text               # said once, with its reason
    assert "adapter_dir" not in text and "versions:" not in text        # not a key dump


@pytest.mark.parametrize("exc, title, hint", [
    (ModelFetchError("no model at /m"), "Model missing", "assistant ask"),
    (ContextFullError("uses 9000 tokens"), "Context full", "ctrl+n"),
    (type("BudgetError", (ValueError,), {})("needs 9 GiB"), "Memory budget too small", "memory_budget"),
    (KeyError("boom"), "Unexpected error while answering", "log file"),
])
def test_explain(exc: BaseException, title: str, hint: str) -> None:
    p = explain(exc, "answering")
    assert p.title == title and hint in p.action and "Traceback" not in p.render()


def test_explain_adapter_errors() -> None:
    assert explain(RuntimeError("disk full"), "adapter").title == "Adapter failed"


def test_export_helpers() -> None:
    md = to_markdown("T", "be brief", [("user", "hi"), ("assistant", "```py\nprint(1)\n```")])
    assert md.startswith("# T\n") and "> **System:** be brief" in md and "## You" in md
    assert last_code_block("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```\n") == "y = 2"
    assert last_code_block("text\n```sh\nls -l\n") == "ls -l"
    assert last_code_block("no code") is None
    assert title_from_prompt("  a  b " + "c" * 80, 10).endswith("…")
    assert safe_filename("What is / this?") == "What-is-this.md"


def test_memory_history_matches_the_store_api() -> None:
    h = MemoryHistory()
    a = h.new_conversation("a", "sys")
    b = h.new_conversation("b")
    m = h.add_message(a, "user", "hi")
    assert [c.id for c in h.list_conversations()] == [a, b]   # most recently updated first
    h.rename_conversation(b, "bee")
    h.mark_accepted(m)
    assert h.messages(a)[0].accepted and h.list_conversations()[0].title == "bee"
    h.delete_conversation(a)
    assert [c.id for c in h.list_conversations()] == [b]


def test_keymap_is_complete() -> None:
    actions = {b.action for b in APP_BINDINGS}
    assert {"stop", "quit", "new_conversation", "toggle_banked", "copy_answer", "copy_code", "rename_conversation",
            "delete_conversation", "export_conversation", "system_prompt", "adapter_cycle"} <= actions
    assert ("enter", "Send") in describe()


def test_importing_the_ui_does_not_import_torch() -> None:
    code = "import sys, assistant.tui.app, assistant.commands.chat; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_chat_command_is_registered() -> None:
    from assistant.cli import build_parser
    from assistant.commands import chat

    args = build_parser().parse_args(["chat", "--profile", "work"])
    assert args.func is chat.run and args.profile == "work"


def test_adapter_panel_leads_with_what_the_worker_does(tmp_path, monkeypatch) -> None:
    from types import SimpleNamespace

    from assistant.commands.chat import _adapter_source
    from assistant.profiles import Profile

    monkeypatch.setenv("ASSISTANT_HOME", str(tmp_path))
    prof = Profile.open("panel")
    worker = SimpleNamespace(state="running", stage="features")
    st = _adapter_source(prof, None, worker).status()
    assert list(st)[0] == "worker" and st["worker"] == "running (features)" and st["profile"] == "panel"
    worker.state, worker.stage = "idle", None
    assert _adapter_source(prof, None, worker).status()["worker"] == "idle"
    assert "worker" not in _adapter_source(prof).status()
