#!/usr/bin/env bash
# The GPU checks (the SmolLM2 bench on the GPU; t(w)/t(1) of a Qwen3-4B-shaped verify), run ON the device
# machine (no package index there; docs/gpu.md: how the payload built by scripts/gpu_payload.sh gets there,
# three calls, the 2nd and 3rd within the machine's warm time):
#   scripts/gpu_bench.sh table     GPU tests, then t(w)/t(1) of a random Qwen3-4B-shaped model, bf16 and
#                                  bitsandbytes int8, eager and compiled engines (carry .device/table)
#   scripts/gpu_bench.sh stash     keep the first part of the SmolLM2 GGUF in /tmp (carry .device/gguf1)
#   scripts/gpu_bench.sh smollm2   the full bench for SmolLM2 on the GPU, both engines (carry .device/bench)
# Results go to $OUT (the device's return folder; ./gpu-results when unset).
# Environment: PROMPTS (5), TOKENS (96), DTYPES ("bf16 fp32") for smollm2.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
PY=${PY:-python3}
SITE=/tmp/assistant-site STASH=/tmp/assistant-stash
mkdir -p "$OUT" "$SITE" "$STASH"
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ASSISTANT_CACHE=/tmp/assistant-cache ASSISTANT_HOME=/tmp/assistant-home HF_HUB_OFFLINE=1

install() {   # the carried wheels, without their dependencies (the image has them)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"
    "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
               "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
}

case "${1:-}" in
table)
    install .device/table/*.whl
    "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider tests/runtime/test_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" ||
        echo "gpu_bench: GPU tests failed (gpu-tests.log); the table runs anyway" >&2
    "$PY" scripts/verify_cost_table.py --engines eager,compiled --json "$OUT/verify-table.json" | tee "$OUT/verify-table.md"
    ;;
stash)
    cp .device/gguf1/gguf.part1 "$STASH/"
    ls -l "$STASH"
    ;;
smollm2)
    if [ ! -f "$STASH/gguf.part1" ]; then
        echo "gpu_bench: $STASH/gguf.part1 is missing (the machine was given back after 'stash'): run 'stash' again, then this at once" >&2
        exit 1
    fi
    install .device/bench/*.whl
    cat "$STASH/gguf.part1" .device/bench/gguf.part2 > "$STASH/SmolLM2-135M-Instruct.Q4_1.gguf"
    export ASSISTANT_GGUF="$STASH/SmolLM2-135M-Instruct.Q4_1.gguf"
    DATA=.device/bench/data OUT="$OUT" PLOT="$OUT/bench-gpu.png" PY="$PY" \
        scripts/bench_all.sh "${PROMPTS:-5}" "${TOKENS:-96}" "${DTYPES:-bf16 fp32}" 2>&1 | tee "$OUT/bench.log"
    ;;
*)
    sed -n '2,10p' "$0"
    exit 2
    ;;
esac
