"""Session: one target + drafter ready to answer, the unit the CLI and the UI drive.

Contract: `Session(config)` is cheap; `load(progress)` loads the target and the
phrase head (the profile's current head artifact if given, else the shipped
default head for the target if one exists, else prompt lookup only). `answer(messages)`
streams `assistant.runtime.decode.Step`s for one assistant turn, using phrase speculation
(or greedy decoding when `config.method == "greedy"`). `swap_head(path)` replaces
the head between answers. Each answer starts from the KV cache the last one left (`kept`,
assistant.runtime.prefix): a chat's next turn prefills only what its prompt adds to the
conversation so far. With engine "auto" and no saved compiled engine yet, `load`
starts building it in a background process (assistant.runtime.background) and answers on the
eager engine; the compiled one is switched in between answers once it is ready
(`maybe_upgrade_engine`), so no start waits on the compiler. All torch imports happen
inside methods so that importing this module stays cheap. The tree width of the answers is
assistant.runtime.width.plan_width's: the config's tree_width (lowered by the memory budget when
planned from a profile) caps every pass, and with auto width the cost model's plan starts it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from assistant.runtime.prefix import KeptCache
from assistant.runtime.width import DEFAULT_WIDTH, plan_width


@dataclass(frozen=True)
class SessionConfig:
    target: str = "default"          # "default", a local checkpoint dir, or a model id
    dtype: str = "auto"              # auto | fp32 | bf16 | int8 (assistant.runtime.budget.resolve_dtype)
    device: str = "auto"
    max_new_tokens: int = 512
    tree_width: int = DEFAULT_WIDTH  # most verify nodes per pass, root included (the memory budget's cap)
    auto_width: bool = True          # pick the width <= tree_width that is fastest on this device
    method: str = "phrase"           # phrase | greedy
    system_prompt: str = ""
    head_path: str | None = None     # a head artifact; None = shipped default for the target
    max_context: int | None = None   # tokens; None = the model's own limit
    engine: str = "auto"             # auto | eager | compiled (assistant.runtime.engine; auto: the measured faster here)
    threads: int | None = None       # torch threads of the answers; None: measured and fitted to the load
    history_lookup: bool = True      # draft from the profile's past answers too (assistant.runtime.history_lookup),
                                     # ranked with the other sources (a lookup that does not pay loses its nodes)
    history_tokens: int = 1_000_000  # most tokens of past answers indexed (4 bytes each), newest kept


@dataclass
class Session:
    config: SessionConfig = field(default_factory=SessionConfig)
    target: Any = None
    drafter: Any = None
    head_info: dict[str, Any] = field(default_factory=dict)
    profile_path: Path | None = None                        # marks answers in progress for other processes
    head_source: Callable[[], Path | None] | None = None    # the newest published head (the profile's CURRENT)
    busy: threading.Event = field(default_factory=threading.Event, repr=False)  # set while answering
    on_loaded: list[Callable[["Session"], None]] = field(default_factory=list, repr=False)
    width: int = 0                                          # verify width in use (set by load)
    width_ctl: Any = None                                   # assistant.runtime.width.WidthController (auto width)
    engine: Any = None                                      # assistant.runtime.engine engine the answers run on
    kept: KeptCache = field(default_factory=KeptCache, repr=False)  # the last answer's KV cache, for the next prompt
    pending_engine: Path | None = None                      # a compiled engine building in the background
    threads: int = 0                                        # torch's default thread count (set by load)
    thread_policy: Any = None                               # assistant.runtime.threads.ThreadPolicy of the answers
    progress: Callable[[str, float | None], None] | None = field(default=None, repr=False)   # load's reporter
    past_answers: Callable[[], list[str]] | None = None     # the profile's accepted answers, oldest first
    history: Any = None                                     # assistant.runtime.history_lookup.AnswerIndex of them
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_profile(cls, profile: Any, **overrides: Any) -> "Session":
        """A Session for a profiles.Profile: its config, budget, current head and adapter hooks."""
        return cls(session_config_from_profile(profile, **overrides), profile_path=profile.path,
                   head_source=profile.heads.current, past_answers=profile.history.answer_texts)

    @property
    def loaded(self) -> bool:
        return self.target is not None

    def load(self, progress: Callable[[str, float | None], None] | None = None) -> None:
        from assistant.runtime.fetch import stderr_progress
        from assistant.runtime.target import load_target

        from assistant.runtime.budget import resolve_dtype

        progress = progress or stderr_progress
        self.progress = progress
        import torch

        self.threads = torch.get_num_threads()
        if self.config.dtype == "auto":
            self.config = replace(self.config, dtype=resolve_dtype("auto", self.config.device))
        progress(f"loading {self.config.target} ({self.config.dtype})", None)
        self.target = load_target(self.config.target, self.config.dtype, self.config.device, progress)
        self.history = self._index_past_answers()
        self.swap_head(self.config.head_path)
        kind, state, path = self.config.engine, "", None
        if kind == "auto":
            from assistant.runtime.background import background_state, failed_reason, start_build

            state, path = background_state(self.target, self._feature_layers())
            if state == "failed":
                progress(f"compiled engine unavailable (its build failed: {failed_reason(path)}); using the eager "
                         "engine", None)
            kind = "eager" if state in ("missing", "failed") else kind
        self._use_engine(kind, progress)          # before the build starts: it would skew the cost measurement
        self._measure_threads(progress)
        if state == "missing":
            from assistant.runtime.layout import packed_keys

            start_build(self.target.path, self.target.dtype, "cpu", self._feature_layers(), path,
                        first_key=min(packed_keys(self.target.model), default=0))
            progress("the compiled engine is being built in the background (once per machine, 1-2 min); "
                     "answering on the eager engine until it is ready", None)
            self.pending_engine = path
        progress("ready", 1.0)
        for hook in self.on_loaded:
            hook(self)

    def _feature_layers(self) -> tuple[int, ...]:
        return tuple(getattr(self.drafter, "feature_layers", (-1,)))

    def _use_engine(self, kind: str, progress: Callable[[str, float | None], None]) -> None:
        from assistant.runtime.costmodel import apply_plan, pick_engine

        engine, plan = pick_engine(self.target, self.config.tree_width, progress, kind=kind,
                                   max_len=self.config.max_context, feature_layers=self._feature_layers(),
                                   threads=self.config.threads)
        apply_plan(self.target, plan)
        self.engine = engine
        widths = plan_width(self.config.tree_width, verify=plan,
                            auto=self.config.auto_width and self.config.method == "phrase")
        # one controller per engine: the width follows what the head banks on this user's text
        self.width, self.width_ctl = widths.start, widths.controller()

    def _measure_threads(self, progress: Callable[[str, float | None], None]) -> None:
        from assistant.runtime.threads import ThreadPolicy

        self.thread_policy = ThreadPolicy.for_engine(self.target, self.engine, self.config.threads, progress)

    def maybe_upgrade_engine(self, progress: Callable[[str, float | None], None] | None = None) -> bool:
        """Between answers: once the background build of the compiled engine has finished, load it and
        use it if it is the faster one here (True when the engine changed)."""
        path = self.pending_engine
        if path is None:
            return False
        from assistant.runtime.background import failed_reason, ready

        if failed_reason(path) is not None:
            self.pending_engine = None
            return False
        if not ready(path):
            return False
        self.pending_engine = None
        before = self.engine
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)   # the cost model measures (and caches) at the default count
        progress = progress or self.progress or (lambda *a: None)
        self._use_engine("auto", progress)
        self._measure_threads(progress)
        return self.engine is not before and self.engine.name != before.name

    def swap_head(self, path: str | Path | None) -> dict[str, Any]:
        """Load a head artifact (None: the shipped default) and use it from the next answer on."""
        from assistant.runtime.defaults import build_drafter

        drafter, info = build_drafter(self.target, path, history=self.history)
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
        """Stream Steps of the assistant's reply to `messages` (role/content dicts).

        Between answers a head newly published by the adapter is swapped in; while the
        answer streams, the session is marked busy so the adapter yields the CPU.
        """
        from assistant.runtime.decode import DecodeConfig, greedy_generate, speculative_generate

        if not self.loaded:
            raise RuntimeError("session not loaded")
        if self.head_source is not None:
            self.maybe_reload_head(self.head_source())
        self.maybe_upgrade_engine()
        ids = self.prompt_ids(messages)
        limit = max_new_tokens or self.config.max_new_tokens
        context = self.context_limit()
        room = context - len(ids)
        if room <= 0:          # refused before any forward: a prompt past the context cannot be answered
            raise ContextFullError(f"the conversation uses {len(ids):,} tokens and the context holds {context:,}: "
                                   "shorten it or start a new conversation")
        limit = min(limit, room)
        # the cap plan_width settled (the memory budget's, when planned); the controller picks below it
        cfg = DecodeConfig(max_new_tokens=limit, max_nodes=self.config.tree_width)
        with self._lock:
            drafter = self.drafter
        if self.config.method == "greedy":
            steps = greedy_generate(self.target, ids, cfg, cancel, engine=self.engine, kept=self.kept)
        else:
            steps = speculative_generate(self.target, ids, drafter, cfg, cancel, width=self.width_ctl,
                                         engine=self.engine, kept=self.kept)
        return self._marked_busy(steps)

    def context_limit(self) -> int:
        """Tokens an answer's prompt + reply may hold: the memory budget's context, at most the model's own."""
        own = int(getattr(self.target.model.config, "max_position_embeddings", 0) or 0) if self.target else 0
        limits = [n for n in (self.config.max_context, own) if n]
        return min(limits) if limits else 1 << 30

    def _marked_busy(self, steps: Iterator[Any]) -> Iterator[Any]:
        """Runs in the thread that iterates the answer: the thread count is set there, for its forwards."""
        from assistant.adapt.worker import generating
        from assistant.runtime.threads import ThreadPolicy

        if self.thread_policy is None:
            self.thread_policy = ThreadPolicy(fixed=self.config.threads)
        self.thread_policy.apply()
        with generating(self.profile_path, self.busy):
            if self.history is None:
                yield from steps
                return
            tokens: list[int] = []
            for step in steps:
                tokens.extend(step.tokens)
                yield step
        self.history.add(tokens)          # only an answer that ran to its end (a stopped one raises above)

    def _index_past_answers(self) -> Any:
        """The lookup index of the profile's past answers (None without a profile history)."""
        if self.past_answers is None or not self.config.history_lookup or self.config.method == "greedy":
            return None
        from assistant.runtime.history_lookup import AnswerIndex

        return AnswerIndex.from_texts(self.past_answers(), self.target.tokenizer, self.config.history_tokens)

    def info(self) -> dict[str, Any]:
        t = self.target
        out = {"target": self.config.target, "dtype": self.config.dtype, "method": self.config.method,
               "engine": getattr(self.engine, "name", None), "engine_building": self.pending_engine is not None,
               "threads": self.thread_policy.last if self.thread_policy is not None and self.thread_policy.last else None,
               "tree_width": (self.width_ctl.best() if self.width_ctl is not None
                              else self.width or self.config.tree_width)}
        if t is not None:
            out.update(model=t.name, device=str(t.device), target_parameters=t.num_parameters)
        out["head"] = self.head_info
        return out

    def with_config(self, **changes: Any) -> "Session":
        return Session(replace(self.config, **changes))

    def maybe_reload_head(self, path: str | Path | None) -> bool:
        """Between answers: use the head artifact at `path` if it is not the one in use (True when
        swapped). An answer already streaming keeps the drafter it started with; a head that fails
        to load is reported (returns False) and the current one keeps working."""
        if path is None or not self.loaded:
            return False
        if str(path) == str((self.head_info or {}).get("head")):
            return False
        try:
            self.swap_head(path)
        except Exception as e:  # noqa: BLE001 - a bad adapter head must not stop the chat
            import logging

            logging.getLogger("assistant.session").warning("head %s not swapped in: %s", path, e)
            return False
        return True


class ContextFullError(RuntimeError):
    """The conversation no longer fits the context the memory budget allows."""


def session_config_from_profile(profile: Any, **overrides: Any) -> SessionConfig:
    """Map a profiles.Profile onto a SessionConfig that obeys the profile's memory budget.

    head_path = the profile's current head (falling back to its last good version; None: the
    shipped default). With `memory_budget` set, assistant.runtime.budget plans the target before anything
    is loaded: BudgetError (one line, with the numbers) when it cannot fit, else max_context and
    tree_width come from the plan. `overrides` are SessionConfig fields applied before planning.
    """
    cfg = profile.config
    head = profile.heads.current()
    sc = SessionConfig(target=cfg.target, dtype=cfg.dtype, max_new_tokens=cfg.max_new_tokens,
                       tree_width=cfg.tree_width, system_prompt=cfg.system_prompt, threads=cfg.threads,
                       head_path=str(head) if head else None, history_lookup=cfg.history_lookup,
                       history_tokens=cfg.history_tokens)
    sc = replace(sc, **overrides)
    if sc.dtype == "auto":
        from assistant.runtime.budget import resolve_dtype

        sc = replace(sc, dtype=resolve_dtype("auto", sc.device))
    if cfg.memory_budget:
        from assistant.runtime.budget import budget_limits

        width, context = budget_limits(sc.target, sc.dtype, cfg.memory_budget, sc.tree_width, device=sc.device,
                                       head_path=sc.head_path, head_rows=cfg.row_budget, max_context=sc.max_context,
                                       history_tokens=sc.history_tokens if sc.history_lookup else 0)
        sc = replace(sc, max_context=context, tree_width=width)
    return sc


def open_session(profile_name: str | None = None, **overrides: Any) -> "Session":
    """An unloaded Session for the named profile (None: the default profile, created if missing)."""
    from assistant.profiles import Profile

    return Session.from_profile(Profile.open(profile_name), **overrides)
