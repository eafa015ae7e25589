"""Offline tokens-per-pass of a drafter on reference greedy answers (no tree forwards).

Contract: `simulate_decode(drafter, answers, features, max_nodes)` replays the
decode loop on each reference answer: the prefill yields a_0; then, per pass,
the drafter proposes continuations of the pending token a_i from the features of
the position that predicted a_i (taken from ONE prefill of prompt+answer, see
assistant.adapt.features), the candidates are merged by assistant.runtime.tree.build_tree, and the
accepted run is the longest tree path equal to the reference, plus the bonus.
Because the decode loop keeps exactly the target's greedy tokens, this equals the
real loop's tokens per pass up to floating-point differences between a prefill
and a tree forward. With `width` (a fresh assistant.runtime.width.WidthController built from the
runtime's verify costs) every pass is verified at the width the controller picks, as the runtime
does (assistant.runtime.decode.propose, the same function), instead of a fixed `max_nodes`: the figure is then what the user sees live, not what a fixed
wide tree would bank. A drafter that ranks its sources online (assistant.runtime.drafters.UnionDrafter)
learns from every replayed pass as it does live (`calibrate`); the head's row usage statistics are
left alone (they count live use only). `history`, the AnswerIndex of past answers the drafter looks up,
takes each answer once it is replayed, as a session's index takes each finished answer (assistant.session).
Returns {"tokens_per_pass", "passes", "tokens", "hist", "mean_width"}.
`pause()`, when given, is called before every pass (a background adapter yields there).
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Callable, Sequence

from assistant.adapt.distill import Answer
from assistant.adapt.features import Features
from assistant.runtime.decode import DraftContext, propose
from assistant.runtime.tree import build_tree

if TYPE_CHECKING:
    from assistant.runtime.width import WidthController


def simulate_decode(drafter, answers: Sequence[Answer], features: Features, max_nodes: int = 16,
                    hidden: int | None = None, pause: Callable[[], None] | None = None,
                    width: "WidthController | None" = None, history=None) -> dict:
    layers = tuple(getattr(drafter, "feature_layers", (-1,)))
    hidden = hidden or features.feats.shape[1] // len(features.layers)
    x = features.select_layers(layers, hidden)
    calibrate = getattr(drafter, "calibrate", None)
    where = {(s, p): k for k, (s, p) in enumerate(zip(features.seq.tolist(), features.pos.tolist()))}
    passes = tokens = 0
    hist: Counter = Counter()
    widths = drafts = 0
    for ai, a in enumerate(answers):
        ref = a.answer_ids
        n = len(ref)
        if n == 0:
            continue
        passes += 1          # prefill -> a_0
        tokens += n
        if width is not None:
            width.start_answer()
        i = 0
        while i < n - 1:
            if pause is not None:
                pause()
            f = x[where[(ai, i)]].reshape(len(layers), hidden)
            ctx = DraftContext(ids=a.prompt_ids + ref[: i + 1], root=ref[i], features=f, max_nodes=max_nodes)
            candidates, w = propose(drafter, ctx, width)
            widths += w
            drafts += 1
            tree = build_tree(ref[i], candidates, w)
            node, j, path = 0, i, [0]
            while j + 1 < n:
                child = tree.children[node].get(ref[j + 1])
                if child is None:
                    break
                node, j = child, j + 1
                path.append(node)
            if width is not None:
                width.observe(path, w)
            if calibrate is not None and tree.size > 1:
                calibrate(tree, path)
            hist[j - i] += 1
            i = j + 1        # bonus token a_{j+1} is the new pending token
            passes += 1
        if history is not None:
            history.add(ref)
    return {"tokens_per_pass": tokens / max(passes, 1), "passes": passes, "tokens": tokens,
            "hist": dict(sorted(hist.items())), "mean_width": round(widths / max(drafts, 1), 2)}
