"""build_tree / accept / masks on pure tensors."""
import torch

from assistant.runtime.tree import accept, build_tree


def test_merges_shared_prefixes_and_sets_depths():
    t = build_tree(5, [[1, 2, 3], [1, 2, 4], [7]])
    assert t.tokens == [5, 1, 2, 3, 4, 7]
    assert t.parents == [-1, 0, 1, 2, 2, 0]
    assert t.depths == [0, 1, 2, 3, 3, 1]
    assert t.source == [-1, 0, 0, 0, 1, 2]
    assert t.position_ids(10).tolist() == [[10, 11, 12, 13, 13, 11]]


def test_candidate_repeating_anothers_prefix_adds_no_nodes():
    t = build_tree(5, [[1, 2, 3], [1, 2], [1]])
    assert t.tokens == [5, 1, 2, 3]


def test_empty_candidate_set_is_root_only():
    for cands in ([], [[]]):
        t = build_tree(9, cands)
        assert t.size == 1 and t.tokens == [9]
        m = t.attention_mask(3, torch.float32)
        assert m.shape == (1, 1, 1, 4) and (m == 0).all()


def test_max_nodes_caps_tree_best_first():
    t = build_tree(0, [[1, 2, 3], [4, 5], [6]], max_nodes=5)
    assert t.tokens == [0, 1, 2, 3, 4]


def test_mask_is_additive_float_prefix_plus_ancestors():
    t = build_tree(5, [[1, 2], [3]])
    m = t.attention_mask(2, torch.float32)[0, 0]
    neg = torch.finfo(torch.float32).min
    assert m.dtype == torch.float32 and m.shape == (4, 6)
    assert (m[:, :2] == 0).all()
    allowed = (m[:, 2:] == 0)
    assert allowed.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, False, False, True],
    ]
    assert (m[:, 2:][~allowed] == neg).all()
    assert t.attention_mask(2, torch.bfloat16).dtype == torch.bfloat16


def test_accept_walks_argmax_and_adds_bonus():
    t = build_tree(5, [[1, 2, 3], [1, 4]])          # nodes: 5,1,2,3,4
    argmax = [1, 4, 9, 9, 8]                        # after root ->1, after 1 ->4, after 4 ->8
    path, bonus = accept(t, argmax)
    assert path == [0, 1, 4] and bonus == 8


def test_accept_rejects_at_first_token():
    t = build_tree(5, [[1, 2]])
    path, bonus = accept(t, [7, 2, 3])
    assert path == [0] and bonus == 7


def test_path_to_and_ancestors_agree():
    t = build_tree(0, [[1, 2, 3], [1, 5], [6, 7]])
    anc = t.ancestors()
    for node in range(t.size):
        assert set(torch.nonzero(anc[node]).flatten().tolist()) == set(t.path_to(node))
