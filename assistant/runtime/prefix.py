"""Prefix reuse: the KV cache of one answer serves the next prompt that starts the same way.

Contract: a `KeptCache` holds at most one answer's cache, the engine it belongs to and the token ids
whose keys/values its first slots hold. `take(kept, engine, prompt_ids, room)` empties the holder and
returns `(cache, start)`: a cache for an answer of `room` tokens on `engine` whose first `start`
entries already hold `prompt_ids[:start]`, with `start` the longest common prefix of the kept ids and
the prompt, at most `len(prompt_ids) - 1` so the prefill still computes the root's logits and
features; without a kept cache of this engine (`kept` None or empty, another engine) a fresh cache
and 0 (a kept one that shares nothing with the prompt is reused from 0). `keep(kept, engine, cache,
ids)` stores an answer's cache when it ends (finished, stopped, cancelled or abandoned; the decode loop
keeps `ids` equal to what its cache holds after every commit). The engines' `resume(cache, keep,
room)` does the cache side (eager: crop; compiled: seek, growing a static cache too small layer by layer).

Why: a chat's next prompt is the whole conversation again (the previous prompt, the answer, the new
message), so without reuse every turn prefills every earlier turn (SmolLM2 bf16 on 2 cores: 1.2 s at
1,024 tokens, 3.2 s at 2,048) before its first token; with it only the new message and the chat
template's glue around it. llama.cpp's server (`cache_prompt`) and ollama keep a conversation's cache
the same way. The kept keys/values are those the previous answer's own passes computed, so later
tokens read the same values they would have read inside one longer answer: the output is the
target's greedy output as before (fp32-exact, tests/runtime/test_prefix.py); the re-rendered
conversation may tokenize the old answer differently, which only shortens the common prefix.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class KeptCache:
    """One answer's cache between answers: (engine, cache, ids) swapped as a whole under a lock, since
    an abandoned answer's generator may hand its cache back from another thread when it is collected."""

    slot: tuple[Any, Any, list[int]] | None = None     # (engine, cache, ids its first len(ids) slots hold)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear(self) -> None:
        with self.lock:
            self.slot = None

    @property
    def tokens(self) -> int:
        """How many tokens' keys/values are kept (0: none)."""
        slot = self.slot
        return len(slot[2]) if slot else 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def take(kept: KeptCache | None, engine, prompt_ids: Sequence[int], room: int) -> tuple[Any, int]:
    """(cache, start): a cache for `room` tokens whose first `start` entries hold prompt_ids[:start]
    (see the module docstring); the holder is emptied either way."""
    slot = None
    if kept is not None:
        with kept.lock:
            slot, kept.slot = kept.slot, None
    if slot is None or slot[0] is not engine:
        return engine.new_cache(room), 0
    _, cache, ids = slot
    start = max(min(common_prefix(ids, prompt_ids), len(prompt_ids) - 1), 0)
    return engine.resume(cache, start, room), start     # nothing in common: the same cache, emptied


def keep(kept: KeptCache | None, engine, cache, ids: Sequence[int]) -> None:
    """Remember `cache` (holding `ids`) for the next prompt on `engine`."""
    if kept is not None:
        with kept.lock:
            kept.slot = (engine, cache, list(ids))
