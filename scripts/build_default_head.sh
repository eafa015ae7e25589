#!/usr/bin/env bash
# Rebuild the shipped phrase head for SmolLM2-135M-Instruct:
#   assistant/runtime/data/heads/SmolLM2-135M-Instruct.safetensors
# The one documented command (see docs/training.md). Every stage is resumable: rerun it after an
# interruption and it continues (work files in the user cache dir, <cache>/train/SmolLM2-135M-Instruct/).
# Environment overrides: DATA (folder of the shared data sets), QUESTIONS (GSM8K-train questions
# distilled), ARENA (arena_hard_prompts lines 0..ARENA-1 distilled too, for open chat; 0: maths
# only; keep it <= 400: lines 400-499 are the simulated arena user's future prompts in BENCHMARKS.md's
# online-adaptation runs),
# ROWS (draft-vocabulary rows), HELD_OUT (answers after the training ones used to pick the tree
# shape, default 40; 0 skips that step). Extra arguments go to `assistant train` and win over the
# shipped flags (scripts/head_sweep.sh trains its other sizes this way).
# Then scripts/tune_drafter.py picks the tree shape (top_k, chain depth/width) on the held-out answers
# that follow the training ones, when the cache has them (a run with QUESTIONS+HELD_OUT distilled them),
# and stores it in the artifact; without them the head keeps the drafter's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-../shared/data}"
QUESTIONS="${QUESTIONS:-1500}"
ARENA="${ARENA:-400}"
ROWS="${ROWS:-4000}"
HELD_OUT="${HELD_OUT:-40}"
OUT=assistant/runtime/data/heads/SmolLM2-135M-Instruct.safetensors
chat=()
[ "$ARENA" -gt 0 ] && chat=(--data "$DATA/arena_hard_prompts.jsonl:0:$ARENA")
prev=""
for arg in "$@"; do   # the artifact path, so that the tuning step below finds it
    case "$arg" in --out=*) OUT="${arg#--out=}";; esac
    [ "$prev" = "--out" ] && OUT="$arg"
    prev="$arg"
done
.venv/bin/assistant train \
  --target default --dtype fp32 \
  --data "$DATA/gsm8k_train.jsonl:0:$QUESTIONS" \
  "${chat[@]}" \
  --max-new-tokens 256 --gen-batch 32 \
  --rows "$ROWS" --max-words 3 --chain-width 4 \
  --layers=-1 --feature-layers=-1,8,16,24 \
  --inner 1024 --width 256 --epochs 4 \
  --store-dtype fp16 \
  --out "$OUT" "$@"
ANSWERS="$(.venv/bin/python -c 'from assistant.runtime.fetch import cache_dir; print(cache_dir())')/train/SmolLM2-135M-Instruct/answers.jsonl"
KEYS="gsm8k_train:$QUESTIONS:$((QUESTIONS + HELD_OUT))"
found="$(grep -c "\"gsm8k_train:$((QUESTIONS + HELD_OUT - 1))\"" "$ANSWERS" 2>/dev/null || true)"
if [ "$HELD_OUT" -eq 0 ]; then
  echo "[train] HELD_OUT=0: the head keeps the drafter's default tree shape" >&2
elif [ "${found:-0}" -gt 0 ]; then
  .venv/bin/python scripts/tune_drafter.py "$OUT" --answers "$ANSWERS" --keys "$KEYS" \
    --top-k 6,12 --depth 2 --chain-width 2,4 --write
else
  echo "[train] no held-out answers $KEYS in the cache: the head keeps the drafter's default tree shape" >&2
fi
