"""assistant.adapt.cycle on a tiny random Llama (real SmolLM2 tokenizer) in a temporary profile.

Also home of the helpers the worker and CLI tests reuse (`adapt_profile`, `add_answers`, `FAST`).
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from assistant.adapt.cycle import AdapterError, CycleConfig, run_cycle
from assistant.adapt.datasets import describe, slices_path, write_slices
from assistant.adapt.distill import DistillConfig, distill, load_answers
from assistant.adapt.features import collect_features
from assistant.adapt.grow import ChangeLog
from assistant.adapt.mine import chain_table, mine
from assistant.adapt.replay import ReplayBuffer
from assistant.adapt.state import read_state
from assistant.adapt.train import HeadTrainConfig, row_targets, train_head, write_artifact
from assistant.profiles import Profile
from assistant.runtime.decode import DecodeConfig, greedy_generate, run_to_end
from assistant.runtime.head import load_artifact
from assistant.runtime.vocab import DraftVocab

quiet = lambda *a: None  # noqa: E731
QUIET_LOG = type("L", (), {"progress": staticmethod(quiet), "say": staticmethod(quiet)})()
FAST = CycleConfig(steps=15, batch_size=64, anchor_prompts=3, rehearsal_prompts=3, anchor_max_new_tokens=10,
                   max_new_rows=40,
                   feature_batch=16, eval_every=4, margin=1.0, max_nodes=12)
PROMPTS = ["What is 2 + 3?", "Natalia sold 48 clips in April.", "How many legs does a cat have?",
           "Name a colour.", "Write one word.", "Count to five.", "Say hello.", "Add 7 and 8.",
           "Describe the sea.", "List three fruits.", "Spell cat.", "Name a planet."]
PHRASES = ["the quarterly report", "as discussed in the meeting", "please find attached", "kind regards",
           "the project timeline", "next steps are", "let me know if", "thanks for your patience"]


def user_text(i: int, k: int = 3) -> str:
    """An answer a user accepted: a few of their habitual phrases, repeated."""
    ps = [PHRASES[(i + j) % len(PHRASES)] for j in range(k)]
    return (" ".join(f"{p.capitalize()}, {q} and {r}." for p, q, r in [ps] * 2)).strip()


@pytest.fixture(scope="session")
def base_artifact(tiny_llama, table, tmp_path_factory):
    """A head trained on the tiny model's own greedy answers to 6 prompts, shipped the way the real one is:
    tiny-llama.safetensors with tiny-llama.slices.jsonl (the 6 held-back prompts) beside it. The prompts
    file is gone afterwards: a cycle must not need the training data on this machine."""
    d = tmp_path_factory.mktemp("base")
    src = d / "data" / "prompts.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    from assistant.adapt.distill import training_prompts

    prompts = training_prompts([(str(src), 0, 6)])
    distill(tiny_llama, prompts, d / "answers.jsonl", DistillConfig(batch_size=6, max_new_tokens=24), progress=quiet)
    answers = load_answers(d / "answers.jsonl")
    seqs = [a.answer_ids for a in answers]
    vocab = DraftVocab()
    for r in mine(seqs, table, 30):
        vocab.add(r, table.text_of(r))
    chain = chain_table(seqs, vocab, 2)
    feats = collect_features(tiny_llama, answers, (-1,), progress=quiet)
    targets = row_targets(answers, feats.seq, feats.pos, vocab)
    emb = tiny_llama.model.get_input_embeddings().weight
    head, _ = train_head(feats.feats, feats.roots, targets, emb, vocab, 32,
                         HeadTrainConfig(inner=64, width=32, epochs=20, lr=3e-3, batch_size=64, holdout=0.0),
                         log=QUIET_LOG)
    path = write_artifact(d / "tiny-llama.safetensors", head, vocab, chain,
                          {"target": "tiny-llama", "training_data": describe([(str(src), 0, 6)])}, store_dtype="fp32")
    write_slices(path, [(str(src), 0, 6)], 6)
    src.unlink()
    return path


@pytest.fixture
def adapt_profile(tmp_path, monkeypatch, tiny_llama_dir, base_artifact):
    """A profile 'u' on the tiny model with the base head published as v000001; the base is also the
    target's shipped head (its held-back prompts are found beside it, as for the real target)."""
    monkeypatch.setenv("ASSISTANT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ASSISTANT_PROFILE", raising=False)
    monkeypatch.setattr("assistant.runtime.defaults.SHIPPED", base_artifact.parent)
    p = Profile.open("u")
    p.update_config(target=str(tiny_llama_dir), dtype="fp32", row_budget=60, tree_width=12)
    p.heads.publish(base_artifact, {"origin": "test base"})
    yield p
    p.close()


def add_answers(profile, start: int, n: int, text=user_text) -> list[int]:
    ids = []
    h = profile.history
    for i in range(start, start + n):
        with h.transaction():
            c = h.new_conversation(f"c{i}")
            h.add_message(c, "user", PROMPTS[i % len(PROMPTS)])
            ids.append(h.add_message(c, "assistant", text(i), accepted=True))
    return ids


def test_cycle_grows_finetunes_and_publishes(adapt_profile, tiny_llama):
    p = adapt_profile
    base = load_artifact(p.heads.current())
    ids = add_answers(p, 0, 8)
    stages = []
    rep = run_cycle(p, target=tiny_llama, config=FAST, on_stage=stages.append)
    assert rep["status"] == "published", rep
    assert stages[:1] == ["answers"] and stages.index("finetune") < stages.index("check") < stages.index("publish")
    assert rep["version"] == "v000002" and p.heads.current_version() == "v000002"
    art = load_artifact(p.heads.current())
    assert art.head.rows == art.vocab.capacity <= 60
    assert rep["grown"] > 0 and len(art.vocab) == len(base.vocab) + rep["grown"] - rep["evicted"]
    # the user's phrases are rows now, initialised and chained
    assert any("quarterly report" in (r.text or "") for r in art.vocab.rows if r is not None)
    assert art.extra["chain"].shape[0] == art.vocab.capacity
    # with its probabilities, so the runtime keeps drafting best-first (the base had none: 1/width)
    chain, chain_p = art.extra["chain"], art.extra["chain_p"].float()
    assert chain_p.shape == chain.shape
    assert ((chain_p > 0) == (chain >= 0)).all() and (chain_p <= 1).all()
    tpp = rep["tokens_per_pass"]
    assert all(tpp[k] is not None for k in ("user_before", "user_after", "anchor_before", "anchor_after"))
    assert rep["eval_answers"] == 2 and rep["train_answers"] == 6 and not rep["eval_in_sample"]
    assert rep["anchor"]["available"] and rep["anchor"]["unseen_by_base_head"]
    assert rep["anchor"]["sources"] == [["prompts.jsonl", 6, 9]]   # just past the base head's training prompts
    assert rep["rehearsal"]["sources"][0][1:] == [9, 12]      # then the rehearsed ones: the check stays held-out
    assert rep["finetune"]["rehearsal_positions"] > 0
    # state after the publish; replay holds only the training answers
    st = read_state(p.path)
    assert st["last_msg_id"] == ids[-1] and st["cycles"] == 1 and st["published"] == 1
    assert st["grown"] == rep["grown"] and st["version"] == "v000002"
    buf = ReplayBuffer.open(p.path / "adapter" / "replay.safetensors")
    assert buf.feats.dtype == torch.float16 and len(buf) == rep["replay"]["records"] > 0
    assert len(buf.messages) == 6
    # every change is in the log, tied to its cycle
    log = ChangeLog(p.path / "adapter" / "vocab_log.jsonl").read()
    adds = [r for r in log if r["op"] == "add"]
    assert len(adds) == rep["grown"] and all(r["cycle"] == 1 for r in adds)
    assert log[-1]["op"] == "cycle" and log[-1]["status"] == "published" and log[-1]["version"] == "v000002"
    # nothing new: nothing happens
    assert run_cycle(p, target=tiny_llama, config=FAST)["status"] == "nothing"


def test_the_frozen_base_head_drafts_beside_the_adapted_one(adapt_profile, tiny_llama, base_artifact):
    """A published head carries the head adaptation started from (v000001 here) as its base companion, and
    the runtime drafts with both; a later cycle keeps that first head beside, not the previous adapted one."""
    from assistant.adapt.status import status
    from assistant.runtime.defaults import build_drafter
    from assistant.runtime.headconfig import artifact_bytes, base_companion

    p = adapt_profile
    first = p.heads.current()
    for c in range(2):
        add_answers(p, 10 * c, 8)
        rep = run_cycle(p, target=tiny_llama, config=FAST)
        assert rep["status"] == "published", rep
        cur = p.heads.current()
        assert base_companion(cur).read_bytes() == first.read_bytes()
        assert status(p)["base_beside"] is True          # read off the companion file, the one record of it
    drafter, info = build_drafter(tiny_llama, cur)
    assert info["base_head"] == str(base_companion(cur)) and info["drafter"].startswith("base+phrase")
    assert [getattr(d, "name", None) for d in drafter.drafters] == ["base", "phrase", "prompt"]
    assert artifact_bytes(cur) == cur.stat().st_size + first.stat().st_size
    # the judge measured that pair after the first cycle: its "before" of the second is the pair too
    assert rep["tokens_per_pass"]["user_before"] is not None
    # a damaged companion is reported and left out: the adapted head drafts alone
    base_companion(cur).chmod(0o600)
    base_companion(cur).write_bytes(b"junk")
    drafter, info = build_drafter(tiny_llama, cur)
    assert "base_head" not in info and [d.name for d in drafter.drafters] == ["phrase", "prompt"]
    # and no cycle runs on it: it would publish the adapted head as the new frozen root
    add_answers(p, 20, 4)
    with pytest.raises(AdapterError, match="damaged frozen base head"):
        run_cycle(p, target=tiny_llama, config=FAST)
    assert p.heads.current() == cur


def test_keep_base_off_publishes_the_adapted_head_alone(adapt_profile, tiny_llama):
    from assistant.adapt.status import status
    from assistant.runtime.defaults import build_drafter
    from assistant.runtime.headconfig import base_companion

    p = adapt_profile
    add_answers(p, 0, 8)
    rep = run_cycle(p, target=tiny_llama, config=CycleConfig(**{**FAST.__dict__, "keep_base": False}))
    assert rep["status"] == "published"
    assert not base_companion(p.heads.current()).exists()
    assert status(p)["base_beside"] is False
    assert "base_head" not in build_drafter(tiny_llama, p.heads.current())[1]


def test_rejected_cycle_keeps_current_head(adapt_profile, tiny_llama):
    p = adapt_profile
    add_answers(p, 0, 5)
    strict = CycleConfig(**{**FAST.__dict__, "margin": -1.0})     # demands a 100% gain on the original data
    rep = run_cycle(p, target=tiny_llama, config=strict)
    assert rep["status"] == "rejected" and rep["reasons"] and rep["version"] is None
    assert p.heads.current_version() == "v000001" and p.heads.versions() == ["v000001"]
    st = read_state(p.path)
    assert st["rejected"] == 1 and st["published"] == 0 and st["last_cycle"]["status"] == "rejected"
    log = ChangeLog(p.path / "adapter" / "vocab_log.jsonl").read()
    assert log[-1]["status"] == "rejected"


def test_held_out_answers_accumulate_across_cycles(adapt_profile, tiny_llama):
    from assistant.adapt.state import HELD_OUT_FILE, load_held_out

    p = adapt_profile
    cfg = CycleConfig(**{**FAST.__dict__, "held_out_keep": 3})
    add_answers(p, 0, 8)                                   # 2 held out
    assert run_cycle(p, target=tiny_llama, config=cfg)["held_out_answers"] == 2
    ids = add_answers(p, 8, 8)                             # 2 more: the newest 3 are kept
    rep = run_cycle(p, target=tiny_llama, config=cfg)
    assert rep["eval_answers"] == 2 and rep["held_out_answers"] == 3 and not rep["eval_in_sample"]
    path = p.path / "adapter" / HELD_OUT_FILE
    answers, feats = load_held_out(path, (-1,), tiny_llama.name)
    assert [int(a.key) for a in answers][1:] == [ids[3], ids[7]]     # every 4th answer, newest last
    assert int(feats.seq.max()) == 2 and len(feats.roots) == sum(len(a.answer_ids) - 1 for a in answers)
    # they were never trained on
    buf = ReplayBuffer.open(p.path / "adapter" / "replay.safetensors")
    assert not {int(a.key) for a in answers} & set(buf.messages)
    # another target's or a damaged file starts a new set
    assert load_held_out(path, (-1,), "other") == ([], None)
    path.write_bytes(b"not safetensors")
    add_answers(p, 16, 4)
    assert run_cycle(p, target=tiny_llama, config=cfg)["held_out_answers"] == 1


def test_capacity_bound_over_20_cycles(adapt_profile, tiny_llama):
    p = adapt_profile
    budget = 45
    p.update_config(row_budget=budget)
    cfg = CycleConfig(**{**FAST.__dict__, "steps": 3, "anchor_sources": (), "eval_every": 100,
                         "replay_capacity": 300, "max_new_rows": 15})
    clock = [1_000_000.0]
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
             "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
    grown = evicted = 0
    for c in range(20):
        w = words[c]
        add_answers(p, 100 * c, 2, text=lambda i, w=w: f"The {w} team said {w} rocks. The {w} team said {w} rocks "
                                                       f"and the {w} plan works. The {w} plan works.")
        clock[0] += 3 * 24 * 3600
        rep = run_cycle(p, target=tiny_llama, config=cfg, clock=lambda: clock[0])
        assert rep["status"] == "published"
        art = load_artifact(p.heads.current())
        assert len(art.vocab) <= budget and art.vocab.capacity <= budget and art.head.rows <= budget
        assert len(ReplayBuffer.open(p.path / "adapter" / "replay.safetensors")) <= 300
        grown += rep["grown"]
        evicted += rep["evicted"]
    assert evicted > 0 and grown > budget          # rows were recycled, not just added
    st = read_state(p.path)
    assert st["cycles"] == 20 and st["grown"] == grown and st["evicted"] == evicted
    log = ChangeLog(p.path / "adapter" / "vocab_log.jsonl").read()
    assert sum(r["op"] == "evict" for r in log) == evicted
    # the newest user's phrases survive, the stalest were evicted
    texts = [r.text for r in art.vocab.rows if r is not None]
    assert any("tango" in t for t in texts)
    assert len(p.heads.versions()) <= p.config.keep_versions


def test_swap_keeps_fp32_exact_match(adapt_profile, tiny_llama):
    """The tiny model's own greedy answers are accepted; after the swap, phrase decoding == greedy."""
    from assistant.session import Session, SessionConfig

    p = adapt_profile
    answers = []
    for i, q in enumerate(PROMPTS[6:12]):
        ids = tiny_llama.encode_chat([{"role": "user", "content": q}])
        toks, _ = run_to_end(greedy_generate(tiny_llama, ids, DecodeConfig(max_new_tokens=40)))
        answers.append(tiny_llama.tokenizer.decode(toks, skip_special_tokens=True))
    add_answers(p, 6, 6, text=lambda i: answers[i - 6])
    s = Session(SessionConfig(target="tiny", dtype="fp32", tree_width=12, max_new_tokens=40))
    s.target = tiny_llama
    s.swap_head(p.heads.current())
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["status"] == "published"
    assert s.maybe_reload_head(p.heads.current()) is True
    assert s.maybe_reload_head(p.heads.current()) is False          # already in use
    assert s.head_info["head"] == str(p.heads.current())
    drafted = 0
    for q in PROMPTS[4:10]:
        msgs = [{"role": "user", "content": q}]
        ref, _ = run_to_end(greedy_generate(tiny_llama, s.prompt_ids(msgs), DecodeConfig(max_new_tokens=40)))
        steps = list(s.answer(msgs))
        assert [t for st in steps for t in st.tokens] == ref
        drafted += sum(st.drafted for st in steps)
    assert drafted > 0
    # a damaged artifact is refused and the adapted head keeps working
    bad = p.path / "bad.safetensors"
    bad.write_bytes(b"not a head")
    assert s.maybe_reload_head(bad) is False and s.head_info["head"] == str(p.heads.current())


def test_cycle_loads_its_own_target_for_an_auto_dtype_profile(adapt_profile):
    """The chat's worker passes no target: the cycle loads the profile's, resolving dtype "auto"."""
    p = adapt_profile
    p.update_config(dtype="auto")
    add_answers(p, 0, 4)
    rep = run_cycle(p, target=None, config=FAST)
    assert rep["status"] in ("published", "rejected") and rep["answers"] == 4


def test_every_stage_reports_its_progress(adapt_profile, tiny_llama):
    """The first cycle spent half an hour as 'finetune' and 'check' with no progress: every stage that
    takes long now says k/n, and another process sees the running stage in adapt --status."""
    from assistant.adapt.state import STAGE_FILE, read_stage
    from assistant.adapt.status import status

    p = adapt_profile
    add_answers(p, 0, 8)
    seen, running = [], []

    def on_stage(text):
        seen.append(text)
        if text.startswith("finetune step") and not running:
            running.append(status(p).get("running"))          # read as `adapt --status` would, mid-cycle

    rep = run_cycle(p, target=tiny_llama, config=FAST, on_stage=on_stage)
    assert rep["status"] in ("published", "rejected")
    steps = [s for s in seen if s.startswith("finetune step")]
    assert steps and steps[-1] == f"finetune step {rep['finetune']['steps']}/{rep['finetune']['steps']}"
    assert any(s.startswith("finetune: rehearsal answers") for s in seen)
    assert any(s.startswith("check: anchor answers") for s in seen) and any(s.startswith("check 4/4") for s in seen)
    assert any(s.startswith("features ") and "/" in s for s in seen)
    assert running and running[0]["stage"].startswith("finetune") and running[0]["pid"] == os.getpid()
    assert not (p.path / "adapter" / STAGE_FILE).exists() and read_stage(p.path) is None


def test_anchor_check_runs_without_the_training_data(adapt_profile, tiny_llama, base_artifact):
    """The head names its data by file name and hash; the held-back prompts ship beside it, so the anchor
    check and rehearsal run on a machine that has none of the training data."""
    p = adapt_profile
    meta = load_artifact(base_artifact).meta
    assert [d["file"] for d in meta["training_data"]] == ["prompts.jsonl"] and len(meta["training_data"][0]["sha256"]) == 64
    assert not (base_artifact.parent / "data" / "prompts.jsonl").exists()
    add_answers(p, 0, 8)
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    tpp = rep["tokens_per_pass"]
    assert tpp["anchor_before"] is not None and tpp["anchor_after"] is not None
    assert rep["anchor"]["available"] and rep["anchor"]["answers"] == 3 and rep["rehearsal"]["available"]
    assert load_artifact(p.heads.current()).meta["adapted"]["base"] == "v000001"   # a version, not a path


def test_without_held_back_prompts_the_cycle_says_why(adapt_profile, tiny_llama, base_artifact, tmp_path, monkeypatch):
    p = adapt_profile
    monkeypatch.setattr("assistant.runtime.defaults.SHIPPED", tmp_path / "nothing-shipped")
    add_answers(p, 0, 8)
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["status"] == "published" and rep["tokens_per_pass"]["anchor_before"] is None
    assert not rep["anchor"]["available"] and "slices.jsonl" in rep["anchor"]["reason"]
    assert not rep["rehearsal"]["available"] and rep["rehearsal"]["reason"] == rep["anchor"]["reason"]
    # a slices file beside the base head's own artifact serves as well
    shutil.copyfile(slices_path(base_artifact), slices_path(p.heads.current()))
    add_answers(p, 8, 4)
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["anchor"]["available"] and rep["tokens_per_pass"]["anchor_after"] is not None
    # and the version it publishes carries them on, so the cycle after it still checks the original domain
    assert rep["status"] == "published"
    assert slices_path(p.heads.current()).read_bytes() == slices_path(base_artifact).read_bytes()
    shutil.rmtree(p.path / "adapter")          # forget the slices built so far: they are built again
    add_answers(p, 12, 4)
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["anchor"]["available"] and rep["tokens_per_pass"]["anchor_after"] is not None


def test_a_damaged_slice_is_answered_again(adapt_profile, tiny_llama):
    """The anchor slice is derived data: a damaged info file or a cut answers file is rebuilt, not trusted."""
    p = adapt_profile
    add_answers(p, 0, 8)
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["anchor"]["answers"] == 3
    adir = p.path / "adapter"
    (adir / "anchor.json").write_text('{"prompts": 3, "sour')
    add_answers(p, 8, 4)
    stages: list[str] = []
    rep = run_cycle(p, target=tiny_llama, config=FAST, on_stage=stages.append)
    assert rep["anchor"]["available"] and rep["anchor"]["answers"] == 3
    assert any(s.startswith("check: anchor answers") for s in stages)        # answered again
    lines = (adir / "anchor.jsonl").read_text().splitlines()
    (adir / "anchor.jsonl").write_text("\n".join(lines[:2]) + "\n")       # one answer lost
    add_answers(p, 12, 4)
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["anchor"]["answers"] == 3 and len((adir / "anchor.jsonl").read_text().splitlines()) == 3


def test_the_cycle_judges_at_the_width_the_memory_budget_leaves(adapt_profile, tiny_llama, monkeypatch):
    """A budget that lowers the tree width lowers it for the answers and for the cycle's judge alike."""
    from types import SimpleNamespace

    import assistant.adapt.judge as judge_mod
    from assistant.session import session_config_from_profile

    p = adapt_profile
    p.update_config(memory_budget="2GiB")
    asked: list[tuple] = []
    monkeypatch.setattr("assistant.runtime.budget.plan_session",
                        lambda *a, **k: asked.append((a, k)) or SimpleNamespace(tree_width=4, max_context=512))
    caps: list[int] = []
    judged = judge_mod.judged_widths
    monkeypatch.setattr(judge_mod, "judged_widths", lambda target, cap, fixed=None: caps.append(cap) or
                        judged(target, cap, fixed))
    assert session_config_from_profile(p).tree_width == 4          # profile asks 12, the budget leaves 4
    add_answers(p, 0, 8)
    run_cycle(p, target=tiny_llama, config=FAST)
    assert caps == [4] and asked[-1][0][2] == "2GiB" and asked[-1][1]["tree_width"] == 12


def test_the_report_names_the_verify_costs_the_judge_followed(adapt_profile, tiny_llama, monkeypatch):
    """The judge's verdict can move with the cost table its widths follow: the report carries it, relative to 1 node."""
    import assistant.adapt.judge as judge_mod
    from assistant.runtime.width import WidthPlan

    monkeypatch.setattr(judge_mod, "judged_widths",
                        lambda target, cap, fixed=None: WidthPlan(cap=4, start=4, costs={1: 0.1, 2: 0.12, 4: 0.2}))
    add_answers(adapt_profile, 0, 8)
    rep = run_cycle(adapt_profile, target=tiny_llama, config=FAST)
    assert rep["width"] == "online" and rep["judge_costs"] == {1: 1.0, 2: 1.2, 4: 2.0}
    assert read_state(adapt_profile.path)["last_cycle"]["judge_costs"] == {"1": 1.0, "2": 1.2, "4": 2.0}
