"""One ranking scale: best-first node selection, online calibration, lookup longest-first."""
import numpy as np

from assistant.runtime.decode import DraftContext
from assistant.runtime.drafters import PromptLookupDrafter, UnionDrafter
from assistant.runtime.lookup import continuations
from assistant.runtime.ranking import Calibrator, Draft, select
from assistant.runtime.tree import accept, build_tree


def _value(drafts):
    return lambda si, di, toks, d: toks.prior[d - 1]


def test_select_takes_nodes_best_first_across_drafts():
    a = Draft([1, 2, 3], "a", [0.9, 0.2, 0.1])
    b = Draft([4, 5], "b", [0.6, 0.5])
    c = Draft([1, 7], "c", [0.3, 0.3])              # shares node (1,) with a: a's 0.9 stays
    drafts = [(0, 0, a), (1, 0, b), (0, 1, c)]
    paths, chosen = select(drafts, 4, _value(drafts))
    assert set(chosen) == {(1,), (4,), (4, 5), (1, 7)}    # 0.9, 0.6, 0.5, 0.3 beat a's 0.2 and 0.1
    assert chosen[(1,)].key == "a" and chosen[(4, 5)].depth == 2 and chosen[(1, 7)].draft == 1
    assert paths == [[1], [4], [4, 5], [1, 7]]             # in the order chosen: best first, parents first
    tree = build_tree(0, paths, 5)
    assert tree.tokens == [0, 1, 4, 5, 7]                   # inserted in that order: its first k nodes are the best k


def test_a_node_several_sources_propose_is_worth_more_than_each():
    a, b = Draft([1, 2], "a", [0.5, 0.4]), Draft([1, 3], "b", [0.5, 0.2])
    c, d = Draft([4], "c", [0.7]), Draft([4, 6], "d", [0.6, 0.1])
    paths, chosen = select([(0, 0, a), (1, 0, b), (1, 1, c), (1, 2, d)], 1, _value(None))
    assert paths == [[1]] and abs(chosen[(1,)].value - 0.75) < 1e-9     # missed only if both are wrong
    _, chosen = select([(0, 0, a), (1, 0, b), (1, 1, c), (1, 2, d)], 4, _value(None))
    assert chosen[(4,)].value == 0.7 and chosen[(1, 2)].value == 0.4    # one source twice: its best value


def test_select_never_ranks_a_child_above_its_parent():
    d = Draft([1, 2], "x", [0.1, 0.9])                      # an inconsistent prior
    paths, chosen = select([(0, 0, d), (0, 1, Draft([3], "y", [0.5]))], 2, _value(None))
    assert set(chosen) == {(3,), (1,)}


def test_calibrator_shrinks_the_prior_towards_what_was_accepted():
    cal = Calibrator(strength=4.0)
    assert cal.value(0, "k", 1, 0.5) == 0.5
    for _ in range(20):
        cal.record(0, "k", 1, False)
    assert cal.value(0, "k", 1, 0.5) < 0.1
    for _ in range(40):
        cal.record(1, "k", 1, True)
    assert cal.value(1, "k", 1, 0.1) > 0.85


class _Fixed:
    feature_layers = (-1,)

    def __init__(self, name, tokens):
        self.name, self.tokens = name, tokens

    def propose(self, ctx):
        return [Draft(self.tokens, (self.name,), [0.5] * len(self.tokens))]

    def observe(self, tree, path):
        pass


def test_a_source_that_does_not_pay_loses_its_nodes_within_a_few_passes():
    wrong, right = _Fixed("wrong", [11, 12, 13]), _Fixed("right", [21, 22, 23])
    union = UnionDrafter(wrong, right)
    ctx = DraftContext(ids=[0], root=0, features=None, max_nodes=4)
    first = build_tree(0, union.propose(ctx), 4)
    assert {first.tokens[i] for i in range(1, first.size)} & {11, 12, 13}   # equal priors: both get nodes
    for _ in range(4):
        tree = build_tree(0, union.propose(ctx), 4)
        argmax = [21] + [0] * (tree.size - 1)
        for i, t in enumerate(tree.tokens):
            if t == 21:
                argmax[i] = 22
            if t == 22:
                argmax[i] = 23
        path, _ = accept(tree, argmax)
        union.observe(tree, path)
    tree = build_tree(0, union.propose(ctx), 4)
    assert tree.tokens[1:] == [21, 22, 23]
    assert union.banked["right"] > 0 and union.banked["wrong"] == 0


def test_lookup_longest_match_first_and_never_its_own_tail():
    arr = np.asarray([5, 1, 2, 9, 7, 2, 8, 5, 1, 2], dtype=np.int32)
    # the context ends with 5 1 2: place 0 matches 3 tokens (continues 9 7), place 4 only "2" (continues 8)
    found = continuations(arr, arr.tolist(), length=2, matches=3, min_match=1)
    assert found == [(3, [9, 7]), (1, [8, 5])]


def test_lookup_prefers_the_continuation_most_places_agree_on_among_equal_matches():
    # "7" is followed by 3 twice and by 9 once (the newest): the usual continuation comes first,
    # a longer match still beats both
    arr = np.asarray([7, 3, 0, 7, 3, 1, 7, 9, 2, 5, 7, 4, 6, 5, 7], dtype=np.int32)
    assert continuations(arr, arr.tolist(), 1, 3, 1, agree=True) == [(2, [4]), (1, [3]), (1, [9])]
    assert continuations(arr[:9], [5, 7], 2, 3, 1, agree=True) == [(1, [3, 1]), (1, [3, 0]), (1, [9, 2])]
    # without `agree` (the in-context lookup), the newest place first among equals
    assert continuations(arr, arr.tolist(), 1, 3, 1) == [(2, [4]), (1, [9]), (1, [3])]


def test_prompt_lookup_copies_as_deep_as_the_tree_allows():
    text = list(range(100, 130))
    ids = text + [1, 2] + text[:3]
    cands = PromptLookupDrafter().propose(DraftContext(ids=ids, root=ids[-1], features=None, max_nodes=13))
    assert cands[0] == text[3:15] and cands[0].key == ("prompt", 3)
