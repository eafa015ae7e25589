"""assistant.runtime.width: one plan of the width for every caller; the online width follows what the drafter
banks, and never changes the output."""
from assistant.runtime.decode import DecodeConfig, run_to_end, speculative_generate
from assistant.runtime.drafters import AdversarialDrafter, OracleDrafter
from assistant.runtime.costmodel import VerifyPlan
from assistant.runtime.width import DEFAULT_WIDTH, WidthController, fit_width, plan_width

from .test_decode_tiny import hf_greedy, prompts

COSTS = {1: 1.0, 2: 1.1, 3: 1.15, 4: 1.2, 8: 1.5, 16: 1.9}


def test_plan_width_caps_starts_and_controls():
    assert plan_width() == plan_width(DEFAULT_WIDTH) and plan_width().cap == 16 and plan_width().controller() is None
    assert plan_width(16, budget=4).cap == 4 and plan_width(2, budget=4).cap == 2          # the budget only lowers
    verify = VerifyPlan(width=8, layout="in", costs={"in": COSTS, "out": {1: 1.0, 16: 9.0}})
    auto = plan_width(12, verify=verify)
    assert (auto.cap, auto.start, dict(auto.costs)) == (12, 8, COSTS)
    ctl = auto.controller()
    assert ctl.cap == 8 and ctl.widths == [1, 2, 3, 4, 8]             # measured widths <= the cap
    assert dict(plan_width(verify=verify, layout="out").costs) == {1: 1.0, 16: 9.0}
    fixed = plan_width(12, verify=verify, auto=False)
    assert (fixed.cap, fixed.start, fixed.controller()) == (12, 12, None)


def test_fit_width_halves_until_it_fits():
    assert fit_width(16, lambda w: True) == 16
    assert fit_width(64, lambda w: w <= 20) == 16
    assert fit_width(5, lambda w: w <= 2) == 2 and fit_width(16, lambda w: False) == 1
    assert fit_width(0, lambda w: True) == 1


def test_starts_at_the_cap_and_explores_there():
    c = WidthController(COSTS, cap=8)
    assert c.widths == [1, 2, 3, 4, 8]
    widths = []
    for _ in range(40):
        widths.append(c.next_width())
        c.observe([0, 1, 2, 3, 4, 5], widths[-1])      # deep acceptance: the cap pays, it stays there
    assert widths[0] == 8 and all(w == 8 for w in widths)


def test_explorations_back_off_while_the_cap_does_not_pay():
    c = WidthController(COSTS, cap=16, explore_every=10, explore_max=40)
    explored = []
    for p in range(1, 301):
        w = c.next_width()
        if w == 16:
            explored.append(p)
        c.observe([0], w)                                # nothing banked anywhere
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    # the prior picks the cap for the first passes; then explorations at gaps doubling up to 40
    assert explored[0] == 1 and {21, 61, 101} <= set(explored) and gaps[-1] == 40
    assert len(explored) < 15                            # every 10th pass would have been 30
    # one exploration that banks deep resets the gap to explore_every
    w = c.next_width()
    while w != 16:
        c.observe([0], w)
        w = c.next_width()
    for _ in range(3):
        c.observe([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 16)
    assert c.best() == 16 and c._gap == 10


def test_a_new_answer_explores_at_once_and_keeps_what_was_learned():
    c = WidthController(COSTS, cap=16, explore_every=10, explore_max=80)
    for _ in range(200):
        c.observe([0], c.next_width())
    assert c._gap == 80 and c.best() == 1
    learned = c.drafted(16)
    c.start_answer()
    assert c.next_width() == 16 and c.drafted(16) == learned


def test_nothing_banked_shrinks_to_one():
    c = WidthController(COSTS, cap=16)
    for _ in range(20):
        c.observe([0], c.next_width())
    assert c.best() == 1


def test_deep_acceptance_keeps_the_tree_wide():
    c = WidthController(COSTS, cap=16)
    for _ in range(20):
        c.observe([0, 1, 2, 5, 9, 14], c.next_width())   # 5 drafted tokens, the deepest from node 14
    assert c.best() == 16
    assert c.drafted(16) > c.drafted(8) > c.drafted(3) > c.drafted(1) == 0.0
    assert abs(c.drafted(3) - 2.0) < 0.2 and abs(c.drafted(16) - 5.0) < 1.0


def test_only_widths_it_ran_at_learn():
    c = WidthController(COSTS, cap=16)
    prior16 = c.drafted(16)
    for _ in range(10):
        c.observe([0, 1], 2)
    assert c.seen[2] == 10 and c.seen[16] == 0 and c.drafted(16) == prior16


def test_decode_with_controller_equals_generate(tiny_target):
    c = WidthController(COSTS, cap=16)
    for i, ids in enumerate(prompts(k=4, seed=5)):
        ref = hf_greedy(tiny_target, ids, 40)
        drafter = OracleDrafter(ids + ref) if i % 2 == 0 else AdversarialDrafter(ids + ref, width=3, depth=2)
        steps = list(speculative_generate(tiny_target, ids, drafter,
                                          DecodeConfig(max_new_tokens=40, max_nodes=8, ignore_eos=True), width=c))
        out, stats = run_to_end(iter(steps))
        assert out == ref
        assert max(stats.tree_sizes) <= 8
    assert sum(c.seen.values()) > 0


def test_node_values_pick_this_passes_width():
    c = WidthController({1: 1.0, 4: 1.2, 16: 2.0}, 16, explore_every=0)
    c.next_width()                                            # the first pass explores at the cap
    assert c.next_width([0.05] * 15) == 1                     # nothing likely: no tree at all
    assert c.next_width([0.9, 0.8, 0.7] + [0.01] * 12) == 4   # a likely copy of 3 tokens: 4 nodes
    assert c.next_width([0.9] * 15) == 16                     # a long likely copy: the widest tree


def test_node_values_never_explore_at_the_cap():
    c = WidthController({1: 1.0, 4: 1.2, 16: 4.0}, 16, explore_every=2, explore_max=2)
    widths = []
    for _ in range(10):
        widths.append(c.next_width([0.9, 0.8, 0.7] + [0.05] * 12))
        c.observe([0, 1, 2, 3], widths[-1])
    c.start_answer()
    widths.append(c.next_width([0.9, 0.8, 0.7] + [0.05] * 12))
    assert widths == [4] * 11                                  # a pass at the cap would cost x4 here
    assert c.next_width() == 16                                # without values: explores as before


def test_propose_cuts_a_ranked_proposal_to_the_chosen_width():
    from assistant.runtime.decode import DraftContext, propose
    from assistant.runtime.drafters import UnionDrafter
    from assistant.runtime.ranking import Draft

    class Copy:
        feature_layers, name = (-1,), "prompt"

        def propose(self, ctx):
            return [Draft([5, 6, 7], ("prompt", 8), [0.9, 0.8, 0.7]), Draft([9] * 12, ("prompt", 1), [0.01] * 12)]

        def observe(self, tree, path):
            pass

    c = WidthController({1: 1.0, 4: 1.2, 16: 2.0}, 16, explore_every=0)
    c.next_width()
    candidates, w = propose(UnionDrafter(Copy()), DraftContext([1], 1, None, 16), c)
    assert w == 4 and candidates == [[5], [5, 6], [5, 6, 7]]


def test_values_are_corrected_by_level_not_by_width():
    c = WidthController({1: 1.0, 4: 1.1, 16: 1.3}, 16, explore_every=0)
    c.next_width()
    c.observe([0], 16)
    assert c.next_width([0.9] * 3 + [0.3] * 12) == 16         # as valued, the weak nodes pay for the width
    c.observe([0, 1, 2, 3], 16)
    for _ in range(60):                                      # verified at the cap: all nodes seen
        c.next_width([0.9] * 3 + [0.3] * 12)
        c.observe([0, 1, 2, 3], 16)                          # the likely copy is taken, the weak nodes never
    assert c.value_scale(0.3) < 0.2 and c.value_scale(0.9) > 1.0
    assert c.summary()["scale@0.3"] < 0.2
    assert c.next_width([0.9] * 3 + [0.3] * 12) == 4         # the likely copy alone
    assert c.next_width([0.9] * 15) == 16                    # a long likely copy keeps the widest tree
