"""One online-adaptation cycle: the user's new accepted answers -> a new head version.

Contract: `run_cycle(profile, target=None, config, pause, on_stage, clock, features)` -> report dict.
Stages (each announced through `on_stage(name)`, with progress "k/n" inside the long ones; `pause()` is
called between units of work so a worker can yield to the chat):
  1. answers   accepted answers with message id > state.last_msg_id (profile.history)
  2. features  prompt+answer prefill features, by `features(target, answers, layers, config, pause,
               on_stage)` (default assistant.adapt.features.paced_features; scripts pass a cached one);
               every `eval_every`-th new answer is held out of training to judge the cycle
  3. replay    training positions appended to the bounded replay buffer (assistant.adapt.replay)
  4. grow      rows grown/evicted under profile.config.row_budget (assistant.adapt.grow.grow_cycle)
  5. finetune  a short fine-tune of the COPY, each batch mixed with rehearsal positions (original-domain
               answers, assistant.adapt.slices) so the head keeps what it was trained on (assistant.adapt.train)
  6. check     tokens per pass before/after on the user's held-out answers (this cycle's and the newest
               `held_out_keep` of earlier ones, never trained on) and on the anchor (the base head's
               held-back original data); REJECTED when either drops by more than `config.margin`
               (assistant.adapt.judge)
  7. publish   profile.heads.publish (immutable version + atomic CURRENT switch); with `config.keep_base` the
               frozen head the adaptation started from (the base's own base companion, else the base) goes
               with it as <stem>.base.safetensors and drafts beside it (assistant.runtime.defaults.load_heads):
               the judge measures that pair, the runtime runs it
  8. state     adapter/state.json written AFTER the publish: a kill before it re-runs the same answers
               next time (the replay buffer skips messages it already holds)
One cycle at a time per profile (adapter/.lock; AdapterBusy when held). The base head is the profile's
current head, else the target's shipped head; with neither, AdapterError. The adapter folder's files
are described in assistant.adapt.state.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from assistant.adapt.config import CycleConfig
from assistant.adapt.state import (CYCLE_KEY, HELD_OUT_FILE, REPLAY_FILE, STAGE_FILE, VOCAB_LOG, AdapterBusy,
                                   AdapterError, CycleCancelled, StageFile, adapter_dir, count, cycle_lock,
                                   load_held_out, merge_held_out, read_state, save_held_out, write_state)


def run_cycle(profile, target=None, config: CycleConfig = CycleConfig(), pause: Callable[[], None] | None = None,
              on_stage: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time,
              features: Callable | None = None) -> dict[str, Any]:
    from assistant.adapt.features import paced_features

    adir = adapter_dir(profile.path)
    adir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with cycle_lock(adir):
        stage = StageFile(adir / STAGE_FILE, on_stage)
        try:
            return _run_cycle(profile, adir, target, config, pause or (lambda: None), stage, clock,
                              features or paced_features)
        finally:
            stage.close()


def _base(profile, target, config: CycleConfig, on_stage):
    """(target, base head path, its artifact, its name for metadata: the version, or the shipped file's
    name; never a path of this machine, its frozen base companion's artifact or None): the target loaded
    when not given."""
    from assistant.runtime.defaults import load_heads, shipped_head
    from assistant.runtime.headconfig import base_companion

    if target is None:
        from assistant.runtime.budget import resolve_dtype
        from assistant.runtime.target import load_target

        on_stage("load")
        dtype = resolve_dtype(config.dtype or profile.config.dtype)   # a profile's "auto" is resolved here too
        target = load_target(profile.config.target, dtype, progress=lambda *a: None)
    base_path = profile.heads.current()
    label = base_path.parent.name if base_path is not None else None
    if base_path is None:
        base_path = shipped_head(target.name)
        label = base_path.name if base_path is not None else None
    if base_path is None:
        raise AdapterError(f"{profile.path}: no head to adapt (no version in heads/ and no shipped head for "
                           f"{target.name}); train one with `assistant train`")
    try:
        art, frozen = load_heads(base_path, target.hidden_size, f"target {target.name}")
    except ValueError as e:
        raise AdapterError(str(e)) from e
    if frozen is None and base_companion(base_path).is_file():
        # the answers go on with the adapted head alone, but a cycle would make it the new frozen root
        raise AdapterError(f"{base_companion(base_path)}: damaged frozen base head; no cycle runs until it is "
                           f"restored (answers use the adapted head alone meanwhile)")
    return target, base_path, art, label, frozen


def _run_cycle(profile, adir, target, config: CycleConfig, pause, on_stage, clock, features) -> dict[str, Any]:
    from assistant.adapt.distill import Answer, encode_answer
    from assistant.adapt.grow import ChangeLog, grow_cycle
    from assistant.adapt.judge import drafter, judge, judged_widths, measure
    from assistant.adapt.replay import ReplayBuffer
    from assistant.adapt.datasets import slices_path
    from assistant.adapt.slices import ensure_anchor, ensure_rehearsal
    from assistant.profiles.heads import ARTIFACT
    from assistant.runtime.budget import budget_limits
    from assistant.adapt.train import fine_tune, write_artifact
    from assistant.runtime.head import Artifact
    from assistant.runtime.headconfig import base_companion
    t_start = time.time()
    state = read_state(profile.path)
    cycle_no = count(state, "cycles") + 1
    since = int(state.get("last_msg_id", 0) or 0)

    on_stage("answers")
    new = profile.history.accepted_answers(since)
    if not new:
        return {"status": "nothing", "cycle": None, "pending": 0, "last_msg_id": since}
    last_id = max(m for m, _, _ in new)
    target, base_path, art, base_label, frozen = _base(profile, target, config, on_stage)
    layers, hidden = tuple(art.head.config.feature_layers), target.hidden_size
    pc = profile.config        # judged at the width the profile's answers run at (its memory budget's cap)
    cap, _ = budget_limits(pc.target, target.dtype, pc.memory_budget, pc.tree_width, device=target.device.type,
                           head_path=base_path, head_rows=pc.row_budget,
                           history_tokens=pc.history_tokens if pc.history_lookup else 0)
    widths = judged_widths(target, cap, config.max_nodes)
    emb_module = target.model.get_input_embeddings()
    emb = emb_module.weight.detach().float().cpu()

    # 1-2: answers and features
    on_stage("features")
    answers = []
    for msg_id, ctx, text in new:
        pause()
        answers.append(Answer(str(msg_id), target.encode_chat(ctx),
                              encode_answer(target.tokenizer, text)[: config.max_answer_tokens]))
    msg_ids = [m for m, _, _ in new]
    k = max(1, config.eval_every)
    eval_idx = [i for i in range(len(answers)) if len(answers) >= k and i % k == k - 1]
    train_idx = [i for i in range(len(answers)) if i not in set(eval_idx)]
    feats_all = features(target, answers, layers, config, pause, on_stage)
    f_train, f_eval = feats_all.subset(train_idx), feats_all.subset(eval_idx)
    ans_train, ans_eval = [answers[i] for i in train_idx], [answers[i] for i in eval_idx]

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
    budget = profile.config.row_budget
    g = grow_cycle(art, replay, [a.answer_ids for a in ans_train], target.tokenizer, emb, budget, clock(), config,
                   cycle_no, pause)

    # 5: fine-tune
    on_stage("finetune")
    slice_args = (target, layers, base_path, art.meta, config, pause, features)
    reh_answers, reh_feats, reh_info = ensure_rehearsal(adir, *slice_args, lambda s: on_stage(f"finetune: {s}"))
    rehearsal = None
    if reh_feats is not None:
        rehearsal = ReplayBuffer.empty(adir / "rehearsal-buffer", len(reh_feats.roots) + 1,
                                       dim=reh_feats.feats.shape[1], layers=layers, hidden=hidden, target=target.name)
        rehearsal.add(reh_feats.feats, reh_feats.roots, [a.answer_ids for a in reh_answers], reh_feats.seq,
                      reh_feats.pos, list(range(1, len(reh_answers) + 1)))
    ft = fine_tune(g.head, replay, g.vocab, emb, config, pause, rehearsal, g.added, on_stage)

    # 6: check
    on_stage("check")
    pause()
    anchor_answers, anchor_feats, anchor_info = ensure_anchor(adir, *slice_args, lambda s: on_stage(f"check: {s}"))
    new_art = Artifact(head=g.head, vocab=g.vocab, meta=art.meta, extra={"chain": g.chain, "chain_p": g.chain_p})
    prev_answers, prev_feats = load_held_out(adir / HELD_OUT_FILE, layers, target.name)
    held_answers, held_feats = merge_held_out(prev_answers, prev_feats, ans_eval, f_eval, config.held_out_keep)
    in_sample = not held_answers
    user = (held_answers, held_feats) if held_answers else (ans_train, f_train)
    lookup = profile.config.history_lookup if config.history_lookup is None else config.history_lookup
    past = [a.answer_ids for a in ans_train] if lookup else None
    # the frozen head that drafts beside the new one: the base's own companion, else the base itself
    root, root_path = (frozen, base_companion(base_path)) if frozen is not None else (art, base_path)
    before, after = measure(lambda h: drafter(art, emb_module, h, base=frozen),
                            lambda h: drafter(new_art, emb_module, h, base=root if config.keep_base else None),
                            past, user, (anchor_answers, anchor_feats), widths, pause, on_stage)
    accepted, reasons = judge(before, after, config.margin, user_in_sample=in_sample)
    tpp = {"user_before": before["user"], "user_after": after["user"],
           "anchor_before": before["anchor"], "anchor_after": after["anchor"]}
    report: dict[str, Any] = {
        "cycle": cycle_no, "status": "published" if accepted else "rejected", "reasons": reasons,
        "base": str(base_path), "answers": len(new), "train_answers": len(ans_train), "eval_answers": len(ans_eval),
        "held_out_answers": len(held_answers), "eval_in_sample": in_sample, "first_msg_id": min(msg_ids),
        "last_msg_id": last_id,
        "replay": {"added": added_records, "records": len(replay), "capacity": replay.capacity, "reset": reset},
        "mined": g.mined, "grown": len(g.added), "evicted": len(g.evicted),
        "rows": len(g.vocab), "capacity": g.vocab.capacity, "row_budget": budget, "finetune": ft,
        "tokens_per_pass": tpp, "anchor": anchor_info, "rehearsal": reh_info, "margin": config.margin,
        "max_nodes": widths.cap, "width": "online" if widths.costs else "fixed",
        # the verify costs the judge's widths followed: its verdict can move with them (BENCHMARKS.md, A15)
        "judge_costs": {w: round(c / widths.costs[min(widths.costs)], 3) for w, c in sorted(widths.costs.items())},
    }
    if ans_eval:
        save_held_out(adir / HELD_OUT_FILE, held_answers, held_feats, target.name)

    # 7: publish
    version = None
    if accepted:
        on_stage("publish")
        tmp = adir / f".candidate-{cycle_no}.safetensors"
        meta = {**art.meta, "rows": len(g.vocab),
                "adapted": {"cycle": cycle_no, "base": base_label, "answers": len(new), "last_msg_id": last_id,
                            "grown": len(g.added), "evicted": len(g.evicted), "tokens_per_pass": tpp}}
        meta.pop("date", None)
        write_artifact(tmp, g.head, g.vocab, g.chain, meta, store_dtype="fp32", chain_p=g.chain_p)
        # the base head's held-back prompts go with it, so the next cycle's anchor check finds them
        slices = slices_path(base_path)
        companions = {slices_path(ARTIFACT).name: slices} if slices.exists() else {}
        if config.keep_base:
            companions[base_companion(ARTIFACT).name] = root_path
        version = profile.heads.publish(tmp, {CYCLE_KEY: cycle_no, "rows": len(g.vocab),
                                              "capacity": g.vocab.capacity, "row_budget": budget,
                                              "tokens_per_pass": tpp},
                                        companions=companions or None)
        tmp.unlink(missing_ok=True)
        on_stage("published")
    report["version"] = version
    report["seconds"] = round(time.time() - t_start, 2)
    ChangeLog(adir / VOCAB_LOG).write(g.changes + [{
        "op": "cycle", "cycle": cycle_no, "time": time.time(), "status": report["status"], "version": version,
        "grown": len(g.added), "evicted": len(g.evicted), "rows": len(g.vocab)}])

    # 8: state (after the publish)
    on_stage("state")
    last = {k: report[k] for k in ("cycle", "status", "reasons", "answers", "grown", "evicted", "rows", "capacity",
                                   "row_budget", "tokens_per_pass", "judge_costs", "version", "seconds")}
    last["time"] = clock()
    n_add, n_evict = (len(g.added), len(g.evicted)) if accepted else (0, 0)
    write_state(profile.path, {
        **state, "last_msg_id": last_id, "cycles": cycle_no,
        "published": count(state, "published") + (1 if accepted else 0),
        "rejected": count(state, "rejected") + (0 if accepted else 1),
        "grown": count(state, "grown") + n_add, "evicted": count(state, "evicted") + n_evict,
        "version": version or state.get("version"), "last_cycle": last, "last_error": None,
    })
    return report


__all__ = ["AdapterBusy", "AdapterError", "CycleCancelled", "CycleConfig", "run_cycle"]
