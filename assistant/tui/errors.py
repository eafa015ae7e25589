"""Turn exceptions into what the UI shows: what went wrong and what to do next.

Contract: `explain(exc, during)` returns a `Problem(title, detail, action)` for any
exception, never raising. Known kinds are recognised by class name anywhere in
the exception's MRO (so tui/ needs no import of runtime/ or profiles/): a model
that is missing or cannot be fetched, a memory budget that is too small, a full
context, a damaged profile file, a failed adapter cycle. Anything else is an
"unexpected error" whose action points at the log file. `format_traceback` gives
the text written to that log, never to the screen.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    title: str
    detail: str
    action: str

    def render(self) -> str:
        return f"{self.title}: {self.detail}\n→ {self.action}" if self.detail else f"{self.title}\n→ {self.action}"


_KINDS: dict[str, tuple[str, str]] = {
    "ModelFetchError": ("Model missing",
                        "Check the target in profile.toml, or run `assistant ask \"hi\"` once to fetch the "
                        "default model, then restart `assistant chat`."),
    "BudgetError": ("Memory budget too small",
                    "Raise memory_budget in profile.toml, choose a smaller dtype (int8/bf16) or a smaller "
                    "target; `assistant budget --target T --memory SIZE` shows what fits."),
    "ContextFullError": ("Context full",
                         "Start a new conversation (ctrl+n), or raise memory_budget so a longer context fits."),
    "ProfileError": ("Profile problem",
                     "Fix or remove the file named above; the last good version keeps working."),
    "ArtifactError": ("Head artifact damaged",
                      "The previous head keeps working; run `assistant adapt --status` for details."),
    "AdapterError": ("Adapter failed",
                     "The chat keeps working with the current head; see `assistant adapt --status`."),
    "FileNotFoundError": ("File not found", "Check the path and try again."),
    "PermissionError": ("Permission denied", "Check the file permissions of the path named above."),
    "MemoryError": ("Out of memory",
                    "Lower memory_budget or max_new_tokens in profile.toml, or close other programs."),
}


def explain(exc: BaseException, during: str = "") -> Problem:
    """What to show for `exc`; `during` names the activity ("loading the model", ...)."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for cls in type(exc).__mro__:
        if cls.__name__ in _KINDS:
            title, action = _KINDS[cls.__name__]
            if during == "adapter" and cls.__name__ not in ("BudgetError", "ProfileError"):
                title, action = _KINDS["AdapterError"]
            return Problem(title, detail, action)
    if during == "adapter":
        title, action = _KINDS["AdapterError"]
        return Problem(title, f"{type(exc).__name__}: {detail}", action)
    where = f" while {during}" if during else ""
    return Problem(f"Unexpected error{where}", f"{type(exc).__name__}: {detail}",
                   "The details are in the chat log file; the conversation so far is saved. "
                   "Try again, or restart `assistant chat`.")


def format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
