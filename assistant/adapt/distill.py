"""Distillation data: the target's own greedy answers to training prompts.

Contract: `distill(target, prompts, out_path, config)` appends one JSON line per
prompt to `out_path` — {"key", "prompt_ids", "answer_ids"} (token ids; the
prompt with the chat template applied, the answer without the trailing EOS) —
generating in batches of similar prompt length, shortest first (`batch_greedy`: left
padding, greedy, the target's dtype, finished answers leave the batch), so the file is not
in prompt order. It is
resumable: prompts whose key is already in the file are skipped, and a partial
last line (a killed run) is ignored and rewritten. `load_answers(path)` reads
the file back. Progress goes through `progress(stage, done, total)`. The hidden states kept
from the generation are read back as features by assistant.adapt.features.load_generation_features.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

ProgressFn = Callable[[str, int, int], None]


def print_progress(stage: str, done: int, total: int) -> None:
    end = "\n" if done >= total else "\r"
    print(f"[train] {stage}: {done}/{total}", end=end, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DistillConfig:
    batch_size: int = 16
    max_new_tokens: int = 256
    system: str | None = None      # optional system message for the chat template
    # hidden-state layers kept from the generation itself (features for free, no second
    # prefill); () keeps none. Stored fp16 in <out stem>-feat-<n>.safetensors shards.
    feature_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Answer:
    key: str
    prompt_ids: list[int]
    answer_ids: list[int]


def load_answers(path: str | Path) -> list[Answer]:
    """Every complete line of a distillation file (a torn last line is skipped)."""
    from assistant.runtime.jsonl import read_records

    return [Answer(str(r["key"]), list(r["prompt_ids"]), list(r["answer_ids"])) for r in read_records(path)]


def _repair(path: Path) -> set[str]:
    """Drop a torn last line; return the keys already done."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return {a.key for a in load_answers(path)}


def encode_prompt(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return list(out)


def encode_answer(tokenizer, text: str) -> list[int]:
    """An answer's token ids as the target continues a chat prompt (no special tokens added)."""
    try:
        out = tokenizer(text, add_special_tokens=False)
    except TypeError:
        out = tokenizer(text)
    return list(out["input_ids"])


def distill(target, prompts: Sequence[tuple[str, str]], out_path: str | Path, config: DistillConfig = DistillConfig(),
            progress: ProgressFn = print_progress) -> int:
    """Generate answers for (key, prompt) pairs not yet in out_path; returns how many were added."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = _repair(out_path)
    tok = target.tokenizer
    # shortest prompts first: a batch is padded to its longest prompt and every decode step attends
    # over that width (chat prompts run from 20 to 2,500 tokens), so mixed lengths waste most of a batch
    todo = sorted(((k, encode_prompt(tok, p, config.system)) for k, p in prompts if k not in done),
                  key=lambda kp: len(kp[1]))
    total, added = len(prompts), 0
    progress("distill (answers)", len(prompts) - len(todo), total)
    model = target.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(target.eos_token_ids)[0]
    eos = target.eos_token_ids
    t0, ntok = time.perf_counter(), 0
    with open(out_path, "a", encoding="utf-8") as f:
        for b in range(0, len(todo), config.batch_size):
            batch = todo[b: b + config.batch_size]
            enc = [e for _, e in batch]
            layers = tuple(config.feature_layers)
            answers, feats = batch_greedy(model, enc, pad, eos, config.max_new_tokens, layers)
            rows_out, shard = [], {}
            for j, ((key, _), e, ans) in enumerate(zip(batch, enc, answers)):
                ntok += len(ans)
                rec = {"key": key, "prompt_ids": e, "answer_ids": ans}
                if layers and ans:
                    shard[f"r{j}"] = feats[j]
                    rec.update(shard=_shard_name(out_path, b // config.batch_size, len(done)), row=f"r{j}")
                rows_out.append(rec)
            if shard:
                from safetensors.torch import save_file
                save_file(shard, str(out_path.parent / rows_out[0]["shard"]),
                          metadata={"layers": ",".join(map(str, layers))})
            for rec in rows_out:
                f.write(json.dumps(rec) + "\n")
            f.flush()
            added += len(batch)
            rate = ntok / max(time.perf_counter() - t0, 1e-9)
            progress(f"distill (answers, {rate:.0f} tok/s)", total - len(todo) + added, total)
    return added


def batch_greedy(model, enc: Sequence[Sequence[int]], pad: int, eos: set[int], max_new_tokens: int,
                 layers: Sequence[int] = ()) -> tuple[list[list[int]], list]:
    """Greedy answers for a batch of prompts (left padding); finished rows leave the batch.

    Returns the answers (EOS excluded) and, per answer, fp16 [n, L*H] hidden states of
    the positions that predicted each answer token (None when `layers` is empty).
    """
    import torch
    from transformers import DynamicCache

    dev = model.device
    B, w = len(enc), max(len(e) for e in enc)
    ids = torch.tensor([[pad] * (w - len(e)) + list(e) for e in enc], device=dev)
    att = torch.tensor([[0] * (w - len(e)) + [1] * len(e) for e in enc], device=dev)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    answers: list[list[int]] = [[] for _ in range(B)]
    feats: list[list] = [[] for _ in range(B)]
    alive = list(range(B))
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True,
                    output_hidden_states=bool(layers), logits_to_keep=1)
        cur = pos[:, -1]
        for step in range(max_new_tokens):
            nxt = out.logits[:, -1].argmax(-1)
            f = torch.cat([out.hidden_states[l][:, -1] for l in layers], -1).half() if layers else None
            keep = []
            for j, b in enumerate(alive):
                t = int(nxt[j])
                if t in eos:
                    continue
                answers[b].append(t)
                if f is not None:
                    feats[b].append(f[j])
                keep.append(j)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) < len(alive):
                k = torch.tensor(keep, device=dev)
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[k], layer.values[k]
                att, nxt, cur = att[k], nxt[k], cur[k]
                alive = [alive[j] for j in keep]
            att = torch.cat([att, torch.ones(len(alive), 1, dtype=att.dtype, device=dev)], 1)
            cur = cur + 1
            out = model(input_ids=nxt[:, None], attention_mask=att, position_ids=cur[:, None], cache=cache,
                        use_cache=True, output_hidden_states=bool(layers))
    return answers, [torch.stack(f) if f else None for f in feats]


def _shard_name(out_path: Path, batch_no: int, resumed_from: int) -> str:
    return f"{out_path.stem}-feat-{resumed_from}-{batch_no}.safetensors"


def training_prompts(sources: Iterable[tuple[str, int, int]]) -> list[tuple[str, str]]:
    """(file, start line, stop line) triples -> [(key, prompt)] with keys 'file-stem:line'."""
    from assistant.runtime.jsonl import read_prompts

    out: list[tuple[str, str]] = []
    for path, start, stop in sources:
        recs, _ = read_prompts(path, limit=stop - start, offset=start)
        stem = Path(path).stem
        out.extend((f"{stem}:{r['line'] - 1}", r["prompt"]) for r in recs)
    return out
