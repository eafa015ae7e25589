"""Memory budget: will a target + phrase head fit, and with how much context and tree width?

Contract: everything here works from a model's config alone (no weights, no torch
import): the target's shape comes from assistant.runtime.shapes.load_shape ("Qwen/Qwen3-4B",
"default" = SmolLM2-135M-Instruct, a checkpoint directory or a config.json). `plan(target,
memory, ...)` returns a `BudgetPlan` whose byte terms are:

- weights: every parameter at the chosen precision. int8 is bitsandbytes LLM.int8:
  the Linear layers of the decoder hold 1 byte per weight plus one fp32 scale per
  output row; the embedding (nn.Embedding), the norms, the biases and an untied
  lm_head stay in 16-bit (bitsandbytes keeps them; a tied lm_head shares the
  embedding). fp32 = 4 bytes, bf16 = 2 bytes per parameter. On the CPU a tied output
  layer is held twice: the embedding reads the dense copy and the output layer runs on
  oneDNN's packed copy (assistant.runtime.layout; measured: SmolLM2 bf16 RSS 650 -> 722-757 MB).
- head: the phrase head's fp32 parameters for `head_rows` rows (or a given artifact's
  file size) plus its vocabulary tables (assistant.runtime.headconfig counts them).
- history (cpu only: it lives in host memory): the lookup in the profile's past answers,
  16 bytes a token of its bound (assistant.runtime.history_lookup; profile.toml history_tokens).
- overhead: the process (cpu: Python + torch + transformers + model code + the
  tokenizer, calibrated by RSS on SmolLM2) or the CUDA context (cuda).
- activations: the largest block one forward pass runs: max(tree width, prefill
  chunk) query tokens over the full context, as decode.verify runs it (hidden
  states of every layer kept, logits of every node, the 4D additive mask, one
  layer's attention scores/probabilities (cpu only: CUDA SDPA kernels do not hold
  them), K/V expanded to the query heads, MLP
  intermediates, one layer's KV copy while the cache grows or is compacted).
- kv_cache: 2 x layers x kv_heads x head_dim x (2 bytes; 4 in fp32) per token.
- reserve: 5% of the budget on cuda for allocator fragmentation (0 on cpu).

It chooses the largest tree width <= the one asked for (halving: assistant.runtime.width.fit_width)
that fits with `min_context` tokens, then the largest context that fits (capped at the model's
max_position_embeddings), or reports `fits=False` with `shortfall` bytes.
`require(plan)` raises BudgetError (one line, with the numbers) when it does not fit.
`resolve_device` / `resolve_dtype` settle "auto" the same way for the planner and the runtime.
The runtime obeys a plan by setting Session max_context / tree_width from it and
by prefilling prompts in chunks of at most `prefill_chunk` tokens.
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from assistant.runtime.cpuinfo import flags
from assistant.runtime.headconfig import HeadConfig, artifact_bytes
from assistant.runtime.shapes import DTYPE_BYTES, BudgetError, ModelShape, load_shape
from assistant.runtime.sizes import ANSWER_INDEX_BYTES_PER_TOKEN, format_size, parse_size
from assistant.runtime.width import DEFAULT_WIDTH, fit_width

AUTO_DTYPES = ("bf16", "int8")  # dtype="auto": the most precise of these that fits

# Calibration of the cpu overhead (RSS, transformers 5.24 / torch 2.13 CPU build, Python 3.11):
# import torch + transformers 250 MB, model code 31 MB, SmolLM2 tokenizer (49,152 tokens) 114 MB.
CPU_PROCESS_BYTES = 281_000_000
TOKENIZER_FIXED_BYTES = 40_000_000
TOKENIZER_BYTES_PER_TOKEN = 1_500
CUDA_CONTEXT_BYTES = 600 * 2**20     # CUDA context + cuBLAS workspace (estimate, not measured here)
CUDA_RESERVE_FRACTION = 0.05
DEFAULT_PREFILL_CHUNK = 256
DEFAULT_MIN_CONTEXT = 2048


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX); without it bf16 is emulated and
    slower than fp32 (measured here: a 200-token prefill took 20.7 s in bf16 against 4.9 s in fp32)."""
    return bool({"avx512_bf16", "amx_bf16"} & flags(cpuinfo))


def resolve_dtype(dtype: str, device: str = "auto") -> str:
    """'auto' -> bf16 on a GPU or a CPU with native bf16, else fp32; other values pass through."""
    if dtype != "auto":
        return dtype
    if resolve_device(device).startswith("cuda") or cpu_has_native_bf16():
        return "bf16"
    return "fp32"


def resolve_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' when a CUDA device can run the model, else 'cpu'; any other device as given.

    Whether one can is torch's answer when torch is already imported (the runtime, about to load a
    model), else whether an NVIDIA driver is installed: the planner answers without importing torch."""
    if device != "auto":
        return device
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def _device_type(device: str, dtype: str) -> str:
    """The device type a plan or estimate is for: "auto" with int8 (bitsandbytes) means a CUDA device."""
    if device == "auto" and dtype == "int8":
        return "cuda"
    return resolve_device(device).partition(":")[0]


@dataclass(frozen=True)
class BudgetPlan:
    target: str
    dtype: str
    device: str
    memory: int
    fits: bool
    max_context: int
    tree_width: int
    prefill_chunk: int
    min_context: int
    parameters: int
    terms: dict[str, int] = field(default_factory=dict)   # weights, head, overhead, activations, kv_cache, reserve
    kv_per_token: int = 0
    total: int = 0                                        # bytes at max_context (or at min_context when it does not fit)
    shortfall: int = 0                                    # bytes missing at min_context (0 when it fits)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["memory_human"] = format_size(self.memory)
        d["total_human"] = format_size(self.total)
        d["shortfall_human"] = format_size(self.shortfall)
        return d

    def message(self) -> str:
        """One line: what fits, or what is missing."""
        head = f"{self.target} {self.dtype} on {self.device} in {format_size(self.memory)}"
        if self.fits:
            return (f"{head}: fits with {self.max_context:,} tokens of context and tree width {self.tree_width} "
                    f"({format_size(self.total)} used)")
        return (f"{head}: does not fit: needs {format_size(self.total)} with {self.min_context:,} tokens of "
                f"context, {format_size(self.shortfall)} ({self.shortfall / self.memory:.0%}) more than the budget")

    def table(self) -> str:
        labels = {
            "weights": f"weights ({self.parameters / 1e9:.3g}B parameters, {self.dtype}"
                       + (", embeddings/norms 16-bit)" if self.dtype == "int8" else ")"),
            "head": "phrase head + vocabulary",
            "history": "lookup in past answers (tokens + sorted 3-grams)",
            "overhead": "process (python, torch, tokenizer)" if self.device == "cpu" else "CUDA context",
            "activations": f"largest forward block ({max(self.tree_width, self.prefill_chunk)} tokens)",
            "kv_cache": f"KV cache {format_size(self.kv_per_token)}/token x "
                        f"{(self.max_context if self.fits else self.min_context):,}",
            "reserve": "allocator reserve",
        }
        lines = [self.message()]
        for k, v in self.terms.items():
            lines.append(f"  {labels.get(k, k):<58} {format_size(v):>12}")
        lines.append(f"  {'total':<58} {format_size(self.total):>12}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _block_form_here() -> bool:
    """Whether this CPU's native kernels would hold fp32 weights in block form (assistant.runtime.kernels: a build
    for AVX512F or AVX2 + FMA, not turned off), read from the CPU flags alone (no torch, no build)."""
    from assistant.runtime import cpuinfo

    return cpuinfo.blocks_enabled() and cpuinfo.kernel_build() is not None


def _fixed_terms(shape: ModelShape, budget: int, dtype: str, dev: str, head_rows: int,
                 head_bytes: int | None, history_bytes: int = 0) -> dict[str, int]:
    if head_bytes is None:
        head_bytes = HeadConfig(hidden_size=shape.hidden).memory_bytes(head_rows)
    if dev == "cpu":
        overhead = CPU_PROCESS_BYTES + TOKENIZER_FIXED_BYTES + TOKENIZER_BYTES_PER_TOKEN * shape.vocab
        reserve = 0
    else:
        overhead = CUDA_CONTEXT_BYTES
        reserve = int(CUDA_RESERVE_FRACTION * budget)
    weights = shape.weight_bytes(dtype)
    if dev == "cpu" and shape.tied and dtype in ("fp32", "bf16"):
        weights += shape.embedding_params * DTYPE_BYTES[dtype]    # the packed copy of the tied output layer
    if dev == "cpu" and dtype == "fp32" and shape.gguf_blocks and _block_form_here():
        weights = shape.block_form_bytes()
    terms = {"weights": weights, "head": head_bytes, "overhead": overhead, "reserve": reserve}
    if dev == "cpu" and history_bytes:
        terms["history"] = history_bytes     # in host memory: counted where the budget is the host's
    return terms


def estimate(target: str | os.PathLike | Mapping[str, Any] | ModelShape, context: int, dtype: str = "bf16",
             device: str = "cpu", tree_width: int = DEFAULT_WIDTH, head_rows: int = 8000, head_bytes: int | None = None,
             prefill_chunk: int = DEFAULT_PREFILL_CHUNK, budget: int = 0, history_bytes: int = 0) -> dict[str, int]:
    """Byte terms (and 'total') of a runtime holding `context` tokens: what a measurement compares to."""
    shape = target if isinstance(target, ModelShape) else load_shape(target)
    dev = _device_type(device, dtype)
    terms = _fixed_terms(shape, budget, dtype, dev, head_rows, head_bytes, history_bytes)
    a0, a1 = shape.activation_bytes(max(tree_width, min(prefill_chunk, context)), dtype, dev == "cpu")
    terms["activations"] = a0 + context * a1
    terms["kv_cache"] = context * shape.kv_bytes_per_token(dtype)
    terms["total"] = sum(terms.values())
    return terms


def plan(target: str | os.PathLike | Mapping[str, Any] | ModelShape, memory: str | int, dtype: str = "bf16",
         device: str = "auto", tree_width: int = DEFAULT_WIDTH, min_context: int = DEFAULT_MIN_CONTEXT,
         max_context: int | None = None, head_rows: int = 8000, head_bytes: int | None = None,
         prefill_chunk: int = DEFAULT_PREFILL_CHUNK, history_bytes: int = 0) -> BudgetPlan:
    """Plan `target` in `memory` (see the module docstring). dtype may be 'auto'. `history_bytes`: the
    lookup in past answers (assistant.runtime.sizes.ANSWER_INDEX_BYTES_PER_TOKEN x its tokens)."""
    shape = target if isinstance(target, ModelShape) else load_shape(target)
    try:
        budget = parse_size(memory, "memory size")
    except ValueError as e:
        raise BudgetError(str(e)) from None
    if dtype == "auto":
        plans = [plan(shape, budget, d, device, tree_width, min_context, max_context, head_rows, head_bytes,
                      prefill_chunk, history_bytes) for d in AUTO_DTYPES]
        fitting = [p for p in plans if p.fits]
        return fitting[0] if fitting else min(plans, key=lambda p: p.shortfall)
    if dtype not in DTYPE_BYTES or dtype == "fp16":
        raise BudgetError(f"unknown dtype {dtype!r}: choose int8, bf16 or fp32")
    dev = _device_type(device, dtype)
    notes: list[str] = []
    if dtype == "int8" and dev != "cuda":
        notes.append("bitsandbytes int8 needs a CUDA device; the plan assumes one")
        dev = "cuda"
    cap = min(shape.max_position, max_context) if max_context else shape.max_position
    min_context = max(1, min(min_context, cap))
    fixed_terms = _fixed_terms(shape, budget, dtype, dev, head_rows, head_bytes, history_bytes)
    fixed = sum(fixed_terms.values())
    kv = shape.kv_bytes_per_token(dtype)
    scores = dev == "cpu"

    def largest_context(width: int) -> int:
        a0, a1 = shape.activation_bytes(max(width, min(prefill_chunk, cap)), dtype, scores)
        room = budget - fixed - a0
        return max(0, min(cap, room // (a1 + kv))) if room > 0 else 0

    width = fit_width(tree_width, lambda w: largest_context(w) >= min_context)
    ctx = largest_context(width)
    fits = ctx >= min_context
    if width < tree_width and fits:
        notes.append(f"tree width lowered from {tree_width} to {width} to fit")
    if fits and ctx == shape.max_position:
        notes.append(f"context capped at the model's limit ({shape.max_position:,} tokens)")
    shown = estimate(shape, ctx if fits else min_context, dtype, dev, width if fits else tree_width,
                     head_rows, fixed_terms["head"], prefill_chunk, budget, fixed_terms.get("history", 0))
    total = shown.pop("total")
    terms = {k: shown[k] for k in ("weights", "head", "history", "overhead", "activations", "kv_cache", "reserve")
             if k in shown}
    return BudgetPlan(target=shape.name, dtype=dtype, device=dev, memory=budget, fits=fits,
                      max_context=ctx if fits else 0, tree_width=width if fits else tree_width,
                      prefill_chunk=prefill_chunk, min_context=min_context, parameters=shape.parameters,
                      terms=terms, kv_per_token=kv, total=total, shortfall=0 if fits else total - budget,
                      notes=tuple(notes))


def require(p: BudgetPlan) -> BudgetPlan:
    """Return the plan when it fits, else raise BudgetError with its one-line message."""
    if not p.fits:
        raise BudgetError(p.message())
    return p


def plan_session(target: str, dtype: str, memory: str | int, tree_width: int = DEFAULT_WIDTH, device: str = "auto",
                 head_path: str | os.PathLike | None = None, head_rows: int = 8000,
                 max_context: int | None = None, min_context: int = DEFAULT_MIN_CONTEXT,
                 history_tokens: int = 0) -> BudgetPlan:
    """The plan a Session must obey before loading `target` (raises BudgetError when it does not fit).

    `target` is "default", "Qwen/Qwen3-4B" or a local checkpoint directory (other model ids are
    not resolved: BudgetError). With `head_path` the head's file size (and its base companion's: both draft)
    replaces the `head_rows` estimate.
    `history_tokens`: the most tokens the lookup in past answers may index (0: none).
    """
    head_bytes = artifact_bytes(head_path) if head_path and Path(head_path).is_file() else None
    p = plan(target, memory, dtype=dtype, device=device, tree_width=tree_width, head_rows=head_rows,
             head_bytes=head_bytes, max_context=max_context, min_context=min_context,
             history_bytes=ANSWER_INDEX_BYTES_PER_TOKEN * history_tokens)
    return require(p)


def budget_limits(target: str, dtype: str, memory: str | int | None, tree_width: int, *, device: str = "auto",
                  head_path: str | os.PathLike | None = None, head_rows: int = 8000, max_context: int | None = None,
                  history_tokens: int = 0) -> tuple[int, int | None]:
    """(tree width cap, max context) a session runs at under a memory budget: `tree_width` lowered to what
    `memory` fits (assistant.runtime.width.plan_width) and the context the plan leaves; with no budget, as
    asked. The session and the adapter's judge both take their width from here, so a cycle is judged at the
    width the answers run at. Raises BudgetError when the target does not fit."""
    if not memory:
        return tree_width, max_context
    from assistant.runtime.width import plan_width

    p = plan_session(target, dtype, memory, tree_width=tree_width, device=device, head_path=head_path,
                     head_rows=head_rows, max_context=max_context, history_tokens=history_tokens)
    return plan_width(tree_width, budget=p.tree_width).cap, p.max_context
