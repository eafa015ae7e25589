"""assistant.runtime.prefix: a chat's next answer starts from the last answer's cache and decodes exactly what
generate() does on the whole conversation (tiny random Qwen3, eager engine; the compiled engine's resume is
tested in test_engine.py)."""
import random

import torch

from assistant.runtime.decode import DecodeConfig, greedy_generate, run_to_end, speculative_generate
from assistant.runtime.drafters import PromptLookupDrafter, UnionDrafter
from assistant.runtime.eager import EagerEngine
from assistant.runtime.prefix import KeptCache, common_prefix, take

from .test_decode_tiny import hf_greedy, prompts, random_phrase_drafter


def answer(target, ids, kept, engine, n=30, cancel=None, stop=()):
    drafter = UnionDrafter(random_phrase_drafter(target), PromptLookupDrafter())
    steps = list(speculative_generate(target, ids, drafter, DecodeConfig(max_new_tokens=n, ignore_eos=True,
                                                                         stop_strings=stop),
                                      cancel=cancel, engine=engine, kept=kept))
    return [t for s in steps for t in s.tokens], steps


def holds(kept, ids):
    """The kept cache holds `ids` first (a last pass cut by max_new_tokens or a stop may have committed more)."""
    return kept.slot[2][:len(ids)] == list(ids)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_second_turn_prefills_only_the_new_message_and_matches_generate(tiny_target):
    engine, kept = EagerEngine(tiny_target.model), KeptCache()
    rng = random.Random(3)
    for first in prompts(k=3, seed=8):
        kept.clear()
        a1, _ = answer(tiny_target, first, kept, engine)
        assert a1 == hf_greedy(tiny_target, first, 30)
        # the cache holds every committed token but the last (the pending root)
        assert holds(kept, first + a1[:-1])
        follow = first + a1 + [rng.randrange(3, 256) for _ in range(rng.randrange(1, 12))]
        a2, steps = answer(tiny_target, follow, kept, engine)
        assert steps[0].tree_size == len(follow) - (len(first) + len(a1) - 1)   # only the new tokens prefilled
        assert a2 == hf_greedy(tiny_target, follow, 30)
        assert holds(kept, follow + a2[:-1])


def test_an_edited_conversation_reuses_only_what_is_common(tiny_target):
    engine, kept = EagerEngine(tiny_target.model), KeptCache()
    first = prompts(k=1, seed=9)[0] + [5, 6, 7, 8]
    a1, _ = answer(tiny_target, first, kept, engine)
    edited = first[:4] + [9, 9, 9] + a1[:5]
    a2, steps = answer(tiny_target, edited, kept, engine)
    assert steps[0].tree_size == len(edited) - 4
    assert a2 == hf_greedy(tiny_target, edited, 30)
    # the same prompt again: all but its last token come from the cache
    a3, steps = answer(tiny_target, edited, kept, engine)
    assert steps[0].tree_size == 1 and a3 == a2
    # a prompt that shares nothing: the kept cache is reused from its first slot
    other = [(edited[0] + 1) % 256 or 3] + edited[1:]
    a4, steps = answer(tiny_target, other, kept, engine)
    assert steps[0].tree_size == len(other) and a4 == hf_greedy(tiny_target, other, 30)


def test_a_cancelled_or_stopped_answer_leaves_what_its_cache_holds(tiny_target):
    engine, kept = EagerEngine(tiny_target.model), KeptCache()
    first = prompts(k=1, seed=10)[0]
    polls = []
    part, steps = answer(tiny_target, first, kept, engine, cancel=lambda: polls.append(1) or len(polls) > 4)
    assert steps[-1].finish == "cancelled" and part
    assert kept.tokens == len(first) + len(part) - 1 and holds(kept, first + part[:-1])
    follow = first + part + [11, 12]
    a2, _ = answer(tiny_target, follow, kept, engine)
    assert a2 == hf_greedy(tiny_target, follow, 30)
    # a stop string truncates the answer after tokens the cache already holds: the next prompt (the
    # answer as shown) shares less with them, and is still decoded exactly
    ref = hf_greedy(tiny_target, follow, 30)
    stop = tiny_target.tokenizer.decode(ref[5:7])
    shown, steps = answer(tiny_target, follow, kept, engine, stop=(stop,))
    assert steps[-1].finish == "stop" and shown == ref[:len(shown)]
    again = follow + shown + [13]
    a3, _ = answer(tiny_target, again, kept, engine)
    assert a3 == hf_greedy(tiny_target, again, 30)


def test_a_cancelled_prefill_keeps_only_what_was_there(tiny_target):
    engine, kept = EagerEngine(tiny_target.model), KeptCache()
    first = prompts(k=1, seed=11)[0]
    a1, _ = answer(tiny_target, first, kept, engine)
    held = kept.tokens
    follow = first + a1 + [20, 21, 22]
    steps = list(greedy_generate(tiny_target, follow, DecodeConfig(max_new_tokens=10), cancel=lambda: True,
                                 engine=engine, kept=kept))
    assert steps[-1].finish == "cancelled" and kept.tokens == held
    out, _ = run_to_end(greedy_generate(tiny_target, follow, DecodeConfig(max_new_tokens=30, ignore_eos=True),
                                        engine=engine, kept=kept))
    assert out == hf_greedy(tiny_target, follow, 30)


def test_another_engines_cache_is_not_reused(tiny_target):
    kept = KeptCache()
    first = prompts(k=1, seed=12)[0]
    answer(tiny_target, first, kept, EagerEngine(tiny_target.model))
    other = EagerEngine(tiny_target.model)
    with torch.inference_mode():
        cache, start = take(kept, other, first + [3, 4], 64)
    assert start == 0 and cache.get_seq_length() == 0 and kept.slot is None
