"""Train the phrase head and write it as an artifact.

Contract:
- `row_targets(answers, features, vocab)` -> Long [N]: for each feature row (answer
  i, pending token a_t), the id of the LONGEST vocabulary row equal to the tokens
  right after a_t (-1 when none matches).
- `fit(head, batches, steps, emb, mask, lr, ...)`: the one fitting loop (AdamW, cosine schedule,
  cross-entropy over the live rows) that both of these run:
- `train_head(features, targets, embeddings, vocab, config)` -> (PhraseHead, report): a new head,
  epochs over the training positions, a held-out split reported as top-1/top-k hit rates;
- `fine_tune(head, replay, vocab, emb, config, pause, rehearsal, new_rows, on_stage)` -> report: the
  online adapter's short fine-tune of a head on the replay buffer mixed with rehearsal positions.
- `write_artifact(path, head, vocab, chain, meta, store_dtype, chain_p)` writes head +
  vocabulary + chain table (+ its probabilities) with metadata (target, hidden size, rows, training
  data; no date) as canonical bytes: the same inputs write the same file (`canonical_safetensors`);
  the pipeline that calls these stages lives in assistant/adapt/pipeline.py.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from assistant.adapt.config import CycleConfig
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


def fit(head, batches: Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], steps: int, emb: torch.Tensor,
        mask: torch.Tensor, lr: float, *, trunk_lr_scale: float = 1.0, weight_decay: float = 0.0, warmup: int = 0,
        old_rows_scale: float = 1.0, new_rows: Sequence[int] = (), pause: Callable[[], None] | None = None,
        on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """The one fitting loop (in place; returns the loss of every step): AdamW with the output rows at `lr`
    and the trunk at `lr * trunk_lr_scale`, a cosine schedule over `steps` after `warmup` linear steps,
    cross-entropy of `head(x, emb[roots]) + mask` on the labels of each (x, roots, labels) batch until
    `steps` or the batches run out. Rows not in `new_rows` move `old_rows_scale` as far as the optimiser
    takes them (1: freely, 0: frozen). `pause()` runs before every step, `on_step(step, loss)` after it."""
    out_params = list(head.out.parameters())
    trunk_params = [p for p in head.parameters() if all(p is not q for q in out_params)]
    opt = torch.optim.AdamW([{"params": out_params, "lr": lr}, {"params": trunk_params, "lr": lr * trunk_lr_scale}],
                            weight_decay=weight_decay)

    def factor(s: int) -> float:
        warm = min(1.0, (s + 1) / warmup) if warmup else 1.0
        return warm * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    if old_rows_scale != 1.0:
        old = torch.ones(head.rows, dtype=torch.bool)
        old[torch.as_tensor(list(new_rows), dtype=torch.long)] = False
        w0, b0 = head.out.weight.detach().clone(), head.out.bias.detach().clone()
    head.train()
    losses: list[float] = []
    for step in range(steps):
        if pause is not None:
            pause()
        batch = next(batches, None)
        if batch is None:
            break
        x, roots, labels = batch
        logits = head(x.float(), emb[roots.long()]) + mask
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if old_rows_scale != 1.0:
            with torch.no_grad():
                for p, p0 in ((head.out.weight, w0), (head.out.bias, b0)):
                    p[old] = p0[old] + old_rows_scale * (p[old] - p0[old])
                    p0[old] = p[old]
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    head.eval()
    return losses


def live_mask(vocab) -> torch.Tensor:
    """0 for the vocabulary's live rows, -inf for free ones (added to the head's logits)."""
    live = torch.tensor([r is not None for r in vocab.rows], dtype=torch.bool)
    return torch.where(live, 0.0, float("-inf"))


def train_head(x: torch.Tensor, roots: torch.Tensor, targets: torch.Tensor, embeddings: torch.Tensor,
               vocab, hidden: int, config: HeadTrainConfig, log: StageLog | None = None):
    """x: [N, L*H] features (any float dtype); embeddings: [V, H] the target's input embeddings.
    Epochs over a shuffled training split (`fit` with a 100-step warm-up), then top-k on the held-out one."""
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
    with torch.no_grad():   # start from the log-prior of each row
        counts = torch.bincount(targets[tr], minlength=vocab.capacity).float()
        head.out.bias.copy_(torch.log(counts + 0.1) - math.log(counts.sum() + 1))
    emb = embeddings.detach().float()
    per_epoch = math.ceil(len(tr) / config.batch_size)
    steps = max(1, config.epochs * per_epoch)
    mask = live_mask(vocab)

    def epochs():
        for _ in range(config.epochs):
            order = tr[torch.randperm(len(tr), generator=g)]
            for b in range(0, len(order), config.batch_size):
                idx = order[b:b + config.batch_size]
                yield x[idx], roots[idx], targets[idx]

    total = [0.0]

    def progress(step: int, loss: float) -> None:
        ep, b = divmod(step, per_epoch)
        b *= config.batch_size
        n = min(config.batch_size, len(tr) - b)
        total[0] = (0.0 if b == 0 else total[0]) + loss * n
        if (step + 1) % 20 == 0 or b + config.batch_size >= len(tr):
            log.progress(f"train epoch {ep + 1}/{config.epochs} loss {total[0] / (b + n):.3f}",
                         min(b + config.batch_size, len(tr)), len(tr))

    t0 = time.perf_counter()
    fit(head, epochs(), steps, emb, mask, config.lr, weight_decay=config.weight_decay, warmup=100, on_step=progress)
    report = evaluate_head(head, x[val], roots[val], targets[val], emb, mask)
    report.update({"train_positions": int(len(tr)), "val_positions": int(len(val)),
                   "seconds": round(time.perf_counter() - t0, 1), "epochs": config.epochs})
    log.say(f"head: {json.dumps(report)}")
    return head, report


def fine_tune(head, replay, vocab, emb: torch.Tensor, config: CycleConfig, pause: Callable[[], None],
              rehearsal=None, new_rows: Sequence[int] = (), on_stage: Callable[[str], None] | None = None
              ) -> dict[str, Any]:
    """A short fine-tune of `head` (in place) on the replay buffer's positions, labelled under `vocab`
    (`fit` on batches drawn with replacement); `rehearsal` (a ReplayBuffer of original-domain answers)
    fills `config.rehearsal_share` of each batch. The trunk learns at `config.trunk_lr_scale` of the rows'
    rate; rows not in `new_rows` move `config.old_rows_scale` as far. Progress: "finetune step k/n"."""
    torch.manual_seed(config.seed)
    targets = replay.targets(vocab)
    keep = (targets >= 0).nonzero().squeeze(1)
    if len(keep) == 0:
        return {"positions": 0, "steps": 0}
    r_targets = rehearsal.targets(vocab) if rehearsal is not None and len(rehearsal) else None
    r_keep = (r_targets >= 0).nonzero().squeeze(1) if r_targets is not None else torch.zeros(0, dtype=torch.long)
    r_n = int(round(config.batch_size * config.rehearsal_share)) if len(r_keep) else 0
    g = torch.Generator().manual_seed(config.seed)
    steps = min(config.steps, max(1, math.ceil(config.epochs * len(keep) / config.batch_size)))

    def sampled():
        while True:
            idx = keep[torch.randint(len(keep), (min(config.batch_size - r_n, len(keep)),), generator=g)]
            feats, roots, labels = replay.feats[idx], replay.roots[idx], targets[idx]
            if r_n:
                ridx = r_keep[torch.randint(len(r_keep), (r_n,), generator=g)]
                feats = torch.cat([feats, rehearsal.feats[ridx]])
                roots = torch.cat([roots, rehearsal.roots[ridx]])
                labels = torch.cat([labels, r_targets[ridx]])
            yield feats, roots, labels

    def progress(step: int, loss: float) -> None:
        if on_stage is not None and ((step + 1) * 20 // steps > step * 20 // steps):
            on_stage(f"finetune step {step + 1}/{steps}")

    losses = fit(head, sampled(), steps, emb, live_mask(vocab), config.lr, trunk_lr_scale=config.trunk_lr_scale,
                 old_rows_scale=config.old_rows_scale, new_rows=new_rows, pause=pause, on_step=progress)
    tail = losses[-max(1, len(losses) // 10):]
    return {"positions": int(len(keep)), "rehearsal_positions": int(len(r_keep)) if r_n else 0, "steps": steps,
            "loss_first": round(losses[0], 4),
            "loss_last": round(sum(tail) / len(tail), 4)}


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
    rename, fsync the folder; readable by its owner only), as canonical bytes (`canonical_safetensors`)."""
    from assistant.profiles.atomic import atomic_write_bytes
    from assistant.runtime.head import save_artifact

    path = Path(path)
    md = dict(meta)
    md.setdefault("rows", len(vocab))
    md.setdefault("hidden_size", head.config.hidden_size)
    extra = {}
    if chain is not None:
        extra["chain"] = chain.to(torch.int32)
    if chain_p is not None:
        extra["chain_p"] = chain_p.to(torch.float16)
    data = save_artifact(None, head, vocab, md, extra=extra or None,
                         dtype=torch.float16 if store_dtype == "fp16" else torch.float32)
    atomic_write_bytes(path, canonical_safetensors(data))
    return path


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors file with its string metadata in key order: the writer emits it in hash-map
    order, which changes from one process to the next. The tensors' entries and bytes are unchanged;
    the header is padded with spaces to 8 bytes as the writer does."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    if "__metadata__" in header:
        header = {"__metadata__": dict(sorted(header["__metadata__"].items())),
                  **{k: v for k, v in header.items() if k != "__metadata__"}}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n:]
