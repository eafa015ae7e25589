"""The adapter's status without torch, and one cycle now: the data source of
`assistant adapt --status` and of the chat's adapter panel.

Contract: `status(profile)` -> dict (version, versions, rows, capacity,
row_budget, enabled, schedule, cycles, published, rejected, grown, evicted,
last_msg_id, pending, held_out (answers kept to judge cycles on), last_cycle,
tokens_per_pass, last_error, running ({stage, time, pid} of a cycle running now in any
process, with its progress: "finetune step 300/1200"), problems[, problem: the first]). The head is resolved
exactly as the runtime resolves it (HeadStore.current: CURRENT if good, else the
newest good version, else the shipped head), and every damaged file it met is one
line of `problems`. It reads adapter/state.json, heads/ (CURRENT, meta.json, else the
artifact's safetensors header) and history.sqlite (HistoryStore.count_accepted); it never imports torch.
`run_once(profile, target=None)` runs assistant.adapt.cycle.run_cycle and returns its report.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (tensor shapes, __metadata__), without torch; {} if unreadable."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > 1 << 28:
                return {}
            h = json.loads(f.read(n))
        return h if isinstance(h, dict) else {}
    except (OSError, ValueError):
        return {}


def _header_rows(path: Path) -> tuple[int | None, int | None]:
    """(live rows, capacity) from a head artifact's safetensors header."""
    h = _header(path)
    if not h:
        return None, None
    try:
        md = h.get("__metadata__", {})
        texts = json.loads(md.get("vocab.texts", "[]"))
        return sum(t is not None for t in texts), int(md.get("vocab.capacity", len(texts)))
    except ValueError:
        return None, None


def _header_len(path: Path, name: str) -> int:
    """Length of tensor `name` in a safetensors file, from its header (0 when absent or unreadable)."""
    try:
        return int(_header(path)[name]["shape"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        return 0


def _pending(profile, since: int) -> tuple[int | None, str | None]:
    """(accepted answers after message `since`, None) or (None, why they cannot be counted); a profile
    without a history has none (and gets no history file from this)."""
    from assistant.profiles.errors import ProfileError

    if not profile.history_path.exists():
        return 0, None
    try:
        return profile.history.count_accepted(since), None
    except ProfileError as e:
        return None, str(e)


def _shipped_head(target: str) -> Path | None:
    """The shipped head a profile without versions adapts from (assistant.runtime.defaults; no torch import)."""
    from assistant.runtime.defaults import shipped_head
    from assistant.runtime.fetch import DEFAULT_ALIASES, DEFAULT_NAME

    name = DEFAULT_NAME if target.lower() in DEFAULT_ALIASES else Path(target).name
    return shipped_head(name)


def status(profile) -> dict[str, Any]:
    from assistant.adapt.state import HELD_OUT_FILE, AdapterError, adapter_dir, read_stage, read_state
    from assistant.runtime.headconfig import base_companion

    out: dict[str, Any] = {"profile": profile.name, "adapter_dir": str(adapter_dir(profile.path))}
    try:
        st = read_state(profile.path)
    except AdapterError as e:
        st, out["problem"] = {}, str(e)
    cfg = profile.config
    heads = profile.heads
    heads.report = lambda message: None          # collected in `problems` below, printed once
    current = heads.current()                    # the head answers use: Session.from_profile resolves it so
    problems = list(heads.problems)
    version = current.parent.name if current is not None else None
    rows = capacity = None
    if current is not None:
        try:
            meta = heads.meta(version)
        except Exception as e:  # noqa: BLE001 - a damaged meta.json: the artifact's own header still tells
            meta = {}
            problems.append(f"{current.parent / 'meta.json'}: unreadable ({type(e).__name__})")
        rows, capacity = meta.get("rows"), meta.get("capacity")
        if rows is None:
            rows, capacity = _header_rows(current)
    else:
        shipped = _shipped_head(cfg.target)
        if shipped is not None:
            rows, capacity = _header_rows(shipped)
    pending, why = _pending(profile, int(st.get("last_msg_id", 0) or 0))
    if why:
        problems.append(why)
    if out.get("problem"):
        problems.insert(0, out["problem"])
    last = st.get("last_cycle") or {}
    out.update({
        "version": version, "versions": heads.versions(), "rows": rows, "capacity": capacity,
        # the frozen head the current one was adapted from, drafting beside it
        "base_beside": current is not None and base_companion(current).is_file(),
        "row_budget": cfg.row_budget, "enabled": cfg.adapter_enabled,
        "schedule": {"min_new_answers": cfg.adapter_min_new_answers, "interval_s": cfg.adapter_interval_s},
        "cycles": st.get("cycles", 0), "published": st.get("published", 0), "rejected": st.get("rejected", 0),
        "grown": st.get("grown", 0), "evicted": st.get("evicted", 0),
        "last_msg_id": st.get("last_msg_id", 0),
        "pending": pending,
        "held_out": _header_len(adapter_dir(profile.path) / HELD_OUT_FILE, "keys"),
        "last_cycle": last or None,
        "tokens_per_pass": last.get("tokens_per_pass"),
        "last_error": st.get("last_error"),
        "running": read_stage(profile.path),
        "problems": problems,
    })
    if problems:
        out["problem"] = problems[0]
    return out




def run_once(profile, target=None, **kw) -> dict[str, Any]:
    from assistant.adapt.cycle import run_cycle

    return run_cycle(profile, target=target, **kw)


__all__ = ["run_once", "status"]
