"""The decode loop on a tiny random Qwen3: output equals generate(do_sample=False) for any drafter."""
import random

import pytest
import torch

from assistant.runtime.decode import DecodeConfig, greedy_generate, run_to_end, speculative_generate
from assistant.runtime.drafters import (AdversarialDrafter, OracleDrafter, PhraseDrafter, PromptLookupDrafter,
                                        UnionDrafter, artifact_drafter)
from assistant.runtime.head import Artifact, HeadConfig, PhraseHead
from assistant.runtime.history_lookup import AnswerIndex, HistoryDrafter
from assistant.runtime.vocab import DraftVocab


def hf_greedy(target, ids, n, eos=None):
    x = torch.tensor([ids])
    out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                eos_token_id=eos, pad_token_id=0)
    return out[0, len(ids):].tolist()


def prompts(k=4, seed=1):
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(3, 20))] for _ in range(k)]


def random_phrase_drafter(target, rows=64, seed=0):
    rng = random.Random(seed)
    vocab = DraftVocab()
    for _ in range(rows):
        vocab.add([rng.randrange(3, 256) for _ in range(rng.randrange(1, 4))])
    torch.manual_seed(seed)
    head = PhraseHead(HeadConfig(hidden_size=target.hidden_size, inner=32, width=16), vocab.capacity)
    return PhraseDrafter(head, vocab, target.model.get_input_embeddings(), top_k=4)


def random_artifact(target, seed):
    d = random_phrase_drafter(target, seed=seed)
    return Artifact(head=d.head, vocab=d.vocab, meta={}, extra={})


@pytest.mark.parametrize("kind", ["none", "oracle", "adversarial", "phrase", "lookup", "union", "history",
                                  "history-wrong", "all", "adapted+base"])
def test_matches_generate(tiny_target, kind):
    n = 40
    for ids in prompts():
        ref = hf_greedy(tiny_target, ids, n)
        drafter = {
            "none": None,
            "oracle": OracleDrafter(ids + ref),
            "adversarial": AdversarialDrafter(ids + ref),
            "phrase": random_phrase_drafter(tiny_target),
            "lookup": PromptLookupDrafter(),
            "union": UnionDrafter(random_phrase_drafter(tiny_target), PromptLookupDrafter()),
            # past answers holding this very answer (long right copies) or a corrupted copy of it
            "history": HistoryDrafter(AnswerIndex.from_answers([ids + ref])),
            "history-wrong": HistoryDrafter(AnswerIndex.from_answers([ids + [(t + 1) % 256 for t in ref]]), min_match=1),
            "all": UnionDrafter(HistoryDrafter(AnswerIndex.from_answers([ref[5:], ids])),
                                random_phrase_drafter(tiny_target), PromptLookupDrafter()),
            # an adapted head with the frozen head it came from drafting beside it (what a cycle publishes)
            "adapted+base": artifact_drafter(random_artifact(tiny_target, 1), tiny_target.model.get_input_embeddings(),
                                             history=AnswerIndex.from_answers([ref[7:], ids]),
                                             base=random_artifact(tiny_target, 2)),
        }[kind]
        out, stats = run_to_end(speculative_generate(tiny_target, ids, drafter,
                                                     DecodeConfig(max_new_tokens=n, ignore_eos=True)))
        assert out == ref
        assert stats.new_tokens == n
        if kind in ("oracle", "history"):
            assert stats.tokens_per_pass > 3.0      # the tree path is really used
        if kind == "adversarial":
            assert stats.tokens_per_pass == pytest.approx(1.0)
        if kind == "adapted+base":
            assert [getattr(d, "name", None) for d in drafter.drafters] == ["history", "base", "phrase", "prompt"]


def test_greedy_reference_matches_generate(tiny_target):
    for ids in prompts():
        ref = hf_greedy(tiny_target, ids, 30)
        out, stats = run_to_end(greedy_generate(tiny_target, ids, DecodeConfig(max_new_tokens=30, ignore_eos=True)))
        assert out == ref and stats.passes == 30


def _eos_inside_reference(ref):
    for k in range(3, len(ref) - 3):
        if ref[k] not in ref[:k]:
            return k
    raise AssertionError("the reference has no fresh token to use as EOS")


def test_eos_inside_an_accepted_run(tiny_target):
    ids = prompts(1, seed=3)[0]
    long = hf_greedy(tiny_target, ids, 40)
    k = _eos_inside_reference(long)
    eos = long[k]
    ref = hf_greedy(tiny_target, ids, 40, eos=eos)
    assert ref == long[: k + 1]
    steps = list(speculative_generate(tiny_target, ids, OracleDrafter(ids + long, depth=8),
                                      DecodeConfig(max_new_tokens=40, eos_token_ids=(eos,))))
    out = [t for s in steps for t in s.tokens]
    assert out == ref and steps[-1].finish == "eos"
    assert steps[-1].truncated > 0                 # the verified run went past EOS and was cut there


def test_max_new_tokens_inside_an_accepted_run(tiny_target):
    ids = prompts(1, seed=4)[0]
    long = hf_greedy(tiny_target, ids, 40)
    for n in (1, 2, 5, 11):
        steps = list(speculative_generate(tiny_target, ids, OracleDrafter(ids + long, depth=8),
                                          DecodeConfig(max_new_tokens=n, ignore_eos=True)))
        out = [t for s in steps for t in s.tokens]
        assert out == long[:n] and steps[-1].finish == "length"
    assert steps[-1].truncated > 0


def test_stop_string_cuts_where_greedy_would(tiny_target):
    ids = prompts(1, seed=5)[0]
    long = hf_greedy(tiny_target, ids, 30)
    stop = f"<{long[6]}>"
    first = next(i for i, t in enumerate(long) if f"<{t}>" == stop)
    steps = list(speculative_generate(tiny_target, ids, OracleDrafter(ids + long, depth=8),
                                      DecodeConfig(max_new_tokens=30, ignore_eos=True, stop_strings=(stop,))))
    assert [t for s in steps for t in s.tokens] == long[: first + 1]
    assert steps[-1].finish == "stop"


def test_empty_and_duplicate_candidates(tiny_target):
    class Fixed:
        feature_layers = (-1,)

        def __init__(self, cands):
            self.cands = cands

        def propose(self, ctx):
            return self.cands

        def observe(self, tree, path):
            pass

    ids = prompts(1, seed=6)[0]
    ref = hf_greedy(tiny_target, ids, 20)
    for cands in ([], [[]], [[5, 6], [5, 6], [5]], [[ref[1]], [ref[1], ref[2]]]):
        out, _ = run_to_end(speculative_generate(tiny_target, ids, Fixed(cands),
                                                 DecodeConfig(max_new_tokens=20, ignore_eos=True)))
        assert out == ref


def test_cancel_between_steps(tiny_target):
    ids = prompts(1)[0]
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 3

    steps = list(speculative_generate(tiny_target, ids, None, DecodeConfig(max_new_tokens=50, ignore_eos=True), cancel))
    # polled once before the prompt's one prefill chunk, then between passes: 3 polls say go on
    assert steps[-1].finish == "cancelled" and sum(len(s.tokens) for s in steps) == 3


def test_text_deltas_add_up(tiny_target):
    ids = prompts(1)[0]
    steps = list(speculative_generate(tiny_target, ids, PromptLookupDrafter(), DecodeConfig(max_new_tokens=25, ignore_eos=True)))
    tokens = [t for s in steps for t in s.tokens]
    assert "".join(s.text for s in steps) == tiny_target.tokenizer.decode(tokens)


def test_time_split_accounts_for_every_pass(tiny_target):
    from assistant.runtime.decode import PHASES

    ids = prompts(1)[0]
    _, stats = run_to_end(speculative_generate(tiny_target, ids, random_phrase_drafter(tiny_target),
                                               DecodeConfig(max_new_tokens=12, ignore_eos=True)))
    assert set(stats.phases) == set(PHASES) | {"other"}
    assert all(v >= 0 for v in stats.phases.values())
    assert sum(stats.phases.values()) == pytest.approx(stats.seconds, rel=1e-6)
    assert stats.phases["verify"] > 0 and stats.phases["prefill"] > 0
