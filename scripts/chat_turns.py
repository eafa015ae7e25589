"""Multi-turn chats with and without the kept KV cache: time to first token per turn, and the same tokens.

Each conversation is an MT-Bench question's two turns plus a third ("Summarise our conversation in three
sentences."), answered by one `Session` (the default drafter, engine, dtype and threads of `assistant
chat`, no profile), every turn re-rendering the whole conversation through the chat template as the chat
UI does. The same conversation runs twice in turn, with the session's kept cache (assistant.runtime.prefix,
the default) and with it dropped before every turn (every turn prefills the whole conversation), so both
see the machine in the same state. Prints, per turn index, the prompt tokens, the tokens prefilled, the
prefill seconds (the time to the first token) and tok/s of the whole turn for each mode, and whether every
turn's tokens are the same in both (where not: the index of the first token that differs); --json writes
the records.

usage: python scripts/chat_turns.py [--data ../shared/data] [--limit 10] [--offset 0] [--tokens 256]
           [--dtype auto] [--engine auto] [--threads N] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

THIRD = "Summarise our conversation in three sentences."


def _turns(path: Path, offset: int, limit: int) -> list[list[str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [list(r["turns"]) + [THIRD] for r in rows[offset: offset + limit]]


def _chat(session, turns: list[str], keep: bool) -> list[dict]:
    """One conversation; per turn: prompt tokens, prefilled tokens, prefill and total seconds, tokens."""
    messages, out = [], []
    for text in turns:
        if not keep:
            session.kept.clear()
        messages.append({"role": "user", "content": text})
        n_prompt = len(session.prompt_ids(messages))
        t0 = time.perf_counter()
        tokens, first, prefilled = [], None, None
        for step in session.answer(messages):
            if first is None:
                first, prefilled = time.perf_counter() - t0, step.tree_size
            tokens.extend(step.tokens)
        total = time.perf_counter() - t0
        out.append({"prompt": n_prompt, "prefilled": prefilled, "first_s": first, "seconds": total, "tokens": tokens})
        messages.append({"role": "assistant", "content": session.target.tokenizer.decode(tokens, skip_special_tokens=True)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from assistant.runtime.bench import first_divergence
    from assistant.session import Session, SessionConfig

    session = Session(SessionConfig(dtype=a.dtype, engine=a.engine, threads=a.threads, max_new_tokens=a.tokens,
                                    history_lookup=False))
    session.load(lambda m, f=None: print(f"  {m}", flush=True))
    if session.pending_engine is not None:       # chat's "auto" answers eagerly until the build is done: wait
        from assistant.runtime.background import ready

        print("  waiting for the compiled engine's background build", flush=True)
        while not ready(session.pending_engine):
            time.sleep(2)
        session.maybe_upgrade_engine()
    for _ in session.answer([{"role": "user", "content": "Hi"}], max_new_tokens=4):   # warm-up: threads, graph
        pass
    info = session.info()
    print(f"engine {info['engine']}, dtype {session.target.dtype}, threads {info['threads']}", flush=True)
    records = []
    for i, turns in enumerate(_turns(Path(a.data) / "mt_bench.jsonl", a.offset, a.limit)):
        rec = {"question": a.offset + i}
        for mode in (("kept", "fresh") if i % 2 == 0 else ("fresh", "kept")):
            rec[mode] = _chat(session, turns, keep=mode == "kept")
        rec["diverged_at"] = [first_divergence(k["tokens"], f["tokens"]) for k, f in zip(rec["kept"], rec["fresh"])]
        rec["same"] = [d is None for d in rec["diverged_at"]]
        records.append(rec)
        print(f"question {a.offset + i}: first token " + " / ".join(
            f"{k['first_s'] * 1e3:.0f} vs {f['first_s'] * 1e3:.0f} ms" for k, f in zip(rec["kept"], rec["fresh"]))
              + f"; first different token {rec['diverged_at']}", flush=True)

    print(f"\n{'turn':>4} {'prompt':>7} | {'prefilled kept/fresh':>20} | {'first token ms kept/fresh':>26} | "
          f"{'tok/s kept/fresh':>17} | same")
    for t in range(len(records[0]["kept"])):
        rows = {m: [r[m][t] for r in records] for m in ("kept", "fresh")}

        def mean(m, key):
            return sum(x[key] for x in rows[m]) / len(rows[m])

        def tps(m):
            return sum(len(x["tokens"]) for x in rows[m]) / sum(x["seconds"] for x in rows[m])

        same = sum(r["same"][t] for r in records)
        print(f"{t + 1:>4} {mean('fresh', 'prompt'):>7.0f} | {mean('kept', 'prefilled'):>9.0f} / "
              f"{mean('fresh', 'prefilled'):<8.0f} | {mean('kept', 'first_s') * 1e3:>11.0f} / "
              f"{mean('fresh', 'first_s') * 1e3:<12.0f} | {tps('kept'):>7.1f} / {tps('fresh'):<7.1f} | "
              f"{same}/{len(records)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"engine": info["engine"], "dtype": session.target.dtype,
                                            "threads": info["threads"], "records": records}))


if __name__ == "__main__":
    main()
