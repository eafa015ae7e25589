"""The phrase head: a small MLP from the target's hidden state to draft-vocabulary rows.

Contract: `PhraseHead(config, rows)` maps the target's features at the node that
predicted the pending token (`features`, [B, L*H]) and the target's input
embedding of that pending token (`root_embedding`, [B, H]) to logits over the
draft vocabulary ([B, rows]): which phrase follows the pending token. The output
layer is one row of `width + 1` parameters per entry, so the row count is the
parameter budget, and `resize` grows or shrinks it at run time. It computes in its parameters'
dtype (fp32 as trained and loaded; the runtime casts it to bf16 beside a bf16 target) and returns
fp32 logits. `save_artifact`/
`load_artifact` keep a head and its vocabulary in ONE safetensors file with JSON
metadata (config, target, training provenance); nothing is pickled. An adapted head (the online
adapter's) may have the frozen head it was adapted from beside it (assistant.runtime.headconfig.base_companion,
<stem>.base.safetensors): the runtime drafts with both (assistant.runtime.defaults.load_heads).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save, save_file
from torch import nn

from assistant.runtime.headconfig import HeadConfig
from assistant.runtime.vocab import DraftVocab


class PhraseHead(nn.Module):
    def __init__(self, config: HeadConfig, rows: int):
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(config.in_dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.in_dim, config.inner), nn.SiLU(),
            nn.Linear(config.inner, config.width), nn.SiLU(),
        )
        self.out = nn.Linear(config.width, rows)

    @property
    def rows(self) -> int:
        return self.out.out_features

    def trunk(self, features: torch.Tensor, root_embedding: torch.Tensor) -> torch.Tensor:
        """[B, L*H], [B, H] -> [B, width], computed in the parameters' dtype."""
        x = torch.cat([features, root_embedding], dim=-1).to(self.norm.weight.dtype)
        return self.mlp(self.norm(x))

    def forward(self, features: torch.Tensor, root_embedding: torch.Tensor) -> torch.Tensor:
        """[B, L*H], [B, H] -> logits [B, rows] (fp32)."""
        return self.out(self.trunk(features, root_embedding)).float()

    def resize(self, rows: int, init: torch.Tensor | None = None) -> None:
        """Set the row count, keeping existing rows; `init` ([new, width+1]) initialises added rows."""
        old = self.out
        new = nn.Linear(self.config.width, rows)
        with torch.no_grad():
            keep = min(rows, old.out_features)
            new.weight[:keep] = old.weight[:keep]
            new.bias[:keep] = old.bias[:keep]
            if rows > keep:
                if init is not None:
                    new.weight[keep:] = init[:, :-1]
                    new.bias[keep:] = init[:, -1]
                else:
                    new.weight[keep:] = 0.0
                    new.bias[keep:] = old.bias[:keep].min() if keep else 0.0
        self.out = new

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def describe(self, target_params: int | None = None) -> dict[str, Any]:
        n = self.parameter_count()
        out = {"parameters": n, "rows": self.rows, "params_per_row": self.config.row_params}
        if target_params:
            out["share_of_target"] = n / target_params
        return out


def save_artifact(path: str | Path | None, head: PhraseHead, vocab: DraftVocab, meta: dict[str, Any] | None = None,
                  extra: dict[str, torch.Tensor] | None = None, dtype: torch.dtype = torch.float32) -> bytes | None:
    """Write head + vocabulary (+ extra tensors, e.g. a phrase-chain table) to one safetensors file, or
    return the file's bytes when `path` is None.

    `dtype` is the storage precision of the head weights (fp16 halves a shipped file);
    `load_artifact` always returns a float32 head.
    """
    if head.rows != vocab.capacity:
        raise ValueError(f"head has {head.rows} rows but the vocabulary {vocab.capacity}")
    tensors = {f"head.{k}": v.detach().to(dtype).contiguous() for k, v in head.state_dict().items()}
    vt, vmeta = vocab.state()
    tensors.update(vt)
    for k, v in (extra or {}).items():
        tensors[f"extra.{k}"] = v.contiguous()
    md = dict(vmeta)
    md["head.config"] = json.dumps(asdict(head.config))
    md["artifact.meta"] = json.dumps(meta or {})
    if path is None:
        return save(tensors, metadata=md)
    save_file(tensors, str(path), metadata=md)
    return None


@dataclass
class Artifact:
    head: PhraseHead
    vocab: DraftVocab
    meta: dict[str, Any]
    extra: dict[str, torch.Tensor]


def load_artifact(path: str | Path) -> Artifact:
    """Read a file written by save_artifact. Raises ValueError naming the file when it is damaged."""
    try:
        with safe_open(str(path), framework="pt") as f:
            md = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        cfg = json.loads(md["head.config"])
        cfg["feature_layers"] = tuple(cfg["feature_layers"])
        config = HeadConfig(**cfg)
        vocab = DraftVocab.from_state({k: v for k, v in tensors.items() if k.startswith("vocab.")}, md)
        head = PhraseHead(config, vocab.capacity)
        head.load_state_dict({k[5:]: v.float() for k, v in tensors.items() if k.startswith("head.")})
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ValueError(f"{path}: damaged head artifact ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})") from e
    head.eval()
    return Artifact(head=head, vocab=vocab, meta=json.loads(md.get("artifact.meta", "{}")),
                    extra={k[6:]: v for k, v in tensors.items() if k.startswith("extra.")})
