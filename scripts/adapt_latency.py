"""Chat latency while the adapter works (issue 5): the same answers timed idle, with an adapter cycle
running in the background thread (as `assistant chat` runs it), and idle again.

A copy of PROFILE (its history must hold accepted answers) is made under a temporary ASSISTANT_HOME
with its adapter state reset and the cursor set so that only the last PENDING answers are new: the
worker then has one whole cycle (features, grow, fine-tune, check, publish) to run. The worker shares
the session's target, as assistant/commands/chat.py wires it. Between answers the script waits THINK
seconds (a user reading), during which the adapter runs; while an answer is generated the adapter must
yield (assistant.adapt.worker: pause() between units of work, nice 10). The adapting phase goes on until the
cycle ends (at most MAX answers), so every stage is measured; idle phases have N answers each.
Paired design (this CPU is shared and drifts by 30% between minutes): in the adapting phase every
prompt is answered twice in a row, once after a think time in which the adapter worked ("adapting")
and once after a think time in which it was held (`busy` set: the control); the figure is the median
over pairs of adapting / control, so drift hits both sides alike.
usage: python scripts/adapt_latency.py PROFILE_DIR PROMPTS.jsonl [N] [TOKENS] [THINK] [PENDING] [MAX]
(run it alone: the measurement is wall time on a shared CPU)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict


def main(src: str, prompts_path: str, n: int = 6, tokens: int = 48, think: float = 3.0, pending: int = 30,
         max_answers: int = 200) -> None:
    home = tempfile.mkdtemp(prefix="adapt-latency-")
    os.environ["ASSISTANT_HOME"] = home
    from assistant.adapt.state import copy_reset, write_state
    from assistant.adapt.worker import AdapterWorker, pending_answers
    from assistant.session import Session
    from assistant.profiles import Profile
    from assistant.runtime.jsonl import read_prompts

    copy_reset(src, os.path.join(home, "profiles", "latency"))
    prof = Profile.open("latency", create=False)
    ids = [r[0] for r in prof.history._read("SELECT id FROM messages WHERE accepted = 1 AND role = 'assistant' "
                                            "ORDER BY id")]
    write_state(prof.path, {"last_msg_id": ids[-pending - 1] if len(ids) > pending else 0})
    print(f"[latency] {pending_answers(prof)} answers pending", file=sys.stderr, flush=True)
    session = Session.from_profile(prof, dtype="fp32")
    session.load(progress=lambda *a: None)
    prompts, _ = read_prompts(prompts_path, max(n, 1), 0)

    def answer(i: int) -> float:
        t0 = time.perf_counter()
        k = sum(len(s.tokens) for s in session.answer([{"role": "user", "content": prompts[i % len(prompts)]["prompt"]}],
                                                      max_new_tokens=tokens))
        return (time.perf_counter() - t0) / max(k, 1)

    def idle_phase(name: str) -> list[float]:
        out = []
        for i in range(n):
            time.sleep(think)
            out.append(answer(i))
            print(f"[latency] {name} {i + 1}/{n}: {1000 * out[-1]:.1f} ms/token", file=sys.stderr, flush=True)
        return out

    answer(0)                                   # warm-up
    idle1 = idle_phase("idle")
    worker = AdapterWorker("latency", busy=session.busy, watch=False, poll_s=0.5)
    worker.target = session.target              # as assistant/commands/chat.py does: one model, shared
    t_cycle = time.time()
    worker.start()
    while worker.state != "running" and time.time() - t_cycle < 60:
        time.sleep(0.1)
    active: list[tuple[str, float, int]] = []   # (stage when the answer started, s/token, prompt index)
    control: list[float] = []                   # the same prompt right after, the adapter held meanwhile
    i = 0
    while not worker.reports and worker.state != "failed" and len(active) < max_answers:
        time.sleep(think)
        stage = (worker.stage or worker.state).split()[0]      # "features 12/40" -> "features"
        active.append((stage, answer(i), i % n))
        session.busy.set()                      # hold the adapter through the control's think time;
        time.sleep(think)
        control.append(answer(i))              # the answer's own busy mark ends with it and frees the worker
        print(f"[latency] pair {len(active)}: adapting {1000 * active[-1][1]:.1f} / held "
              f"{1000 * control[-1]:.1f} ms/token, stage {stage}", file=sys.stderr, flush=True)
        i += 1
    cycle_s = time.time() - t_cycle
    report = worker.reports[-1] if worker.reports else {"status": worker.state, "errors": worker.errors}
    worker.stop(timeout=None)
    idle2 = idle_phase("idle")
    ratios = [s / c for (_, s, _), c in zip(active, control)]
    base = {j: statistics.median([idle1[j], idle2[j]]) for j in range(n)}
    vs_idle = [s / base[j] for _, s, j in active]
    by_stage = defaultdict(list)
    for (stage, _, _), r in zip(active, ratios):
        by_stage[stage].append(r)
    print(json.dumps({
        "answers_idle": 2 * n, "answers_adapting": len(active), "tokens": tokens, "think_s": think,
        "pending_answers": pending, "cycle": {"status": report.get("status"), "seconds": round(cycle_s, 1)},
        "ms_per_token": {"idle_median": round(1000 * statistics.median(idle1 + idle2), 1),
                         "adapting_median": round(1000 * statistics.median(s for _, s, _ in active), 1)
                         if active else None},
        "adapting_over_held": {"median": round(statistics.median(ratios), 3) if ratios else None,
                               "mean": round(statistics.mean(ratios), 3) if ratios else None,
                               "max": round(max(ratios), 3) if ratios else None},
        "adapting_over_idle_phases": round(statistics.median(vs_idle), 3) if vs_idle else None,
        "held_over_idle_phases": round(statistics.median(c / base[j] for c, (_, _, j) in zip(control, active)), 3)
        if control else None,
        "by_stage": {k: {"answers": len(v), "median": round(statistics.median(v), 3), "max": round(max(v), 3)}
                     for k, v in by_stage.items()},
        "idle_spread": round(max(a / b for a, b in zip(idle1, idle2)) if n else 0, 3),
        "per_answer_ms_per_token": {"idle_before": [round(1000 * x, 1) for x in idle1],
                                    "pairs": [[st, round(1000 * x, 1), round(1000 * c, 1)]
                                              for (st, x, _), c in zip(active, control)],
                                    "idle_after": [round(1000 * x, 1) for x in idle2]}}, indent=1))
    shutil.rmtree(home, ignore_errors=True)
    os._exit(0)   # the adapter thread may still be inside torch (see assistant/commands/chat.py)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], *(int(x) for x in a[2:4]), *(float(x) for x in a[4:5]), *(int(x) for x in a[5:7]))
