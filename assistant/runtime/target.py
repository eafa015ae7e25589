"""Load the frozen target model and its tokenizer.

Contract: `load_target(spec, dtype, device)` returns a `Target` whose model is in
eval mode with gradients off. `spec` is "default" (the embedded SmolLM2-135M-
Instruct, fetched on first use by assistant.runtime.fetch), a local checkpoint directory,
or a model id such as "Qwen/Qwen3-4B" resolved by transformers (its local cache
only when no hub is reachable). dtype is "fp32", "bf16" or "int8" (bitsandbytes
8-bit, CUDA only); device "auto" is settled by assistant.runtime.budget.resolve_device, as
the memory planner settles it. `load_model(path, dtype, device)` is the model half alone,
for a checkpoint without a tokenizer (scripts/verify_cost_table.py). Any failure to find or
load raises ModelFetchError with one line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from assistant.runtime.budget import resolve_device
from assistant.runtime.fetch import (DEFAULT_ALIASES, DEFAULT_NAME, ModelFetchError, Progress, ensure_default_model,
                                     stderr_progress)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Target:
    """A frozen causal LM and its tokenizer."""

    model: Any
    tokenizer: Any
    name: str
    dtype: str
    device: torch.device
    path: str | None = None        # the checkpoint directory (None: built in memory), for a background compile

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if src is None:
                continue
            ids.update(src if isinstance(src, (list, tuple)) else [src])
        return ids

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation with the generation prompt appended."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            return list(out)
        text = "\n".join(m["content"] for m in messages) + "\n"
        return tok(text)["input_ids"]


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def load_model(path: str, dtype: str, dev: torch.device, spec: str | None = None):
    """The causal LM at `path` in `dtype` on `dev`, eval mode, gradients off (int8: bitsandbytes, CUDA only)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {}
    if dtype == "int8":
        if dev.type != "cuda":
            raise ModelFetchError("dtype int8 (bitsandbytes) needs a CUDA device; use --dtype bf16 or fp32 on the CPU")
        from transformers import BitsAndBytesConfig
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = {"": dev.index or 0}
    elif dtype in DTYPES:
        kwargs["dtype"] = DTYPES[dtype]
    else:
        raise ModelFetchError(f"unknown dtype {dtype!r}: choose fp32, bf16 or int8")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()        # one progress display: the caller's ("loading ...")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelFetchError(f"cannot load model {spec or path!r}: {_first_line(e)}") from e
    if dtype != "int8":
        model.to(dev)
    model.eval()
    model.requires_grad_(False)
    return model


def load_target(spec: str = "default", dtype: str = "fp32", device: str = "auto",
                progress: Progress = stderr_progress) -> Target:
    """Load the target named by `spec` (see module docstring)."""
    from transformers import AutoTokenizer

    dev = torch.device(resolve_device(device))
    if spec.lower() in DEFAULT_ALIASES:
        path: str = str(ensure_default_model(progress))
        name = DEFAULT_NAME
    else:
        path = spec
        name = Path(spec).name if os.path.isdir(spec) else spec
        if not os.path.isdir(spec) and os.path.sep in spec and not spec.count("/") == 1:
            raise ModelFetchError(f"model directory not found: {spec}")
    model = load_model(path, dtype, dev, spec)      # first: it refuses a dtype the device cannot run
    if dev.type == "cpu" and model.dtype in (torch.bfloat16, torch.float32):
        from assistant.runtime import kernels

        kernels.load(progress)      # built once per machine; its packed layout and compiled engine run on them
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ModelFetchError(f"cannot load model {spec!r}: {_first_line(e)}") from e
    return Target(model=model, tokenizer=tokenizer, name=name, dtype=dtype, device=dev,
                  path=path if os.path.isdir(path) else None)
