"""`assistant chat [--profile P]`: the Textual terminal UI (assistant.tui.app.ChatApp).

Contract: opens the profile (its history, memory budget and settings), builds an
unloaded Session from it and runs the UI, which loads the model in the
background. Problems found before the UI starts (a budget that cannot fit, a
damaged history file) are shown inside the UI with what to do, not as a
traceback: a session that failed to build reports its error when it "loads", and
a history that cannot be opened is replaced by an in-memory one. Nothing heavy
is imported until `run`. Exit code: 0 on a clean quit.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from assistant.commands import positive_int


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("chat", help="the terminal UI",
                              description="Chat in the terminal: streaming answers, conversations, "
                                          "speculation statistics and the adapter's status.")
    p.add_argument("--profile", default=None, help="profile name (default: $ASSISTANT_PROFILE or 'default')")
    p.add_argument("--engine", choices=("auto", "eager", "compiled"), default="auto",
                   help="decode engine (assistant/runtime/engine.py); auto: the measured faster on this device")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch threads of the answers (default: the profile's, else measured and fitted to the "
                        "machine's load)")
    p.set_defaults(func=run)


class _BrokenSession:
    """Stands in for a Session that could not be built: its error surfaces in the UI on load."""

    def __init__(self, error: BaseException, info: dict[str, Any]) -> None:
        self._error, self._info = error, info

    def load(self, progress: Any = None) -> None:
        raise self._error

    def answer(self, messages: Any, cancel: Any = None) -> Any:
        raise self._error

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def swap_head(self, path: Any) -> dict[str, Any]:
        raise self._error


def _adapter_source(profile: Any, session: Any = None, worker: Any = None) -> Any:
    """The adapter panel's data source (assistant.tui.protocol.AdapterStatusSource).

    `assistant.adapt.status.status(profile)` is the same data as `assistant adapt --status`, led by what the
    background worker is doing (state, and the stage of a running cycle); a cycle run from the panel
    reuses the session's loaded target instead of loading a second copy.
    """
    from assistant.adapt.status import run_once, status
    from assistant.tui.protocol import AdapterHooks

    def run_now() -> Any:
        return run_once(profile, target=getattr(session, "target", None))

    def current() -> dict[str, Any]:
        st = status(profile)
        if worker is None:
            return st
        doing = worker.state + (f" ({worker.stage})" if worker.stage else "")
        return {"worker": doing, **st}

    return AdapterHooks(current, run_now)


def _start_adapter(profile: Any, session: Any) -> Any:
    """Run the background adapter beside the chat once the model is loaded (profile's [adapter] enabled)."""
    if not profile.config.adapter_enabled or not hasattr(session, "on_loaded"):
        return None
    from assistant.adapt.worker import AdapterWorker

    worker = AdapterWorker(profile.name, busy=session.busy)

    def attach(s: Any) -> None:
        worker.target = s.target        # one copy of the model, shared; the worker yields while answering
        worker.start()

    session.on_loaded.append(attach)
    return worker


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from assistant.profiles import Profile

    from assistant import session as session_mod
    from assistant.tui.app import ChatApp
    from assistant.tui.history import MemoryHistory

    profile = Profile.open(args.profile)
    startup_errors: list[tuple[BaseException, str]] = []
    cfg = profile.config
    try:
        overrides = {"threads": args.threads} if getattr(args, "threads", None) else {}
        session: Any = session_mod.Session.from_profile(profile, engine=getattr(args, "engine", "auto"), **overrides)
    except Exception as e:  # noqa: BLE001 - shown in the UI with what to do
        session = _BrokenSession(e, {"target": cfg.target, "dtype": cfg.dtype})
    try:
        history: Any = profile.history
        history.list_conversations()
    except Exception as e:  # noqa: BLE001
        startup_errors.append((e, "opening the history (this session is kept in memory only)"))
        history = MemoryHistory()

    worker = _start_adapter(profile, session)
    app = ChatApp(session, history=history, adapter=_adapter_source(profile, session, worker),
                  memory_budget=cfg.memory_budget, profile_name=profile.name,
                  log_path=profile.path / "chat.log", startup_errors=startup_errors)
    code = app.run() or 0
    if worker is not None:
        worker.stop(timeout=5.0)
    busy = app.workers and any(w.is_running for w in app.workers)
    if busy or (worker is not None and worker.alive):
        # A model load or an adapter step inside torch cannot be interrupted, and a daemon thread
        # inside C++ code at interpreter shutdown aborts the process ("terminate called without an
        # active exception"). The history is committed and a head publish is atomic: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
