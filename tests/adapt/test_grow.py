"""assistant.adapt.grow: budget, decayed-utility eviction, id reuse, mean-trunk init, the change log, chains."""
from __future__ import annotations

import pytest
import torch

from assistant.adapt.grow import ChangeLog, GrowConfig, apply, mean_trunk_init, merge_chain, observe_usage, plan
from assistant.runtime.head import HeadConfig, PhraseHead
from assistant.runtime.vocab import DraftVocab

DAY = 24 * 3600.0
NOW = 1_000_000_000.0


def _vocab(n, used=()):
    v = DraftVocab()
    for i in range(n):
        v.add((100 + i, 7))
    for rid, banked, age in used:
        v.record(rid, banked=banked, now=NOW - age)
    return v


def test_plan_fills_free_budget_then_evicts_lowest_decayed_utility():
    v = _vocab(4, used=[(0, 50, 0), (1, 50, 60 * DAY), (2, 5, 0)])   # row 1 is stale, row 3 never used
    cands = [((1, 2), 30), ((3, 4), 20), ((5, 6), 1), ((8, 9), 3)]
    p = plan(v, cands, budget=5, now=NOW)
    assert [t for t, _ in p.add][:1] == [(1, 2)]                     # one free slot first
    evicted = [r for r, _ in p.evict]
    assert evicted[:2] == [3, 1]                                      # never used, then the stale one
    assert (5, 6) not in [t for t, _ in p.add]                        # below min_gain
    assert len(v) + len(p.add) - len(p.evict) <= 5
    # a candidate must beat its victim's utility by the margin
    assert plan(v, [((1, 2), 6)], budget=4, now=NOW, config=GrowConfig(margin=100)).add == []


def test_lower_budget_evicts_down_and_no_slot_beyond_budget():
    v = _vocab(6)
    p = plan(v, [((1, 2), 50)], budget=3, now=NOW)
    assert len(v) - len(p.evict) + len(p.add) <= 3
    head = PhraseHead(HeadConfig(hidden_size=4, inner=8, width=4), v.capacity)
    added, _ = apply(head, v, p, None, NOW)
    assert all(r < 3 for r in added) and len(v) <= 3


def test_apply_reuses_ids_resizes_initialises_and_logs(tmp_path):
    torch.manual_seed(0)
    v = _vocab(3)
    head = PhraseHead(HeadConfig(hidden_size=4, inner=8, width=4), 3)
    log = ChangeLog(tmp_path / "log.jsonl")
    p = plan(v, [((1, 2), 9), ((3, 4), 8)], budget=4, now=NOW)
    # 1 free slot, then (3, 4) replaces a never-used row
    feats = torch.randn(40, 4)
    roots = torch.zeros(40, dtype=torch.long)
    emb = torch.randn(10, 4)

    def init_fn(rows):
        tg = torch.full((40,), -1, dtype=torch.long)
        tg[:20] = rows[0]                                      # the new phrase follows at these positions
        return mean_trunk_init(head, feats, roots, emb, tg, rows)

    added, evicted = apply(head, v, p, None, NOW, log, cycle=7, init_fn=init_fn)
    assert len(added) == 2 and len(evicted) == 1 and evicted[0] in added   # the freed id was reused
    assert v.capacity == head.rows == 4 and len(v) == 4
    assert v[added[0]].banked == 9 and v[added[0]].last_used == NOW         # mined gain = first usage
    with torch.no_grad():
        logits = head(feats, emb[roots])
    r = added[0]
    assert logits[:20, r].mean() > logits[20:, r].mean()                     # scores high where it is due
    assert head.out.weight[r].norm() > 0
    recs = log.read()
    assert [x["op"] for x in recs] == ["evict", "add", "add"] and all(x["cycle"] == 7 for x in recs)
    assert recs[1]["tokens"] == [1, 2] and recs[1]["gain"] == 9
    with open(log.path, "a") as f:
        f.write('{"op": "add", "cyc')                                        # a torn last line
    assert len(log.read()) == 3


def test_observe_usage_credits_rows_and_decay():
    v = DraftVocab()
    a = v.add((1, 2, 3))
    b = v.add((9, 9))
    got = observe_usage(v, [[0, 1, 2, 3, 0, 1, 2, 3]], now=NOW)
    assert got == {a: 6} and v[a].banked == 6 and v[b].banked == 0
    assert v[a].utility(NOW) > v[a].utility(NOW + 30 * DAY) > 0
    assert v[b].utility(NOW) == 0


def test_merge_chain_drops_links_of_changed_rows():
    old = torch.tensor([[1, 2], [2, -1], [0, -1]])
    new = torch.tensor([[-1, -1], [0, -1], [-1, -1], [1, -1]])
    m, p = merge_chain(old, new, changed={2}, width=2)
    assert m.tolist() == [[1, -1], [0, -1], [-1, -1], [1, -1]]
    assert p.tolist() == [[0.5, 0.0], [0.5, 0.0], [0.0, 0.0], [0.5, 0.0]]   # no probabilities given: 1/width


def test_merge_chain_keeps_each_links_probability():
    old = torch.tensor([[1, 2], [2, -1]])
    old_p = torch.tensor([[0.75, 0.25], [1.0, 0.0]])
    new = torch.tensor([[3, -1], [-1, -1], [-1, -1], [-1, -1]])
    new_p = torch.tensor([[0.9, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    m, p = merge_chain(old, new, changed=set(), width=2, old_p=old_p, new_p=new_p)
    assert m.tolist() == [[3, 1], [2, -1], [-1, -1], [-1, -1]]
    assert torch.allclose(p, torch.tensor([[0.9, 0.75], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))


def test_quiet_init_starts_new_rows_below_every_old_one(tmp_path):
    """A quiet row outscores no old row anywhere until training raises it (CycleConfig.new_row_init "quiet")."""
    from assistant.adapt.grow import quiet_init

    torch.manual_seed(0)
    v = _vocab(3)
    head = PhraseHead(HeadConfig(hidden_size=4, inner=8, width=4), 3)
    p = plan(v, [((1, 2), 9)], budget=4, now=NOW)
    added, _ = apply(head, v, p, None, NOW, None, init_fn=lambda rows: quiet_init(head, rows, below=5.0))
    r = added[0]
    old = [i for i in range(head.rows) if i != r]
    assert head.out.weight[r].abs().sum() == 0
    assert float(head.out.bias[r]) == pytest.approx(float(head.out.bias[old].min()) - 5.0)
    with torch.no_grad():
        logits = head(torch.randn(50, 4), torch.randn(50, 4))
    assert bool((logits[:, r] < logits[:, old].max(dim=1).values).all())


def test_cycle_config_starts_grown_rows_quiet_and_refuses_unknown_inits():
    from assistant.adapt.config import CycleConfig

    assert CycleConfig().new_row_init == "quiet"
    assert CycleConfig(new_row_init="mean_trunk").new_row_init == "mean_trunk"
    with pytest.raises(ValueError, match="new_row_init"):
        CycleConfig(new_row_init="zeros")
