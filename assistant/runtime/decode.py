"""The decode loop: prefill, then propose -> build_tree -> verify -> accept -> commit.

Contract: `speculative_generate(target, prompt_ids, drafter, config)` yields one
`Step` per target forward pass with the tokens committed by that pass, their text
delta and statistics. The committed tokens are the target's own greedy tokens:
a drafted token is kept only while it equals the target's argmax at its parent,
and the target's argmax after the last kept node (the bonus) is always added.
EOS, stop strings and max_new_tokens cut the run exactly where greedy decoding
would stop, also in the middle of an accepted run. `cancel()` is polled between
passes and between the prompt's prefill chunks. `greedy_generate` is the plain one-token reference on the same cache code.
A `assistant.runtime.width.WidthController` may pick each pass's tree width (<= max_nodes);
the output never depends on it, only the time does. The target's forwards run on a
`assistant.runtime.engine` engine (eager by default, the reference: assistant.runtime.eager); an engine whose cache is
full for this answer (the budget's context) ends it with finish "length", never with a
wrong token. With a `assistant.runtime.prefix.KeptCache` the answer starts from the cache the last
answer left there (only the prompt's tokens past their common prefix are prefilled) and leaves its
own cache there when it ends.

KV cache invariant between passes: the cache holds every committed token except
the last one (`root`, the pending bonus token), whose key/values are computed in
the next pass as tree node 0.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import torch

from assistant.runtime import prefix
from assistant.runtime.eager import Cancelled, EagerEngine
from assistant.runtime.textstream import TextStream
from assistant.runtime.tree import Tree, accept, build_tree
from assistant.runtime.width import DEFAULT_WIDTH, WidthController


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 256
    max_nodes: int = DEFAULT_WIDTH  # verify width: tree nodes per pass, root included
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False       # decode past EOS (tests force long runs this way)
    eos_token_ids: tuple[int, ...] | None = None  # None: the target's own


@dataclass
class DraftContext:
    """What a drafter may look at when proposing continuations of `root`."""

    ids: list[int]                 # prompt + committed tokens; ids[-1] == root
    root: int                      # the known next target token (not yet in the cache)
    features: torch.Tensor | None  # [L, H] hidden states (drafter.feature_layers) of the node that predicted root
    max_nodes: int


class Drafter(Protocol):
    feature_layers: tuple[int, ...]

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        """Candidate continuations after ctx.root, best first. A drafter that ranks its nodes
        (assistant.runtime.drafters.UnionDrafter) returns one path per tree node in the order chosen
        and sets `node_values` (each node's chance of being accepted), so the first w - 1 paths are
        the best tree of w nodes."""

    def observe(self, tree: Tree, path: list[int]) -> None:
        """Told which nodes of its tree were accepted (for statistics/adaptation)."""


@dataclass
class Step:
    tokens: list[int]              # tokens committed by this pass (after stop truncation)
    drafted: int                   # how many of them came from the tree
    text: str                      # their text
    finish: str | None             # None, "eos", "stop", "length" or "cancelled"
    tree_size: int = 1
    seconds: float = 0.0
    sources: list[int] = field(default_factory=list)  # candidate index that made each drafted token
    truncated: int = 0             # verified tokens dropped because a stop condition came first
    phases: dict[str, float] = field(default_factory=dict)  # seconds per stage of this pass (see PHASES)


PHASES = ("prefill", "propose", "tree", "verify", "accept", "commit")


def propose(drafter: Drafter | None, ctx: DraftContext, width: WidthController | None = None
            ) -> tuple[list[list[int]], int]:
    """One pass's candidates and verify width (<= ctx.max_nodes). The drafter proposes for the widest
    tree allowed; the width controller then picks the width, from the drafter's `node_values` for this
    pass when it ranks its nodes (and the candidates are cut to that tree), else from what each width
    banked lately; without a controller the pass uses ctx.max_nodes."""
    if drafter is None:
        return [], 1
    candidates, values = [], None
    if ctx.max_nodes > 1:
        candidates = drafter.propose(ctx)
        values = getattr(drafter, "node_values", None)      # a ranking drafter: [] when it has nothing
    if width is None:
        return candidates, ctx.max_nodes
    w = min(width.next_width(values), ctx.max_nodes)
    return (candidates[: w - 1] if values is not None else candidates), w


@dataclass
class DecodeStats:
    passes: int = 0                # target forward passes, prefill included
    new_tokens: int = 0
    seconds: float = 0.0
    accepted_hist: Counter = field(default_factory=Counter)  # drafted tokens kept per pass -> count
    phases: Counter = field(default_factory=Counter)          # PHASES -> seconds, plus "other"
    tree_sizes: Counter = field(default_factory=Counter)      # verified tree size -> passes (prefill apart)

    def add(self, step: Step) -> None:
        self.passes += 1
        self.new_tokens += len(step.tokens)
        self.seconds += step.seconds
        self.accepted_hist[step.drafted] += 1
        self.phases.update(step.phases)
        self.phases["other"] += max(step.seconds - sum(step.phases.values()), 0.0)
        if "prefill" not in step.phases:
            self.tree_sizes[step.tree_size] += 1

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / max(self.passes, 1)


def _emit(stream: TextStream, tokens: list[int], drafted: int, sources: list[int], t0: float, tree_size: int,
          phases: dict[str, float]) -> Step:
    kept, text = [], []
    for tok in tokens:
        kept.append(tok)
        text.append(stream.push(tok))
        if stream.finish:
            break
    if stream.finish:
        text.append(stream.flush())
    return Step(tokens=kept, drafted=min(drafted, len(kept)), text="".join(text), finish=stream.finish,
                tree_size=tree_size, seconds=time.perf_counter() - t0, sources=sources[:len(kept)],
                truncated=len(tokens) - len(kept), phases=phases)


def _stream_for(target, config: DecodeConfig) -> TextStream:
    eos = set(config.eos_token_ids) if config.eos_token_ids is not None else target.eos_token_ids
    if config.ignore_eos:
        eos = set()
    return TextStream(target.tokenizer, eos, config.max_new_tokens, config.stop_strings)


@torch.inference_mode()
def speculative_generate(target, prompt_ids: Sequence[int], drafter: Drafter | None, config: DecodeConfig,
                         cancel: Callable[[], bool] | None = None, width: WidthController | None = None,
                         engine=None, kept: prefix.KeptCache | None = None) -> Iterator[Step]:
    """Yield one Step per target forward pass (see module docstring). `width` (assistant.runtime.width) picks
    each pass's verify width, at most config.max_nodes; without it every pass uses config.max_nodes.
    `engine` (assistant.runtime.engine) runs the forwards; None: the eager reference. `kept`
    (assistant.runtime.prefix) lends the last answer's cache and receives this one's."""
    engine = engine or EagerEngine(target.model)
    if config.max_new_tokens <= 0:
        return
    t0 = time.perf_counter()
    cache, start = prefix.take(kept, engine, prompt_ids, len(prompt_ids) + config.max_new_tokens + config.max_nodes)
    cached = list(prompt_ids[:start])       # the ids whose keys/values the cache holds, kept true after every commit
    try:
        yield from _passes(target, prompt_ids, drafter, config, cancel, width, engine, cache, start, cached, t0)
    finally:
        prefix.keep(kept, engine, cache, cached)


def _passes(target, prompt_ids: Sequence[int], drafter: Drafter | None, config: DecodeConfig,
            cancel: Callable[[], bool] | None, width: WidthController | None, engine, cache, start: int,
            cached: list[int], t0: float) -> Iterator[Step]:
    """speculative_generate's prefill (from `start`) and passes on `cache`, extending `cached` as it fills."""
    layers = tuple(drafter.feature_layers) if drafter is not None else ()
    stream = _stream_for(target, config)
    try:
        root, feats = engine.prefill(cache, prompt_ids, layers, cancel=cancel, start=start)
    except Cancelled:
        yield Step(tokens=[], drafted=0, text="", finish="cancelled")
        return
    cached[start:] = prompt_ids[start:]
    if width is not None:
        width.start_answer()
    prefix_len = len(prompt_ids)
    ids = list(prompt_ids) + [root]
    # a prefill "tree" is the prompt tokens it computed: those past the part a kept cache already held
    step = _emit(stream, [root], 0, [], t0, len(prompt_ids) - start, {"prefill": time.perf_counter() - t0})
    yield step
    while step.finish is None:
        if cancel is not None and cancel():
            yield Step(tokens=[], drafted=0, text="", finish="cancelled")
            return
        t0 = time.perf_counter()
        room = engine.room(cache, prefix_len)
        if room is not None and room < 1:      # the context is full: stop where a bounded greedy would
            yield Step(tokens=[], drafted=0, text=stream.flush(), finish="length")
            return
        cap = min(config.max_nodes, room) if room is not None else config.max_nodes
        candidates, w = propose(drafter, DraftContext(ids=ids, root=root, features=feats, max_nodes=cap), width)
        t1 = time.perf_counter()
        tree = build_tree(root, candidates, w)
        t2 = time.perf_counter()
        argmax, hs = engine.verify(cache, tree, prefix_len, layers)   # .tolist() syncs
        t3 = time.perf_counter()
        path, bonus = accept(tree, argmax)
        t4 = time.perf_counter()
        prefix_len = engine.commit(cache, prefix_len, path)
        cached.extend(tree.tokens[n] for n in path)
        if drafter is not None and tree.size > 1:
            drafter.observe(tree, path)
        if width is not None and drafter is not None:
            width.observe(path, w)
        new = [tree.tokens[n] for n in path[1:]] + [bonus]
        feats = hs[:, path[-1]] if layers else None
        t5 = time.perf_counter()
        phases = {"propose": t1 - t0, "tree": t2 - t1, "verify": t3 - t2, "accept": t4 - t3, "commit": t5 - t4}
        step = _emit(stream, new, len(path) - 1, [tree.source[n] for n in path[1:]], t0, tree.size, phases)
        ids.extend(step.tokens)
        root = bonus
        yield step


def greedy_generate(target, prompt_ids: Sequence[int], config: DecodeConfig,
                    cancel: Callable[[], bool] | None = None, engine=None,
                    kept: prefix.KeptCache | None = None) -> Iterator[Step]:
    """The reference: one token per forward pass (a root-only tree) on the same cache code."""
    return speculative_generate(target, prompt_ids, None, config, cancel, engine=engine, kept=kept)


def run_to_end(steps: Iterator[Step]) -> tuple[list[int], DecodeStats]:
    """Drain a step iterator; returns the generated tokens and statistics."""
    tokens: list[int] = []
    stats = DecodeStats()
    for step in steps:
        if step.finish == "cancelled":
            break
        tokens.extend(step.tokens)
        stats.add(step)
    return tokens, stats
