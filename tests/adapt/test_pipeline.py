"""distill -> features -> train -> artifact -> offline simulation, on a tiny random Llama."""
from __future__ import annotations

import json

import pytest
import torch

from assistant.adapt.distill import DistillConfig, distill, load_answers
from assistant.adapt.evaluate import simulate_decode
from assistant.adapt.features import Features, collect_features
from assistant.adapt.mine import chain_table, mine
from assistant.adapt.train import HeadTrainConfig, row_targets, train_head, write_artifact
from assistant.runtime.decode import DecodeConfig, greedy_generate, run_to_end, speculative_generate
from assistant.runtime.drafters import PhraseDrafter
from assistant.runtime.head import load_artifact
from assistant.runtime.vocab import DraftVocab

PROMPTS = [(f"p{i}", q) for i, q in enumerate([
    "What is 2 + 3?", "Natalia sold 48 clips in April.", "How many legs does a cat have?",
    "Name a colour.", "Write one word.", "Count to five."])]
quiet = lambda *a: None  # noqa: E731


def test_distill_is_resumable(tiny_llama, tmp_path):
    out = tmp_path / "answers.jsonl"
    cfg = DistillConfig(batch_size=2, max_new_tokens=6)
    assert distill(tiny_llama, PROMPTS[:3], out, cfg, progress=quiet) == 3
    with open(out, "a") as f:
        f.write('{"key": "torn", "prompt_')          # a killed run
    assert distill(tiny_llama, PROMPTS[:5], out, cfg, progress=quiet) == 2
    got = load_answers(out)
    assert sorted(a.key for a in got) == ["p0", "p1", "p2", "p3", "p4"]   # shortest prompts first
    # batched left-padded generation equals the one-at-a-time greedy reference
    for a in got:
        ref, _ = run_to_end(greedy_generate(tiny_llama, a.prompt_ids, DecodeConfig(max_new_tokens=6, ignore_eos=True)))
        assert a.answer_ids == ref[: len(a.answer_ids)]


def test_features_are_the_predicting_positions(tiny_llama, tmp_path):
    out = tmp_path / "a.jsonl"
    distill(tiny_llama, PROMPTS[:3], out, DistillConfig(batch_size=3, max_new_tokens=5), progress=quiet)
    answers = load_answers(out)
    f = collect_features(tiny_llama, answers, layers=(-1, 1), batch_size=2, progress=quiet)
    assert f.feats.shape[1] == 2 * 32
    k = int(((f.seq == 1) & (f.pos == 2)).nonzero()[0])
    a = answers[1]
    ids = torch.tensor([a.prompt_ids + a.answer_ids])
    hs = tiny_llama.model(input_ids=ids, output_hidden_states=True).hidden_states
    P = len(a.prompt_ids)
    assert torch.allclose(f.feats[k, :32], hs[-1][0, P + 1], atol=1e-5)
    assert int(f.roots[k]) == a.answer_ids[2]
    f.save(tmp_path / "f.safetensors")
    g, _ = Features.load(tmp_path / "f.safetensors")
    assert g.layers == (-1, 1) and torch.equal(g.feats, f.feats)


def test_chunked_features_equal_one_prefill_and_pause_between_pieces(tiny_llama, tmp_path):
    out = tmp_path / "a.jsonl"
    distill(tiny_llama, PROMPTS[:4], out, DistillConfig(batch_size=4, max_new_tokens=12), progress=quiet)
    answers = load_answers(out)
    whole = collect_features(tiny_llama, answers, layers=(-1, 1), batch_size=2, progress=quiet)
    calls = []
    pieces = collect_features(tiny_llama, answers, layers=(-1, 1), batch_size=1, progress=quiet, chunk=5,
                              pause=lambda: calls.append(1))
    order = lambda f: torch.argsort(f.seq * 1000 + f.pos)  # noqa: E731
    a, b = order(whole), order(pieces)
    assert torch.equal(whole.seq[a], pieces.seq[b]) and torch.equal(whole.roots[a], pieces.roots[b])
    assert torch.allclose(whole.feats[a], pieces.feats[b], atol=1e-5)
    lengths = [len(x.prompt_ids) + len(x.answer_ids) for x in answers]
    assert len(calls) == sum((n - 1) // 5 for n in lengths)      # between pieces, not before the first


def test_train_write_load_and_simulation_matches_decode(tiny_llama, table, tmp_path):
    out = tmp_path / "a.jsonl"
    distill(tiny_llama, PROMPTS, out, DistillConfig(batch_size=6, max_new_tokens=24), progress=quiet)
    answers = load_answers(out)
    seqs = [a.answer_ids for a in answers]
    vocab = DraftVocab()
    for r in mine(seqs, table, 40):
        vocab.add(r, table.text_of(r))
    chain = chain_table(seqs, vocab, 2)
    feats = collect_features(tiny_llama, answers, (-1,), progress=quiet)
    targets = row_targets(answers, feats.seq, feats.pos, vocab)
    assert (targets >= 0).float().mean() > 0.5
    emb = tiny_llama.model.get_input_embeddings().weight
    head, report = train_head(feats.feats, feats.roots, targets, emb, vocab, 32,
                              HeadTrainConfig(inner=64, width=32, epochs=30, lr=3e-3, batch_size=64, holdout=0.0),
                              log=type("L", (), {"progress": staticmethod(quiet), "say": staticmethod(quiet)})())
    assert report["top8"] > 0.3
    path = write_artifact(tmp_path / "h.safetensors", head, vocab, chain, {"target": "tiny-llama"})
    assert path.stat().st_mode & 0o077 == 0 and not list(tmp_path.glob(".h.safetensors*"))  # private, no temp left
    art = load_artifact(path)
    assert art.meta["rows"] == len(vocab) and art.meta["hidden_size"] == 32 and "date" not in art.meta
    assert torch.equal(art.extra["chain"].long(), chain)
    # offline simulation == the real decode loop (fp32: same tokens, same passes)
    drafter = PhraseDrafter.from_artifact(art, tiny_llama.model.get_input_embeddings(), top_k=4)
    sim = simulate_decode(drafter, answers[:3], collect_features(tiny_llama, answers[:3], (-1,), progress=quiet),
                          max_nodes=12)
    passes = tokens = 0
    for a in answers[:3]:
        cfg = DecodeConfig(max_new_tokens=len(a.answer_ids), max_nodes=12, ignore_eos=True)
        toks, st = run_to_end(speculative_generate(tiny_llama, a.prompt_ids, drafter, cfg))
        assert toks == a.answer_ids
        passes += st.passes
        tokens += st.new_tokens
    assert sim["tokens"] == tokens
    assert sim["passes"] == passes


def test_generation_features_equal_prefill_features(tiny_llama, tmp_path):
    from assistant.adapt.features import load_generation_features

    out = tmp_path / "a.jsonl"
    distill(tiny_llama, PROMPTS[:3], out, DistillConfig(batch_size=3, max_new_tokens=6, feature_layers=(-1, 1)),
            progress=quiet)
    answers = load_answers(out)
    g = load_generation_features(out, answers)
    f = collect_features(tiny_llama, answers, (-1, 1), progress=quiet)
    assert g.layers == (-1, 1)
    order_g = sorted(range(len(g.roots)), key=lambda k: (int(g.seq[k]), int(g.pos[k])))
    order_f = sorted(range(len(f.roots)), key=lambda k: (int(f.seq[k]), int(f.pos[k])))
    assert torch.equal(g.roots[order_g], f.roots[order_f])
    assert torch.allclose(g.feats[order_g].float(), f.feats[order_f].float(), atol=2e-2, rtol=1e-2)


def test_written_artifact_is_canonical_bytes(tiny_llama, table, tmp_path):
    """The safetensors writer emits metadata in hash-map order (it changes per process and per map):
    write_artifact sorts it, so the same head, vocabulary and metadata always give the same bytes."""
    from safetensors.torch import save

    from assistant.adapt.train import canonical_safetensors
    from assistant.runtime.head import HeadConfig, PhraseHead

    torch.manual_seed(0)
    vocab = DraftVocab()
    for r in [(5, 6), (7,), (8, 9, 10)]:
        vocab.add(r, table.text_of(r))
    head = PhraseHead(HeadConfig(hidden_size=32, feature_layers=(-1,), inner=16, width=8), vocab.capacity)
    meta = {f"k{i}": i for i in range(12)}
    a = write_artifact(tmp_path / "a.safetensors", head, vocab, None, meta).read_bytes()
    c = write_artifact(tmp_path / "c.safetensors", head, vocab, None, meta).read_bytes()
    assert a == c
    raw = save({f"t{i}": torch.full((i + 1,), float(i)) for i in range(9)}, metadata={f"m{i}": "é\n" for i in range(9)})
    canon = canonical_safetensors(raw)
    assert canon == canonical_safetensors(canon)
    n = int.from_bytes(canon[:8], "little")
    assert n % 8 == 0 and canon[8 + n:] == raw[-len(canon[8 + n:]):]          # tensors aligned and untouched
    assert list(json.loads(canon[8:8 + n])["__metadata__"]) == sorted(f"m{i}" for i in range(9))
    (tmp_path / "c.st").write_bytes(canon)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "c.st"), framework="pt") as f:
        assert f.metadata() == {f"m{i}": "é\n" for i in range(9)} and torch.equal(f.get_tensor("t8"), torch.full((9,), 8.0))
    assert load_artifact(tmp_path / "a.safetensors").meta.items() >= meta.items()


def test_a_replay_with_a_history_adds_each_answer_as_a_session_does(tiny_llama, tmp_path):
    from assistant.runtime.drafters import UnionDrafter
    from assistant.runtime.history_lookup import AnswerIndex, HistoryDrafter

    out = tmp_path / "a.jsonl"
    distill(tiny_llama, PROMPTS[:1], out, DistillConfig(batch_size=1, max_new_tokens=24), progress=quiet)
    answers = load_answers(out) * 2            # the same question twice: the second answer is in the history
    feats = collect_features(tiny_llama, answers, (-1,), progress=quiet)
    index = AnswerIndex()
    sim = simulate_decode(UnionDrafter(HistoryDrafter(index)), answers, feats, max_nodes=12, history=index)
    assert len(index) == 2 * (len(answers[0].answer_ids) + 1)
    alone = simulate_decode(UnionDrafter(HistoryDrafter(AnswerIndex())), answers[:1], feats, max_nodes=12)
    assert sim["passes"] < 2 * alone["passes"]
