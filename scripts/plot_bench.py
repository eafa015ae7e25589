"""Plot `assistant bench --json` reports: speed-up over hf per data set and method, and the
accepted-length histogram of the phrase method.

usage: python scripts/plot_bench.py OUT.png REPORT.json [REPORT.json ...]
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(out: str, reports: list[str]) -> None:
    data = [json.loads(Path(r).read_text()) for r in reports]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    methods = [m for m in ("pld", "greedy", "phrase") if any(m in d["methods"] for d in data)]
    width = 0.8 / max(len(methods), 1)
    for mi, m in enumerate(methods):
        xs = [i + mi * width for i in range(len(data))]
        ys = [d["methods"].get(m, {}).get("speedup_vs_hf", 0.0) for d in data]
        bars = ax1.bar(xs, ys, width, label=m)
        ax1.bar_label(bars, fmt="%.2fx", fontsize=8)
    ax1.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax1.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(data))])
    ax1.set_xticklabels([f"{Path(d.get('dataset', '?')).stem}\n{d['dtype']}" for d in data], fontsize=8)
    ax1.set_ylabel("speed-up over HF generate()")
    ax1.set_title("tok/s relative to hf (same run)")
    ax1.legend()
    for d in data:
        h = d["methods"].get("phrase", {}).get("accepted_histogram")
        if not h:
            continue
        ks = sorted(int(k) for k in h)
        total = sum(h.values())
        ax2.plot(ks, [h[str(k)] / total for k in ks], marker="o",
                 label=f"{Path(d.get('dataset', '?')).stem} {d['dtype']}")
    ax2.set_xlabel("drafted tokens accepted in one pass (the bonus token comes on top)")
    ax2.set_ylabel("share of passes")
    ax2.set_title("phrase: accepted length per verify pass")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="PNG to write")
    ap.add_argument("reports", nargs="+", help="`assistant bench --json` reports")
    args = ap.parse_args()
    main(args.out, args.reports)
