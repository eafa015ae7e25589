"""Model shapes from a config alone: parameter counts and bytes per token, without weights or torch.

Contract: `load_shape(target)` returns a `ModelShape` for "Qwen/Qwen3-4B" and "default" (SmolLM2-
135M-Instruct, from the configs shipped in assistant/runtime/data/configs/), a local checkpoint
directory, a path to a config.json or a config dict; a config it cannot read or understand raises
BudgetError (one line). A `ModelShape` counts the decoder's parameters (`parameters`,
`weight_bytes(dtype)`: int8 is bitsandbytes LLM.int8, 1 byte per decoder Linear weight plus one fp32
scale per output row, with the embedding, norms, biases and an untied lm_head kept in 16-bit) and the
bytes a forward needs (`kv_bytes_per_token`, `activation_bytes`); assistant.runtime.budget plans
memory with them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
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


class BudgetError(ValueError):
    """The model does not fit the memory budget, or the budget/target cannot be read (one line)."""


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
    gguf_blocks: bool = False   # fp32 weights dequantized from GGUF Q4_1 layers and a Q8_0 output layer (the
                                # embedded default, assistant.runtime.fetch): packed on a CPU they stay in that
                                # block form (assistant.runtime.kernels.blocks)

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

    def block_form_bytes(self) -> int:
        """Bytes of the weights held on a CPU in fp32 with `gguf_blocks`: the decoder's linears in 4-bit block form
        (0.75 bytes a weight), the embedding dense (its lookups read it), the packed output layer in 8-bit block form
        (1.25) and the norms in fp32."""
        out = self.embedding_params if self.tied else self.lm_head_params
        return (self.decoder_linear_params * 3 // 4 + 4 * self.embedding_params + out * 5 // 4
                + 4 * self.small_params)

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


def load_shape(target: str | os.PathLike | Mapping[str, Any]) -> ModelShape:
    """A ModelShape for a shipped name, a checkpoint directory, a config.json path or a config dict."""
    if isinstance(target, Mapping):
        return ModelShape.from_config(target)
    spec = str(target)
    key = spec.strip().lower()
    if key in SHIPPED:
        path = CONFIGS / SHIPPED[key]
        shape = ModelShape.from_config(json.loads(path.read_text("utf-8")))
        return replace(shape, gguf_blocks=SHIPPED[key] == SHIPPED["default"])
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
