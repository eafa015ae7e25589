#!/usr/bin/env bash
# The full bench (BENCHMARKS.md): per data set and dtype, one run per engine. The compiled run holds hf,
# pld, greedy, phrase (and llama.cpp's plain decode of the same weights, BF16 and Q4_1 GGUF, when
# scripts/build_llamacpp.sh has built it); the eager run holds hf, greedy and phrase, so each engine's
# speed-ups are ratios to generate() measured in its own run. Then the PNG plot. Run it alone.
#   scripts/bench_all.sh [PROMPTS] [TOKENS] [DTYPES] [ENGINES]   (defaults: 20 128 "bf16 fp32" "compiled eager")
# Environment: DATA (the data sets' folder, default ../shared/data), OUT (reports), PLOT (the PNG),
# PY (the Python with the project's dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20} TOKENS=${2:-128} DTYPES=${3:-bf16 fp32} ENGINES=${4:-compiled eager}
DATA=${DATA:-../shared/data}
OUT=${OUT:-bench-results}
PLOT=${PLOT:-docs/bench.png}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
reports=()
for dtype in $DTYPES; do
    for ds in gsm8k_test mt_bench; do
        for engine in $ENGINES; do
            methods=hf,greedy,phrase
            [ "$engine" = compiled ] && methods=hf,pld,greedy,phrase,llamacpp,llamacpp_q4
            "$PY" -m assistant bench --dataset "$DATA/$ds.jsonl" --limit "$N" --max-new-tokens "$TOKENS" \
                --dtype "$dtype" --engine "$engine" --methods "$methods" --json "$OUT/$ds-$dtype-$engine.json" \
                2> "$OUT/$ds-$dtype-$engine.log"
            [ "$engine" = compiled ] && reports+=("$OUT/$ds-$dtype-$engine.json")
        done
    done
done
"$PY" scripts/plot_bench.py "$PLOT" "${reports[@]}"
