"""A user who comes back to their own earlier material: tokens per pass with and without their history.

The user first asks 20 questions the shipped head was not trained on (arena-hard 400-409, vicuna 0-9; --offset K
takes 400+K.. and K..), each answer recorded in a fresh profile (`assistant ask --file`). Then three follow-ups
per earlier answer: "again", the same question asked again in other words ("I asked you this before, but answer it
once more: ..."); "quote", a question that quotes the first sentences of the earlier answer and asks for
more; "same", the very same question in a new conversation (a user coming back to it another day). `--kinds`
picks others too, each quoting the earlier answer: "recall" (its opening, and the user lost the rest: "write your
whole answer again"), "detail" (a sentence from its middle: "explain that part in more detail"), "short" (its
opening: "sum up your whole answer in a few sentences"); "quoting" is every kind asked that quotes. Both
`assistant bench` runs answer the follow-ups with the default drafter (--dtype, fp32 by default; same engine
and threads): once with an empty history, once drafting from the profile's past answers too (`--history`). Prints
tokens per pass of each, per kind and for "again" + "quote" (the 40 questions that are not a plain
repeat), the gain, and whether every answer is token for token the same in both runs. With --cycle the
adapter runs one cycle on the 20 earlier answers between the two runs (`assistant adapt --once`: what the
background adapter does once 20 answers are pending), so the second run drafts with whatever head it
published; the first run is a fresh user's (the shipped head, or --head) either way.

usage: python scripts/repeat_user.py OUT_DIR [--data ../shared/data] [--tokens 128] [--threads 1]
           [--engine compiled] [--dtype fp32] [--cycle] [--kinds again,quote,same]
           [--target DIR] [--head HEAD.safetensors] [--offset 0]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

EARLIER = (("arena_hard_prompts.jsonl", 400, 410), ("vicuna_bench_prompts.jsonl", 0, 10))


def _prompt(record: dict) -> str:
    for key in ("prompt", "question", "instruction", "text"):
        if isinstance(record.get(key), str):
            return record[key]
    return record["turns"][0]


def _opening(answer: str, chars: int = 240) -> str:
    """The first sentences of an answer, at most about `chars` characters."""
    sentences = re.split(r"(?<=[.!?])\s+", answer.strip())
    out = ""
    for s in sentences:
        if out and len(out) + len(s) > chars:
            break
        out = f"{out} {s}".strip()
    return out[: chars * 2]


def _middle(answer: str) -> str:
    """A sentence (or line) from the middle of an answer."""
    parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+|\n+", answer.strip()) if len(p.strip()) > 20]
    return parts[len(parts) // 2] if parts else answer.strip()[:200]


# kind -> the follow-up's prompt from the earlier question and its answer
FOLLOW_UPS = {
    "again": lambda q, a: f"I asked you this before, but answer it once more:\n\n{q}",
    "quote": lambda q, a: (f"Earlier you told me:\n\n\"{_opening(a)}\"\n\nGo on from there: explain the rest of your "
                           f"answer to \"{q[:200]}\"."),
    "same": lambda q, a: q,
    "recall": lambda q, a: (f"Earlier you told me:\n\n\"{_opening(a)}\"\n\nI lost the rest of that answer. Write your "
                            f"whole answer to \"{q[:200]}\" again."),
    "detail": lambda q, a: (f"In your answer to \"{q[:200]}\" you wrote:\n\n\"{_middle(a)}\"\n\nExplain that part in "
                            f"more detail."),
    "short": lambda q, a: (f"Earlier you told me:\n\n\"{_opening(a)}\"\n\nSum up your whole answer to \"{q[:200]}\" "
                           f"in a few sentences."),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engine", default="compiled")
    ap.add_argument("--dtype", default="fp32", help="fp32: both runs' answers are the same token for token; bf16 "
                                                    "(auto on AVX512-BF16) may round apart where the trees differ")
    ap.add_argument("--cycle", action="store_true", help="one adapter cycle between the two runs")
    ap.add_argument("--offset", type=int, default=0, help="take the earlier questions this many lines further on in "
                                                          "each file (another sample of the same held-back sets)")
    ap.add_argument("--target", default=None, help="the profile's target (default: the product's default)")
    ap.add_argument("--head", default=None, help="the head the fresh profile starts with, as its first version "
                                                 "(default: the target's shipped one); --cycle adapts from it")
    ap.add_argument("--kinds", default="again,quote,same", help=f"follow-up kinds, in order per earlier answer "
                                                                  f"(of {', '.join(FOLLOW_UPS)})")
    a = ap.parse_args()
    if unknown := set(a.kinds.split(",")) - FOLLOW_UPS.keys():
        ap.error(f"unknown follow-up kinds: {', '.join(sorted(unknown))} (of {', '.join(FOLLOW_UPS)})")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ASSISTANT_HOME=str(out / "home"))
    cli = [sys.executable, "-m", "assistant.cli"]
    common = ["--dtype", a.dtype, "--engine", a.engine, "--threads", str(a.threads)]

    earlier = []
    for name, lo, hi in EARLIER:
        lo, hi = lo + a.offset, hi + a.offset
        lines = open(Path(a.data) / name, encoding="utf-8").read().splitlines()
        earlier += [{"id": f"{name}:{i}", "prompt": _prompt(json.loads(lines[i]))} for i in range(lo, hi)]
    (out / "earlier.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier), encoding="utf-8")
    print(f"1/3 answering {len(earlier)} earlier questions into a fresh profile", file=sys.stderr)
    subprocess.run(cli + ["profile", "create", "repeat"], env=env, capture_output=True, text=True)
    if a.target:
        subprocess.run(cli[:1] + ["-c", "import sys; from assistant.profiles.profile import Profile; "
                                  "Profile.open('repeat').update_config(target=sys.argv[1])", a.target],
                       env=env, check=True)
    if a.head:
        subprocess.run(cli[:1] + ["-c", "import sys; from assistant.profiles.profile import Profile; "
                                  "Profile.open('repeat').heads.publish(sys.argv[1])", str(Path(a.head).resolve())],
                       env=env, check=True)
    r = subprocess.run(cli + ["ask", "--file", str(out / "earlier.jsonl"), "--json", "--profile", "repeat",
                              "--max-new-tokens", str(a.tokens)] + common, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ask failed: {r.stderr.strip().splitlines()[-1:]}")
    answers = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]

    follow = [{"id": f"{kind}:{e['id']}", "prompt": FOLLOW_UPS[kind](e["prompt"], ans["answer"])}
              for e, ans in zip(earlier, answers) for kind in a.kinds.split(",")]
    (out / "followups.jsonl").write_text("".join(json.dumps(r) + "\n" for r in follow), encoding="utf-8")

    reports, cycle = {}, None
    for i, (label, extra) in enumerate((("empty", []), ("history", ["--history"]))):
        if label == "history" and a.cycle:
            print("adapter cycle on the earlier answers", file=sys.stderr)
            r = subprocess.run(cli + ["adapt", "--once", "--profile", "repeat", "--json", "--dtype", a.dtype], env=env,
                               capture_output=True, text=True)
            if "{" not in r.stdout:
                sys.exit(f"adapt failed: {r.stderr.strip().splitlines()[-1:]}")
            report = json.loads(r.stdout[r.stdout.index("{"):])
            cycle = {k: report.get(k) for k in ("status", "reasons", "tokens_per_pass", "version")}
        print(f"{i + 2}/3 bench of the {len(follow)} follow-ups, {label} history", file=sys.stderr)
        path = out / f"{label}.json"
        r = subprocess.run(cli + ["bench", "--dataset", str(out / "followups.jsonl"), "--methods", "phrase",
                                  "--profile", "repeat", "--max-new-tokens", str(a.tokens), "--json", str(path)]
                           + common + extra, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench failed: {r.stderr.strip().splitlines()[-1:]}")
        reports[label] = json.loads(path.read_text())
    same = sum(x["tokens"] == y["tokens"] for x, y in zip(reports["empty"]["per_prompt"], reports["history"]["per_prompt"]))
    asked = tuple(a.kinds.split(","))
    quoting = tuple(k for k in asked if k not in ("again", "same"))      # the follow-ups that quote an answer
    kinds = {name: ks for name, ks in (("again+quote", ("again", "quote")), ("quoting", quoting))
             if ks and set(ks) <= set(asked)}
    kinds.update({k: (k,) for k in asked}, all=asked)
    table = {}
    for name, prefixes in kinds.items():
        tpp = {}
        for label in ("empty", "history"):
            rows = [r for r in reports[label]["per_prompt"] if r["id"].split(":")[0] in prefixes]
            tpp[label] = sum(r["new_tokens"] for r in rows) / max(sum(r["forward_passes"] for r in rows), 1)
        table[name] = {"questions": len(rows), "tokens_per_pass_empty": round(tpp["empty"], 3),
                       "tokens_per_pass_history": round(tpp["history"], 3),
                       "gain": round(tpp["history"] / tpp["empty"] - 1, 3)}
    h = reports["history"]["methods"]["phrase"]
    costs = [reports[k]["config"].get("verify_costs") for k in ("empty", "history")]
    if costs[0] != costs[1]:
        print("warning: the two runs chose their widths from different verify cost tables (measured while the "
              "machine was busy, not cached): tokens per pass are not comparable; run it again on a quiet machine",
              file=sys.stderr)
    print(json.dumps({"kinds": table, "cycle": cycle, "same_verify_costs": costs[0] == costs[1],
                      "verify_costs": costs[1], "banked_by_source_history": h.get("banked_by_source"),
                      "identical_outputs": f"{same}/{len(follow)}", "engine": a.engine, "dtype": a.dtype,
                      "threads": a.threads,
                      "cpu_flags": reports["history"].get("cpu_flags")}, indent=1))


if __name__ == "__main__":
    main()
