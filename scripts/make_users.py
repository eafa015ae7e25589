"""Write the prompt sets of simulated users from domains the shipped head was not trained on.

Each user asks GSM8K-train questions the head never saw (lines from 6000 on; the head was distilled on
0-1499 and its held-back slices are 1500-1547) in a style of their own: a code user (a Python function
that solves it), a user writing in French, and a long-form maths user (every step a LaTeX equation).
For each user two files: <name>-past.jsonl (what they asked before the adapter's cycle) and
<name>-next.jsonl (what they ask after it, never trained on).
usage: python scripts/make_users.py OUT_DIR [--data ../shared/data] [--past 60] [--next 40]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

USERS = {
    "code": ("Write a short Python function that solves this problem, then call it and print the answer.\n\n{q}", 6000),
    "french": ("Réponds en français, étape par étape.\n\n{q}", 6200),
    "latex": ("Solve the problem. Write each step as a LaTeX equation and give the final answer as "
              "\\boxed{{...}}.\n\n{q}", 6400),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--past", type=int, default=60)
    ap.add_argument("--next", type=int, default=40)
    a = ap.parse_args()
    lines = [json.loads(x) for x in open(Path(a.data) / "gsm8k_train.jsonl", encoding="utf-8")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (template, start) in USERS.items():
        spans = {"past": (start, start + a.past), "next": (start + a.past, start + a.past + a.next)}
        for part, (lo, hi) in spans.items():
            with open(out / f"{name}-{part}.jsonl", "w", encoding="utf-8") as f:
                for i in range(lo, hi):
                    f.write(json.dumps({"id": f"gsm8k_train:{i}", "prompt": template.format(q=lines[i]["question"])},
                                       ensure_ascii=False) + "\n")
        print(f"{name}: {out}/{name}-past.jsonl ({a.past}), {out}/{name}-next.jsonl ({a.next})")


if __name__ == "__main__":
    main()
