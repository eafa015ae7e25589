"""Fakes for the chat UI tests: a scripted Session (same protocol as assistant.session.Session) and helpers."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from assistant.tui.app import ChatApp
from assistant.tui.history import MemoryHistory


@dataclass
class FakeStep:
    text: str
    tokens: list[int]
    drafted: int = 0
    finish: str | None = None
    seconds: float = 0.01
    tree_size: int = 4


# "Paris is the capital of France." as five passes; passes 2 and 4 banked drafted tokens.
PARIS = [FakeStep("Paris", [1]), FakeStep(" is the", [2, 3], drafted=1), FakeStep(" capital", [4]),
         FakeStep(" of France", [5, 6, 7], drafted=2), FakeStep(".", [8], finish="eos")]


class ModelFetchError(RuntimeError):
    """Same name as assistant.runtime.fetch.ModelFetchError: tui recognises errors by class name."""


class ContextFullError(RuntimeError):
    pass


@dataclass
class FakeSession:
    steps: list[FakeStep] = field(default_factory=lambda: list(PARIS))
    step_delay: float = 0.0
    load_delay: float = 0.0
    load_error: BaseException | None = None
    answer_error: BaseException | None = None
    loaded: threading.Event = field(default_factory=threading.Event)
    release_load: threading.Event | None = None
    calls: list[list[dict[str, str]]] = field(default_factory=list)
    first_step_shown: threading.Event = field(default_factory=threading.Event)

    def load(self, progress: Callable[[str, float | None], None] | None = None) -> None:
        if progress:
            progress("loading fake-model", 0.25)
        if self.release_load is not None:
            self.release_load.wait(10)
        time.sleep(self.load_delay)
        if self.load_error is not None:
            raise self.load_error
        if progress:
            progress("ready", 1.0)
        self.loaded.set()

    def answer(self, messages: list[dict[str, str]], cancel: Callable[[], bool] | None = None) -> Iterator[FakeStep]:
        self.calls.append([dict(m) for m in messages])
        if self.answer_error is not None:
            raise self.answer_error
        for i, step in enumerate(self.steps):
            if cancel is not None and cancel():
                yield FakeStep("", [], finish="cancelled")
                return
            if i:
                self.first_step_shown.set()
                time.sleep(self.step_delay)
            yield step

    def info(self) -> dict[str, Any]:
        return {"model": "FakeLM-1M", "device": "cpu", "dtype": "fp32", "engine": "compiled", "threads": 2,
                "head": {"name": "v0003", "parameters": 1_234_567, "rows": 2048}}

    def swap_head(self, path: Any) -> dict[str, Any]:
        return {"name": str(path)}


def make_app(session: FakeSession | None = None, **kwargs: Any) -> ChatApp:
    kwargs.setdefault("history", MemoryHistory())
    kwargs.setdefault("poll_seconds", 0)
    kwargs.setdefault("memory_probe", lambda: 300 * 1024 * 1024)
    kwargs.setdefault("memory_budget", "8GiB")
    return ChatApp(session or FakeSession(), **kwargs)


async def settle(app: ChatApp, pilot: Any) -> None:
    """Let workers finish and the UI process what they posted."""
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def send(pilot: Any, text: str) -> None:
    """Type `text` into the prompt (inserted at once) and press Enter."""
    prompt = pilot.app.query_one("#prompt")
    prompt.focus()
    prompt.insert(text)
    await pilot.press("enter")


def sync(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run an async test with asyncio.run (no pytest async plugin needed); fixtures still apply."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper
