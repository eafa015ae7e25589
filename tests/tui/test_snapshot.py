"""SVG snapshot of the main screen after one exchange (scripted session, fixed size, no clock).

Update after an intended change with: .venv/bin/pytest tests/tui/test_snapshot.py --snapshot-update
"""
from __future__ import annotations

from tests.tui.tui_fakes import FakeSession, make_app, send, settle
from tui.history import MemoryHistory
from tui.protocol import AdapterHooks


def _app():
    history = MemoryHistory()
    old = history.new_conversation("Packing list for Lisbon")
    history.add_message(old, "user", "What should I pack?")
    app = make_app(FakeSession(), history=history,
                   adapter=AdapterHooks(lambda: {"state": "idle", "head": "v0003", "rows": 2048,
                                                 "new_answers": 3, "next_cycle_in_s": 240}))
    return app


async def _exchange(pilot) -> None:
    app = pilot.app
    await settle(app, pilot)
    app.query_one("#prompt").cursor_blink = False
    await send(pilot, "What is the capital of France?")
    await settle(app, pilot)
    await pilot.press("ctrl+t")          # the banked view: highlighted text came from accepted phrases
    app.clear_notifications()
    await settle(app, pilot)


def test_main_screen(snap_compare) -> None:
    assert snap_compare(_app(), terminal_size=(110, 32), run_before=_exchange)
