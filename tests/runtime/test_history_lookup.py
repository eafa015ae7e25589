"""AnswerIndex / HistoryDrafter: longest match first, bounded memory, no proposal without a match."""
from __future__ import annotations

from assistant.runtime.decode import DraftContext
from assistant.runtime.history_lookup import SEP, AnswerIndex, HistoryDrafter


def test_longest_match_first_then_newest():
    idx = AnswerIndex.from_answers([[1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 7, 8], [0, 3, 4, 70]])
    # context ...1 2 3 4: the first answer matches 4 tokens, the second 3, the third 2 (< min_match)
    assert idx.lookup([1, 2, 3, 4], length=2, matches=3) == [[5, 6], [7, 8]]
    # context ...9 2 3 4: now the second answer is the longest match
    assert idx.lookup([9, 2, 3, 4], length=2, matches=1) == [[7, 8]]


def test_continuations_stop_at_the_end_of_an_answer():
    idx = AnswerIndex.from_answers([[1, 2, 3, 4], [5, 6]])
    assert idx.lookup([1, 2, 3], length=8) == [[4]]
    assert idx.lookup([2, 3, 4], length=8) == []          # nothing follows within that answer


def test_no_match_no_proposal():
    d = HistoryDrafter(AnswerIndex.from_answers([[1, 2, 3, 4]]))
    assert d.propose(DraftContext(ids=[7, 8, 9], root=9, features=None, max_nodes=8)) == []
    assert d.propose(DraftContext(ids=[7, 1, 2, 3], root=3, features=None, max_nodes=8)) == [[4]]


def test_depth_is_capped_by_the_tree_width():
    d = HistoryDrafter(AnswerIndex.from_answers([list(range(40))]), length=16)
    assert d.propose(DraftContext(ids=[0, 1, 2], root=2, features=None, max_nodes=5)) == [[3, 4, 5, 6]]


def test_the_oldest_answers_go_first_when_full():
    idx = AnswerIndex(max_tokens=10)
    for ans in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        idx.add(ans)
    assert len(idx) <= 10 and idx.answers == 2
    assert idx.lookup([1, 2, 3]) == [] and idx.lookup([4, 5], min_match=2) == [[6]]
    assert list(idx._arr).count(SEP) == idx.answers
    assert len(AnswerIndex.from_answers([[1] * 6, [2] * 6], max_tokens=10)) == 7   # newest kept


def test_ten_thousand_answers_fit_in_fifty_megabytes():
    import numpy as np

    rng = np.random.default_rng(0)
    answers = [rng.integers(0, 49152, 256).tolist() for _ in range(10_000)]
    idx = AnswerIndex.from_answers(answers, max_tokens=3_000_000)
    assert idx.answers == 10_000 and idx.nbytes <= 50_000_000        # 16 bytes a token: tokens + sorted 3-grams
    ctx = answers[1234][:40]
    found = idx.matches(ctx, length=16, matches=2, min_match=3)
    assert found[0] == (16, answers[1234][40:56])                     # the longest match: the answer itself


def test_the_sorted_index_finds_what_a_scan_finds_while_answers_come_and_go(monkeypatch):
    import numpy as np

    import assistant.runtime.history_lookup as hl
    from assistant.runtime.lookup import continuations

    monkeypatch.setattr(hl, "MERGE", 50)                 # rebuild often: the old keys, the new scan, the drops
    rng = np.random.default_rng(1)
    idx = AnswerIndex(max_tokens=400)
    for step in range(60):
        idx.add(rng.integers(0, 12, int(rng.integers(5, 30))).tolist())
        ctx = rng.integers(0, 12, 8).tolist()
        for n in (1, 2, 3):                              # one key range for a 1-, 2- or 3-token tail
            assert idx.matches(ctx, 6, 3, n) == continuations(idx._arr, ctx, 6, 3, n, agree=True), (step, n)
        assert len(idx) <= 400


def test_a_short_tail_finds_the_newest_places_and_still_prefers_a_longer_match():
    idx = AnswerIndex.from_answers([[5, 6, 7, 8], [1, 7, 9], [2, 7, 3]])
    assert idx.matches([0, 7], length=1, matches=2, min_match=1) == [(1, [3]), (1, [9])]
    assert idx.matches([5, 6, 7], length=1, matches=2, min_match=1) == [(3, [8]), (1, [3])]
    assert idx.matches([0, 7], length=1, matches=2, min_match=2) == []


def test_an_index_of_texts_is_the_index_of_their_tokens_without_special_ones():
    class Tok:
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}

    idx = AnswerIndex.from_texts(["ab", "cd"], Tok(), max_tokens=4)
    assert idx._arr.tolist() == AnswerIndex.from_answers([[97, 98], [99, 100]], max_tokens=4)._arr.tolist() == [99, 100, -1]
