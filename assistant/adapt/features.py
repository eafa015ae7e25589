"""Hidden states by prefill: the head's training inputs.

Contract: `collect_features(target, answers, layers)` runs prompt+answer through
the frozen target (right-padded batches; causal attention makes the padding
invisible to real positions) and returns `Features`: for every answer position t
(answer token a_t is the pending "root"), `feats[k]` = the hidden states (the
requested layers, concatenated, [N, L*H], the target's dtype) of the position
that PREDICTED a_t, i.e. the last prompt token for t = 0; `roots[k]` = a_t;
`seq[k]`, `pos[k]` = which answer and which t. Only positions that have at least
one token after the root are kept. With `chunk`, each batch is prefilled `chunk`
tokens at a time on a KV cache, calling `pause()` between pieces (a background
adapter yields there). `save`/`load` use safetensors; `subset(keep_seq)` keeps some answers.
`paced_features(target, answers, layers, config, pause, on_stage)` is the adapter's way of
taking them (small pieces, pause() between, progress "features k/n"), and
`load_generation_features(answers_file, answers)` reads the hidden states that
assistant.adapt.distill kept from the generation itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from assistant.adapt.distill import Answer, print_progress

if TYPE_CHECKING:
    from assistant.adapt.config import CycleConfig


@dataclass
class Features:
    feats: torch.Tensor      # [N, L*H]
    roots: torch.Tensor      # [N] long
    seq: torch.Tensor        # [N] long, index into the answers
    pos: torch.Tensor        # [N] long, t within the answer
    layers: tuple[int, ...]

    def select_layers(self, layers: Sequence[int], hidden: int) -> torch.Tensor:
        """The columns of a subset of the stored layers, in the requested order."""
        idx = [self.layers.index(l) for l in layers]
        return torch.cat([self.feats[:, i * hidden:(i + 1) * hidden] for i in idx], dim=1)

    def subset(self, keep_seq: Sequence[int]) -> "Features":
        """The positions of answers `keep_seq` only, renumbered 0.. in that order."""
        remap = {s: i for i, s in enumerate(keep_seq)}
        mask = torch.tensor([s in remap for s in self.seq.tolist()], dtype=torch.bool)
        seq = torch.tensor([remap[s] for s in self.seq[mask].tolist()], dtype=torch.long)
        return Features(self.feats[mask], self.roots[mask], seq, self.pos[mask], self.layers)

    def save(self, path: str | Path, meta: dict[str, str] | None = None) -> None:
        """Write atomically (assistant.profiles.atomic: temp file, fsync, rename; private to the user)."""
        from safetensors.torch import save

        from assistant.profiles.atomic import atomic_write_bytes

        md = dict(meta or {})
        md["layers"] = ",".join(map(str, self.layers))
        atomic_write_bytes(path, save({"feats": self.feats.contiguous(), "roots": self.roots, "seq": self.seq,
                                       "pos": self.pos}, metadata=md))

    @classmethod
    def load(cls, path: str | Path) -> tuple["Features", dict[str, str]]:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            md = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
        layers = tuple(int(x) for x in md["layers"].split(","))
        return cls(t["feats"], t["roots"], t["seq"], t["pos"], layers), md


def _hidden_states(model, ids: torch.Tensor, layers: tuple[int, ...], chunk: int | None,
                   pause: Callable[[], None] | None) -> torch.Tensor:
    """[B, T, L*H] hidden states of `ids` [B, T]; with `chunk`, a prefill of `chunk` tokens at a time on
    a KV cache with pause() between the pieces (the same states up to rounding; a background adapter
    then never holds the CPU for a whole long answer). Only one position's logits are computed."""
    from transformers import DynamicCache

    T = ids.shape[1]
    if chunk is None or T <= chunk:
        hs = model(input_ids=ids, output_hidden_states=True, use_cache=False, logits_to_keep=1).hidden_states
        return torch.cat([hs[l] for l in layers], dim=-1)
    cache = DynamicCache(config=model.config)
    parts = []
    for start in range(0, T, chunk):
        if start and pause is not None:
            pause()
        part = ids[:, start:start + chunk]
        pos = torch.arange(start, start + part.shape[1], device=ids.device)[None].expand(part.shape[0], -1)
        hs = model(input_ids=part, cache=cache, position_ids=pos, use_cache=True, logits_to_keep=1,
                   output_hidden_states=True).hidden_states
        parts.append(torch.cat([hs[l] for l in layers], dim=-1))
    return torch.cat(parts, dim=1)


@torch.inference_mode()
def collect_features(target, answers: Sequence[Answer], layers: Sequence[int] = (-1,), batch_size: int = 8,
                     progress: Callable[[str, int, int], None] = print_progress, chunk: int | None = None,
                     pause: Callable[[], None] | None = None) -> Features:
    model = target.model
    layers = tuple(layers)
    order = sorted(range(len(answers)), key=lambda i: len(answers[i].prompt_ids) + len(answers[i].answer_ids))
    out_f, out_r, out_s, out_p = [], [], [], []
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        seqs = [answers[i].prompt_ids + answers[i].answer_ids for i in idx]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=model.device)
        stack = _hidden_states(model, ids, layers, chunk, pause)   # [B, T, L*H]
        for j, i in enumerate(idx):
            a = answers[i]
            P, n = len(a.prompt_ids), len(a.answer_ids)
            if n < 2:
                continue
            t = torch.arange(n - 1)
            out_f.append(stack[j, P - 1 + t].cpu())
            out_r.append(torch.tensor(a.answer_ids[: n - 1]))
            out_s.append(torch.full((n - 1,), i))
            out_p.append(t)
        progress("features (prefill)", min(b + batch_size, len(order)), len(order))
    if not out_f:
        h = model.config.hidden_size * len(layers)
        z = torch.zeros(0, dtype=torch.long)
        return Features(torch.zeros(0, h, dtype=model.dtype), z, z, z, layers)
    return Features(torch.cat(out_f), torch.cat(out_r), torch.cat(out_s), torch.cat(out_p), layers)


def paced_features(target, answers: Sequence[Answer], layers: Sequence[int], config: "CycleConfig",
                   pause: Callable[[], None], on_stage: Callable[[str], None] | None = None) -> Features:
    """collect_features in small chunks (`config.feature_batch` answers, `config.feature_chunk` tokens)
    with pause() between them; `on_stage("features k/n")` about every tenth of the way (the longest
    stage of a cycle: minutes for a few hundred answers on 2 cores)."""
    quiet = lambda *a: None  # noqa: E731
    parts = []
    step = max(1, config.feature_batch)
    for b in range(0, len(answers), step):
        pause()
        f = collect_features(target, answers[b:b + step], layers, batch_size=step, progress=quiet,
                             chunk=config.feature_chunk, pause=pause)
        parts.append(Features(f.feats, f.roots, f.seq + b, f.pos, f.layers))
        done = min(b + step, len(answers))
        if on_stage is not None and (done * 10 // len(answers) > b * 10 // len(answers) or done == len(answers)):
            on_stage(f"features {done}/{len(answers)}")
    if not parts:
        return collect_features(target, [], layers, progress=quiet)
    return Features(torch.cat([p.feats for p in parts]), torch.cat([p.roots for p in parts]),
                    torch.cat([p.seq for p in parts]), torch.cat([p.pos for p in parts]), tuple(layers))


def load_generation_features(out_path: str | Path, answers: Sequence[Answer] | None = None):
    """Features from generation-time hidden states (assistant.adapt.distill shards), or None if absent."""
    from safetensors import safe_open

    from assistant.runtime.jsonl import read_records

    out_path = Path(out_path)
    recs = read_records(out_path, missing_ok=False)
    keep = {a.key: i for i, a in enumerate(answers)} if answers is not None else {r["key"]: i for i, r in enumerate(recs)}
    feats, roots, seq, pos, layers = [], [], [], [], None
    handles: dict = {}
    for r in recs:
        if r["key"] not in keep or len(r["answer_ids"]) < 2:
            continue
        if "shard" not in r:
            return None
        if r["shard"] not in handles:
            handles[r["shard"]] = safe_open(str(out_path.parent / r["shard"]), framework="pt")
        h = handles[r["shard"]]
        layers = tuple(int(x) for x in h.metadata()["layers"].split(","))
        x = h.get_tensor(r["row"])
        n = len(r["answer_ids"])
        feats.append(x[: n - 1])
        roots.append(torch.tensor(r["answer_ids"][: n - 1]))
        seq.append(torch.full((n - 1,), keep[r["key"]]))
        pos.append(torch.arange(n - 1))
    if not feats:
        return None
    return Features(torch.cat(feats), torch.cat(roots), torch.cat(seq), torch.cat(pos), layers)
