#!/usr/bin/env bash
# Every drafting source side by side, per data set and dtype, one `assistant bench` run each (the default
# engine, as chat and ask pick it): hf (generate()), pld (its prompt lookup), phrase (the default drafter:
# head + in-context lookup ranked on one scale), head (the phrase head alone), lookup (our in-context lookup
# alone). Data sets: gsm8k_test and mt_bench, and the held-back slices the shipped head was not trained on
# (arena_hard_prompts 400-, vicuna_bench_prompts). Then the plot of tokens per pass and of the source
# that banked each drafted token. Run it alone.
#   scripts/bench_sources.sh [PROMPTS] [TOKENS] [DTYPES]   (defaults: 20 128 "fp32 bf16")
# Environment: DATA (default ../shared/data), OUT (reports, default bench-results/sources), PLOT
# (default docs/sources.png), PY (the Python with the project's dependencies), EXTRA (more bench flags),
# SETS (data set:first line pairs, default all four below).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20} TOKENS=${2:-128} DTYPES=${3:-fp32 bf16}
DATA=${DATA:-../shared/data}
OUT=${OUT:-bench-results/sources}
PLOT=${PLOT:-docs/sources.png}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
reports=()
for dtype in $DTYPES; do
    for spec in ${SETS:-gsm8k_test:0 mt_bench:0 arena_hard_prompts:400 vicuna_bench_prompts:0}; do
        ds=${spec%%:*} offset=${spec##*:}
        "$PY" -m assistant bench --dataset "$DATA/$ds.jsonl" --offset "$offset" --limit "$N" \
            --max-new-tokens "$TOKENS" --dtype "$dtype" --methods hf,pld,phrase,head,lookup ${EXTRA:-} \
            --json "$OUT/$ds-$dtype.json" 2> "$OUT/$ds-$dtype.log"
        reports+=("$OUT/$ds-$dtype.json")
        echo "$ds $dtype done" >&2
    done
done
"$PY" scripts/plot_sources.py "$PLOT" $(ls "$OUT"/*.json)
