#!/usr/bin/env bash
# Rebuild the shipped phrase head for SmolLM2-135M-Instruct:
#   runtime/data/heads/SmolLM2-135M-Instruct.safetensors
# The one documented command (see docs/training.md). Every stage is resumable: rerun it after an
# interruption and it continues (work files in the user cache dir, <cache>/train/SmolLM2-135M-Instruct/).
# Environment overrides: DATA (folder of the shared data sets), QUESTIONS (GSM8K-train questions
# distilled), ROWS (draft-vocabulary rows). Extra arguments go to `assistant train`.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${DATA:-/work/shared/data}"
QUESTIONS="${QUESTIONS:-1500}"
ROWS="${ROWS:-8000}"
exec .venv/bin/assistant train \
  --target default --dtype fp32 \
  --data "$DATA/gsm8k_train.jsonl:0:$QUESTIONS" \
  --max-new-tokens 256 --gen-batch 32 \
  --rows "$ROWS" --max-words 3 --chain-width 4 \
  --layers=-1 --feature-layers=-1,8,16,24 \
  --inner 1024 --width 256 --epochs 4 \
  --store-dtype fp16 \
  --out runtime/data/heads/SmolLM2-135M-Instruct.safetensors "$@"
