"""Before/after: does a cycle's new head draft at least as well as the head it replaces?

Contract:
- `measure(before, after, past, user, anchor, widths, pause, on_stage)` -> (before, after), each
  {"user": tokens/pass or None, "anchor": tokens/pass or None}: assistant.adapt.evaluate.simulate_decode
  of two drafters on the user's held-out answers and on the anchor (an (answers, features) pair each;
  a set without answers or features gives None), announced as "check k/4: ...". `before` and `after`
  build a drafter from a past-answers index (or None): every set is replayed by a fresh one, as a
  new session starts with a fresh calibration, over an index of `past` (answer token ids; None: no
  lookup in past answers) that each replayed answer then joins, as a session's does.
- `judge(before, after, margin, user_in_sample)` -> (accepted, reasons), pure: rejected when the
  anchor's tokens per pass drops by more than `margin` (relative), or the held-out user answers' do
  (not judged when they were trained on: `user_in_sample`).
- `judged_widths(target, cap)` is the runtime's width plan on this device (the cost model's measured
  verify costs), replayed by a fresh WidthController per measured set, and `drafter(art, emb_module,
  history, base)` the drafter the runtime builds for an artifact (and the frozen base head beside it)
  with the lookup in the user's past answers:
  a cycle judges what the user will see live, not a fixed wide tree.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence


def drafter(art, emb_module, history=None, base=None):
    from assistant.runtime.drafters import artifact_drafter

    return artifact_drafter(art, emb_module, history=history, base=base)


def judged_widths(target, cap: int, fixed: int | None = None):
    """The runtime's WidthPlan on this device (cached cost measurements; online control when measured);
    `fixed` judges at that one width instead."""
    from assistant.runtime.costmodel import runtime_plan
    from assistant.runtime.width import WidthPlan, plan_width

    if fixed:
        return WidthPlan(cap=fixed, start=fixed)
    return plan_width(cap, verify=runtime_plan(target, cap))


def tokens_per_pass(d, answers, feats, widths, pause: Callable[[], None], history=None) -> float | None:
    """Tokens per pass of drafter `d` replaying `answers` at the widths of `widths` (a WidthPlan: its
    online controller, fresh, when it has costs; else its cap); None without answers or features.
    `history`: the past-answers index `d` looks up (each replayed answer joins it)."""
    from assistant.adapt.evaluate import simulate_decode

    if not answers or feats is None:
        return None
    return round(simulate_decode(d, answers, feats, widths.cap, pause=pause, width=widths.controller(),
                                 history=history)["tokens_per_pass"], 4)


def measure(before: Callable, after: Callable, past: Sequence[Sequence[int]] | None, user: tuple, anchor: tuple,
            widths, pause: Callable[[], None], on_stage: Callable[[str], None]
            ) -> tuple[dict[str, float | None], dict[str, float | None]]:
    from assistant.runtime.history_lookup import AnswerIndex

    out: tuple[dict[str, float | None], dict[str, float | None]] = ({}, {})
    step = 0
    for name, data, label in (("user", user, "user answers"), ("anchor", anchor, "original data")):
        pause()
        for k, (build, head) in enumerate(((before, "old head"), (after, "new head"))):
            step += 1
            on_stage(f"check {step}/4: {label}, {head}")
            index = AnswerIndex.from_answers(past) if past is not None else None
            out[k][name] = tokens_per_pass(build(index), *data, widths, pause, history=index)
    return out


def judge(before: Mapping[str, float | None], after: Mapping[str, float | None], margin: float,
          user_in_sample: bool = False) -> tuple[bool, list[str]]:
    reasons = []
    ab, aa = before.get("anchor"), after.get("anchor")
    if ab is not None and aa is not None and aa < ab * (1 - margin):
        reasons.append(f"anchor tokens/pass fell {ab} -> {aa} (more than {margin:.0%})")
    ub, ua = before.get("user"), after.get("user")
    if ub is not None and ua is not None and not user_in_sample and ua < ub * (1 - margin):
        reasons.append(f"held-out user tokens/pass fell {ub} -> {ua}")
    return not reasons, reasons


__all__ = ["drafter", "judge", "judged_widths", "measure", "tokens_per_pass"]
