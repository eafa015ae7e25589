#!/usr/bin/env bash
# Head-size sweep (docs/log/2026-12-01-sessions-1-7.md, "Head-size sweep"): phrase heads trained on the SAME
# distilled answers (gsm8k_train 0..QUESTIONS, plus arena_hard_prompts 0..ARENA) at several sizes, each
# measured by replaying the decode loop offline (scripts/tune_drafter.py: phrase head + prompt lookup,
# 16-node trees, one tree shape for all) on the HELD_OUT gsm8k_train answers that follow; prints rows,
# parameters, share of the target and tokens per pass. Tokens per pass do not depend on timing, so this
# may share the machine.
#   QUESTIONS=752 HELD_OUT=40 scripts/head_sweep.sh
# SIZES: space-separated ROWS:INNER:WIDTH:LAYERS (LAYERS comma-separated hidden-state layers).
# Each head is trained by `assistant train` with the shipped head's flags (its recipe,
# assistant/runtime/data/heads/SmolLM2-135M-Instruct.recipe.toml: batch-32 distillation, the rest
# TrainConfig's defaults) at its size, stored fp32; heads go to $OUT (default /tmp/head-sweep). The
# answers are distilled once, into the user cache dir's work directory, and shared by every size.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-../shared/data}"
QUESTIONS="${QUESTIONS:-752}"
ARENA="${ARENA:-400}"
HELD_OUT="${HELD_OUT:-40}"
SIZES="${SIZES:-2000:1024:256:-1 4000:1024:256:-1 8000:1024:256:-1 2000:1024:256:-1,8,16,24 2000:2048:512:-1 8000:2048:512:-1,8,16,24}"
OUT="${OUT:-/tmp/head-sweep}"
mkdir -p "$OUT"
chat=()
[ "$ARENA" -gt 0 ] && chat=(--data "$DATA/arena_hard_prompts.jsonl:0:$ARENA")
heads=()
for size in $SIZES; do
    IFS=: read -r rows inner width layers <<<"$size"
    head="$OUT/head-q$QUESTIONS-$rows-$inner-$width-L${layers//,/_}.safetensors"
    if [ ! -f "$head" ]; then
        .venv/bin/assistant train --data "$DATA/gsm8k_train.jsonl:0:$QUESTIONS" "${chat[@]}" --gen-batch 32 \
            --rows "$rows" --layers="$layers" --inner "$inner" --width "$width" --store-dtype fp32 --out "$head"
    fi
    heads+=("$head")
done
# the held-out answers (after the training ones, in batches of their own, as `assistant train --recipe` does)
ANSWERS="$(.venv/bin/assistant train --data "$DATA/gsm8k_train.jsonl:$QUESTIONS:$((QUESTIONS + HELD_OUT))" \
    --gen-batch 32 --distill-only)"
.venv/bin/python scripts/tune_drafter.py "${heads[@]}" --answers "$ANSWERS" \
    --keys "gsm8k_train:$QUESTIONS:$((QUESTIONS + HELD_OUT))" --top-k 12 --depth 2 --chain-width 4
