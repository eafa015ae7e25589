"""The draft vocabulary: rows of target-token sequences with stable ids.

Contract: a row stands for a phrase as the target emits it: its target token ids
(canonical form: greedy longest-match of the phrase text against the target's
vocabulary, see `TokenTable.expand`), its text and usage statistics. Row ids are
stable for the life of the vocabulary; a removed row's id is reused by the next
`add`. `capacity` (the number of row slots) is what the head's output layer is
sized to. `save`/`load` use safetensors (a JSON header and raw buffers) with
metadata; nothing is pickled.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file


@dataclass
class Row:
    tokens: tuple[int, ...]
    text: str
    proposed: int = 0        # times offered in a tree
    accepted: int = 0        # times at least its first token was kept
    banked: int = 0          # target tokens it contributed, summed
    last_used: float = 0.0   # unix time of the last acceptance

    def utility(self, now: float, half_life_s: float = 7 * 24 * 3600.0) -> float:
        """Tokens banked, decayed by time since last use (used for eviction)."""
        age = max(now - self.last_used, 0.0) if self.last_used else half_life_s * 4
        return (self.banked + 0.1 * self.accepted) * 0.5 ** (age / half_life_s)


class DraftVocab:
    """Rows indexed by stable ids; None marks a free slot."""

    def __init__(self, rows: Iterable[Row | None] = (), meta: dict[str, Any] | None = None):
        self.rows: list[Row | None] = list(rows)
        self.meta: dict[str, Any] = dict(meta or {})
        self._index: dict[tuple[int, ...], int] = {}
        self.free: list[int] = []
        for i, r in enumerate(self.rows):
            if r is None:
                self.free.append(i)
            else:
                self._index[r.tokens] = i
        self.free.sort(reverse=True)

    # -- structure -------------------------------------------------------
    @property
    def capacity(self) -> int:
        return len(self.rows)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return tuple(tokens) in self._index

    def __getitem__(self, row_id: int) -> Row:
        row = self.rows[row_id]
        if row is None:
            raise KeyError(f"row {row_id} is free")
        return row

    def id_of(self, tokens: Sequence[int]) -> int | None:
        return self._index.get(tuple(tokens))

    def live_ids(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r is not None]

    def add(self, tokens: Sequence[int], text: str = "") -> int:
        """Add a row (or return the existing one's id); freed ids are reused first."""
        key = tuple(int(t) for t in tokens)
        if not key:
            raise ValueError("a row needs at least one token")
        if key in self._index:
            return self._index[key]
        row = Row(tokens=key, text=text)
        if self.free:
            rid = self.free.pop()
            self.rows[rid] = row
        else:
            rid = len(self.rows)
            self.rows.append(row)
        self._index[key] = rid
        return rid

    def remove(self, row_id: int) -> Row:
        row = self[row_id]
        del self._index[row.tokens]
        self.rows[row_id] = None
        self.free.append(row_id)
        self.free.sort(reverse=True)
        return row

    def record(self, row_id: int, proposed: int = 0, banked: int = 0, now: float | None = None) -> None:
        row = self[row_id]
        row.proposed += proposed
        if banked:
            row.accepted += 1
            row.banked += banked
            row.last_used = time.time() if now is None else now

    def token_matrix(self, pad: int = -1) -> torch.Tensor:
        """Long [capacity, max_len] of row tokens, `pad` after each row's end and for free rows."""
        width = max((len(r.tokens) for r in self.rows if r is not None), default=1)
        out = torch.full((max(self.capacity, 1), width), pad, dtype=torch.long)
        for i, r in enumerate(self.rows):
            if r is not None:
                out[i, : len(r.tokens)] = torch.tensor(r.tokens)
        return out

    # -- persistence -----------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """Tensors and string metadata for a safetensors file."""
        stats = torch.zeros(max(self.capacity, 1), 4, dtype=torch.float64)
        texts = []
        for i, r in enumerate(self.rows):
            texts.append(None if r is None else r.text)
            if r is not None:
                stats[i] = torch.tensor([r.proposed, r.accepted, r.banked, r.last_used], dtype=torch.float64)
        tensors = {"vocab.tokens": self.token_matrix().to(torch.int32), "vocab.stats": stats}
        meta = {"vocab.texts": json.dumps(texts), "vocab.meta": json.dumps(self.meta),
                "vocab.capacity": str(self.capacity)}
        return tensors, meta

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> "DraftVocab":
        texts = json.loads(meta["vocab.texts"])
        capacity = int(meta["vocab.capacity"])
        toks, stats = tensors["vocab.tokens"].long(), tensors["vocab.stats"]
        rows: list[Row | None] = []
        for i in range(capacity):
            if texts[i] is None:
                rows.append(None)
                continue
            t = tuple(int(x) for x in toks[i] if x >= 0)
            p, a, b, lu = stats[i].tolist()
            rows.append(Row(tokens=t, text=texts[i], proposed=int(p), accepted=int(a), banked=int(b), last_used=lu))
        return cls(rows, json.loads(meta.get("vocab.meta", "{}")))

    def save(self, path: str | Path) -> None:
        tensors, meta = self.state()
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "DraftVocab":
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith("vocab.")}
        return cls.from_state(tensors, meta)


@dataclass
class TokenTable:
    """The target vocabulary as raw bytes, for greedy longest-match expansion of phrase text."""

    by_bytes: dict[bytes, int]
    max_len: int
    id_bytes: list[bytes] = field(repr=False, default_factory=list)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "TokenTable":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        decoder = {c: b for b, c in bytes_to_unicode().items()}
        special = set(tokenizer.all_special_ids)
        vocab = tokenizer.get_vocab()
        id_bytes = [b""] * (max(vocab.values()) + 1)
        by_bytes: dict[bytes, int] = {}
        for piece, tid in vocab.items():
            if tid in special:
                continue
            if all(c in decoder for c in piece):
                raw = bytes(decoder[c] for c in piece)
            else:  # sentencepiece-style pieces
                raw = piece.replace("\u2581", " ").encode("utf-8")
            id_bytes[tid] = raw
            # keep the lowest id for duplicate byte strings (the canonical entry)
            if raw and (raw not in by_bytes or tid < by_bytes[raw]):
                by_bytes[raw] = tid
        return cls(by_bytes=by_bytes, max_len=max(len(b) for b in by_bytes), id_bytes=id_bytes)

    def expand(self, text: str) -> list[int]:
        """Greedy longest-match of `text` against the target vocabulary."""
        data = text.encode("utf-8")
        out, i = [], 0
        while i < len(data):
            for n in range(min(self.max_len, len(data) - i), 0, -1):
                tid = self.by_bytes.get(data[i: i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
            else:
                raise ValueError(f"byte {data[i]:#x} of {text!r} is not in the target vocabulary")
        return out

    def text_of(self, tokens: Sequence[int]) -> str:
        return b"".join(self.id_bytes[t] for t in tokens).decode("utf-8", errors="replace")


def row_summary(vocab: DraftVocab) -> dict[str, Any]:
    lengths = [len(r.tokens) for r in vocab.rows if r is not None]
    return {"rows": len(vocab), "capacity": vocab.capacity,
            "mean_tokens": sum(lengths) / max(len(lengths), 1), "meta": vocab.meta}


__all__ = ["Row", "DraftVocab", "TokenTable", "row_summary"]
