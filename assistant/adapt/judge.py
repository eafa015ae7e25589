"""Before/after: does a cycle's new head draft at least as well as the head it replaces?

Contract:
- `measure(before, after, user, anchor, max_nodes, pause, on_stage)` -> (before, after), each
  {"user": tokens/pass or None, "anchor": tokens/pass or None}: assistant.adapt.evaluate.simulate_decode
  of two drafters on the user's held-out answers and on the anchor (an (answers, features) pair each;
  a set without answers or features gives None), announced as "check k/4: ...".
- `judge(before, after, margin, user_in_sample)` -> (accepted, reasons), pure: rejected when the
  anchor's tokens per pass drops by more than `margin` (relative), or the held-out user answers' do
  (not judged when they were trained on: `user_in_sample`).
- `_drafter(art, emb_module)` is the drafter the runtime builds for an artifact and `_runtime_width(target,
  cap)` the verify width it uses on this device, so a cycle judges what will run (assistant.adapt.cycle
  uses both).
"""
from __future__ import annotations

from typing import Callable, Mapping


def _drafter(art, emb_module):
    """The drafter the runtime builds for this artifact (PhraseDrafter.from_artifact: its stored tree
    shape, best-first by the chain probabilities) with prompt lookup, so a cycle judges what will run."""
    from assistant.runtime.drafters import PhraseDrafter, PromptLookupDrafter, UnionDrafter

    return UnionDrafter(PhraseDrafter.from_artifact(art, emb_module), PromptLookupDrafter())


def _runtime_width(target, cap: int) -> int:
    """The verify width the runtime uses on this device (assistant.session: auto engine and width <= cap),
    so the cycle judges a head at the tree size it will be used with."""
    from assistant.runtime.costmodel import runtime_plan

    return runtime_plan(target, cap).width


def tokens_per_pass(d, answers, feats, max_nodes: int, pause: Callable[[], None]) -> float | None:
    """Tokens per pass of drafter `d` replaying `answers` (None without answers or features)."""
    from assistant.adapt.evaluate import simulate_decode

    if not answers or feats is None:
        return None
    return round(simulate_decode(d, answers, feats, max_nodes, pause=pause)["tokens_per_pass"], 4)


def measure(before_d, after_d, user: tuple, anchor: tuple, max_nodes: int, pause: Callable[[], None],
            on_stage: Callable[[str], None]) -> tuple[dict[str, float | None], dict[str, float | None]]:
    before: dict[str, float | None] = {}
    after: dict[str, float | None] = {}
    pause()
    on_stage("check 1/4: user answers, old head")
    before["user"] = tokens_per_pass(before_d, *user, max_nodes, pause)
    on_stage("check 2/4: user answers, new head")
    after["user"] = tokens_per_pass(after_d, *user, max_nodes, pause)
    pause()
    on_stage("check 3/4: original data, old head")
    before["anchor"] = tokens_per_pass(before_d, *anchor, max_nodes, pause)
    on_stage("check 4/4: original data, new head")
    after["anchor"] = tokens_per_pass(after_d, *anchor, max_nodes, pause)
    return before, after


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


__all__ = ["judge", "measure", "tokens_per_pass"]
