#!/usr/bin/env bash
# The simulated user of issue 5 (BENCHMARKS.md, "Online adaptation"): one profile answers the prompts a
# user asked before, `assistant adapt --once` learns from them, then the shipped head and the adapted
# head are benched on prompts the user asks next (never seen).
#   scripts/simulate_user.sh PROFILE PAST.jsonl NEXT.jsonl [TOKENS] [JOBS]
# JOBS > 1 answers PAST in that many 1-thread processes side by side (tokens per pass does not depend on
# it; on 2 cores two 1-thread processes answer ~1.4x faster than one 2-thread process). Reports go to
# $OUT (default bench-results/<profile>/).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=$1 PAST=$2 NEXT=$3 TOKENS=${4:-64} JOBS=${5:-1}
OUT=${OUT:-bench-results/$PROFILE}
A=.venv/bin/assistant
mkdir -p "$OUT"
$A profile create "$PROFILE" 2>/dev/null || true

# 1. the user's past: every answer is recorded as accepted in the profile's history
n=$(wc -l < "$PAST"); per=$(( (n + JOBS - 1) / JOBS ))
rm -f "$OUT"/past.[0-9][0-9]
split -l "$per" -d "$PAST" "$OUT/past."
pids=()
for part in "$OUT"/past.[0-9][0-9]; do
    OMP_NUM_THREADS=$(( JOBS > 1 ? 1 : $(nproc) )) $A ask --file "$part" --profile "$PROFILE" \
        --max-new-tokens "$TOKENS" --dtype fp32 --json > "$part.answers.jsonl" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

# 2. one adaptation cycle
$A adapt --once --profile "$PROFILE" --dtype fp32 --json | tee "$OUT/cycle.json"

# 3. the user's next prompts: shipped head vs adapted head at the same verify width (the one the runtime
#    picks on this machine unless WIDTH is set), exactness vs hf
W=(); [ -n "${WIDTH:-}" ] && W=(--tree-width "$WIDTH")
$A bench --dataset "$NEXT" --max-new-tokens "$TOKENS" --dtype fp32 --methods phrase "${W[@]}" \
    --head assistant/runtime/data/heads/SmolLM2-135M-Instruct.safetensors --json "$OUT/next-shipped.json"
$A bench --dataset "$NEXT" --max-new-tokens "$TOKENS" --dtype fp32 --methods hf,phrase "${W[@]}" \
    --profile "$PROFILE" --json "$OUT/next-adapted.json"
