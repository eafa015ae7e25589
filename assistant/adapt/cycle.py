"""One online-adaptation cycle: the user's new accepted answers -> a new head version.

Contract: `run_cycle(profile, target=None, config, pause, on_stage)` -> report dict.
Stages (each announced through `on_stage(name)`, features also as "features k/n" on the
way; `pause()` is called between units of work so a worker can yield to the chat):
  1. answers   accepted answers with message id > state.last_msg_id (history store)
  2. features  prompt+answer prefill features (assistant.adapt.features); every `eval_every`-th
               new answer is held out of training to measure tokens per pass
  3. replay    training positions appended to the bounded replay buffer (assistant.adapt.replay)
  4. grow      usage observed on the new answers (decayed utility), new phrases mined
               over the replayed answers (assistant.adapt.mine), rows grown/evicted under
               profile.config.row_budget (assistant.adapt.grow), every change logged to
               adapter/vocab_log.jsonl, new rows initialised from the mean head trunk
  5. finetune  a short fine-tune of a COPY of the head on the replay buffer, each batch
               mixed with rehearsal positions: original-domain answers (prompts just past
               the anchor's, answered once and kept in adapter/rehearsal.*), so the head
               does not forget what it was trained on; the trunk learns at a tenth of the
               output rows' rate (`old_rows_scale` can also hold the existing rows back)
  6. check     tokens per pass (assistant.adapt.evaluate.simulate_decode, the runtime's drafter
               composition: phrase head + chain table + prompt lookup) before/after on
               (a) the user's held-out answers: this cycle's and those of earlier cycles
               (adapter/heldout.safetensors, the newest `held_out_keep`; never trained
               on) and (b) the anchor: a held-back slice of the ORIGINAL training data
               (prompts just past the base head's training range, answered by the
               target once and kept in adapter/anchor.*). The cycle is
               REJECTED when the anchor's tokens per pass drops by more than
               `config.margin` (relative, default 3%) or the held-out user answers get worse.
  7. publish   profile.heads.publish (immutable version + atomic CURRENT switch)
  8. state     adapter/state.json written atomically AFTER the publish: last message id,
               counters, the last cycle's report. A kill before it re-runs the same
               answers next time (the replay buffer skips messages it already holds).
One cycle at a time per profile (adapter/.lock; AdapterBusy when held). The base head is
the profile's current head, else the target's shipped head; with neither, AdapterError.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

ADAPTER_DIR = "adapter"
STATE_FILE = "state.json"
REPLAY_FILE = "replay.safetensors"
VOCAB_LOG = "vocab_log.jsonl"
LOCK_FILE = ".lock"
STAGE_FILE = "stage.json"
BUSY_FILE = "generating"
HELD_OUT_FILE = "heldout.safetensors"


class AdapterError(RuntimeError):
    """The adapter cannot run (no head to adapt, ...): a one-line reason."""


class _Collect:
    """A ChangeLog stand-in that keeps the records for one write at the end of the cycle."""

    def __init__(self, into: list[dict]):
        self.into = into

    def write(self, records) -> None:
        self.into.extend(records)


class AdapterBusy(AdapterError):
    """Another adapter holds the profile's adapter lock."""


class CycleCancelled(Exception):
    """Raised by a pause() callback to stop a cycle (nothing is published)."""


@dataclass(frozen=True)
class CycleConfig:
    dtype: str | None = None          # target dtype for features (None: the profile's)
    max_answer_tokens: int = 512
    max_new_rows: int = 2000          # rows mined per cycle at most
    mine_max_words: int = 3
    chain_width: int = 4
    replay_capacity: int = 20000      # positions
    steps: int = 1200                 # fine-tune steps at most
    epochs: float = 30.0              # 3 epochs (126 steps on 300 answers) left the loss at 4.5 nats and the
                                      # new rows half-trained: they displaced good rows on the anchor (-5.5%);
                                      # 600 -> 1200 steps: held-out user +22.1% -> +26.0% (BENCHMARKS.md)
    batch_size: int = 256
    lr: float = 1e-3                  # output rows
    trunk_lr_scale: float = 0.1       # the shared trunk moves slower: it serves the original domain too
    old_rows_scale: float = 1.0       # how far rows that existed before this cycle may move (0: frozen)
    eval_every: int = 5               # every 5th new answer is held out for the tokens-per-pass check
    held_out_keep: int = 60           # held-out answers kept across cycles (the newest): a cycle of 12
                                      # answers holds out 2, too few to judge on (20-cycle run, BENCHMARKS.md)
    anchor_prompts: int = 16
    anchor_max_new_tokens: int = 128
    anchor_sources: tuple[tuple[str, int, int], ...] | None = None   # None: just past the base head's training data
    rehearsal_prompts: int = 32       # original-domain answers mixed into every fine-tune (0: none)
    rehearsal_share: float = 0.3      # share of each fine-tune batch drawn from them
    margin: float = 0.03              # allowed relative drop of anchor tokens/pass
    max_nodes: int | None = None      # None: the runtime width on this device (auto, <= tree_width)
    feature_batch: int = 1            # answers per prefill, and
    feature_chunk: int | None = 64    # tokens per piece of it: pause() runs between pieces, so a chat answer
                                      # that starts meanwhile shares the CPU with at most one piece (~0.1 s)
    half_life_s: float = 7 * 24 * 3600.0
    seed: int = 0


# ---------------------------------------------------------------- state (no torch)
def adapter_dir(profile_path: str | Path) -> Path:
    return Path(profile_path) / ADAPTER_DIR


def copy_reset(src: str | Path, dst: str | Path) -> None:
    """Copy a profile folder with its adapter state reset (no head versions, replay buffer, state, change
    log, held-out set, lock or busy marker; the anchor and rehearsal slices are kept, they depend only
    on the base head): the experiments in scripts/ replay one user's history from the start."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("heads", REPLAY_FILE, STATE_FILE, VOCAB_LOG,
                                                            HELD_OUT_FILE, LOCK_FILE, BUSY_FILE))


def read_state(profile_path: str | Path) -> dict[str, Any]:
    p = adapter_dir(profile_path) / STATE_FILE
    try:
        return json.loads(p.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise AdapterError(f"{p}: damaged adapter state ({e}); delete it to start over") from e


def write_state(profile_path: str | Path, state: dict[str, Any]) -> None:
    from assistant.profiles.atomic import atomic_write_text

    state = dict(state, updated=time.time())
    atomic_write_text(adapter_dir(profile_path) / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def _count(state: dict, key: str) -> int:
    return int(state.get(key, 0) or 0)


# ---------------------------------------------------------------- helpers
class _Paced(Sequence):
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


_TABLES: dict[int, tuple[Any, Any]] = {}


def _token_table(tokenizer):
    """TokenTable.from_tokenizer, built once per tokenizer object (it walks the whole vocabulary)."""
    from assistant.runtime.vocab import TokenTable

    hit = _TABLES.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        hit = (tokenizer, TokenTable.from_tokenizer(tokenizer))
        _TABLES[id(tokenizer)] = hit
    return hit[1]


def _encode_answer(tokenizer, text: str) -> list[int]:
    try:
        out = tokenizer(text, add_special_tokens=False)
    except TypeError:
        out = tokenizer(text)
    return list(out["input_ids"])


def _subset(features, keep_seq: list[int]):
    """Features restricted to answers `keep_seq` (renumbered 0..)."""
    import torch

    from assistant.adapt.features import Features

    remap = {s: i for i, s in enumerate(keep_seq)}
    mask = torch.tensor([s in remap for s in features.seq.tolist()], dtype=torch.bool)
    seq = torch.tensor([remap[s] for s in features.seq[mask].tolist()], dtype=torch.long)
    return Features(features.feats[mask], features.roots[mask], seq, features.pos[mask], features.layers)


def _drafter(art, emb_module):
    """The drafter the runtime builds for this artifact (PhraseDrafter.from_artifact: its stored tree
    shape, best-first by the chain probabilities) with prompt lookup, so a cycle judges what will run."""
    from assistant.runtime.drafters import PhraseDrafter, PromptLookupDrafter, UnionDrafter

    return UnionDrafter(PhraseDrafter.from_artifact(art, emb_module), PromptLookupDrafter())


def _features(target, answers, layers, config, pause, on_stage=None):
    """collect_features in small chunks with pause() between them; `on_stage("features k/n")` about
    every tenth of the way (the longest stage: minutes for a few hundred answers on 2 cores)."""
    import torch

    from assistant.adapt.features import Features, collect_features

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


def load_held_out(path: Path, layers, target_name: str):
    """(answers, features) of the user's held-out answers from earlier cycles; ([], None) when there
    are none or they were taken with other feature layers or another target (or the file is damaged:
    the set starts over, nothing else depends on it)."""
    from safetensors import safe_open

    from assistant.adapt.distill import Answer
    from assistant.adapt.features import Features

    if not path.exists():
        return [], None
    try:
        with safe_open(str(path), framework="pt") as f:
            md = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
        if md.get("target") != target_name or md.get("layers") != ",".join(map(str, layers)):
            return [], None
        answers, p0, a0 = [], 0, 0
        for key, pl, al in zip(t["keys"].tolist(), t["prompt_len"].tolist(), t["answer_len"].tolist()):
            answers.append(Answer(str(key), t["prompt_ids"][p0:p0 + pl].tolist(), t["answer_ids"][a0:a0 + al].tolist()))
            p0, a0 = p0 + pl, a0 + al
        return answers, Features(t["feats"], t["roots"], t["seq"], t["pos"], tuple(layers))
    except Exception:  # noqa: BLE001 - a damaged file: start a new held-out set
        return [], None


def save_held_out(path: Path, answers, feats, target_name: str) -> None:
    """Atomically write the held-out set (one safetensors file: features and the answers' ids)."""
    import torch
    from safetensors.torch import save

    from assistant.profiles.atomic import atomic_write_bytes

    cat = lambda xs: torch.tensor([t for x in xs for t in x], dtype=torch.long)  # noqa: E731
    tensors = {"feats": feats.feats.contiguous(), "roots": feats.roots, "seq": feats.seq, "pos": feats.pos,
               "keys": torch.tensor([int(a.key) for a in answers], dtype=torch.long),
               "prompt_len": torch.tensor([len(a.prompt_ids) for a in answers], dtype=torch.long),
               "answer_len": torch.tensor([len(a.answer_ids) for a in answers], dtype=torch.long),
               "prompt_ids": cat(a.prompt_ids for a in answers), "answer_ids": cat(a.answer_ids for a in answers)}
    atomic_write_bytes(path, save(tensors, metadata={"target": target_name, "layers": ",".join(map(str, feats.layers))}))


def merge_held_out(old_answers, old_feats, new_answers, new_feats, keep: int):
    """The newest `keep` of old + new held-out answers (an old answer with a new one's key is the same
    answer seen again after a kill: the new copy wins)."""
    import torch

    from assistant.adapt.features import Features

    if old_feats is None or not old_answers:
        old_answers = []
    new_keys = {a.key for a in new_answers}
    both = list(old_answers) + list(new_answers)
    if old_answers:
        feats = Features(torch.cat([old_feats.feats, new_feats.feats]), torch.cat([old_feats.roots, new_feats.roots]),
                         torch.cat([old_feats.seq, new_feats.seq + len(old_answers)]),
                         torch.cat([old_feats.pos, new_feats.pos]), new_feats.layers)
    else:
        feats = new_feats
    idx = [i for i, a in enumerate(both) if i >= len(old_answers) or a.key not in new_keys]
    idx = idx[max(len(idx) - keep, 0):]
    return [both[i] for i in idx], _subset(feats, idx)


def anchor_sources(meta: dict[str, Any], n: int) -> tuple[list[tuple[str, int, int]], bool]:
    """Prompts of the base head's training data it was NOT trained on: (sources, unseen?)."""
    data = meta.get("training_data") or []
    for src in data:
        try:
            path, start, stop = src[0], int(src[1]), int(src[2])
        except (TypeError, ValueError, IndexError):
            continue
        if not Path(path).exists():
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = sum(1 for line in f if line.strip())
        if stop + n <= lines:
            return [(path, stop, stop + n)], True
        if start >= n:
            return [(path, start - n, start)], True
        return [(path, max(start, stop - n), stop)], False
    return [], False


def ensure_anchor(adir: Path, target, layers, meta: dict[str, Any], config: CycleConfig, pause, on_stage=None):
    """(answers, features, info) of the held-back original data; built once, then read from adapter/."""
    sources = None
    if config.anchor_sources is not None:
        sources = [tuple(s) for s in config.anchor_sources]
    return _ensure_slice(adir, "anchor", target, layers, meta, config, pause, config.anchor_prompts, 0, sources,
                         on_stage)


def ensure_rehearsal(adir: Path, target, layers, meta: dict[str, Any], config: CycleConfig, pause, on_stage=None):
    """(answers, features, info) of original-domain answers the fine-tune rehearses, so the head keeps
    what it knew (measured without them: the anchor's tokens/pass fell 9-15% after one arena cycle).
    The prompts come right after the anchor's, so the check stays held-out; with explicit
    `anchor_sources` there is no known place for them and nothing is rehearsed."""
    if config.rehearsal_prompts <= 0 or config.anchor_sources is not None:
        return [], None, {"available": False}
    return _ensure_slice(adir, "rehearsal", target, layers, meta, config, pause, config.rehearsal_prompts,
                         config.anchor_prompts, None, on_stage)


def _ensure_slice(adir: Path, name: str, target, layers, meta, config: CycleConfig, pause, n: int, skip: int,
                  sources, on_stage=None):
    """Built once: the target answers the slice's prompts ("<name> answers k/n") and their features are
    taken ("<name> features k/n"), both announced through `on_stage`."""
    say = on_stage or (lambda s: None)
    from assistant.adapt.distill import DistillConfig, distill, load_answers, training_prompts
    from assistant.adapt.features import Features

    fpath, apath, info_path = adir / f"{name}.safetensors", adir / f"{name}.jsonl", adir / f"{name}.json"
    answers = load_answers(apath)
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    if not answers or info.get("prompts") is None:
        unseen = True
        if sources is None:
            found, unseen = anchor_sources(meta, skip + n)
            sources = [(p, a + skip, b) for p, a, b in found if b - (a + skip) > 0] if unseen or not skip else []
        if not sources:
            return [], None, {"available": False, "reason": "the base head names no training data on this machine"}
        prompts = training_prompts(sources)
        pause()
        distill(target, prompts, apath, DistillConfig(batch_size=8, max_new_tokens=config.anchor_max_new_tokens),
                progress=lambda stage, done, total: say(f"{name} answers {done}/{total}"))
        answers = load_answers(apath)
        info = {"sources": [list(s) for s in sources], "unseen_by_base_head": unseen, "prompts": len(prompts)}
        from assistant.profiles.atomic import atomic_write_text

        atomic_write_text(info_path, json.dumps(info))
    feats = None
    if fpath.exists():
        feats, md = Features.load(fpath)
        if feats.layers != tuple(layers) or md.get("target") != target.name:
            feats = None
    if feats is None:
        feats = _features(target, answers, layers, config, pause, lambda s: say(f"{name} {s}"))
        feats.save(fpath, {"target": target.name})
    return answers, feats, {"available": True, **info, "answers": len(answers)}


def fine_tune(head, replay, vocab, emb, config: CycleConfig, pause, rehearsal=None,
              new_rows: Sequence[int] = (), on_stage=None) -> dict[str, Any]:
    """A short fine-tune of `head` (in place) on the replay buffer's positions, labelled under `vocab`;
    `rehearsal` (a ReplayBuffer of original-domain answers) fills `config.rehearsal_share` of each batch.
    Rows not in `new_rows` move `config.old_rows_scale` as far as the optimiser takes them."""
    import torch

    targets = replay.targets(vocab)
    keep = (targets >= 0).nonzero().squeeze(1)
    if len(keep) == 0:
        return {"positions": 0, "steps": 0}
    r_targets = rehearsal.targets(vocab) if rehearsal is not None and len(rehearsal) else None
    r_keep = (r_targets >= 0).nonzero().squeeze(1) if r_targets is not None else torch.zeros(0, dtype=torch.long)
    r_n = int(round(config.batch_size * config.rehearsal_share)) if len(r_keep) else 0
    g = torch.Generator().manual_seed(config.seed)
    live = torch.tensor([r is not None for r in vocab.rows], dtype=torch.bool)
    mask = torch.where(live, 0.0, float("-inf"))
    steps = min(config.steps, max(1, math.ceil(config.epochs * len(keep) / config.batch_size)))
    out_params = list(head.out.parameters())
    trunk_params = [p for p in head.parameters() if all(p is not q for q in out_params)]
    opt = torch.optim.AdamW([{"params": out_params, "lr": config.lr},
                             {"params": trunk_params, "lr": config.lr * config.trunk_lr_scale}], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    head.train()
    old = torch.ones(head.rows, dtype=torch.bool)
    old[torch.as_tensor(list(new_rows), dtype=torch.long)] = False
    w0, b0 = head.out.weight.detach().clone(), head.out.bias.detach().clone()
    losses = []
    for step in range(steps):
        pause()
        idx = keep[torch.randint(len(keep), (min(config.batch_size - r_n, len(keep)),), generator=g)]
        feats, roots, labels = replay.feats[idx], replay.roots[idx], targets[idx]
        if r_n:
            ridx = r_keep[torch.randint(len(r_keep), (r_n,), generator=g)]
            feats = torch.cat([feats, rehearsal.feats[ridx]])
            roots = torch.cat([roots, rehearsal.roots[ridx]])
            labels = torch.cat([labels, r_targets[ridx]])
        logits = head(feats.float(), emb[roots.long()]) + mask
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if config.old_rows_scale != 1.0:
            with torch.no_grad():
                for p, p0 in ((head.out.weight, w0), (head.out.bias, b0)):
                    p[old] = p0[old] + config.old_rows_scale * (p[old] - p0[old])
                    p0[old] = p[old]
        losses.append(float(loss.detach()))
        if on_stage is not None and ((step + 1) * 20 // steps > step * 20 // steps):
            on_stage(f"finetune step {step + 1}/{steps}")
    head.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"positions": int(len(keep)), "rehearsal_positions": int(len(r_keep)) if r_n else 0, "steps": steps,
            "loss_first": round(losses[0], 4),
            "loss_last": round(sum(tail) / len(tail), 4)}


def _runtime_width(target, cap: int) -> int:
    """The verify width the runtime uses on this device (assistant.session: auto engine and width <= cap),
    so the cycle judges a head at the tree size it will be used with."""
    from assistant.runtime.costmodel import runtime_plan

    return runtime_plan(target, cap).width


def _tpp(drafter, answers, feats, max_nodes, pause) -> float | None:
    from assistant.adapt.evaluate import simulate_decode

    if not answers:
        return None
    return round(simulate_decode(drafter, answers, feats, max_nodes, pause=pause)["tokens_per_pass"], 4)


# ---------------------------------------------------------------- the cycle
def run_cycle(profile, target=None, config: CycleConfig = CycleConfig(), pause: Callable[[], None] | None = None,
              on_stage: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    from filelock import FileLock, Timeout

    adir = adapter_dir(profile.path)
    adir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(adir / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout as e:
        raise AdapterBusy(f"{adir / LOCK_FILE}: another adapter cycle is running for this profile") from e
    stage = StageFile(adir / STAGE_FILE, on_stage)
    try:
        return _run_cycle(profile, adir, target, config, pause or (lambda: None), stage, clock)
    finally:
        stage.close()
        lock.release()


class StageFile:
    """Forwards each stage to `on_stage` and keeps adapter/stage.json current (atomically, at most once a
    second for progress within a stage), so `assistant adapt --status` in another process and the chat's
    panel show what a running cycle does; removed when the cycle ends."""

    def __init__(self, path: Path, on_stage: Callable[[str], None] | None):
        self.path, self.on_stage, self._last = path, on_stage, (None, 0.0)

    def __call__(self, text: str) -> None:
        if self.on_stage is not None:
            self.on_stage(text)
        name, now = text.split()[0].rstrip(":"), time.time()
        if name == self._last[0] and now - self._last[1] < 1.0:
            return
        self._last = (name, now)
        from assistant.profiles.atomic import atomic_write_text

        try:
            atomic_write_text(self.path, json.dumps({"stage": text, "time": now, "pid": os.getpid()}))
        except OSError:
            pass

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def read_stage(profile_path: Path) -> dict[str, Any] | None:
    """The running cycle's {"stage", "time", "pid"} (None when no cycle runs: absent, or its process died)."""
    try:
        data = json.loads((adapter_dir(profile_path) / STAGE_FILE).read_text())
        os.kill(int(data["pid"]), 0)
        return data
    except ProcessLookupError:
        return None
    except PermissionError:
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run_cycle(profile, adir: Path, target, config: CycleConfig, pause, on_stage, clock) -> dict[str, Any]:
    import torch

    from assistant.adapt.distill import Answer
    from assistant.adapt.grow import ChangeLog, GrowConfig, apply, candidate_gains, mean_trunk_init, merge_chain, \
        observe_usage, plan
    from assistant.adapt.mine import MineConfig, chain_table, mine
    from assistant.adapt.replay import ReplayBuffer
    from assistant.adapt.train import write_artifact
    from assistant.runtime.defaults import shipped_head
    from assistant.runtime.head import Artifact, load_artifact
    t_start = time.time()
    state = read_state(profile.path)
    cycle_no = _count(state, "cycles") + 1
    since = int(state.get("last_msg_id", 0) or 0)

    on_stage("answers")
    new = profile.history.accepted_answers(since)
    if not new:
        return {"status": "nothing", "cycle": None, "pending": 0, "last_msg_id": since}
    last_id = max(m for m, _, _ in new)

    if target is None:
        from assistant.runtime.budget import resolve_dtype
        from assistant.runtime.target import load_target

        on_stage("load")
        dtype = resolve_dtype(config.dtype or profile.config.dtype)   # a profile's "auto" is resolved here too
        target = load_target(profile.config.target, dtype, progress=lambda *a: None)
    base_path = profile.heads.current() or shipped_head(target.name)
    if base_path is None:
        raise AdapterError(f"{profile.path}: no head to adapt (no version in heads/ and no shipped head for "
                           f"{target.name}); train one with `assistant train`")
    art = load_artifact(base_path)
    if art.head.config.hidden_size != target.hidden_size:
        raise AdapterError(f"{base_path}: head reads hidden size {art.head.config.hidden_size}, "
                           f"target {target.name} has {target.hidden_size}")
    layers = tuple(art.head.config.feature_layers)
    hidden = target.hidden_size
    max_nodes = config.max_nodes or _runtime_width(target, profile.config.tree_width)
    emb_module = target.model.get_input_embeddings()
    emb = emb_module.weight.detach().float().cpu()
    table = _token_table(target.tokenizer)

    # 1-2: answers and features
    on_stage("features")
    answers = []
    for msg_id, ctx, text in new:
        pause()
        ids = _encode_answer(target.tokenizer, text)[: config.max_answer_tokens]
        answers.append(Answer(str(msg_id), target.encode_chat(ctx), ids))
    msg_ids = [m for m, _, _ in new]
    k = max(1, config.eval_every)
    eval_idx = [i for i in range(len(answers)) if len(answers) >= k and i % k == k - 1]
    train_idx = [i for i in range(len(answers)) if i not in set(eval_idx)]
    feats_all = _features(target, answers, layers, config, pause, on_stage)
    f_train = _subset(feats_all, train_idx)
    f_eval = _subset(feats_all, eval_idx)
    ans_train = [answers[i] for i in train_idx]
    ans_eval = [answers[i] for i in eval_idx]

    # 3: replay
    on_stage("replay")
    replay = ReplayBuffer.open(adir / REPLAY_FILE, config.replay_capacity)
    reset = replay.ensure_layout(layers, hidden, target.name)
    added_records = replay.add(f_train.feats, f_train.roots, [a.answer_ids for a in ans_train], f_train.seq,
                               f_train.pos, [msg_ids[i] for i in train_idx])
    replay.save()

    # 4: grow / evict
    on_stage("grow")
    pause()
    now = clock()
    head, vocab = copy.deepcopy(art.head), copy.deepcopy(art.vocab)
    budget = profile.config.row_budget
    seqs_new = _Paced([a.answer_ids for a in ans_train], pause)
    observe_usage(vocab, seqs_new, now)
    seqs_window = _Paced(replay.sequences(), pause)
    pause()
    mined = mine(seqs_window, table, config.max_new_rows, existing=vocab,
                 config=MineConfig(max_words=config.mine_max_words))
    gains = candidate_gains(seqs_window, vocab, mined)
    the_plan = plan(vocab, [(c, gains[c]) for c in mined], budget, now, GrowConfig(half_life_s=config.half_life_s))
    vlog = ChangeLog(adir / VOCAB_LOG)
    changes: list[dict] = []      # written with the cycle's own record at its end: a killed cycle logs nothing

    def init_fn(rows):
        tg = replay.targets(vocab)
        return mean_trunk_init(head, replay.feats, replay.roots, emb, tg, rows)

    added, evicted = apply(head, vocab, the_plan, table, now, _Collect(changes), cycle_no, init_fn)
    pause()
    new_chain, new_chain_p = chain_table(seqs_window, vocab, config.chain_width, with_probs=True)
    chain, chain_p = merge_chain(art.extra.get("chain"), new_chain, set(added) | set(evicted), config.chain_width,
                                 old_p=art.extra.get("chain_p"), new_p=new_chain_p)

    # 5: fine-tune
    on_stage("finetune")
    reh_answers, reh_feats, reh_info = ensure_rehearsal(adir, target, layers, art.meta, config, pause,
                                                        lambda s: on_stage(f"finetune: {s}"))
    rehearsal = None
    if reh_feats is not None:
        rehearsal = ReplayBuffer.empty(adir / "rehearsal-buffer", len(reh_feats.roots) + 1,
                                       dim=reh_feats.feats.shape[1], layers=layers,
                                       hidden=hidden, target=target.name)
        rehearsal.add(reh_feats.feats, reh_feats.roots, [a.answer_ids for a in reh_answers], reh_feats.seq,
                      reh_feats.pos, list(range(1, len(reh_answers) + 1)))
    torch.manual_seed(config.seed)
    ft = fine_tune(head, replay, vocab, emb, config, pause, rehearsal, added, on_stage)

    # 6: check
    on_stage("check")
    pause()
    anchor_answers, anchor_feats, anchor_info = ensure_anchor(adir, target, layers, art.meta, config, pause,
                                                              lambda s: on_stage(f"check: {s}"))
    before_d = _drafter(art, emb_module)
    after_d = _drafter(Artifact(head=head, vocab=vocab, meta=art.meta, extra={"chain": chain, "chain_p": chain_p}),
                       emb_module)
    prev_answers, prev_feats = load_held_out(adir / HELD_OUT_FILE, layers, target.name)
    held_answers, held_feats = merge_held_out(prev_answers, prev_feats, ans_eval, f_eval, config.held_out_keep)
    in_sample = not held_answers
    ev_answers, ev_feats = (held_answers, held_feats) if held_answers else (ans_train, f_train)
    pause()
    on_stage("check 1/4: user answers, old head")
    user_before = _tpp(before_d, ev_answers, ev_feats, max_nodes, pause)
    on_stage("check 2/4: user answers, new head")
    user_after = _tpp(after_d, ev_answers, ev_feats, max_nodes, pause)
    pause()
    on_stage("check 3/4: original data, old head")
    anchor_before = _tpp(before_d, anchor_answers, anchor_feats, max_nodes, pause) if anchor_feats is not None else None
    on_stage("check 4/4: original data, new head")
    anchor_after = _tpp(after_d, anchor_answers, anchor_feats, max_nodes, pause) if anchor_feats is not None else None
    reasons = []
    if anchor_before is not None and anchor_after < anchor_before * (1 - config.margin):
        reasons.append(f"anchor tokens/pass fell {anchor_before} -> {anchor_after} "
                       f"(more than {config.margin:.0%})")
    if user_before is not None and not in_sample and user_after < user_before * (1 - config.margin):
        reasons.append(f"held-out user tokens/pass fell {user_before} -> {user_after}")
    accepted = not reasons

    report: dict[str, Any] = {
        "cycle": cycle_no, "status": "published" if accepted else "rejected", "reasons": reasons,
        "base": str(base_path), "answers": len(new), "train_answers": len(ans_train), "eval_answers": len(ans_eval),
        "held_out_answers": len(held_answers), "eval_in_sample": in_sample, "first_msg_id": min(msg_ids), "last_msg_id": last_id,
        "replay": {"added": added_records, "records": len(replay), "capacity": replay.capacity, "reset": reset},
        "mined": len(mined), "grown": len(added), "evicted": len(evicted),
        "rows": len(vocab), "capacity": vocab.capacity, "row_budget": budget,
        "finetune": ft,
        "tokens_per_pass": {"user_before": user_before, "user_after": user_after,
                            "anchor_before": anchor_before, "anchor_after": anchor_after},
        "anchor": anchor_info, "rehearsal": reh_info, "margin": config.margin, "max_nodes": max_nodes,
    }

    if ans_eval:
        save_held_out(adir / HELD_OUT_FILE, held_answers, held_feats, target.name)

    # 7: publish
    version = None
    if accepted:
        on_stage("publish")
        tmp = adir / f".candidate-{cycle_no}.safetensors"
        meta = dict(art.meta)
        meta.update({"rows": len(vocab), "adapted": {"cycle": cycle_no, "base": str(base_path),
                                                     "answers": len(new), "last_msg_id": last_id,
                                                     "grown": len(added), "evicted": len(evicted),
                                                     "tokens_per_pass": report["tokens_per_pass"]}})
        meta.pop("date", None)
        write_artifact(tmp, head, vocab, chain, meta, store_dtype="fp32", chain_p=chain_p)
        version = profile.heads.publish(tmp, {"adapter_cycle": cycle_no, "rows": len(vocab),
                                              "capacity": vocab.capacity, "row_budget": budget,
                                              "tokens_per_pass": report["tokens_per_pass"]})
        tmp.unlink(missing_ok=True)
        on_stage("published")
    report["version"] = version
    report["seconds"] = round(time.time() - t_start, 2)
    vlog.write(changes + [{"op": "cycle", "cycle": cycle_no, "time": time.time(), "status": report["status"],
                           "version": version, "grown": len(added), "evicted": len(evicted), "rows": len(vocab)}])

    # 8: state (after the publish)
    on_stage("state")
    last = {k: report[k] for k in ("cycle", "status", "reasons", "answers", "grown", "evicted", "rows", "capacity",
                                   "row_budget", "tokens_per_pass", "version", "seconds")}
    last["time"] = clock()
    write_state(profile.path, {
        **state, "last_msg_id": last_id, "cycles": cycle_no,
        "published": _count(state, "published") + (1 if accepted else 0),
        "rejected": _count(state, "rejected") + (0 if accepted else 1),
        "grown": _count(state, "grown") + (len(added) if accepted else 0),
        "evicted": _count(state, "evicted") + (len(evicted) if accepted else 0),
        "version": version or state.get("version"), "last_cycle": last, "last_error": None,
    })
    return report


__all__ = ["AdapterBusy", "AdapterError", "CycleCancelled", "CycleConfig", "adapter_dir", "copy_reset", "read_state",
           "run_cycle",
           "write_state"]
