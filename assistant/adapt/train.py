"""Train the phrase head and write it as an artifact.

Contract:
- `row_targets(answers, features, vocab)` -> Long [N]: for each feature row (answer
  i, pending token a_t), the id of the LONGEST vocabulary row equal to the tokens
  right after a_t (-1 when none matches).
- `train_head(features, targets, embeddings, vocab, config)` -> (PhraseHead, report):
  cross-entropy on those targets over the live rows (AdamW, cosine schedule), a
  held-out split reported as top-1/top-k hit rates.
- `write_artifact(path, head, vocab, chain, meta, store_dtype, chain_p)` writes head +
  vocabulary + chain table (+ its probabilities) with metadata (target, hidden size, rows, training
  data, date); the pipeline that calls these stages lives in assistant/adapt/pipeline.py.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from assistant.adapt.distill import Answer, print_progress

@dataclass
class StageLog:
    progress: Callable[[str, int, int], None] = print_progress

    def say(self, msg: str) -> None:
        print(f"[train] {msg}", file=sys.stderr, flush=True)


def row_targets(answers: Sequence[Answer], seq: torch.Tensor, pos: torch.Tensor, vocab) -> torch.Tensor:
    from assistant.adapt.mine import longest_match

    index = vocab._index
    max_len = max((len(t) for t in index), default=1)
    cache: dict[int, list[int]] = {}
    out = torch.full((len(seq),), -1, dtype=torch.long)
    for k, (i, t) in enumerate(zip(seq.tolist(), pos.tolist())):
        ids = answers[i].answer_ids
        L = longest_match(ids, t + 1, index, max_len)
        if L:
            out[k] = index[tuple(ids[t + 1:t + 1 + L])]
    return out


@dataclass(frozen=True)
class HeadTrainConfig:
    layers: tuple[int, ...] = (-1,)
    inner: int = 1024
    width: int = 256
    epochs: int = 4
    lr: float = 2e-3
    batch_size: int = 512
    weight_decay: float = 0.01
    holdout: float = 0.03
    seed: int = 0


def train_head(x: torch.Tensor, roots: torch.Tensor, targets: torch.Tensor, embeddings: torch.Tensor,
               vocab, hidden: int, config: HeadTrainConfig, log: StageLog | None = None):
    """x: [N, L*H] features (any float dtype); embeddings: [V, H] the target's input embeddings."""
    from assistant.runtime.head import HeadConfig, PhraseHead

    log = log or StageLog()
    g = torch.Generator().manual_seed(config.seed)
    keep = (targets >= 0).nonzero().squeeze(1)
    perm = keep[torch.randperm(len(keep), generator=g)]
    n_val = max(int(len(perm) * config.holdout), min(256, len(perm) // 4))
    val, tr = perm[:n_val], perm[n_val:]
    torch.manual_seed(config.seed)
    head = PhraseHead(HeadConfig(hidden_size=hidden, feature_layers=tuple(config.layers),
                                 inner=config.inner, width=config.width), vocab.capacity)
    live = torch.tensor([r is not None for r in vocab.rows], dtype=torch.bool)
    with torch.no_grad():   # start from the log-prior of each row
        counts = torch.bincount(targets[tr], minlength=vocab.capacity).float()
        head.out.bias.copy_(torch.log(counts + 0.1) - math.log(counts.sum() + 1))
    emb = embeddings.detach().float()
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps = max(1, config.epochs * math.ceil(len(tr) / config.batch_size))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    mask = torch.where(live, 0.0, float("-inf"))
    step = 0
    t0 = time.perf_counter()
    for ep in range(config.epochs):
        head.train()
        order = tr[torch.randperm(len(tr), generator=g)]
        total = 0.0
        for b in range(0, len(order), config.batch_size):
            idx = order[b:b + config.batch_size]
            logits = head(x[idx].float(), emb[roots[idx]]) + mask
            loss = torch.nn.functional.cross_entropy(logits, targets[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            total += float(loss.detach()) * len(idx)
            if step % 20 == 0 or b + config.batch_size >= len(order):
                log.progress(f"train epoch {ep + 1}/{config.epochs} loss {total / (b + len(idx)):.3f}",
                             min(b + config.batch_size, len(order)), len(order))
    head.eval()
    report = evaluate_head(head, x[val], roots[val], targets[val], emb, mask)
    report.update({"train_positions": int(len(tr)), "val_positions": int(len(val)),
                   "seconds": round(time.perf_counter() - t0, 1), "epochs": config.epochs})
    log.say(f"head: {json.dumps(report)}")
    return head, report


@torch.no_grad()
def evaluate_head(head, x, roots, targets, emb, mask, ks: Sequence[int] = (1, 4, 8)) -> dict[str, float]:
    hits = {k: 0 for k in ks}
    for b in range(0, len(x), 2048):
        logits = head(x[b:b + 2048].float(), emb[roots[b:b + 2048]]) + mask
        top = logits.topk(min(max(ks), logits.shape[-1]), dim=-1).indices
        t = targets[b:b + 2048, None]
        for k in ks:
            hits[k] += int((top[:, :k] == t).any(-1).sum())
    n = max(len(x), 1)
    return {f"top{k}": round(hits[k] / n, 4) for k in ks}


def write_artifact(path: str | Path, head, vocab, chain: torch.Tensor | None, meta: dict[str, Any],
                   store_dtype: str = "fp16", chain_p: torch.Tensor | None = None) -> Path:
    """Save head + vocabulary (+ chain table) atomically and durably (assistant.profiles.atomic: temp file, fsync,
    rename, fsync the folder; readable by its owner only)."""
    from assistant.profiles.atomic import atomic_write_bytes
    from assistant.runtime.head import save_artifact

    path = Path(path)
    md = dict(meta)
    md.setdefault("date", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    md.setdefault("rows", len(vocab))
    md.setdefault("hidden_size", head.config.hidden_size)
    extra = {}
    if chain is not None:
        extra["chain"] = chain.to(torch.int32)
    if chain_p is not None:
        extra["chain_p"] = chain_p.to(torch.float16)
    atomic_write_bytes(path, save_artifact(None, head, vocab, md, extra=extra or None,
                                           dtype=torch.float16 if store_dtype == "fp16" else torch.float32))
    return path
