"""One full exchange in the chat UI against the real SmolLM2-135M-Instruct (slow: loads the model).

Run as a script to refresh the README screenshot of a real session:
    .venv/bin/python -m tests.tui.test_real_model docs/screenshot.svg
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.tui.tui_fakes import send, settle, sync
from assistant.tui.app import ChatApp
from assistant.tui.history import MemoryHistory
from assistant.tui.widgets.message import MessageView


def _real_app(max_new_tokens: int = 16) -> ChatApp:
    from assistant.session import Session, SessionConfig
    from assistant.runtime.fetch import ensure_default_model

    ensure_default_model()
    session = Session(SessionConfig(target="default", dtype="fp32", max_new_tokens=max_new_tokens))
    return ChatApp(session, history=MemoryHistory(), poll_seconds=0, memory_budget="4GiB")


@pytest.mark.slow
@sync
async def test_real_model_exchange() -> None:
    app = _real_app()
    async with app.run_test(size=(130, 32)) as pilot:           # wide enough for every status part
        await send(pilot, "What is the capital of France?")       # sent while the model loads: queued
        await settle(app, pilot)
        await settle(app, pilot)
        assert app.ready and app.query_one("#error").display is False
        answer = [v for v in app.query(MessageView) if v.role == "assistant"][0]
        assert "Paris" in answer.text
        assert answer.stats.tokens > 0 and answer.stats.passes > 0 and answer.stats.finish in ("eos", "length")
        status = str(app.query_one("#status").render())
        assert "SmolLM2-135M-Instruct" in status and "cpu" in status and "fp32" in status and "tok/s" in status
        saved = app.history.messages(app.conv_id)
        assert [m.role for m in saved] == ["user", "assistant"] and saved[1].content == answer.text


async def _screenshot(path: Path) -> None:
    app = _real_app(max_new_tokens=96)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        app.query_one("#prompt").cursor_blink = False
        for prompt in ("What is the capital of France?",
                       "Write a Python function that returns the square of a number."):
            await send(pilot, prompt)
            await settle(app, pilot)
            await settle(app, pilot)
        app.clear_notifications()
        await pilot.pause()
        path.parent.mkdir(parents=True, exist_ok=True)
        app.save_screenshot(filename=path.name, path=str(path.parent))


if __name__ == "__main__":
    asyncio.run(_screenshot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshot.svg")))
