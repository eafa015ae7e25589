"""A user over many adapter cycles (issue 5: the capacity bound, and the gain as cycles go by).

A copy of PROFILE (its history holds the user's accepted answers) is made under a temporary
ASSISTANT_HOME with its adapter state reset and every answer un-accepted. Then, CYCLES times: the
next PER_CYCLE answers are accepted again, the clock moves one DAY on, and assistant.adapt.cycle.run_cycle runs
(the profile's row budget set to BUDGET, so rows are evicted and reused once it is full). The answers
after the last cycle's are held out: every EVAL_EVERY cycles, and after the last, tokens per pass of
the current head on them (assistant.adapt.evaluate.simulate_decode at WIDTH) beside the shipped head's.
Checks after every cycle: the published head's rows, capacity and output matrix stay within BUDGET.
usage: python scripts/adapt_cycles.py PROFILE_DIR [CYCLES] [PER_CYCLE] [BUDGET] [WIDTH] [EVAL_EVERY]
Prints one JSON line per cycle and a summary line.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time


def main(src: str, cycles: int = 20, per_cycle: int = 12, budget: int = 3000, width: int = 16,
         eval_every: int = 4) -> None:
    home = tempfile.mkdtemp(prefix="adapt-cycles-")
    os.environ["ASSISTANT_HOME"] = home
    from assistant.adapt.cycle import CycleConfig, run_cycle
    from assistant.adapt.distill import Answer, encode_answer
    from assistant.adapt.features import collect_features
    from assistant.adapt.judge import tokens_per_pass
    from assistant.runtime.width import WidthPlan
    from assistant.adapt.state import copy_reset, read_state
    from assistant.profiles import Profile
    from assistant.runtime.defaults import build_drafter, shipped_head
    from assistant.runtime.head import load_artifact
    from assistant.runtime.target import load_target

    copy_reset(src, os.path.join(home, "profiles", "cycles"))
    prof = Profile.open("cycles", create=False)
    prof.update_config(row_budget=budget)
    answers = prof.history.accepted_answers(0)
    for msg_id, _, _ in answers:
        prof.history.mark_accepted(msg_id, False)
    used = cycles * per_cycle
    if used >= len(answers):
        raise SystemExit(f"{len(answers)} answers: not enough for {cycles} x {per_cycle} and a held-out rest")
    target = load_target(prof.config.target, "fp32", progress=lambda *a: None)
    held = [Answer(str(m), target.encode_chat(ctx), encode_answer(target.tokenizer, text)[:512])
            for m, ctx, text in answers[used:]]
    shipped_path = shipped_head(target.name)
    shipped = load_artifact(shipped_path)
    layers = tuple(shipped.head.config.feature_layers)
    feats = collect_features(target, held, layers, batch_size=1, progress=lambda *a: None, chunk=128)

    def tpp(path) -> float:
        return tokens_per_pass(build_drafter(target, path)[0], held, feats, WidthPlan(cap=width, start=width),
                               lambda: None)

    base = tpp(shipped_path)
    print(json.dumps({"held_out_answers": len(held), "shipped_rows": len(shipped.vocab), "budget": budget,
                      "width": width, "shipped_tokens_per_pass": base}), flush=True)
    clock = [time.time()]
    rows_max, curve = 0, [(0, base)]
    for c in range(1, cycles + 1):
        for msg_id, _, _ in answers[(c - 1) * per_cycle: c * per_cycle]:
            prof.history.mark_accepted(msg_id)
        clock[0] += 24 * 3600.0
        t0 = time.time()
        r = run_cycle(prof, target, CycleConfig(max_nodes=width), clock=lambda: clock[0])
        current = prof.heads.current() or shipped_path
        art = load_artifact(current)
        assert len(art.vocab) <= budget and art.vocab.capacity <= budget and art.head.rows <= budget, \
            f"cycle {c}: {len(art.vocab)} rows, capacity {art.vocab.capacity} over the budget {budget}"
        rows_max = max(rows_max, art.vocab.capacity)
        line = {"cycle": c, "status": r["status"], "grown": r["grown"], "evicted": r["evicted"], "rows": r["rows"],
                "capacity": art.vocab.capacity, "tokens_per_pass": r["tokens_per_pass"],
                "loss": [r["finetune"].get("loss_first"), r["finetune"].get("loss_last")],
                "seconds": round(time.time() - t0)}
        if c % eval_every == 0 or c == cycles:
            line["held_out_tokens_per_pass"] = tpp(current)
            curve.append((c, line["held_out_tokens_per_pass"]))
        print(json.dumps(line), flush=True)
    st = read_state(prof.path)
    print(json.dumps({"summary": True, "cycles": st.get("cycles"), "published": st.get("published"),
                      "rejected": st.get("rejected"), "grown": st.get("grown"), "evicted": st.get("evicted"),
                      "max_capacity": rows_max, "budget": budget, "held_out_curve": curve}), flush=True)
    prof.close()
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:6]))
