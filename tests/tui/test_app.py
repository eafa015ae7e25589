"""Pilot tests of the chat UI against a scripted session (fast, no torch work)."""
from __future__ import annotations

import asyncio
import threading

from tests.tui.tui_fakes import ContextFullError, FakeSession, FakeStep, ModelFetchError, make_app, send, settle, sync

from assistant.tui.history import MemoryHistory
from assistant.tui.protocol import AdapterHooks
from assistant.tui.widgets.message import MessageView
from assistant.tui.widgets.notice import ErrorBanner
from assistant.tui.widgets.prompt import PromptInput
from assistant.types import AnswerStats

SIZE = (110, 34)


def views(app) -> list[tuple[str, str]]:
    return [(v.role, v.text) for v in app.query(MessageView)]


async def wait_for(pilot, predicate, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not reached")


@sync
async def test_full_exchange_streams_saves_and_shows_stats() -> None:
    history = MemoryHistory()
    app = make_app(history=history)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.ready
        await send(pilot, "What is the capital of France?")
        await settle(app, pilot)
        assert views(app) == [("user", "What is the capital of France?"), ("assistant", "Paris is the capital of France.")]
        conv = history.list_conversations()[0]
        assert conv.title == "What is the capital of France?"
        saved = history.messages(conv.id)
        assert [(m.role, m.accepted) for m in saved] == [("user", False), ("assistant", True)]
        assert saved[1].stats.drafted == 3 and saved[1].stats.banked == [(5, 12), (20, 30)]
        status = str(app.query_one("#status").render())
        assert "1.60 tok/pass" in status and "38% banked" in status and "FakeLM-1M" in status
        assert "mem 300.0 MiB / 8.0 GiB" in status
        # second turn: the model sees the whole conversation
        await send(pilot, "And Germany?")
        await settle(app, pilot)
        assert [m["role"] for m in app.session.calls[-1]] == ["user", "assistant", "user"]


@sync
async def test_prompts_sent_while_loading_are_queued() -> None:
    gate = threading.Event()
    session = FakeSession(release_load=gate)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.ready and "loading fake-model 25%" in str(app.query_one("#status").render())
        await send(pilot, "first")
        await send(pilot, "second")
        assert len(app.queue) == 2 and session.calls == []
        assert "queued" in app.query(MessageView)[1].query_one(".msg-note").render().plain
        gate.set()
        await settle(app, pilot)
        await settle(app, pilot)
        assert [c[-1]["content"] for c in session.calls] == ["first", "second"]
        assert [t for r, t in views(app) if r == "assistant"] == ["Paris is the capital of France."] * 2


@sync
async def test_escape_stops_at_once_keeps_text_and_restores_prompt() -> None:
    session = FakeSession(step_delay=0.3)
    history = MemoryHistory()
    app = make_app(session, history=history)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(pilot, "Tell me about Paris")
        await wait_for(pilot, lambda: app.active is not None and app.active.answer_view.text)
        shown = app.active.answer_view.text
        await pilot.press("escape")
        assert app.active is None                                   # stopped at once, not after the next step
        assert app.query_one(PromptInput).text == "Tell me about Paris"
        await settle(app, pilot)
        answer = [v for v in app.query(MessageView) if v.role == "assistant"][0]
        assert answer.text == shown and shown != "Paris is the capital of France."
        assert "stopped" in answer.query_one(".msg-note").render().plain
        # the stopped turn is not in the history, so sending the prompt again does not duplicate it
        assert history.messages(history.list_conversations()[0].id) == []
        await pilot.press("enter")
        await settle(app, pilot)
        assert session.calls[-1] == [{"role": "user", "content": "Tell me about Paris"}]


@sync
async def test_escape_puts_back_a_queued_prompt() -> None:
    gate = threading.Event()
    app = make_app(FakeSession(release_load=gate))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await send(pilot, "not yet")
        await pilot.press("escape")
        assert not app.queue and views(app) == [] and app.query_one(PromptInput).text == "not yet"
        gate.set()
        await settle(app, pilot)


@sync
async def test_conversation_switching_resumes_history() -> None:
    history = MemoryHistory()
    a = history.new_conversation("Alpha chat")
    history.add_message(a, "user", "alpha question")
    history.add_message(a, "assistant", "alpha answer", accepted=True, stats=AnswerStats(tokens=3, banked=[(0, 5)]))
    b = history.new_conversation("Beta chat", system_prompt="Answer in French.")
    history.add_message(b, "user", "beta question")
    history.add_message(b, "assistant", "beta answer", accepted=True)
    session = FakeSession()
    app = make_app(session, history=history)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        items = app.query("ConversationItem")
        assert [i.conv_id for i in items] == [b, a]
        await pilot.click(items[1])                          # pick "Alpha chat" with the mouse
        await settle(app, pilot)
        assert app.conv_id == a and views(app) == [("user", "alpha question"), ("assistant", "alpha answer")]
        await app.open_conversation(b)
        await pilot.pause()
        assert views(app)[0] == ("system", "Answer in French.")
        await send(pilot, "more")
        await settle(app, pilot)
        assert session.calls[-1][0] == {"role": "system", "content": "Answer in French."}
        assert [m.content for m in history.messages(b)][-2:] == ["more", "Paris is the capital of France."]
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.conv_id is None and views(app) == []


@sync
async def test_load_error_is_explained_not_a_traceback() -> None:
    session = FakeSession(load_error=ModelFetchError("no model at /nowhere"))
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "hello?")
        await settle(app, pilot)
        banner = app.query_one(ErrorBanner)
        assert banner.display and banner.problem.title == "Model missing"
        text = banner.render().plain
        assert "no model at /nowhere" in text and "assistant ask" in text and "Traceback" not in text
        assert app.query_one(PromptInput).text == "hello?"          # the queued prompt is not lost
        assert "model not loaded" in str(app.query_one("#status").render())


@sync
async def test_answer_error_is_explained_and_prompt_restored(tmp_path) -> None:
    session = FakeSession(answer_error=ContextFullError("the conversation uses 9000 tokens"))
    app = make_app(session, log_path=tmp_path / "chat.log")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(pilot, "one more")
        await settle(app, pilot)
        banner = app.query_one(ErrorBanner)
        assert banner.problem.title == "Context full" and "ctrl+n" in banner.problem.action
        assert app.query_one(PromptInput).text == "one more" and app.active is None
        assert "ContextFullError" in (tmp_path / "chat.log").read_text()      # the traceback goes to the log
        await pilot.press("escape")                                            # Esc with nothing running clears it
        assert not banner.display


@sync
async def test_multiline_input_keys_and_paste() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        prompt = app.query_one(PromptInput)
        assert prompt.text == "a\nb\nc" and not app.session.calls
        prompt.clear()
        from textual import events
        app.post_message(events.Paste("line one\nline two"))   # as the terminal driver delivers it
        await pilot.pause()
        assert prompt.text == "line one\nline two"
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.session.calls[-1][-1]["content"] == "line one\nline two"
        shown = app.query(MessageView)[0].query_one(".msg-body").render()
        assert str(shown) == "line one\nline two"               # the user's line breaks are kept on screen


@sync
async def test_banked_toggle_copy_rename_system_prompt_export_delete(tmp_path) -> None:
    history = MemoryHistory()
    session = FakeSession(steps=[FakeStep("Use:\n\n```sh\nls -la\n```\n", [1, 2, 3], drafted=2, finish="eos")])
    app = make_app(session, history=history)
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(pilot, "list files")
        await settle(app, pilot)
        answer = [v for v in app.query(MessageView) if v.role == "assistant"][0]
        await pilot.press("ctrl+t")
        assert app.banked and answer.query_one(".msg-banked").display
        spans = answer.query_one(".msg-banked").render().spans
        assert [(sp.start, sp.end) for sp in spans] == [(0, len(answer.text))] and spans[0].style.background
        await pilot.press("ctrl+t")
        assert not answer.query_one(".msg-banked").display
        await pilot.press("ctrl+o", "ctrl+g")
        assert copied == [answer.text, "ls -la"]

        conv = app.conv_id
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one("#dialog-input").value = "Shell help"
        await pilot.press("enter")
        await pilot.pause()
        assert history.list_conversations()[0].title == "Shell help"

        await pilot.press("f3")
        await pilot.pause()
        app.screen.query_one("#dialog-input").value = "Be terse."
        await pilot.press("enter")
        await pilot.pause()
        assert history.list_conversations()[0].system_prompt == "Be terse."

        out = tmp_path / "out" / "chat.md"
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#dialog-input").value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        text = out.read_text()
        assert text.startswith("# Shell help") and "Be terse." in text and "ls -la" in text

        await pilot.press("f8")
        await pilot.pause()
        await pilot.press("n")
        await pilot.pause()
        assert [c.id for c in history.list_conversations()] == [conv]
        await pilot.press("f8")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert history.list_conversations() == [] and app.conv_id is None and views(app) == []


@sync
async def test_adapter_panel_and_cycle() -> None:
    runs: list[int] = []
    hooks = AdapterHooks(lambda: {"version": "v000002", "rows": 2048, "row_budget": 8000, "pending": 3,
                                  "worker": "waiting"}, lambda: runs.append(1) or {"status": "published"})
    app = make_app(adapter=hooks)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        text = str(app.query_one("#adapter").render())
        assert "v000002" in text and "2,048 / 8,000" in text and "pending  3" in text
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert runs == [1] and not app.adapter_busy

    failing = AdapterHooks(lambda: None, lambda: (_ for _ in ()).throw(RuntimeError("disk full")))
    app = make_app(adapter=failing)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert app.query_one(ErrorBanner).problem.title == "Adapter failed"

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert "adapter: not available" in str(app.query_one("#adapter").render())


@sync
async def test_quit_mid_answer_saves_what_was_shown() -> None:
    history = MemoryHistory()
    session = FakeSession(step_delay=0.3)
    app = make_app(session, history=history)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await send(pilot, "long story")
        await wait_for(pilot, lambda: app.active is not None and app.active.answer_view.text)
        await pilot.press("ctrl+c")
        await asyncio.sleep(0)
    msgs = history.messages(history.list_conversations()[0].id)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].stats.finish == "interrupted" and not msgs[1].accepted
    assert app.return_code == 0


@sync
async def test_startup_problems_from_the_cli_are_shown_in_the_ui() -> None:
    from assistant.commands.chat import _BrokenSession

    budget_error = type("BudgetError", (ValueError,), {})("SmolLM2 fp32 needs 1.2 GiB, the budget is 256 MiB")
    history_error = type("ProfileError", (RuntimeError,), {})("/p/history.sqlite: not a database")
    app = make_app(_BrokenSession(budget_error, {"target": "default", "dtype": "fp32"}),
                   startup_errors=[(history_error, "opening the history")])
    async with app.run_test(size=SIZE) as pilot:
        banner = app.query_one(ErrorBanner)
        assert banner.problem.title == "Profile problem"
        await settle(app, pilot)
        assert banner.problem.title == "Memory budget too small" and "256 MiB" in banner.problem.detail
        assert not app.ready


@sync
async def test_a_bug_in_a_handler_is_logged_and_reported_in_one_line(tmp_path, capsys) -> None:
    import pytest

    app = make_app(log_path=tmp_path / "chat.log")
    app.action_toggle_banked = lambda: 1 / 0  # type: ignore[method-assign]
    with pytest.raises(ZeroDivisionError):
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            await pilot.press("ctrl+t")
            await pilot.pause()
    assert "ZeroDivisionError" in (tmp_path / "chat.log").read_text()
    err = capsys.readouterr().err
    assert "details in" in err and "Traceback" not in err
