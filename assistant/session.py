"""Session: one target + drafter ready to answer, the unit the CLI and the UI drive.

Contract: `Session(config)` is cheap; `load(progress)` loads the target and the
phrase head (the profile's current head artifact if given, else the shipped
default head for the target if one exists, else prompt lookup only). `answer(messages)`
streams `runtime.decode.Step`s for one assistant turn, using phrase speculation
(or greedy decoding when `config.method == "greedy"`). `swap_head(path)` replaces
the head between answers. All torch imports happen inside methods so that
importing this module stays cheap.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class SessionConfig:
    target: str = "default"          # "default", a local checkpoint dir, or a model id
    dtype: str = "bf16"              # fp32 | bf16 | int8
    device: str = "auto"
    max_new_tokens: int = 512
    tree_width: int = 16             # verify nodes per pass, root included
    method: str = "phrase"           # phrase | greedy
    system_prompt: str = ""
    head_path: str | None = None     # a head artifact; None = shipped default for the target
    max_context: int | None = None   # tokens; None = the model's own limit


@dataclass
class Session:
    config: SessionConfig = field(default_factory=SessionConfig)
    target: Any = None
    drafter: Any = None
    head_info: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def loaded(self) -> bool:
        return self.target is not None

    def load(self, progress: Callable[[str, float | None], None] | None = None) -> None:
        from runtime.fetch import stderr_progress
        from runtime.target import load_target

        progress = progress or stderr_progress
        progress(f"loading {self.config.target} ({self.config.dtype})", None)
        self.target = load_target(self.config.target, self.config.dtype, self.config.device, progress)
        self.swap_head(self.config.head_path)
        progress("ready", 1.0)

    def swap_head(self, path: str | Path | None) -> dict[str, Any]:
        """Load a head artifact (None: the shipped default) and use it from the next answer on."""
        from runtime.defaults import build_drafter

        drafter, info = build_drafter(self.target, path)
        with self._lock:
            self.drafter, self.head_info = drafter, info
        return info

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        msgs = list(messages)
        if self.config.system_prompt and not any(m["role"] == "system" for m in msgs):
            msgs = [{"role": "system", "content": self.config.system_prompt}] + msgs
        return self.target.encode_chat(msgs)

    def answer(self, messages: list[dict[str, str]], cancel: Callable[[], bool] | None = None,
               max_new_tokens: int | None = None) -> Iterator[Any]:
        """Stream Steps of the assistant's reply to `messages` (role/content dicts)."""
        from runtime.decode import DecodeConfig, greedy_generate, speculative_generate

        if not self.loaded:
            raise RuntimeError("session not loaded")
        ids = self.prompt_ids(messages)
        limit = max_new_tokens or self.config.max_new_tokens
        if self.config.max_context is not None:
            room = self.config.max_context - len(ids)
            if room <= 0:
                raise ContextFullError(f"the conversation uses {len(ids)} tokens and the context holds "
                                       f"{self.config.max_context}: start a new conversation")
            limit = min(limit, room)
        cfg = DecodeConfig(max_new_tokens=limit, max_nodes=self.config.tree_width)
        with self._lock:
            drafter = self.drafter
        if self.config.method == "greedy":
            return greedy_generate(self.target, ids, cfg, cancel)
        return speculative_generate(self.target, ids, drafter, cfg, cancel)

    def info(self) -> dict[str, Any]:
        t = self.target
        out = {"target": self.config.target, "dtype": self.config.dtype, "method": self.config.method,
               "tree_width": self.config.tree_width}
        if t is not None:
            out.update(model=t.name, device=str(t.device), target_parameters=t.num_parameters)
        out["head"] = self.head_info
        return out

    def with_config(self, **changes: Any) -> "Session":
        return Session(replace(self.config, **changes))


class ContextFullError(RuntimeError):
    """The conversation no longer fits the context the memory budget allows."""
