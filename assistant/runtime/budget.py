"""Memory budget: will a target + phrase head fit, and with how much context and tree width?

Contract: everything here works from a model's config alone (no weights, no torch
import). `load_shape(target)` reads "Qwen/Qwen3-4B" and "default" (SmolLM2-135M-
Instruct) from the configs shipped in assistant/runtime/data/configs/, or config.json from a
local checkpoint directory (or a path to a config.json). `plan(target, memory, ...)`
returns a `BudgetPlan` whose byte terms are:

- weights: every parameter at the chosen precision. int8 is bitsandbytes LLM.int8:
  the Linear layers of the decoder hold 1 byte per weight plus one fp32 scale per
  output row; the embedding (nn.Embedding), the norms, the biases and an untied
  lm_head stay in 16-bit (bitsandbytes keeps them; a tied lm_head shares the
  embedding). fp32 = 4 bytes, bf16 = 2 bytes per parameter. On the CPU a tied output
  layer is held twice: the embedding reads the dense copy and the output layer runs on
  oneDNN's packed copy (assistant.runtime.layout; measured: SmolLM2 bf16 RSS 650 -> 722-757 MB).
- head: the phrase head's fp32 parameters for `head_rows` rows (or a given artifact's
  file size) plus its vocabulary tables.
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

It chooses the largest tree width <= the one asked for (halving) that fits with
`min_context` tokens, then the largest context that fits (capped at the model's
max_position_embeddings), or reports `fits=False` with `shortfall` bytes.
`require(plan)` raises BudgetError (one line, with the numbers) when it does not fit.
The runtime obeys a plan by setting Session max_context / tree_width from it and
by prefilling prompts in chunks of at most `prefill_chunk` tokens.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

CONFIGS = Path(__file__).parent / "data" / "configs"
SHIPPED = {
    "qwen/qwen3-4b": "qwen3-4b.json", "qwen3-4b": "qwen3-4b.json",
    "default": "smollm2-135m-instruct.json", "smollm2": "smollm2-135m-instruct.json",
    "smollm2-135m-instruct": "smollm2-135m-instruct.json",
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m-instruct.json",
}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
HF_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
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

# The default phrase head (assistant.runtime.head.HeadConfig defaults): feature_layers=(-1,), inner 1024, width 256.
HEAD_INNER = 1024
HEAD_WIDTH = 256
HEAD_FEATURE_LAYERS = 1
HEAD_TABLE_BYTES_PER_ROW = 128       # vocabulary token ids, statistics and the chain table per row

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


class BudgetError(ValueError):
    """The model does not fit the memory budget, or the budget/target cannot be read (one line)."""


def parse_size(text: str | int) -> int:
    """'8GiB', '512 MiB', '6GB', '1.5G', 1024 -> bytes (G/GB are 10^9, GiB 2^30)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise BudgetError(f"memory size must be positive: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(f"not a memory size: {text!r} (write e.g. 8GiB, 512MiB, 6GB)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise BudgetError(f"memory size must be positive: {text!r}")
    return n


def format_size(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{sign}{n / k:.2f} {unit}"
    return f"{sign}{int(n)} B"


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_position: int
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    checkpoint_dtype: str = "bf16"

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], name: str = "") -> "ModelShape":
        cfg = dict(cfg.get("text_config") or cfg)
        try:
            hidden = int(cfg["hidden_size"])
            q_heads = int(cfg["num_attention_heads"])
            kv = cfg.get("num_key_value_heads")
            head_dim = cfg.get("head_dim")
            dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
            return cls(
                name=name or str(cfg.get("_name") or cfg.get("_name_or_path") or cfg.get("model_type", "model")),
                hidden=hidden, layers=int(cfg["num_hidden_layers"]), q_heads=q_heads,
                kv_heads=int(kv) if kv else q_heads,
                head_dim=int(head_dim) if head_dim else hidden // q_heads,
                intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                max_position=int(cfg.get("max_position_embeddings") or 2048),
                attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                qk_norm=str(cfg.get("model_type", "")).startswith("qwen3"),
                checkpoint_dtype=HF_DTYPES.get(str(dtype), "bf16"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise BudgetError(f"{name or 'config'}: not a decoder config this budget understands "
                              f"(missing or bad {e})") from e

    # ---- parameter counts ---------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def decoder_linear_params(self) -> int:
        """Weights of the Linear layers inside the decoder blocks (what bitsandbytes quantises)."""
        h, i = self.hidden, self.intermediate
        per_layer = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 3 * h * i
        return self.layers * per_layer

    @property
    def decoder_linear_rows(self) -> int:
        """Output features of those Linear layers (one int8 scale each)."""
        return self.layers * (self.q_dim + 2 * self.kv_dim + self.hidden + 2 * self.intermediate + self.hidden)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def small_params(self) -> int:
        """Norms and biases (kept in 16-bit by bitsandbytes)."""
        n = self.layers * 2 * self.hidden + self.hidden
        if self.qk_norm:
            n += self.layers * 2 * self.head_dim
        if self.attention_bias:
            n += self.layers * (self.q_dim + 2 * self.kv_dim)
        if self.mlp_bias:
            n += self.layers * (2 * self.intermediate + self.hidden)
        return n

    @property
    def parameters(self) -> int:
        return self.decoder_linear_params + self.embedding_params + self.lm_head_params + self.small_params

    def weight_bytes(self, dtype: str) -> int:
        if dtype == "int8":
            return (self.decoder_linear_params + 4 * self.decoder_linear_rows
                    + 2 * (self.embedding_params + self.lm_head_params + self.small_params))
        return DTYPE_BYTES[dtype] * self.parameters

    def kv_bytes_per_token(self, dtype: str) -> int:
        return 2 * self.layers * self.kv_dim * compute_bytes(dtype)

    def activation_bytes(self, q: int, dtype: str, scores: bool = True) -> tuple[int, int]:
        """(constant, per-context-token) bytes of one forward over q query tokens on top of a context.

        scores=False models fused attention (CUDA SDPA kernels) that never holds the q x context
        score matrix; the CPU path is assumed to materialise it."""
        b = compute_bytes(dtype)
        s = (4 + b) if scores else 0
        const = ((self.layers + 1) * q * self.hidden * b          # hidden states of every layer (kept)
                 + q * self.vocab * 4                              # logits
                 + q * (self.q_dim + 2 * self.kv_dim) * b          # q/k/v projections of one layer
                 + 3 * q * self.intermediate * b                   # MLP gate/up/act of one layer
                 + self.q_heads * q * q * s + q * q * b)           # scores/probs/mask over the block itself
        per_ctx = (self.q_heads * q * s                            # scores (fp32 softmax) + probs
                   + q * b                                         # additive 4D mask
                   + 2 * self.q_dim * b                            # K/V expanded to the query heads
                   + 2 * self.kv_dim * b)                          # one layer's KV copy (cat / index_select)
        return const, per_ctx


def compute_bytes(dtype: str) -> int:
    """Bytes of activations and KV cache: fp32 4, else 2 (int8 computes in 16-bit)."""
    return 4 if dtype == "fp32" else 2


def head_param_count(hidden: int, rows: int, inner: int = HEAD_INNER, width: int = HEAD_WIDTH,
                     feature_layers: int = HEAD_FEATURE_LAYERS) -> int:
    """Parameters of assistant.runtime.head.PhraseHead: LayerNorm, two Linear layers, rows x (width + 1)."""
    d = hidden * (feature_layers + 1)
    return 2 * d + d * inner + inner + inner * width + width + rows * (width + 1)


def load_shape(target: str | os.PathLike | Mapping[str, Any]) -> ModelShape:
    """A ModelShape for a shipped name, a checkpoint directory, a config.json path or a config dict."""
    if isinstance(target, Mapping):
        return ModelShape.from_config(target)
    spec = str(target)
    key = spec.strip().lower()
    if key in SHIPPED:
        path = CONFIGS / SHIPPED[key]
        return ModelShape.from_config(json.loads(path.read_text("utf-8")))
    p = Path(spec).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        known = ", ".join(sorted({"Qwen/Qwen3-4B", "default"}))
        raise BudgetError(f"{spec}: no config.json there and not a shipped config ({known})")
    try:
        cfg = json.loads(p.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise BudgetError(f"{p}: cannot read config ({e})") from e
    name = p.parent.name if p.name == "config.json" else p.stem
    return ModelShape.from_config(cfg, name=cfg.get("_name") or name)


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX); without it bf16 is emulated and
    slower than fp32 (measured here: a 200-token prefill took 20.7 s in bf16 against 4.9 s in fp32)."""
    try:
        with open(cpuinfo) as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: str = "auto") -> str:
    """'auto' -> bf16 on a GPU or a CPU with native bf16, else fp32; other values pass through."""
    if dtype != "auto":
        return dtype
    if resolve_device(device, dtype) == "cuda" or cpu_has_native_bf16():
        return "bf16"
    return "fp32"


def resolve_device(device: str, dtype: str) -> str:
    """'auto' -> 'cuda' for int8 or when an NVIDIA driver is present, else 'cpu' (no torch import)."""
    if device != "auto":
        return "cuda" if device.startswith("cuda") else device
    if dtype == "int8" or os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


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


def _fixed_terms(shape: ModelShape, budget: int, dtype: str, dev: str, head_rows: int,
                 head_bytes: int | None) -> dict[str, int]:
    if head_bytes is None:
        head_bytes = (4 * head_param_count(shape.hidden, head_rows) + HEAD_TABLE_BYTES_PER_ROW * head_rows
                      if head_rows > 0 else 0)
    if dev == "cpu":
        overhead = CPU_PROCESS_BYTES + TOKENIZER_FIXED_BYTES + TOKENIZER_BYTES_PER_TOKEN * shape.vocab
        reserve = 0
    else:
        overhead = CUDA_CONTEXT_BYTES
        reserve = int(CUDA_RESERVE_FRACTION * budget)
    weights = shape.weight_bytes(dtype)
    if dev == "cpu" and shape.tied and dtype in ("fp32", "bf16"):
        weights += shape.embedding_params * DTYPE_BYTES[dtype]    # the packed copy of the tied output layer
    return {"weights": weights, "head": head_bytes, "overhead": overhead, "reserve": reserve}


def estimate(target: str | os.PathLike | Mapping[str, Any] | ModelShape, context: int, dtype: str = "bf16",
             device: str = "cpu", tree_width: int = 16, head_rows: int = 8000, head_bytes: int | None = None,
             prefill_chunk: int = DEFAULT_PREFILL_CHUNK, budget: int = 0) -> dict[str, int]:
    """Byte terms (and 'total') of a runtime holding `context` tokens: what a measurement compares to."""
    shape = target if isinstance(target, ModelShape) else load_shape(target)
    dev = resolve_device(device, dtype)
    terms = _fixed_terms(shape, budget, dtype, dev, head_rows, head_bytes)
    a0, a1 = shape.activation_bytes(max(tree_width, min(prefill_chunk, context)), dtype, dev == "cpu")
    terms["activations"] = a0 + context * a1
    terms["kv_cache"] = context * shape.kv_bytes_per_token(dtype)
    terms["total"] = sum(terms.values())
    return terms


def plan(target: str | os.PathLike | Mapping[str, Any] | ModelShape, memory: str | int, dtype: str = "bf16",
         device: str = "auto", tree_width: int = 16, min_context: int = DEFAULT_MIN_CONTEXT,
         max_context: int | None = None, head_rows: int = 8000, head_bytes: int | None = None,
         prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> BudgetPlan:
    """Plan `target` in `memory` (see the module docstring). dtype may be 'auto'."""
    shape = target if isinstance(target, ModelShape) else load_shape(target)
    budget = parse_size(memory)
    if dtype == "auto":
        plans = [plan(shape, budget, d, device, tree_width, min_context, max_context, head_rows, head_bytes,
                      prefill_chunk) for d in AUTO_DTYPES]
        fitting = [p for p in plans if p.fits]
        return fitting[0] if fitting else min(plans, key=lambda p: p.shortfall)
    if dtype not in DTYPE_BYTES or dtype == "fp16":
        raise BudgetError(f"unknown dtype {dtype!r}: choose int8, bf16 or fp32")
    dev = resolve_device(device, dtype)
    notes: list[str] = []
    if dtype == "int8" and dev != "cuda":
        notes.append("bitsandbytes int8 needs a CUDA device; the plan assumes one")
        dev = "cuda"
    cap = min(shape.max_position, max_context) if max_context else shape.max_position
    min_context = max(1, min(min_context, cap))
    fixed_terms = _fixed_terms(shape, budget, dtype, dev, head_rows, head_bytes)
    fixed = sum(fixed_terms.values())
    kv = shape.kv_bytes_per_token(dtype)
    scores = dev == "cpu"

    def largest_context(width: int) -> int:
        a0, a1 = shape.activation_bytes(max(width, min(prefill_chunk, cap)), dtype, scores)
        room = budget - fixed - a0
        return max(0, min(cap, room // (a1 + kv))) if room > 0 else 0

    width = max(1, tree_width)
    while width > 1 and largest_context(width) < min_context:
        width //= 2
    ctx = largest_context(width)
    fits = ctx >= min_context
    if width < tree_width and fits:
        notes.append(f"tree width lowered from {tree_width} to {width} to fit")
    if fits and ctx == shape.max_position:
        notes.append(f"context capped at the model's limit ({shape.max_position:,} tokens)")
    shown = estimate(shape, ctx if fits else min_context, dtype, dev, width if fits else tree_width,
                     head_rows, fixed_terms["head"], prefill_chunk, budget)
    total = shown.pop("total")
    terms = {k: shown[k] for k in ("weights", "head", "overhead", "activations", "kv_cache", "reserve")}
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


def plan_session(target: str, dtype: str, memory: str | int, tree_width: int = 16, device: str = "auto",
                 head_path: str | os.PathLike | None = None, head_rows: int = 8000,
                 max_context: int | None = None, min_context: int = DEFAULT_MIN_CONTEXT) -> BudgetPlan:
    """The plan a Session must obey before loading `target` (raises BudgetError when it does not fit).

    `target` is "default", "Qwen/Qwen3-4B" or a local checkpoint directory (other model ids are
    not resolved: BudgetError). With `head_path` the head's file size replaces the `head_rows` estimate.
    """
    head_bytes = Path(head_path).stat().st_size if head_path and Path(head_path).is_file() else None
    p = plan(target, memory, dtype=dtype, device=device, tree_width=tree_width, head_rows=head_rows,
             head_bytes=head_bytes, max_context=max_context, min_context=min_context)
    return require(p)
