"""Grow and evict draft-vocabulary rows under the row budget, and keep the head in step.

Contract:
- `observe_usage(vocab, seqs, now)` credits every live row with the tokens it
  would bank on the user's new answers (assistant.adapt.mine.simulate: a perfect head
  proposing the longest matching row after each pending token) through
  `DraftVocab.record`, so `Row.utility` (banked tokens decayed by time since last
  use) reflects what the user writes now.
- `plan(vocab, candidates, budget, now, config)` -> `Plan(add, evict)`: new rows
  fill free budget first; beyond it a candidate replaces the live row of lowest
  decayed utility only when the tokens it would bank (`gain`) exceed that
  utility by `config.margin` (ties among equal utilities evict the highest row
  id first: mined rows are added best first). After the plan, live rows <= budget
  and no row slot at or beyond `budget` is ever created: the budget is never
  exceeded (a budget lowered below the live rows evicts down to it).
- `apply(head, vocab, plan, init_trunk, table, log, cycle, now)` removes and adds
  the rows (freed ids are reused), resizes the head's output layer, initialises
  every new/reused row from `init_trunk` (see `mean_trunk_init`; never random),
  records each added row's gain as its first usage, and appends one JSON line
  per change to `log` (assistant/adapt/grow.ChangeLog).
- `mean_trunk_init(head, feats, roots, emb, targets, rows)` -> {row: [width+1]}:
  the weight of a new row is the mean head-trunk output at the positions where
  its phrase follows minus the mean over all positions (scaled to the median
  norm of the live rows) and its bias the median live bias, so a new row scores
  high exactly where its phrase is due. Centring matters: trunk outputs share a
  large common component, and an uncentred mean makes a new row fire in every
  context (measured: the first fine-tune loss was 13.2 nats, and the original
  domain's tokens per pass fell 9%). A row with no such position gets a zero
  weight and the lowest live bias.
- `merge_chain(old, new, changed, width, old_p, new_p)` -> (chain, chain_p) combines an
  existing phrase-chain table with one mined from new answers, dropping links to rows that
  changed, and keeps each link's probability (the runtime drafts best-first by them).
- `grow_cycle(art, replay, new_seqs, tokenizer, emb, budget, now, config, cycle, pause)` -> Growth:
  the adapter cycle's grow stage on a COPY of the artifact's head and vocabulary: usage observed on
  the new answers, phrases mined over the replayed answers (assistant.adapt.mine), the plan applied
  (new rows from `quiet_init`, or `mean_trunk_init` with CycleConfig.new_row_init "mean_trunk"), the chain
  table merged; the changes are returned, not logged, so a killed cycle logs nothing. pause() runs between answers of every pure-Python pass.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from assistant.profiles.atomic import write_chunks


@dataclass(frozen=True)
class GrowConfig:
    half_life_s: float = 7 * 24 * 3600.0   # utility decay (Row.utility)
    margin: float = 1.0                    # a candidate must bank this many tokens more than its victim
    min_gain: int = 2                      # candidates banking fewer tokens are not added
    max_changes: int = 2000                # additions per cycle at most


@dataclass
class Plan:
    add: list[tuple[tuple[int, ...], int]] = field(default_factory=list)   # (tokens, gain)
    evict: list[tuple[int, float]] = field(default_factory=list)           # (row id, utility)


class ChangeLog:
    """Append-only JSON Lines log of vocabulary changes (flushed and fsynced per batch)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def write(self, records: Iterable[dict]) -> None:
        lines = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            write_chunks(fd, lines.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[dict]:
        from assistant.runtime.jsonl import read_records

        return read_records(self.path)       # a torn last line from a crash is skipped


def observe_usage(vocab, seqs: Sequence[Sequence[int]], now: float | None = None) -> dict[int, int]:
    """Credit live rows with the tokens they bank on `seqs`; returns {row id: tokens}."""
    from assistant.adapt.mine import simulate

    now = time.time() if now is None else now
    rows = set(vocab._index)
    if not rows:
        return {}
    banked, _, _ = simulate(seqs, rows, max(map(len, rows)))
    out = {}
    for toks, n in banked.items():
        rid = vocab.id_of(toks)
        if rid is not None and n > 0:
            vocab.record(rid, proposed=0, banked=int(n), now=now)
            out[rid] = int(n)
    return out


def candidate_gains(seqs: Sequence[Sequence[int]], vocab, candidates: Sequence[tuple[int, ...]]) -> dict:
    """Tokens each candidate would bank on `seqs` next to the live rows (perfect-head simulation)."""
    from assistant.adapt.mine import simulate

    rows = set(vocab._index) | set(candidates)
    if not rows:
        return {}
    banked, _, _ = simulate(seqs, rows, max(map(len, rows)))
    return {c: int(banked.get(c, 0)) for c in candidates}


def plan(vocab, candidates: Sequence[tuple[tuple[int, ...], int]], budget: int, now: float,
         config: GrowConfig = GrowConfig()) -> Plan:
    """Which rows to add and which to evict (see module docstring)."""
    out = Plan()
    live = vocab.live_ids()
    victims = sorted(((vocab.rows[i].utility(now, config.half_life_s), -i) for i in live))
    vi = 0
    n_live = len(live)
    # a budget below the live rows: evict the least useful down to it
    while n_live > budget and vi < len(victims):
        u, neg = victims[vi]
        out.evict.append((-neg, u))
        vi += 1
        n_live -= 1
    # slots at or beyond the budget may hold no new row
    slots = sum(1 for i, r in enumerate(vocab.rows) if r is None and i < budget) + max(0, budget - vocab.capacity)
    slots += sum(1 for rid, _ in out.evict if rid < budget)
    cands = sorted(((g, c) for c, g in candidates if g >= config.min_gain and c not in vocab),
                   key=lambda x: -x[0])[: config.max_changes]
    for gain, toks in cands:
        if slots > 0 and n_live < budget:
            out.add.append((toks, gain))
            slots -= 1
            n_live += 1
            continue
        # replace the least useful live row whose slot lies inside the budget
        while vi < len(victims) and -victims[vi][1] >= budget:
            vi += 1
        if vi >= len(victims):
            break
        u, neg = victims[vi]
        if gain <= u + config.margin:
            break                      # candidates are sorted: none later beats this victim
        out.evict.append((-neg, u))
        out.add.append((toks, gain))
        vi += 1
    return out


@torch.no_grad()
def mean_trunk_init(head, feats: torch.Tensor, roots: torch.Tensor, emb: torch.Tensor, targets: torch.Tensor,
                    rows: Sequence[int]) -> dict[int, torch.Tensor]:
    """{row id: [width+1]} initial output weights for `rows` (see module docstring)."""
    live_w = head.out.weight
    norms = live_w.norm(dim=1)
    nz = norms[norms > 0]
    scale = float(nz.median()) if len(nz) else 1.0
    bias = head.out.bias
    med_bias = float(bias.median()) if len(bias) else 0.0
    low_bias = float(bias.min()) if len(bias) else 0.0
    want = set(int(r) for r in rows)
    sel = torch.tensor([int(t) in want for t in targets.tolist()], dtype=torch.bool) if len(targets) else \
        torch.zeros(0, dtype=torch.bool)
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    center = torch.zeros(head.config.width)
    if len(targets):
        sample = torch.randperm(len(targets), generator=torch.Generator().manual_seed(0))[:4096]
        center = head.trunk(feats[sample].float(), emb[roots[sample].long()].float()).mean(0)
    if bool(sel.any()):
        idx = sel.nonzero().squeeze(1)
        for b in range(0, len(idx), 1024):
            i = idx[b:b + 1024]
            h = head.trunk(feats[i].float(), emb[roots[i].long()].float())
            for t, v in zip(targets[i].tolist(), h):
                sums[t] = sums.get(t, 0) + v
                counts[t] = counts.get(t, 0) + 1
    out = {}
    width = head.config.width
    for r in want:
        if r in sums:
            m = sums[r] / counts[r] - center
            w = m / m.norm().clamp_min(1e-6) * scale
            out[r] = torch.cat([w, torch.tensor([med_bias])])
        else:
            out[r] = torch.cat([torch.zeros(width), torch.tensor([low_bias])])
    return out


def quiet_init(head, rows: Sequence[int], below: float) -> dict[int, torch.Tensor]:
    """{row id: [width+1]} for `rows`: a zero weight and a bias `below` under the lowest bias of the other
    rows, so a new row outscores no old one anywhere until the fine-tune raises it where its phrase follows.
    Measured on a new-domain user (BENCHMARKS.md, A12): the mean-trunk init cost the original domain 27% of its
    tokens per pass before any training step (the new rows fire in its contexts too) and the cycle was rejected;
    started quiet, the same cycle kept the original domain within its margin."""
    want = set(int(r) for r in rows)
    bias = head.out.bias.detach()
    others = torch.tensor([i not in want for i in range(len(bias))], dtype=torch.bool)
    low = float(bias[others].min()) if bool(others.any()) else 0.0
    return {r: torch.cat([torch.zeros(head.config.width), torch.tensor([low - below])]) for r in want}


def apply(head, vocab, plan_: Plan, table, now: float, log: ChangeLog | None = None, cycle: int = 0,
          init_fn=None) -> tuple[list[int], list[int]]:
    """Evict, then add, then resize the head and initialise the new rows; returns (added ids, evicted ids).

    `init_fn(row_ids) -> {row id: [width+1]}` is called after the vocabulary changed (the caller
    computes mean-trunk inits there, with labels under the new vocabulary).
    """
    records = []
    evicted = []
    for rid, u in plan_.evict:
        row = vocab.remove(rid)
        evicted.append(rid)
        records.append({"op": "evict", "cycle": cycle, "time": now, "row": rid, "text": row.text,
                        "tokens": list(row.tokens), "utility": round(u, 4), "banked": row.banked,
                        "accepted": row.accepted})
    added = []
    for toks, gain in plan_.add:
        text = table.text_of(toks) if table is not None else ""
        rid = vocab.add(toks, text)
        vocab.record(rid, proposed=0, banked=int(gain), now=now)   # its mined gain is its first usage
        added.append(rid)
        records.append({"op": "add", "cycle": cycle, "time": now, "row": rid, "text": text,
                        "tokens": list(toks), "gain": int(gain)})
    if vocab.capacity != head.rows:
        head.resize(vocab.capacity)
    inits = init_fn(added) if (init_fn is not None and added) else {}
    with torch.no_grad():
        for rid in added:
            v = inits.get(rid)
            if v is None:
                head.out.weight[rid] = 0.0
                head.out.bias[rid] = float(head.out.bias.min())
            else:
                head.out.weight[rid] = v[:-1]
                head.out.bias[rid] = v[-1]
    if log is not None:
        log.write(records)
    return added, evicted


def merge_chain(old: torch.Tensor | None, new: torch.Tensor, changed: Iterable[int], width: int,
                old_p: torch.Tensor | None = None, new_p: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """New links first, then old ones still valid; links from or to `changed` rows are dropped from `old`.

    Returns (Long [cap, width] chain, Float [cap, width] P(next row | row)). A link keeps the probability
    of the table it came from; old links of a table without probabilities get 1/width (best-first
    drafting skips links of probability 0, so they must not be 0).
    """
    cap = new.shape[0]
    out = torch.full((cap, width), -1, dtype=torch.long)
    probs = torch.zeros((cap, width))
    bad = set(int(c) for c in changed)
    for a in range(cap):
        seen: list[int] = []
        ps: list[float] = []
        for j, b in enumerate(new[a].tolist()):
            if b >= 0 and b not in seen:
                seen.append(b)
                ps.append(float(new_p[a, j]) if new_p is not None else 1.0 / width)
        if old is not None and a < old.shape[0] and a not in bad:
            for j, b in enumerate(old[a].tolist()):
                if b >= 0 and b not in bad and b not in seen:
                    seen.append(b)
                    ps.append(float(old_p[a, j]) if old_p is not None and a < old_p.shape[0] else 1.0 / width)
        seen, ps = seen[:width], ps[:width]
        if seen:
            out[a, : len(seen)] = torch.tensor(seen)
            probs[a, : len(ps)] = torch.tensor(ps)
    return out, probs


__all__ = ["ChangeLog", "GrowConfig", "Plan", "apply", "candidate_gains", "mean_trunk_init", "merge_chain",
           "observe_usage", "plan", "quiet_init"]


class Paced(Sequence):
    """A list whose iteration calls pause() before every item, so the pure-Python passes over answers
    (mining, usage, the chain table) yield to the chat between answers instead of between stages."""

    def __init__(self, items: Sequence, pause: Callable[[], None]):
        self.items, self.pause = items, pause

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        for x in self.items:
            self.pause()
            yield x


class _Collect:
    """A ChangeLog stand-in that keeps the records for one write at the end of the cycle."""

    def __init__(self, into: list[dict]):
        self.into = into

    def write(self, records) -> None:
        self.into.extend(records)


_TABLES: dict[int, tuple[Any, Any]] = {}


def token_table(tokenizer):
    """TokenTable.from_tokenizer, built once per tokenizer object (it walks the whole vocabulary)."""
    from assistant.runtime.vocab import TokenTable

    hit = _TABLES.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        hit = (tokenizer, TokenTable.from_tokenizer(tokenizer))
        _TABLES[id(tokenizer)] = hit
    return hit[1]


@dataclass
class Growth:
    head: Any
    vocab: Any
    mined: int
    added: list[int]
    evicted: list[int]
    chain: torch.Tensor
    chain_p: torch.Tensor
    changes: list[dict]


def grow_cycle(art, replay, new_seqs: Sequence[Sequence[int]], tokenizer, emb: torch.Tensor, budget: int, now: float,
               config, cycle: int, pause: Callable[[], None]) -> Growth:
    """`config`: an assistant.adapt.config.CycleConfig (max_new_rows, mine_max_words, chain_width, half_life_s)."""
    import copy

    from assistant.adapt.mine import MineConfig, chain_table, mine

    table = token_table(tokenizer)
    head, vocab = copy.deepcopy(art.head), copy.deepcopy(art.vocab)
    observe_usage(vocab, Paced(new_seqs, pause), now)
    window = Paced(replay.sequences(), pause)
    pause()
    mined = mine(window, table, config.max_new_rows, existing=vocab, config=MineConfig(max_words=config.mine_max_words))
    gains = candidate_gains(window, vocab, mined)
    the_plan = plan(vocab, [(c, gains[c]) for c in mined], budget, now, GrowConfig(half_life_s=config.half_life_s))
    changes: list[dict] = []

    def init_fn(rows):
        if config.new_row_init == "mean_trunk":
            return mean_trunk_init(head, replay.feats, replay.roots, emb, replay.targets(vocab), rows)
        return quiet_init(head, rows, config.quiet_below)

    added, evicted = apply(head, vocab, the_plan, table, now, _Collect(changes), cycle, init_fn)
    pause()
    new_chain, new_chain_p = chain_table(window, vocab, config.chain_width, with_probs=True)
    chain, chain_p = merge_chain(art.extra.get("chain"), new_chain, set(added) | set(evicted), config.chain_width,
                                 old_p=art.extra.get("chain_p"), new_p=new_chain_p)
    return Growth(head, vocab, len(mined), added, evicted, chain, chain_p, changes)
