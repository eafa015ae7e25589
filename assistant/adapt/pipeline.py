"""`assistant train` as resumable stages in one work directory.

Contract: `run_pipeline(config, log, tune)` -> path of the written artifact, or TrainError (a
ValueError the command line prints as one line) for a build that cannot run as asked. Stages and
their outputs (in config.workdir, default assistant.runtime.fetch.cache_dir()/train/<target>/):
  (a) answers.jsonl       the target's greedy answers (assistant.adapt.distill; resumable per prompt):
      the training prompts, then (with `tune`) the held-out ones in batches of their own, so they never
      change the training answers
  (b) vocab-<h>.safetensors  mined rows + chain table (assistant.adapt.mine), h = hash of its inputs
  (c) features: kept from the generation (answers-feat-*.safetensors) when it stored
      the layers the head reads, else features-<h>.safetensors by prefill (assistant.adapt.features)
  (d)+(e) the trained head written with its vocabulary and chain table (assistant.adapt.train); its
      metadata names the training data by file name, sha256 and record range (never a path) and
      <head stem>.slices.jsonl beside it holds the HELD_BACK prompts that follow the training range
      (assistant.adapt.datasets): the online adapter's anchor and rehearsal prompts
  (f) with `tune` (assistant.adapt.tune.TuneConfig): the tree shape picked on the held-out answers
      (which must not be training data) is stored in the artifact's "drafter" metadata
With `distill_only` it stops after (a) and returns the answers file.
A stage whose output exists for the same inputs is skipped, so rerunning the same
command after an interruption continues where it stopped.
Reproducible: the artifact holds no time (no date, no training seconds) and its header is
canonical (assistant.adapt.train.write_artifact), so the same config run from an empty work
directory on the same machine with the same torch thread count writes identical bytes. (CPU
reductions split by thread count; a resumed distillation batches differently; either may move
the last bits.)
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from assistant.adapt.config import CycleConfig
from assistant.errors import UserError
from assistant.adapt.tune import TuneConfig, drafter_meta, held_out_key, tune_tree_shape
from assistant.runtime.fetch import DEFAULT_ALIASES

HELD_BACK = CycleConfig().anchor_prompts + CycleConfig().rehearsal_prompts   # the adapter's anchor, then rehearsal
MACHINE_FIELDS = ("sources", "workdir", "out")     # paths of the machine that trained: not in the metadata
# (a target given as a checkpoint dir is recorded by the dir's name, as the artifact's "target" is)


class TrainError(UserError, ValueError):
    """A build that cannot run as asked (no data, held-out answers that are training data, a bad recipe):
    the command line prints its one line."""


@dataclass(frozen=True)
class TrainConfig:
    target: str = "default"
    dtype: str = "fp32"              # target precision for distillation and features
    # (file, first record, stop record) per source; 0-based record indices; at least one (no default:
    # the data sets live wherever the user keeps them)
    sources: tuple[tuple[str, int, int], ...] = ()
    max_new_tokens: int = 256
    gen_batch: int = 16
    rows: int = 8000
    max_words: int = 3
    chain_width: int = 4
    layers: tuple[int, ...] = (-1,)   # hidden states the head reads
    # hidden states kept from the generation itself (must include `layers` to skip the prefill stage)
    feature_layers: tuple[int, ...] = (-1, 8, 16, 24)
    inner: int = 1024
    width: int = 256
    epochs: int = 4
    lr: float = 2e-3
    batch_size: int = 512
    holdout: float = 0.03
    seed: int = 0
    store_dtype: str = "fp16"        # artifact precision of the head weights
    workdir: str | None = None
    out: str | None = None           # artifact path (default: <workdir>/head-<hash>.safetensors)
    threads: int = 0                 # torch threads (0: leave torch's default)
    distill_only: bool = False       # stop after stage (a) and return the answers file


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def workdir_for(config: TrainConfig, target_name: str) -> Path:
    from assistant.runtime.fetch import cache_dir

    return Path(config.workdir) if config.workdir else cache_dir() / "train" / target_name


def run_pipeline(config: TrainConfig, log=None, tune: TuneConfig | None = None) -> Path:
    import torch

    from assistant.adapt.datasets import describe, write_slices
    from assistant.adapt.distill import DistillConfig, distill, load_answers, training_prompts
    from assistant.adapt.features import Features, collect_features, load_generation_features
    from assistant.adapt.mine import MineConfig, chain_table, coverage, mine
    from assistant.adapt.train import HeadTrainConfig, StageLog, row_targets, train_head, write_artifact
    from assistant.runtime.layout import set_layout
    from assistant.runtime.target import load_target
    from assistant.runtime.vocab import DraftVocab, TokenTable

    log = log or StageLog()
    if not config.sources:
        raise TrainError("no training data: give --data FILE[:START:STOP]")
    prompts = training_prompts(config.sources)
    held = training_prompts([tune.held_out]) if tune else []
    overlap = {k for k, _ in held} & {k for k, _ in prompts}
    if overlap:
        raise TrainError(f"the tree shape's held-out answers {held_out_key(tune.held_out)} include "
                         f"{len(overlap)} training prompts")
    if config.threads:
        torch.set_num_threads(config.threads)
    target = load_target(config.target, config.dtype)
    if target.device.type == "cpu" and config.dtype == "fp32":
        # batched generation runs 16-32 rows per forward: with [in, out] weights MKL stops
        # repacking every weight per call (measured 38 -> 48 tok/s at batch 16; assistant.runtime.layout)
        set_layout(target.model, "in")
    work = workdir_for(config, target.name)
    work.mkdir(parents=True, exist_ok=True)
    log.say(f"work directory {work}")

    # (a) distillation: the training prompts, then the held-out ones
    answers_path = work / "answers.jsonl"
    dc = DistillConfig(config.gen_batch, config.max_new_tokens, feature_layers=tuple(config.feature_layers))
    distill(target, prompts, answers_path, dc, progress=log.progress)
    if held:
        distill(target, held, answers_path, dc, progress=log.progress)
    if config.distill_only:
        log.say(f"answers: {answers_path} (distill only)")
        return answers_path
    order = {k: i for i, (k, _) in enumerate(prompts)}   # prompt order, whatever order they were generated in
    answers = sorted((a for a in load_answers(answers_path) if a.key in order), key=lambda a: order[a.key])
    keys = set(order)
    seqs = [a.answer_ids for a in answers]
    n_tok = sum(map(len, seqs))
    log.say(f"answers: {len(answers)} ({n_tok} tokens)")

    # (b) mining
    table = TokenTable.from_tokenizer(target.tokenizer)
    vh = _hash([sorted(keys), config.rows, config.max_words, config.chain_width, config.dtype, config.max_new_tokens])
    vpath = work / f"vocab-{vh}.safetensors"
    if vpath.exists():
        vocab = DraftVocab.load(vpath)
        from safetensors import safe_open
        with safe_open(str(vpath), framework="pt") as f:
            chain, chain_p = f.get_tensor("chain").long(), f.get_tensor("chain_p")
        log.say(f"vocabulary: {len(vocab)} rows (cached {vpath.name})")
    else:
        t0 = time.perf_counter()
        rows = mine(seqs, table, config.rows, config=MineConfig(max_words=config.max_words))
        vocab = DraftVocab(meta={"mined_from": len(seqs), "max_words": config.max_words})
        for r in rows:
            vocab.add(r, table.text_of(r))
        chain, chain_p = chain_table(seqs, vocab, config.chain_width, with_probs=True)
        from safetensors.torch import save_file
        vt, vmeta = vocab.state()
        vt["chain"], vt["chain_p"] = chain, chain_p
        save_file(vt, str(vpath), metadata=vmeta)
        log.say(f"vocabulary: {len(vocab)} rows mined in {time.perf_counter() - t0:.0f}s, "
                f"perfect-head tokens/pass on the training answers "
                f"{coverage(seqs, set(vocab._index))['tokens_per_pass']:.2f}")

    # (c) features
    fh = _hash([sorted(keys), config.dtype, config.max_new_tokens, list(config.layers)])
    fpath = work / f"features-{fh}.safetensors"
    gen = load_generation_features(answers_path, answers)
    if gen is not None and set(config.layers) <= set(gen.layers):
        feats = gen
        log.say(f"features: {len(feats.roots)} positions (kept from the generation)")
    elif fpath.exists():
        feats, _ = Features.load(fpath)
        log.say(f"features: {len(feats.roots)} positions (cached {fpath.name})")
    else:
        feats = collect_features(target, answers, config.layers, progress=log.progress)
        feats.save(fpath)
        log.say(f"features: {len(feats.roots)} positions")

    # (d) train
    targets = row_targets(answers, feats.seq, feats.pos, vocab)
    hidden = target.hidden_size
    x = feats.select_layers(config.layers, hidden)
    # every head-training setting the pipeline's config names (by field name), the rest at HeadTrainConfig's defaults
    hc = HeadTrainConfig(**{f.name: getattr(config, f.name) for f in fields(HeadTrainConfig) if hasattr(config, f.name)})
    emb = target.model.get_input_embeddings().weight
    head, report = train_head(x, feats.roots, targets, emb, vocab, hidden, hc, log)

    # (e) artifact
    out = Path(config.out) if config.out else work / f"head-{_hash(asdict(config))}.safetensors"
    named = config.target if config.target.lower() in DEFAULT_ALIASES else target.name    # load_target's naming
    meta = {"target": target.name, "target_dtype": config.dtype, "hidden_size": hidden, "rows": len(vocab),
            "training_data": describe(config.sources), "answers": len(answers), "answer_tokens": n_tok,
            "train_config": {k: v for k, v in asdict(config).items() if k not in MACHINE_FIELDS} | {"target": named},
            "report": {k: v for k, v in report.items() if k != "seconds"},   # a time: never in the artifact
            "parameters": head.parameter_count(), "share_of_target": head.parameter_count() / target.num_parameters}
    write_artifact(out, head, vocab, chain, meta, config.store_dtype, chain_p)
    slices = write_slices(out, config.sources, HELD_BACK)
    log.say(f"held-back prompts: {slices}" if slices else "held-back prompts: none (the data has no prompts "
            "beyond the training range): the online adapter will have no anchor check")
    log.say(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {head.parameter_count() / 1e6:.2f}M parameters, "
            f"{100 * head.parameter_count() / target.num_parameters:.3f}% of the target)")

    # (f) tree shape
    if tune:
        tune_stage(target, out, answers_path, [k for k, _ in held], tune, config, log)
    return out


def tune_stage(target, out: Path, answers_path: Path, keys: list[str], tune: TuneConfig, config: TrainConfig,
               log) -> dict:
    """Pick the tree shape of the head written at `out` on the held-out answers `keys` (never training
    data: run_pipeline checks) as stored, fp16 rounding included, and rewrite it with that shape in its
    "drafter" metadata."""
    from assistant.adapt.distill import load_answers
    from assistant.adapt.features import collect_features, load_generation_features
    from assistant.adapt.train import write_artifact
    from assistant.runtime.head import load_artifact

    art = load_artifact(out)
    order = {k: i for i, k in enumerate(keys)}
    answers = sorted((a for a in load_answers(answers_path) if a.key in order), key=lambda a: order[a.key])
    if not answers:
        raise TrainError(f"no held-out answers {held_out_key(tune.held_out)} (the data set has no such records)")
    layers = tuple(art.head.config.feature_layers)
    feats = load_generation_features(answers_path, answers)
    if feats is None or not set(layers) <= set(feats.layers):
        feats = collect_features(target, answers, layers, progress=log.progress)
    best, tpp, _ = tune_tree_shape(
        art, target.model.get_input_embeddings(), answers, feats, target.hidden_size, tune.grid(), tune.nodes,
        on_result=lambda s, v: log.say(f"tree shape {json.dumps(s)}: {v:.3f} tokens/pass"))
    drafter = drafter_meta(best, tpp, tune.held_out)
    write_artifact(out, art.head, art.vocab, art.extra.get("chain"), {**art.meta, "drafter": drafter},
                   config.store_dtype, art.extra.get("chain_p"))
    log.say(f"tree shape: {json.dumps(drafter)} ({len(answers)} held-out answers, {tune.nodes}-node trees)")
    return drafter
