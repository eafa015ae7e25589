"""The compiled decode engine: a static KV cache and one compiled verify forward (the engine
contract of assistant.runtime.eager).

Contract: `CompiledEngine(model, max_len, progress, feature_layers, layout)` follows gpt-fast's
recipe through the public forward: a transformers `StaticCache` allocated per answer at its room
(capped by `max_len`, the context the memory budget allows), one `torch.compile`d verify forward whose
node count, attention window and cache length are dynamic dimensions, so ONE graph serves
every tree width, prompt length and answer (compiling a static shape per width bucket cost
35-45 s each on a 2-core CPU, and the dynamic graph ran as fast as the static ones). The
attention reads only the window of the static cache the mask covers (prefix + tree), through a
registered transformers attention function (`AttentionInterface`, "assistant_window": outside
a compiled region it IS transformers' sdpa attention, so hf/pld and the eager engine are
bit-identical with or without it). Commit copies the accepted nodes' keys/values into
consecutive slots (EAGLE-style compaction) and moves the cache's write position (on a CPU in one native call,
assistant.runtime.kernels' commit_slots, where the kernels are loaded). Trees are
padded to at least 2 nodes (a dimension of size 1 would be specialised into a second graph);
on CUDA also to fixed node buckets and 256-slot windows, so CUDA graphs (mode
"reduce-overhead") see few shapes. Padding nodes see only the prefix and themselves and are
never walked by accept(). On the CPU the compiled forward is captured ahead of time and saved
(assistant.runtime.precompile), so a later start loads it in ~2.5 s instead of tracing and compiling
again; a loaded or fresh graph is checked once against the eager forward before it answers
(`warm_up`; EngineUnavailable when it disagrees).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import torch

from assistant.runtime import precompile
from assistant.runtime.eager import (PREFILL_CHUNK, ContextFull, EagerEngine, EngineUnavailable, check_cancel,
                                     stack_features)
from assistant.runtime.layout import DedupPackedLinear
from assistant.runtime.tree import Tree

ATTENTION = "assistant_window"
CUDA_NODE_BUCKETS = (2, 4, 8, 16, 32, 64)
CUDA_WINDOW_STEP = 256
CUDA_OPTIONS = {"triton.cudagraphs": True}
# inductor's C++ wrapper: the graph's ~400 kernel and op calls a pass leave Python (machine G, fp32, SmolLM2,
# 2 threads, both artifacts loaded in one process and timed in alternation, 15 rounds: 1 node x0.94, 4 x0.96,
# 8 x0.96, 16 x0.99, i.e. ~0.5 ms a pass); it compiles ~30 s longer (87 vs 59 s there), once per machine, in the
# background
CPU_OPTIONS: dict = {"post_grad_custom_pre_pass": DedupPackedLinear(), "cpp_wrapper": True}


def window_attention(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0, **kwargs):
    """Attention over the window of a static cache that the 4D mask covers ([1, 1, q, n]: the first
    n slots). Eager: transformers' own sdpa attention on that window (a no-op slice when the cache
    is exactly the window, as a DynamicCache is). On a CPU whose native kernels have an attention in the
    model's dtype (bf16 with AVX512-BF16, fp32 with AVX512F or AVX2), with an additive mask (the engines'
    trees and the compiled engine's prefill chunks; generate()'s boolean masks keep sdpa), assistant_kernels::attention
    (assistant.runtime.kernels) compiled or eager: a bf16 prefill chunk of 160 tokens took 150 us a layer
    against sdpa's 440, and its rows are invariant to the tree around them. Else, compiled:
    matmul-softmax with grouped queries as one [kv_heads, groups * q] block (no repeat_kv copy), which
    inductor fuses; the CPU flash kernel spent 0.64 ms per layer at q=1 over a 1,024-slot cache."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    window = attention_mask is not None and attention_mask.dim() == 4
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if window:
        n = attention_mask.shape[-1]
        key, value = key[:, :, :n], value[:, :, :n]
        if _native_attention(query) and attention_mask.is_floating_point():
            return torch.ops.assistant_kernels.attention(query, key, value, attention_mask, scale), None
    if not (window and torch.compiler.is_compiling()):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, q, d = query.shape
    kvh = key.shape[1]
    g = h // kvh
    scores = torch.matmul(query.reshape(b, kvh, g * q, d), key.transpose(2, 3)) * scale
    scores = scores.view(b, kvh, g, q, -1) + attention_mask[:, :, None]
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype).view(b, kvh, g * q, -1)
    out = torch.matmul(probs, value).view(b, h, q, d)
    return out.transpose(1, 2).contiguous(), None


def _native_attention(query: torch.Tensor) -> bool:
    """On a CPU whose native kernels have an attention in the query's dtype (assistant.runtime.kernels: bf16 with
    AVX512-BF16, fp32 with AVX512F or AVX2): theirs, which reads each key and value once for a kv head's grouped
    queries, takes no aten::bmm (~40 us a call at these sizes) and is row-invariant (a tree node gets bit for bit
    what a one-token pass gives it, so speculation never changes greedy's answer on this engine)."""
    from assistant.runtime import kernels

    return (query.device.type == "cpu" and query.shape[-1] % 32 == 0 and query.shape[-1] <= 256
            and kernels.attention(query.dtype))


def register_window_attention(model) -> None:
    """Route `model`'s attention through window_attention (a public transformers registry; the
    mask function stays sdpa's, so generate() builds the masks it always did)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, window_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    if model.config._attn_implementation != ATTENTION:
        model.set_attn_implementation(ATTENTION)


def verify_forward(feature_layers: tuple[int, ...]) -> Callable:
    """The function the compiled engine compiles: one forward of the tree on the cache, returning the
    argmax per node [q] and the hidden states of `feature_layers` [Lf, q, H] (None without). The model
    is an argument, not a closure, so a saved compiled copy binds to the model of a later process."""
    def forward(model, ids, pos, mask, cache):
        out = model(input_ids=ids, cache=cache, position_ids=pos, attention_mask=mask, use_cache=True,
                    output_hidden_states=bool(feature_layers))
        feats = torch.stack([out.hidden_states[i][0] for i in feature_layers]) if feature_layers else None
        return out.logits[0].argmax(-1), feats

    return forward


def _round_up(x: int, step: int) -> int:
    return -(-x // step) * step


class CompiledEngine:
    """Static KV cache + one compiled, dynamic-shape verify forward (see the module docstring)."""

    name = "compiled"

    def __init__(self, model, max_len: int | None = None, progress: Callable[[str, float | None], None] | None = None,
                 feature_layers: Sequence[int] = (-1,), layout: str | None = None):
        from assistant.runtime import kernels
        from assistant.runtime.layout import layout_of, packing_supported, set_layout

        self.model = model
        if model.device.type == "cpu" and model.dtype in (torch.bfloat16, torch.float32):
            kernels.load(progress)        # the packed layout's kernels, built once per machine
        # The graph is traced for one weight layout and, to save ~1.5 ms of guards per call, nn-module
        # guards are skipped: the layout is fixed here and checked before every call instead.
        self.layout = layout or ("packed" if packing_supported(model) else layout_of(model))
        set_layout(model, self.layout)
        self._sentinel = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        self._sentinel_packed = self.layout == "packed"
        self.feature_layers = tuple(feature_layers)
        cfg = model.config
        self.max_len = int(max_len or getattr(cfg, "max_position_embeddings", 0) or 4096)
        self.cuda = model.device.type == "cuda"
        # the loaded native kernels move a CPU cache's slots in one call (commit_slots), else tensor ops do
        self.native_commit = model.device.type == "cpu" and kernels.loaded()
        self.node_buckets = CUDA_NODE_BUCKETS if self.cuda else ()
        self.window_step = CUDA_WINDOW_STEP if self.cuda else 1
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.progress = progress
        self._fns: dict[tuple[int, ...], Callable] = {}
        self.check_error: float | None = None     # relative error against the eager forward (warm_up)
        _use_user_cache_for_inductor()
        register_window_attention(model)

    # -- cache -------------------------------------------------------------------------------------------
    def _pad_nodes(self, q: int) -> int:
        q = max(q, 2)
        for b in self.node_buckets:
            if b >= q:
                return b
        return q

    def _slots(self, room: int | None) -> tuple[int, int]:
        """(tokens an answer of `room` may hold, static cache slots it needs)."""
        need = min(int(room or self.max_len), self.max_len)
        return need, _round_up(need + self._pad_nodes(max(self.node_buckets, default=2)), max(self.window_step, 1)) + 1

    def new_cache(self, room: int | None = None):
        from transformers import StaticCache

        need, slots = self._slots(room)
        cache = StaticCache(config=self.model.config, max_cache_len=slots)
        cache.early_initialization(batch_size=1, num_heads=self.kv_heads, head_dim=self.head_dim,
                                   dtype=self.model.dtype, device=self.model.device)
        for layer in cache.layers:
            torch._dynamo.mark_dynamic(layer.keys, 2)
            torch._dynamo.mark_dynamic(layer.values, 2)
        cache.assistant_limit = need        # tokens this answer may hold: the budget's context at most
        return cache

    def room(self, cache, prefix_len: int) -> int:
        return cache.assistant_limit - prefix_len

    def resume(self, cache, keep: int, room: int | None = None):
        """`cache`, ready for an answer of `room` tokens on top of its first `keep` entries. A cache too small
        for it grows layer by layer (a larger tensor, the first `keep` slots copied, the old one freed), so
        at most one layer's keys and values exist twice: the memory budget's one-layer copy term, not a
        second cache."""
        need, slots = self._slots(room)
        if slots > cache.layers[0].keys.shape[2]:
            for layer in cache.layers:
                for name in ("keys", "values"):
                    old = getattr(layer, name)
                    new = old.new_zeros(*old.shape[:2], slots, old.shape[3])
                    new[:, :, :keep].copy_(old[:, :, :keep])
                    torch._dynamo.mark_dynamic(new, 2)
                    setattr(layer, name, new)
                    del old
                layer.max_cache_len = slots
        cache.assistant_limit = need
        self._seek(cache, keep)
        return cache

    def _seek(self, cache, pos: int) -> None:
        if self.native_commit:
            torch.ops.assistant_kernels.commit_slots([], [l.cumulative_length for l in cache.layers], pos, [])
            return
        for layer in cache.layers:
            layer.cumulative_length.fill_(pos)

    # -- forwards ----------------------------------------------------------------------------------------
    def prefill(self, cache, prompt_ids: Sequence[int], feature_layers: Sequence[int] = (-1,),
                chunk: int = PREFILL_CHUNK, cancel: Callable[[], bool] | None = None, start: int = 0):
        """Eager, in chunks, on the static cache: each chunk attends to the cached window before it
        and causally to itself; `cancel` is polled between chunks (Cancelled). The cache already holds
        the first `start` tokens."""
        n = len(prompt_ids)
        if n > cache.assistant_limit:
            raise ContextFull(f"the prompt has {n} tokens and the context holds {cache.assistant_limit}")
        device, dtype = self.model.device, self.model.dtype
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        for start in range(start, n, chunk):
            check_cancel(cancel)
            last = start + chunk >= n
            part = ids[:, start: start + chunk]
            c = part.shape[1]
            mask = torch.full((c, start + c), torch.finfo(dtype).min, dtype=dtype, device=device)
            mask[:, :start] = 0
            mask[:, start:] = torch.triu(mask[:, start:], diagonal=1)
            self._seek(cache, start)
            pos = torch.arange(start, start + c, device=device)[None]
            out = self.model(input_ids=part, cache=cache, position_ids=pos, attention_mask=mask[None, None],
                             use_cache=True, logits_to_keep=1, output_hidden_states=last and bool(feature_layers))
        self._seek(cache, n)
        return int(out.logits[0, -1].argmax()), stack_features(out.hidden_states, feature_layers, -1)

    def _options(self) -> dict:
        return dict(CUDA_OPTIONS if self.cuda else CPU_OPTIONS)

    def artifact_path(self, feature_layers: Sequence[int]):
        return precompile.artifact_path(self.model, self.layout, feature_layers, self._options())

    @property
    def tag(self) -> str:
        """Names this engine's code and graph for cached measurements of it (assistant.runtime.costmodel)."""
        return "cuda" if self.cuda else self.artifact_path(self.feature_layers).stem.rsplit("-", 1)[-1][:12]

    def has_artifact(self, feature_layers: Sequence[int] | None = None) -> bool:
        """A saved compiled forward for these feature layers exists (CPU only; CUDA compiles every start)."""
        return not self.cuda and self.artifact_path(tuple(feature_layers or self.feature_layers)).is_file()

    def _fn(self, feature_layers: tuple[int, ...], example: tuple) -> Callable:
        """The compiled verify forward for `feature_layers`: on the CPU loaded from its saved artifact or
        compiled ahead of time on `example` and saved (assistant.runtime.precompile); on CUDA torch.compile with CUDA
        graphs, compiled at the first call."""
        fn = self._fns.get(feature_layers)
        if fn is not None:
            return fn
        forward = verify_forward(feature_layers)
        if self.cuda:
            fn = torch.compile(forward, options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                                 **self._options()})
        else:
            path = self.artifact_path(feature_layers)
            fn = precompile.load(path, globals(), problem=lambda m: self.progress and self.progress(f"saved compiled engine: {m}",
                                                                                          None))
            if fn is None:
                if self.progress:
                    self.progress("compiling the verify forward (once per machine, 1-2 min on 2 cores; cached under "
                                  "the user cache directory)", None)
                # only tensor metadata is guarded, and not even that after the build: the artifact's key names
                # everything the graph depends on, and verify() checks the weight layout it was built for
                # Python floats (the attention's scale) stay constants: once a process has compiled another
                # model's forward (another head size), dynamo would make them dynamic, and a dynamic float
                # handed to the native attention aborts a full-graph capture (TensorifyScalarRestartAnalysis)
                with torch._dynamo.config.patch(specialize_float=True):
                    compiled = torch.compile(forward, fullgraph=True, options={
                        "guard_filter_fn": torch.compiler.keep_portable_guards_unsafe, **self._options()})
                    fn = compiled.aot_compile((example, {}))
                precompile.save(fn, path)
                fn.disable_guard_check()
            elif self.progress:
                self.progress("loaded the compiled verify forward from the cache", None)
        self._fns[feature_layers] = fn
        return fn

    def verify(self, cache, tree: Tree, prefix_len: int, feature_layers: Sequence[int] = ()):
        """Runs the graph of the engine's feature layers (feats dropped when none are asked for), so
        greedy and phrase decoding share one compiled graph."""
        if (getattr(self._sentinel, "_assistant_packed", None) is not None) != self._sentinel_packed:
            raise RuntimeError(f"the compiled engine was built for {self.layout}-layout weights; "
                               "the target's layout changed under it")
        q = tree.size
        qp = self._pad_nodes(q)
        if prefix_len + qp > cache.layers[0].keys.shape[2] - 1:
            raise ContextFull(f"a {q}-node tree does not fit after {prefix_len} cached tokens")
        device, dtype = self.model.device, self.model.dtype
        n = min(_round_up(prefix_len + qp, self.window_step), cache.layers[0].keys.shape[2] - 1)
        tokens = tree.tokens + [tree.tokens[0]] * (qp - q)
        depths = tree.depths + [0] * (qp - q)
        ids = torch.tensor([tokens], dtype=torch.long)
        pos = (torch.tensor(depths, dtype=torch.long) + prefix_len)[None]
        allowed = torch.zeros(qp, n, dtype=torch.bool)
        allowed[:, :prefix_len] = True
        allowed[:q, prefix_len: prefix_len + q] = tree.ancestors()
        idx = torch.arange(q, qp)
        allowed[idx, prefix_len + idx] = True                 # a padding node sees the prefix and itself
        mask = torch.zeros(qp, n, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]
        ids, pos, mask = ids.to(device), pos.to(device), mask.to(device)
        for t, dim in ((ids, 1), (pos, 1), (mask, 2), (mask, 3)):
            torch._dynamo.mark_dynamic(t, dim)
        self._seek(cache, prefix_len)
        layers = tuple(feature_layers) or self.feature_layers
        args = (self.model, ids, pos, mask, cache)
        argmax, feats = self._fn(layers, args)(*args)
        return argmax[:q].tolist(), (feats[:, :q] if feats is not None and feature_layers else None)

    def commit(self, cache, prefix_len: int, path: list[int]) -> int:
        k = len(path)
        if self.native_commit:      # one native call, not four tensor ops a layer (~0.5 ms a pass on a CPU)
            torch.ops.assistant_kernels.commit_slots(
                [t for layer in cache.layers for t in (layer.keys, layer.values)],
                [layer.cumulative_length for layer in cache.layers], prefix_len, path)
            return prefix_len + k
        if path != list(range(k)):
            device = cache.layers[0].keys.device
            src = prefix_len + torch.tensor(path, dtype=torch.long, device=device)
            dst = torch.arange(prefix_len, prefix_len + k, device=device)
            for layer in cache.layers:
                layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
                layer.values.index_copy_(2, dst, layer.values.index_select(2, src))
        self._seek(cache, prefix_len + k)
        return prefix_len + k

    # -- compile -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def warm_up(self) -> float:
        """Build the verify forward now (loaded or compiled), run it on two tree sizes (a graph that would not
        generalise shows here) and check it against the eager forward; seconds taken. Raises
        EngineUnavailable when the compiled forward disagrees (its saved artifact is removed)."""
        t0 = time.perf_counter()
        from assistant.runtime.tree import build_tree

        vocab = int(self.model.config.vocab_size)
        ids = [int(i) % vocab for i in range(100, 132)]
        cache = self.new_cache(64)
        _, _ = self.prefill(cache, ids, (-1,))    # eager first: transformers installs its output hooks under a lock dynamo cannot trace
        for width in (3, 5):
            tree = build_tree(ids[-1], [ids[:width - 1]])
            _, feats = self.verify(cache, tree, len(ids), self.feature_layers)
        self._check_against_eager(ids, tree, feats)
        return time.perf_counter() - t0

    def _check_against_eager(self, ids: list[int], tree: Tree, feats: torch.Tensor) -> None:
        """The compiled forward's hidden states of `tree` equal the eager forward's up to rounding: a saved
        artifact that does not fit this model (a weight it reads by the wrong key) is caught here."""
        eager = EagerEngine(self.model)
        cache = eager.new_cache()
        eager.prefill(cache, ids, ())
        _, ref = eager.verify(cache, tree, len(ids), self.feature_layers)
        err = float((feats.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))
        tol = 1e-3 if self.model.dtype == torch.float32 else 0.1
        if not err <= tol:
            for layers in list(self._fns):
                self.artifact_path(layers).unlink(missing_ok=True)
            self._fns.clear()
            raise EngineUnavailable(f"the compiled verify forward differs from the eager one (relative error "
                                    f"{err:.2g} > {tol}); its cached copy was removed")
        self.check_error = err


def _use_user_cache_for_inductor() -> None:
    from assistant.runtime.fetch import cache_dir

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
