"""Plot `assistant bench --json` reports of scripts/bench_sources.sh: tokens per pass of every method per
data set and dtype, and which source banked the default drafter's drafted tokens. Prints the table too.

usage: python scripts/plot_sources.py OUT.png REPORT.json [REPORT.json ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = ("pld", "head", "lookup", "phrase")


def main(out: str, reports: list[str]) -> None:
    data = [json.loads(Path(r).read_text()) for r in reports]
    labels = [f"{Path(d.get('dataset', '?')).stem}\n{d['dtype']}" for d in data]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(METHODS)
    for mi, m in enumerate(METHODS):
        xs = [i + mi * width for i in range(len(data))]
        ys = [d["methods"].get(m, {}).get("tokens_per_pass", 0.0) for d in data]
        bars = ax1.bar(xs, ys, width, label=m)
        ax1.bar_label(bars, fmt="%.2f", fontsize=7)
    ax1.set_xticks([i + width * (len(METHODS) - 1) / 2 for i in range(len(data))])
    ax1.set_xticklabels(labels, fontsize=8)
    ax1.set_ylabel("tokens per target forward pass")
    ax1.legend(fontsize=8)
    sources = sorted({s for d in data for s in d["methods"].get("phrase", {}).get("banked_by_source", {})})
    bottom = [0.0] * len(data)
    print("| data set | dtype | " + " | ".join(f"{m} tok/pass" for m in METHODS)
          + " | phrase vs pld (speed) | " + " | ".join(f"banked by {s}" for s in sources) + " |")
    for d in data:
        ms = d["methods"]
        banked = ms.get("phrase", {}).get("banked_by_source", {})
        total = sum(banked.values()) or 1
        # a method the run left out (--methods) reads "-", not 0 (nor a ratio over 0)
        speed = (f"{ms['phrase']['tokens_per_second'] / ms['pld']['tokens_per_second']:.2f}x"
                 if ms.get("phrase", {}).get("tokens_per_second") and ms.get("pld", {}).get("tokens_per_second")
                 else "-")
        print(f"| {Path(d.get('dataset', '?')).stem} | {d['dtype']} | "
              + " | ".join(f"{ms[m]['tokens_per_pass']:.2f}" if m in ms else "-" for m in METHODS)
              + f" | {speed} | " + " | ".join(f"{100 * banked.get(s, 0) / total:.0f}%" for s in sources) + " |")
    for s in sources:
        ys = []
        for d in data:
            banked = d["methods"].get("phrase", {}).get("banked_by_source", {})
            ys.append(banked.get(s, 0) / max(sum(banked.values()), 1))
        ax2.bar(range(len(data)), ys, 0.6, bottom=bottom, label=s)
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax2.set_xticks(range(len(data)))
    ax2.set_xticklabels(labels, fontsize=8)
    ax2.set_ylabel("share of the default drafter's drafted tokens")
    ax2.legend(fontsize=8, title="banked by")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
