"""A bounded on-disk replay buffer of head-training positions.

Contract: `ReplayBuffer.open(path, capacity)` reads `path` (a safetensors file)
or starts empty. A record is one answer position: the target's features of the
position that predicted the pending token (`feats`, fp16, [N, L*H]), the pending
token (`roots`), the FOLLOWING answer tokens (`follow`, [N, F], -1 padded), the
history message id it came from (`msg`) and its position in that answer (`pos`).
Labels are not stored: `targets(vocab)` recomputes the longest matching draft
row for every record (assistant.adapt.train.row_targets), so the buffer stays valid after
the vocabulary grows or evicts rows. `add(...)` appends, skipping message ids
already held (a cycle that was killed and rerun adds nothing twice), and drops
the oldest records beyond `capacity`. `save()` writes atomically (temp file,
fsync, os.replace, fsync the folder): a crash leaves the old or the new buffer.
A buffer recorded for other feature layers or another hidden size is reset by
`ensure_layout` (the features would not fit the head). `sequences()` rebuilds
each held answer's token ids from its records (for mining).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

FOLLOW = 12          # following tokens kept per position (longer than any row)


@dataclass
class ReplayBuffer:
    path: Path
    capacity: int
    feats: torch.Tensor
    roots: torch.Tensor
    follow: torch.Tensor
    msg: torch.Tensor
    pos: torch.Tensor
    layers: tuple[int, ...] = (-1,)
    hidden: int = 0
    target: str = ""

    # -- construction ------------------------------------------------------
    @classmethod
    def empty(cls, path: str | Path, capacity: int, dim: int = 0, layers: Sequence[int] = (-1,), hidden: int = 0,
              target: str = "") -> "ReplayBuffer":
        z = torch.zeros(0, dtype=torch.long)
        return cls(Path(path), capacity, torch.zeros(0, dim, dtype=torch.float16), z.int(),
                   torch.zeros(0, FOLLOW, dtype=torch.int32), z, z.int(), tuple(layers), hidden, target)

    @classmethod
    def open(cls, path: str | Path, capacity: int = 20000) -> "ReplayBuffer":
        """Read the buffer at `path`; a missing file is an empty buffer, a damaged one raises ValueError."""
        path = Path(path)
        if not path.exists():
            return cls.empty(path, capacity)
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                md = f.metadata() or {}
                t = {k: f.get_tensor(k) for k in f.keys()}
            buf = cls(path, capacity, t["feats"], t["roots"], t["follow"], t["msg"], t["pos"],
                      tuple(json.loads(md["layers"])), int(md["hidden"]), md.get("target", ""))
        except Exception as e:  # noqa: BLE001 - safetensors raises several types
            raise ValueError(f"{path}: damaged replay buffer ({type(e).__name__}: {str(e)[:120]})") from e
        buf._trim()
        return buf

    def __len__(self) -> int:
        return int(self.roots.shape[0])

    def ensure_layout(self, layers: Sequence[int], hidden: int, target: str) -> bool:
        """Reset the buffer when it holds features of other layers/size/target; True if it was reset."""
        layers = tuple(layers)
        if (self.layers, self.hidden, self.target) == (layers, hidden, target) and self.feats.shape[1] == hidden * len(layers):
            return False
        fresh = ReplayBuffer.empty(self.path, self.capacity, hidden * len(layers), layers, hidden, target)
        self.__dict__.update({k: v for k, v in fresh.__dict__.items() if k != "path"})
        return True

    @property
    def messages(self) -> set[int]:
        return set(self.msg.unique().tolist())

    # -- writing -----------------------------------------------------------
    def add(self, feats: torch.Tensor, roots: torch.Tensor, answers: Sequence[Sequence[int]], seq: torch.Tensor,
            pos: torch.Tensor, msg_ids: Sequence[int]) -> int:
        """Append positions (assistant.adapt.features.Features layout: seq indexes `answers`/`msg_ids`).

        Returns how many records were added (positions of already-held messages are skipped).
        """
        held = self.messages
        keep = torch.tensor([int(msg_ids[s]) not in held for s in seq.tolist()], dtype=torch.bool)
        if not bool(keep.any()):
            return 0
        feats, roots, seq, pos = feats[keep], roots[keep], seq[keep], pos[keep]
        follow = torch.full((len(seq), FOLLOW), -1, dtype=torch.int32)
        for k, (s, t) in enumerate(zip(seq.tolist(), pos.tolist())):
            nxt = list(answers[s][t + 1: t + 1 + FOLLOW])
            if nxt:
                follow[k, : len(nxt)] = torch.tensor(nxt, dtype=torch.int32)
        self.feats = torch.cat([self.feats, feats.to(torch.float16).cpu()])
        self.roots = torch.cat([self.roots, roots.to(torch.int32).cpu()])
        self.follow = torch.cat([self.follow, follow])
        self.msg = torch.cat([self.msg, torch.tensor([int(msg_ids[s]) for s in seq.tolist()], dtype=torch.long)])
        self.pos = torch.cat([self.pos, pos.to(torch.int32).cpu()])
        self._trim()
        return int(keep.sum())

    def _trim(self) -> None:
        """Keep the newest `capacity` records (the oldest go first)."""
        extra = len(self) - self.capacity
        if extra > 0:
            for name in ("feats", "roots", "follow", "msg", "pos"):
                setattr(self, name, getattr(self, name)[extra:].contiguous())

    def save(self) -> None:
        from safetensors.torch import save

        from assistant.profiles.atomic import atomic_write_bytes

        data = save({"feats": self.feats.contiguous(), "roots": self.roots.contiguous(),
                     "follow": self.follow.contiguous(), "msg": self.msg.contiguous(), "pos": self.pos.contiguous()},
                    metadata={"layers": json.dumps(list(self.layers)), "hidden": str(self.hidden),
                              "target": self.target, "records": str(len(self)), "follow": str(FOLLOW)})
        atomic_write_bytes(self.path, data)

    # -- reading -----------------------------------------------------------
    def targets(self, vocab, index: torch.Tensor | None = None) -> torch.Tensor:
        """Long [N]: the longest vocabulary row equal to each record's following tokens (-1: none)."""
        from assistant.adapt.distill import Answer
        from assistant.adapt.train import row_targets

        idx = torch.arange(len(self)) if index is None else index
        pseudo = []
        for k in idx.tolist():
            f = [int(x) for x in self.follow[k].tolist() if x >= 0]
            pseudo.append(Answer("", [], [int(self.roots[k])] + f))
        n = len(pseudo)
        return row_targets(pseudo, torch.arange(n), torch.zeros(n, dtype=torch.long), vocab)

    def sequences(self) -> list[list[int]]:
        """Each held answer's tokens (as far as its records reach), oldest message first."""
        by_msg: dict[int, dict[int, int]] = {}
        tail: dict[int, tuple[int, list[int]]] = {}
        for m, p, r, k in zip(self.msg.tolist(), self.pos.tolist(), self.roots.tolist(), range(len(self))):
            by_msg.setdefault(m, {})[p] = r
            if m not in tail or p > tail[m][0]:
                tail[m] = (p, [x for x in self.follow[k].tolist() if x >= 0])
        out = []
        for m in sorted(by_msg):
            d = by_msg[m]
            seq = [d[p] for p in sorted(d)]
            last_p, fol = tail[m]
            if sorted(d) == list(range(min(d), last_p + 1)):
                seq += fol            # contiguous: the last record's following tokens end the answer
            out.append(seq)
        return out


__all__ = ["FOLLOW", "ReplayBuffer"]
