"""The adapter panel's glue in the chat app: poll the adapter's status, run one cycle now.

Contract: `AdapterActions` is a mixin for `assistant.tui.app.ChatApp` (it uses the
app's `adapter`, `session`, `info_cache`, `show_error`, `_from_thread`,
`_refresh_status` and `_gen_lock`). `_poll_adapter()` reads `adapter.status()` in a
thread worker and shows it in the AdapterPanel (an error as one line, the last
good status kept). `action_adapter_cycle` runs `adapter.run_once()` in a thread
worker, at most one at a time; when the cycle published a head, the session swaps
to it between answers (under `_gen_lock`) and the status line shows the new head.
"""
from __future__ import annotations

import threading
from typing import Any

from textual import work

from assistant.tui.errors import explain
from assistant.tui.protocol import AdapterStatusSource, SessionLike
from assistant.tui.widgets.adapter import AdapterPanel


class AdapterActions:
    """Mixin: the adapter panel of ChatApp and its 'run one cycle now' key."""

    adapter: AdapterStatusSource | None
    adapter_status: dict[str, Any] | None
    adapter_busy: bool
    session: SessionLike
    info_cache: dict[str, Any]
    _gen_lock: threading.Lock

    def _refresh_adapter(self, error: str | None = None) -> None:
        self.query_one(AdapterPanel).show(self.adapter_status, error, available=self.adapter is not None,
                                          busy=self.adapter_busy)

    @work(thread=True, exclusive=True, group="adapter-status", exit_on_error=False)
    def _poll_adapter(self) -> None:
        if self.adapter is None:
            return
        try:
            status = self.adapter.status()
        except Exception as e:  # noqa: BLE001
            self._from_thread(self._on_adapter_status, None, explain(e, "adapter").render())
            return
        self._from_thread(self._on_adapter_status, status, None)

    def _on_adapter_status(self, status: dict[str, Any] | None, error: str | None) -> None:
        if status is not None:
            self.adapter_status = status
        self._refresh_adapter(error)

    def action_adapter_cycle(self) -> None:
        if self.adapter is None:
            self.notify("The adapter is not available in this build.", severity="warning")
            return
        if self.adapter_busy:
            self.notify("An adapter cycle is already running.")
            return
        self.adapter_busy = True
        self._refresh_adapter()
        self._adapter_cycle()

    @work(thread=True, exclusive=True, group="adapter-run", exit_on_error=False)
    def _adapter_cycle(self) -> None:
        assert self.adapter is not None
        try:
            result = self.adapter.run_once()
            head = (result or {}).get("head_path") if isinstance(result, dict) else None
            info = None
            if head:
                with self._gen_lock:
                    self.session.swap_head(head)
                    info = self.session.info()
        except Exception as e:  # noqa: BLE001
            self._from_thread(self._on_adapter_done, None, None, e)
            return
        self._from_thread(self._on_adapter_done, result, info, None)

    def _on_adapter_done(self, result: dict[str, Any] | None, info: dict[str, Any] | None,
                         exc: Exception | None) -> None:
        self.adapter_busy = False
        if exc is not None:
            self.show_error(exc, "adapter")
            self._refresh_adapter(explain(exc, "adapter").title)
            return
        if info:
            self.info_cache = dict(info)
            self._refresh_status()
        self.notify("Adapter cycle finished.")
        self._poll_adapter()
        self._refresh_adapter()
