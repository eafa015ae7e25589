#!/usr/bin/env bash
# Build llama.cpp (the peer a local user would run) and convert the cached SmolLM2 weights to GGUF,
# so `assistant bench --methods ...,llamacpp` can time its plain greedy decode beside ours.
# Not part of `make test`; ~10 min on 2 cores. Everything lands under the user cache directory
# ($ASSISTANT_CACHE or ~/.cache/assistant)/llamacpp:
#   bin/llama-completion, bin/llama-bench      built from the llama.cpp vendored in the llama-cpp-python sdist
#   SmolLM2-135M-Instruct.BF16.gguf            the cached safetensors weights, converted (same weights as ours)
#   SmolLM2-135M-Instruct.Q4_1.gguf            the GGUF assistant/runtime/fetch.py downloads (linked)
# Usage: scripts/build_llamacpp.sh [PYTHON]   (PYTHON: the project's venv python, default .venv/bin/python)
# LLAMACPP_CMAKE_ARGS replaces -DGGML_NATIVE=ON, e.g. for a build held to AVX2 as on a laptop's CPU:
#   LLAMACPP_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
set -euo pipefail
PY=${1:-.venv/bin/python}
VERSION=0.3.36
CACHE=$("$PY" -c 'from assistant.runtime.fetch import cache_dir; print(cache_dir())')
OUT="$CACHE/llamacpp"
WORK="$OUT/src"
mkdir -p "$OUT/bin" "$WORK"
command -v cmake >/dev/null && command -v ninja >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake ninja-build >/dev/null; }
if [ ! -x "$OUT/bin/llama-completion" ]; then
  echo "[llamacpp] downloading the llama-cpp-python $VERSION sdist (it vendors llama.cpp)"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
  tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
  ISA=${LLAMACPP_CMAKE_ARGS:--DGGML_NATIVE=ON}
  echo "[llamacpp] configuring ($ISA)"
  # shellcheck disable=SC2086  # ISA is a list of cmake arguments
  cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $ISA -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF >/dev/null
  echo "[llamacpp] building llama-completion and llama-bench (~10 min on 2 cores)"
  cmake --build "$WORK/build" -j"$(nproc)" --target llama-completion llama-bench
  cp "$WORK/build/bin/llama-completion" "$WORK/build/bin/llama-bench" "$OUT/bin/"
  cp "$WORK"/build/bin/*.so* "$OUT/bin/" 2>/dev/null || true
fi
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
MODEL=$("$PY" -c 'from assistant.runtime.fetch import ensure_default_model; print(ensure_default_model())')
if [ ! -f "$OUT/SmolLM2-135M-Instruct.BF16.gguf" ]; then
  echo "[llamacpp] converting $MODEL to a BF16 GGUF"
  "$PY" -m pip install -q sentencepiece "gguf>=0.10"
  "$PY" "$SRC/convert_hf_to_gguf.py" "$MODEL" --outtype bf16 --outfile "$OUT/SmolLM2-135M-Instruct.BF16.gguf"
fi
if [ ! -f "$OUT/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  echo "[llamacpp] fetching the Q4_1 GGUF assistant/runtime/fetch.py uses (sha256-checked)"
  "$PY" -c "import pathlib, shutil; from assistant.runtime.fetch import fetch_gguf; g = fetch_gguf(pathlib.Path('$WORK')); shutil.copy(g, '$OUT/SmolLM2-135M-Instruct.Q4_1.gguf')"
fi
echo "[llamacpp] ready: $OUT"
ls -la "$OUT"
