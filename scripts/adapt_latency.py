"""Chat latency while the adapter works (issue 5): the same answers timed idle, with an adapter cycle
running in the background thread (as `assistant chat` runs it), and idle again.

The worker shares the session's target, as `assistant chat` wires it. A copy of PROFILE (its history must hold answers not yet adapted on) is made under a temporary
ASSISTANT_HOME with its adapter state reset, so the worker has a full cycle to run. Between answers
the script waits THINK seconds (a user reading), during which the adapter runs; while an answer is
generated the adapter must yield (adapt.worker: pause() between units of work, nice 10).
usage: python scripts/adapt_latency.py PROFILE_DIR PROMPTS.jsonl [N] [TOKENS] [THINK]   (run it alone)
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time


def main(src: str, prompts_path: str, n: int = 6, tokens: int = 64, think: float = 2.0) -> None:
    home = tempfile.mkdtemp(prefix="adapt-latency-")
    os.environ["ASSISTANT_HOME"] = home
    from adapt.worker import AdapterWorker
    from assistant.session import Session
    from profiles import Profile
    from runtime.jsonl import read_prompts

    dst = os.path.join(home, "profiles", "latency")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("heads", "replay.safetensors", "state.json",
                                                              "vocab_log.jsonl", ".lock", "generating"))
    prof = Profile.open("latency", create=False)
    session = Session.from_profile(prof, dtype="fp32")
    session.load(progress=lambda *a: None)
    prompts, _ = read_prompts(prompts_path, n, 0)

    def answer(p: dict) -> tuple[float, int]:
        t0 = time.perf_counter()
        k = sum(len(s.tokens) for s in session.answer([{"role": "user", "content": p["prompt"]}],
                                                      max_new_tokens=tokens))
        return time.perf_counter() - t0, k

    def phase(name: str, worker=None) -> list[float]:
        out = []
        for i, p in enumerate(prompts):
            time.sleep(think)
            s, k = answer(p)
            out.append(s / max(k, 1))
            state = f", adapter {worker.state}" if worker else ""
            print(f"[latency] {name} {i + 1}/{len(prompts)}: {k} tokens, {1000 * s / max(k, 1):.1f} ms/token{state}",
                  file=sys.stderr, flush=True)
        return out

    answer(prompts[0])                          # warm-up
    idle1 = phase("idle")
    worker = AdapterWorker("latency", busy=session.busy, watch=False, poll_s=0.5)
    worker.target = session.target      # as assistant/commands/chat.py does: one model, shared
    worker.start()
    t_wait = time.time()
    while worker.state != "running" and time.time() - t_wait < 60:
        time.sleep(0.1)
    time.sleep(think)
    active = phase("adapting", worker)
    still_running = worker.state in ("running", "waiting")
    worker.stop(timeout=None)
    idle2 = phase("idle")
    idle = statistics.median(idle1 + idle2)
    act = statistics.median(active)
    print(json.dumps({"answers": len(prompts), "tokens": tokens, "think_s": think,
                      "ms_per_token": {"idle": round(1000 * idle, 2), "adapting": round(1000 * act, 2)},
                      "adapting_over_idle": round(act / idle, 3),
                      "cycle_still_running_after_active_phase": still_running,
                      "per_answer_ms_per_token": {"idle_before": [round(1000 * x, 1) for x in idle1],
                                                  "adapting": [round(1000 * x, 1) for x in active],
                                                  "idle_after": [round(1000 * x, 1) for x in idle2]}}, indent=1))
    shutil.rmtree(home, ignore_errors=True)
    os._exit(0)   # the adapter thread may still be inside torch (see assistant/commands/chat.py)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], *(int(x) for x in a[2:4]), *(float(x) for x in a[4:5]))
