"""Decode engines: where the target's forward runs and how one answer's KV cache lives.

Contract: `make_engine(target, kind)` builds the engine `kind` for `target`: "eager"
(assistant.runtime.eager.EagerEngine, the reference: transformers' DynamicCache and the model's own
forward, the path `generate()` takes) or "compiled" (assistant.runtime.compiled.CompiledEngine, the
fast one: a static cache and one compiled verify forward, compiled and warmed up here); "compiled"
falls back to the eager engine with a one-line notice when compiling is unavailable or fails. Both
follow the engine contract of assistant.runtime.eager and compute the same function; only rounding
(and the time) may differ. Which engine "auto" runs is assistant.runtime.costmodel.pick_engine's
choice, by measured verify costs.
"""
from __future__ import annotations

from typing import Callable, Sequence

from assistant.runtime.compiled import CompiledEngine
from assistant.runtime.eager import EagerEngine

ENGINES = ("eager", "compiled")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def make_engine(target, kind: str = "eager", feature_layers: Sequence[int] = (-1,), max_len: int | None = None,
                progress: Callable[[str, float | None], None] | None = None):
    """The engine `kind` for `target` ("eager" or "compiled"; compiled is compiled and warmed up here).
    A compiled engine that cannot be built falls back to eager with a one-line notice through `progress`."""
    if kind == "eager":
        return EagerEngine(target.model)
    if kind != "compiled":
        raise ValueError(f"unknown engine {kind!r}: choose {', '.join(ENGINES)}")
    from assistant.runtime.layout import layout_of, set_layout

    before = layout_of(target.model)
    try:
        engine = CompiledEngine(target.model, max_len=max_len, progress=progress, feature_layers=feature_layers)
        engine.warm_up()
        return engine
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eager, say so in one line
        set_layout(target.model, before)
        if progress:
            progress(f"compiled engine unavailable ({type(e).__name__}: {_first_line(e)}); using the eager engine",
                     None)
        return EagerEngine(target.model)
