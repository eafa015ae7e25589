"""SVG snapshot of the main screen after one exchange (scripted session, fixed size, no clock).

Update after an intended change with: .venv/bin/pytest tests/tui/test_snapshot.py --snapshot-update
"""
from __future__ import annotations

import time

import pytest

from tests.tui.tui_fakes import FakeSession, make_app, send, settle
from assistant.tui.history import MemoryHistory
from assistant.tui.protocol import AdapterHooks


def _status(**changes):
    """An adapter status as assistant.adapt.status.status returns it (times relative to now: '10 min ago')."""
    base = {"version": "v000003", "rows": 3817, "row_budget": 8000, "pending": 12, "enabled": True,
            "schedule": {"min_new_answers": 20, "interval_s": 300}, "worker": "waiting", "problems": [],
            "last_cycle": {"status": "published", "time": time.time() - 600,
                           "tokens_per_pass": {"user_before": 1.623, "user_after": 2.055,
                                               "anchor_before": 2.748, "anchor_after": 2.740}}}
    return {**base, **changes}


def adapter_states() -> dict:
    """Built when a test runs, not at import: "10 min ago" must be 10 minutes before the snapshot."""
    rejected = {"status": "rejected", "time": time.time() - 30,
                "reasons": ["anchor tokens/pass fell 2.748 -> 2.601 (more than 3%)"],
                "tokens_per_pass": {"user_before": 1.62, "user_after": 1.91, "anchor_before": 2.748,
                                    "anchor_after": 2.601}}
    return {
        "idle": _status(),
        "running": _status(worker="running (finetune step 300/1200)",
                           running={"stage": "finetune step 300/1200", "pid": 4242, "time": 0}),
        "rejected": _status(last_cycle=rejected),
        "failed": _status(worker="failed", last_error={"message": "OSError: [Errno 28] No space left on device",
                                                       "time": 0},
                          problems=["heads/CURRENT: damaged pointer, using the newest good version"]),
    }


STATES = ("idle", "running", "rejected", "failed")


def _app(adapter: dict | None = None):
    history = MemoryHistory()
    old = history.new_conversation("Packing list for Lisbon")
    history.add_message(old, "user", "What should I pack?")
    status = adapter or adapter_states()["idle"]
    return make_app(FakeSession(), history=history, adapter=AdapterHooks(lambda: status))


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


async def _loaded(pilot) -> None:
    await settle(pilot.app, pilot)
    pilot.app.query_one("#prompt").cursor_blink = False
    await settle(pilot.app, pilot)


@pytest.mark.parametrize("state", STATES)
def test_adapter_panel(snap_compare, state) -> None:
    """The panel idle, mid-cycle with progress, after a rejected cycle, and after a failure."""
    assert snap_compare(_app(adapter_states()[state]), terminal_size=(110, 32), run_before=_loaded)


@pytest.mark.parametrize("width", [80, 120])
def test_status_line_width(snap_compare, width) -> None:
    """After an answer the status line fits the terminal: whole parts, most useful first."""
    assert snap_compare(_app(), terminal_size=(width, 24), run_before=_exchange)
