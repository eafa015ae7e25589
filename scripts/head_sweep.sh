#!/usr/bin/env bash
# Head-size sweep (issue 3, BENCHMARKS.md "Head-size sweep"): phrase heads trained on the SAME
# distilled answers at several sizes, each measured by the real decode loop (phrase + prompt lookup,
# fixed 16-node tree, fp32) on GSM8K test prompts; prints parameters, share of the target and
# tokens per pass. Tokens per pass do not depend on timing, so this may share the machine.
#   QUESTIONS=N scripts/head_sweep.sh [PROMPTS] [TOKENS]      (defaults: 10 128)
# SIZES: space-separated ROWS:INNER:WIDTH (default "2000:1024:256 8000:1024:256 32000:2048:512").
# Heads go to $OUT (default /tmp/head-sweep); the distilled answers are the ones
# scripts/build_default_head.sh left in the cache (same QUESTIONS), so nothing is generated again.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10} TOKENS=${2:-128}
DATA="${DATA:-/work/shared/data}"
QUESTIONS="${QUESTIONS:-1500}"
SIZES="${SIZES:-2000:1024:256 8000:1024:256 32000:2048:512}"
OUT="${OUT:-/tmp/head-sweep}"
mkdir -p "$OUT"
reports=()
for size in $SIZES; do
    IFS=: read -r rows inner width <<<"$size"
    head="$OUT/head-$rows-$inner-$width.safetensors"
    if [ ! -f "$head" ]; then
        .venv/bin/assistant train --target default --dtype fp32 \
            --data "$DATA/gsm8k_train.jsonl:0:$QUESTIONS" --max-new-tokens 256 --gen-batch 32 \
            --rows "$rows" --max-words 3 --chain-width 4 --layers=-1 --feature-layers=-1,8,16,24 \
            --inner "$inner" --width "$width" --epochs 4 --store-dtype fp32 --out "$head"
    fi
    .venv/bin/assistant bench --dataset "$DATA/gsm8k_test.jsonl" --limit "$N" --max-new-tokens "$TOKENS" \
        --dtype fp32 --methods phrase --tree-width 16 --head "$head" --json "$OUT/bench-$rows-$inner-$width.json"
    reports+=("$OUT/bench-$rows-$inner-$width.json")
done
.venv/bin/python - "${reports[@]}" <<'PY'
import json, sys
rows = []
for path in sys.argv[1:]:
    d = json.load(open(path))
    h, m = d["head"], d["methods"]["phrase"]
    cfg = h.get("meta", {}).get("train_config", {})
    rows.append((h["rows"], cfg.get("inner"), cfg.get("width"), h["parameters"], h["share_of_target"],
                 m["tokens_per_pass"], m["exact_match_vs_hf"] if "exact_match_vs_hf" in m else None))
best = max(r[5] for r in rows)
print("| rows | inner | width | parameters | share of target | tokens/pass | of the best |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]:,} | {r[1]} | {r[2]} | {r[3]:,} | {100 * r[4]:.3f}% | {r[5]:.3f} | {100 * r[5] / best:.1f}% |")
PY
