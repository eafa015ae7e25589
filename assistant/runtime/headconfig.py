"""The phrase head's shape and what it costs: the one place its size is counted.

Contract: `HeadConfig(hidden_size, feature_layers, inner, width)` is the shape of
assistant.runtime.head.PhraseHead (LayerNorm over the fused input, Linear in -> inner, Linear
inner -> width, then one output row of `width + 1` parameters per draft-vocabulary entry).
`parameter_count(rows)` counts its parameters for `rows` rows exactly as the module holds them;
`memory_bytes(rows)` is what the memory budget (assistant.runtime.budget) charges for a head
that is not on disk yet: fp32 parameters plus its vocabulary tables. Pure arithmetic, no torch,
so the budget planner can size a head without loading anything. `base_companion(path)` is where an
adapted head's frozen base head lives (<stem>.base.safetensors, drafting beside it) and
`artifact_bytes(path)` the bytes of both on disk.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TABLE_BYTES_PER_ROW = 128       # vocabulary token ids, statistics and the chain table per row


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int                       # target hidden size H
    feature_layers: tuple[int, ...] = (-1,)  # which hidden_states the head reads (fused by concatenation)
    inner: int = 1024                      # MLP inner width
    width: int = 256                       # input width of the output layer (row cost = width + 1)

    @property
    def in_dim(self) -> int:
        return self.hidden_size * (len(self.feature_layers) + 1)

    @property
    def row_params(self) -> int:
        """Parameters of one output row: `width` weights and a bias."""
        return self.width + 1

    def parameter_count(self, rows: int) -> int:
        """Parameters of a head with `rows` rows: LayerNorm, two Linear layers, rows x (width + 1)."""
        d = self.in_dim
        return 2 * d + d * self.inner + self.inner + self.inner * self.width + self.width + rows * self.row_params

    def memory_bytes(self, rows: int) -> int:
        """Bytes of a head with `rows` rows in memory: fp32 parameters and the vocabulary tables."""
        return 4 * self.parameter_count(rows) + TABLE_BYTES_PER_ROW * rows if rows > 0 else 0


BASE_SUFFIX = ".base.safetensors"


def base_companion(path: str | Path) -> Path:
    """Where the frozen base head of the artifact at `path` lives, if it has one: <stem>.base.safetensors."""
    path = Path(path)
    return path.with_name(path.stem + BASE_SUFFIX)


def artifact_bytes(path: str | Path) -> int:
    """Bytes of the artifact at `path` and of its base companion (what loading it for drafting reads)."""
    path, base = Path(path), base_companion(path)
    return path.stat().st_size + (base.stat().st_size if base.is_file() else 0)
