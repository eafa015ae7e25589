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


def test_near_stays_in_one_answer_longest_match_then_nearest():
    idx = AnswerIndex.from_answers([[5, 1, 2, 3], [1, 7, 8, 1, 9, 10, 11, 1, 12]])
    first = 5                                         # the second answer starts after [5 1 2 3 SEP]
    # 1 is at three places of the second answer; nearest to `center` first; the first answer never
    assert [c for _, c, _ in idx.near([4, 1], first + 7, length=2, matches=3)] == [[12], [9, 10], [7, 8]]
    assert [c for _, c, _ in idx.near([4, 1], first, length=2, matches=1)] == [[7, 8]]
    # a longer match beats a nearer one
    assert idx.near([8, 1], first + 7, length=2, matches=1)[0][:2] == (2, [9, 10])
    assert idx.near([4, 1], 4, length=2) == []        # a separator is no answer


def test_related_is_the_answer_the_prompt_quotes():
    a = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25, 26], [30, 31, 32, 33]]
    idx = AnswerIndex.from_answers(a)
    prompt = [1, 2, 21, 22, 23, 24, 25, 3, 4]         # quotes the second answer: 3 runs of 3
    assert idx.related(prompt, min_shared=3) == 7 and idx.related(prompt) is None
    assert idx.related([1, 2, 3, 4]) is None


def test_history_drafter_picks_up_the_answer_it_followed():
    # two past answers; the current text followed the first, left it for a word, and comes back with a
    # 1-token match (token 9), which the newest answer also has: the followed answer's place comes first
    followed = [40, 41, 42, 43, 9, 50, 51, 52]
    newer = [60, 9, 70, 71, 72]
    d = HistoryDrafter(AnswerIndex.from_answers([followed, newer]))
    ctx = [1, 40, 41, 42]
    assert d.propose(DraftContext(ids=ctx, root=42, features=None, max_nodes=8))[0] == [43, 9, 50, 51, 52]
    ctx = ctx + [43, 99, 9]                            # 99: the text's own word; then 9 again
    drafts = d.propose(DraftContext(ids=ctx, root=9, features=None, max_nodes=8))
    assert drafts[0] == [50, 51, 52] and drafts[0].key == ("near", 1)
    assert [70, 71, 72] in drafts and drafts[drafts.index([70, 71, 72])].key == ("history", 1)
    # another context (a new answer) does not follow the old one
    other = [7] * 20 + [9]
    assert [c.key[0] for c in d.propose(DraftContext(ids=other, root=9, features=None, max_nodes=8))] == ["history"] * 2
