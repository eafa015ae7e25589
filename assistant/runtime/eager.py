"""The decode-engine contract and its reference engine.

Contract: an engine offers the three target calls of the decode loop on a cache it makes
for one answer, `cache = engine.new_cache(room)` (room: the most tokens the answer may cache):
- `prefill(cache, prompt_ids, feature_layers, cancel=None, start=0) -> (root, feats [Lf, H] | None)`:
  the prompt in chunks (`cancel()` polled between them: Cancelled), from `start` on (the first
  `start` tokens are already in the cache); root = the target's argmax after it; feats = its hidden
  states at `feature_layers`.
- `verify(cache, tree, prefix_len, feature_layers) -> (argmax list[q], feats [Lf, q, H] | None)`:
  one forward over the tree's q nodes on top of the first `prefix_len` cached tokens.
- `commit(cache, prefix_len, path) -> prefix_len + len(path)`: keep the accepted nodes only.
- `room(cache, prefix_len) -> int`: how many tree nodes still fit (None: unbounded); an engine
  whose cache is full raises ContextFull.
- `resume(cache, keep, room) -> cache`: a cache for an answer of `room` tokens whose first `keep`
  entries are `cache`'s (assistant.runtime.prefix: a chat's next prompt reuses the last answer's).
The engines compute the same function; only rounding (and the time) may differ.

`EagerEngine` is the reference: transformers' DynamicCache and the model's own forward, the
path `generate()` takes. The fast engine is assistant.runtime.compiled.CompiledEngine;
assistant.runtime.engine.make_engine builds either.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from assistant.runtime.tree import Tree

PREFILL_CHUNK = 512


class ContextFull(RuntimeError):
    """The answer's static cache holds no more tokens (message is one line)."""


class EngineUnavailable(RuntimeError):
    """The compiled engine cannot run here (message is one line)."""


class Cancelled(Exception):
    """`cancel()` said stop while a prompt was being prefilled."""


def check_cancel(cancel: Callable[[], bool] | None) -> None:
    """Raise Cancelled when `cancel()` says stop (polled between prefill chunks)."""
    if cancel is not None and cancel():
        raise Cancelled


def stack_features(hidden_states, layers: Sequence[int], index) -> torch.Tensor | None:
    """The hidden states of `layers` at positions `index` of the batch's only row ([Lf, ...]; None without)."""
    return torch.stack([hidden_states[i][0, index] for i in layers]) if layers else None


class EagerEngine:
    """transformers' DynamicCache and eager forward: the reference and the fallback."""

    name = "eager"

    def __init__(self, model):
        self.model = model

    def new_cache(self, room: int | None = None):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def room(self, cache, prefix_len: int) -> int | None:
        return None

    def resume(self, cache, keep: int, room: int | None = None):
        for layer in cache.layers:       # layer by layer: an answer stopped inside a commit may leave them uneven
            drop = layer.get_seq_length() - keep if layer.is_initialized else 0
            if drop > 0:
                layer.crop(-drop)
        return cache

    def prefill(self, cache, prompt_ids: Sequence[int], feature_layers: Sequence[int] = (-1,),
                chunk: int = PREFILL_CHUNK, cancel: Callable[[], bool] | None = None, start: int = 0):
        """Long prompts go in chunks so activations stay inside the memory budget; only the last
        position's logits and hidden states are kept. `cancel` is polled between chunks (Cancelled).
        The cache already holds the first `start` tokens."""
        device = self.model.device
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        n = ids.shape[1]
        for start in range(start, n, chunk):
            check_cancel(cancel)
            last = start + chunk >= n
            part = ids[:, start: start + chunk]
            pos = torch.arange(start, start + part.shape[1], device=device)[None]
            out = self.model(input_ids=part, cache=cache, position_ids=pos, use_cache=True, logits_to_keep=1,
                             output_hidden_states=last and bool(feature_layers))
        return int(out.logits[0, -1].argmax()), stack_features(out.hidden_states, feature_layers, -1)

    def verify(self, cache, tree: Tree, prefix_len: int, feature_layers: Sequence[int] = ()):
        device = self.model.device
        ids = torch.tensor([tree.tokens], dtype=torch.long, device=device)
        mask = tree.attention_mask(prefix_len, self.model.dtype, device)
        out = self.model(input_ids=ids, cache=cache, position_ids=tree.position_ids(prefix_len, device),
                         attention_mask=mask, use_cache=True, output_hidden_states=bool(feature_layers))
        feats = stack_features(out.hidden_states, feature_layers, slice(None)) if feature_layers else None
        return out.logits[0].argmax(-1).tolist(), feats

    def commit(self, cache, prefix_len: int, path: list[int]) -> int:
        q = cache.get_seq_length() - prefix_len
        if path == list(range(len(path))):
            drop = q - len(path)
            if drop:
                cache.crop(-drop)
        else:
            device = cache.layers[0].keys.device
            keep = torch.cat([torch.arange(prefix_len, device=device),
                              prefix_len + torch.tensor(path, dtype=torch.long, device=device)])
            for layer in cache.layers:
                layer.keys = layer.keys.index_select(-2, keep)
                layer.values = layer.values.index_select(-2, keep)
        return prefix_len + len(path)
