#!/usr/bin/env bash
# Head-size sweep (docs/log/2026-12-01-sessions-1-7.md, "Head-size sweep"): phrase heads trained on the SAME
# distilled answers (gsm8k_train 0..QUESTIONS) at several sizes, each measured by replaying the decode
# loop offline (scripts/tune_drafter.py: phrase head + prompt lookup, 16-node trees, one tree shape
# for all) on the HELD_OUT answers that follow; prints rows, parameters, share of the target and
# tokens per pass. Tokens per pass do not depend on timing, so this may share the machine.
#   QUESTIONS=752 HELD_OUT=40 scripts/head_sweep.sh
# SIZES: space-separated ROWS:INNER:WIDTH:LAYERS (LAYERS comma-separated hidden-state layers).
# The answers come from the cache that scripts/build_default_head.sh filled (distil QUESTIONS+HELD_OUT
# there first); each head is trained by scripts/build_default_head.sh (the shipped flags) at its
# size, with HELD_OUT=0 there; heads go to $OUT (default /tmp/head-sweep).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-../shared/data}"
QUESTIONS="${QUESTIONS:-752}"
HELD_OUT="${HELD_OUT:-40}"
SIZES="${SIZES:-2000:1024:256:-1 4000:1024:256:-1 8000:1024:256:-1 2000:1024:256:-1,8,16,24 2000:2048:512:-1 8000:2048:512:-1,8,16,24}"
OUT="${OUT:-/tmp/head-sweep}"
mkdir -p "$OUT"
heads=()
for size in $SIZES; do
    IFS=: read -r rows inner width layers <<<"$size"
    head="$OUT/head-q$QUESTIONS-$rows-$inner-$width-L${layers//,/_}.safetensors"
    if [ ! -f "$head" ]; then   # the shipped head's training, at this size
        DATA="$DATA" QUESTIONS="$QUESTIONS" ROWS="$rows" HELD_OUT=0 scripts/build_default_head.sh \
            --layers="$layers" --inner "$inner" --width "$width" --store-dtype fp32 --out "$head"
    fi
    heads+=("$head")
done
ANSWERS="$(.venv/bin/python -c 'from assistant.runtime.fetch import cache_dir; print(cache_dir())')/train/SmolLM2-135M-Instruct/answers.jsonl"
.venv/bin/python scripts/tune_drafter.py "${heads[@]}" --answers "$ANSWERS" \
    --keys "gsm8k_train:$QUESTIONS:$((QUESTIONS + HELD_OUT))" --top-k 12 --depth 2 --chain-width 4
