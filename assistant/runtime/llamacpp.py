"""llama.cpp's plain greedy decode of the same weights: the peer a local user would run.

Contract: `find_build()` returns a `Build` when scripts/build_llamacpp.sh has built
llama.cpp and converted the weights under the user cache directory (`llamacpp/`), else
None (bench then drops the llamacpp methods with a one-line note). `Build.generate(kind,
prompt_ids, tokenizer, max_new_tokens)` runs `llama-completion` greedily (temperature 0,
top-k 1) on the GGUF of that kind ("BF16": the cached safetensors converted, the same
weights as ours; "Q4_1": the GGUF assistant.runtime.fetch downloads) with the prompt's own text
(special tokens included, so the template is the same), and returns (generated text,
seconds, forward passes, whether it stopped at EOS) where seconds are llama.cpp's own prompt-eval + eval times: the
whole answer, prefill included, model loading excluded, as bench times the other methods.
llama.cpp is not a dependency of the runtime; nothing here is imported by it.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from assistant.runtime.fetch import DEFAULT_NAME, cache_dir

_END = "[end of text]"
_TIME = re.compile(r"(prompt eval|eval) time =\s*([\d.]+) ms /\s*(\d+) (tokens|runs)")


def llamacpp_dir() -> Path:
    return cache_dir() / "llamacpp"


@dataclass(frozen=True)
class Build:
    binary: Path
    models: dict[str, Path]            # "BF16" / "Q4_1" -> GGUF

    def generate(self, kind: str, prompt_ids: list[int], tokenizer, max_new_tokens: int,
                 ignore_eos: bool = False, threads: int | None = None) -> tuple[str, float, int, bool]:
        gguf = self.models.get(kind)
        if gguf is None:
            raise FileNotFoundError(f"no {kind} GGUF under {llamacpp_dir()}: run scripts/build_llamacpp.sh")
        prompt = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        # -p, not -f: llama.cpp drops a prompt file's trailing newline, and the chat template ends in one
        cmd = [str(self.binary), "-m", str(gguf), "-p", prompt, "-n", str(max_new_tokens),
               "--temp", "0", "--top-k", "1", "-t", str(threads or torch.get_num_threads()),
               "-c", str(len(prompt_ids) + max_new_tokens + 16), "-no-cnv", "--no-display-prompt",
               "--no-warmup"]
        if ignore_eos:
            cmd.append("--ignore-eos")
        env = dict(os.environ, LD_LIBRARY_PATH=f"{self.binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise RuntimeError(f"llama-completion failed ({proc.returncode}): {tail}")
        seconds, passes = 0.0, 0
        for name, ms, count, unit in _TIME.findall(proc.stderr):
            seconds += float(ms) / 1000
            passes += 1 if name == "prompt eval" else int(count)
        text = proc.stdout
        ended = text.rstrip().endswith(_END)             # llama-completion's own marker, not model text
        if ended:
            text = text.rstrip()[: -len(_END)].rstrip(" ")
        return text, seconds, passes, ended


def find_build(root: Path | None = None) -> Build | None:
    root = root or llamacpp_dir()
    binary = root / "bin" / "llama-completion"
    if not binary.exists():
        return None
    models = {kind: root / f"{DEFAULT_NAME}.{kind}.gguf" for kind in ("BF16", "Q4_1")}
    return Build(binary=binary, models={k: p for k, p in models.items() if p.exists()})
