#!/usr/bin/env bash
# The issue-3 benchmark (BENCHMARKS.md "Phrase head vs HF generate() and prompt lookup"): hf, pld, greedy
# and phrase in ONE run per data set and dtype, then the PNG plot. Run it alone on the machine.
#   scripts/bench_all.sh [PROMPTS] [TOKENS] [DTYPES]     (defaults: 10 128 "fp32 bf16")
# Environment: DATA (the data sets' folder), OUT (reports), PLOT (the PNG), PY (the Python with the
# project's dependencies; the project itself may be on PYTHONPATH instead of installed).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10} TOKENS=${2:-128} DTYPES=${3:-fp32 bf16}
DATA=${DATA:-/work/shared/data}
OUT=${OUT:-bench-results}
PLOT=${PLOT:-docs/bench.png}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
reports=()
for dtype in $DTYPES; do
    for ds in gsm8k_test mt_bench; do
        "$PY" -m assistant bench --dataset "$DATA/$ds.jsonl" --limit "$N" --max-new-tokens "$TOKENS" \
            --dtype "$dtype" --methods hf,pld,greedy,phrase --json "$OUT/$ds-$dtype.json"
        reports+=("$OUT/$ds-$dtype.json")
    done
done
"$PY" scripts/plot_bench.py "$PLOT" "${reports[@]}"
