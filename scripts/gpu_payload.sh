#!/usr/bin/env bash
# Build .device/ (git-ignored) for scripts/gpu_bench.sh: the device machine reaches no package index and
# takes at most 64 MiB a call (working tree included), so the wheels it lacks, the SmolLM2 GGUF (94 MiB,
# split in two) and the two data sets travel in three folders, one per call. Run here, with network.
#   scripts/gpu_payload.sh        (DATA: the data sets' folder, default ../shared/data beside the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
PY=${PY:-.venv/bin/python}
D=.device
rm -rf "$D" && mkdir -p "$D/table" "$D/gguf1" "$D/bench/data"
wheels() {   # DEST NAME==VERSION...: manylinux wheels for the device's Python 3.12
    local dest=$1; shift
    for spec in "$@"; do
        "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
            --platform manylinux_2_17_x86_64 --platform any -d "$dest" "$spec"
    done
}
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
TRANSFORMERS="transformers==$(version transformers)" PLATFORMDIRS="platformdirs==$(version platformdirs)"
wheels "$D/table" "bitsandbytes==$(version bitsandbytes)" "$TRANSFORMERS" "$PLATFORMDIRS"
wheels "$D/bench" "$TRANSFORMERS" "$PLATFORMDIRS" "gguf==$(version gguf)"

# assistant.runtime.fetch's own download and sha256 check (ASSISTANT_GGUF: a local copy instead)
gguf=$(PYTHONPATH=. "$PY" -c 'import sys; from pathlib import Path; from assistant.runtime.fetch import fetch_gguf
print(fetch_gguf(Path(sys.argv[1])))' "$D")
head -c $((52 * 1024 * 1024)) "$gguf" > "$D/gguf1/gguf.part1"
tail -c +$((52 * 1024 * 1024 + 1)) "$gguf" > "$D/bench/gguf.part2"
case "$gguf" in "$D"/*) rm "$gguf";; esac
cp "$DATA/gsm8k_test.jsonl" "$DATA/mt_bench.jsonl" "$D/bench/data/"

tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for part in table gguf1 bench; do
    total=$(( ($(du -sb "$D/$part" | cut -f1) + tree_bytes) / 1048576 ))
    echo "$D/$part + working tree: $total MiB (limit 64)"
    [ "$total" -lt 64 ] || { echo "gpu_payload: $D/$part is too large for one call" >&2; exit 1; }
done
cat <<'CALLS'
Device calls (docs/gpu.md), each from the repo root:
  1. run carry=[".device/table"]  command="scripts/gpu_bench.sh table"    timeout_s=420
  2. run carry=[".device/gguf1"]  command="scripts/gpu_bench.sh stash"    timeout_s=60
  3. run carry=[".device/bench"]  command="scripts/gpu_bench.sh smollm2"  timeout_s=540   (at once after 2)
CALLS
