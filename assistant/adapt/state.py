"""The adapter's folder in a profile: its layout, lock, state, running stage and held-out set.

Contract: everything lives in <profile>/adapter/:
  .lock                 one cycle at a time per profile (`cycle_lock`; AdapterBusy when held)
  state.json            the cursor and counters (`read_state`/`write_state`; written after a publish)
  stage.json            the running cycle's stage for other processes (`StageFile`, `read_stage`)
  heldout.safetensors   the user's held-out answers with their features (`load_held_out`/`save_held_out`,
                        `merge_held_out` keeps the newest)
  replay.safetensors, vocab_log.jsonl, generating, anchor.*, rehearsal.*: see assistant.adapt.replay,
                        assistant.adapt.grow, assistant.adapt.worker and assistant.adapt.slices
Every write goes through assistant.profiles.atomic (temp file, fsync, rename, fsync the folder), so a
kill leaves the old or the new file. `copy_reset(src, dst)` copies a profile with its adapter state
reset, for the experiments in scripts/. Nothing here imports torch at module level.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from assistant.profiles.atomic import atomic_write_bytes, atomic_write_text, read_json

ADAPTER_DIR = "adapter"
STATE_FILE = "state.json"
REPLAY_FILE = "replay.safetensors"
VOCAB_LOG = "vocab_log.jsonl"
LOCK_FILE = ".lock"
STAGE_FILE = "stage.json"
BUSY_FILE = "generating"
HELD_OUT_FILE = "heldout.safetensors"
CYCLE_KEY = "adapter_cycle"      # in the meta of every head version a cycle publishes: its cycle number


class AdapterError(RuntimeError):
    """The adapter cannot run (no head to adapt, ...): a one-line reason."""


class AdapterBusy(AdapterError):
    """Another adapter holds the profile's adapter lock."""


class CycleCancelled(Exception):
    """Raised by a pause() callback to stop a cycle (nothing is published)."""


def adapter_dir(profile_path: str | Path) -> Path:
    return Path(profile_path) / ADAPTER_DIR


@contextmanager
def cycle_lock(adir: Path) -> Iterator[None]:
    """Hold adapter/.lock for one cycle (never waits: AdapterBusy when another cycle holds it)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(adir / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout as e:
        raise AdapterBusy(f"{adir / LOCK_FILE}: another adapter cycle is running for this profile") from e
    try:
        yield
    finally:
        lock.release()


def copy_reset(src: str | Path, dst: str | Path) -> None:
    """Copy a profile folder with its adapter state reset (no replay buffer, state, change log, held-out
    set, lock or busy marker; the anchor and rehearsal slices are kept, they depend only on the base head):
    the experiments in scripts/ replay one user's history from the start. Of the head versions only those
    the adapter did not publish (a head the user installed: its meta has no CYCLE_KEY) are kept, the
    newest current, so the copy starts from the same base head as the user did."""
    import shutil

    from assistant.profiles.heads import ARTIFACT, META, HeadStore
    from assistant.profiles.paths import HEADS_DIR

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(HEADS_DIR, REPLAY_FILE, STATE_FILE, VOCAB_LOG,
                                                            HELD_OUT_FILE, LOCK_FILE, BUSY_FILE))
    heads = Path(src) / HEADS_DIR
    if not heads.is_dir():
        return
    old, new = HeadStore(heads), HeadStore(Path(dst) / HEADS_DIR)
    for version in old.versions():
        meta = old.meta(version)
        if CYCLE_KEY in meta or old.check(version) is not None:
            continue
        folder = old.path_of(version).parent
        companions = {f.name: f for f in folder.iterdir() if f.is_file() and f.name not in (ARTIFACT, META)}
        new.publish(folder / ARTIFACT, meta, prune=False, companions=companions)   # its own keys rewritten


def read_state(profile_path: str | Path) -> dict[str, Any]:
    p = adapter_dir(profile_path) / STATE_FILE
    return read_json(p, lambda e: AdapterError(f"{p}: damaged adapter state ({e}); delete it to start over"))


def write_state(profile_path: str | Path, state: dict[str, Any]) -> None:
    state = dict(state, updated=time.time())
    atomic_write_text(adapter_dir(profile_path) / STATE_FILE, json.dumps(state, indent=1, sort_keys=True))


def count(state: dict, key: str) -> int:
    """A counter of the state (0 when absent)."""
    return int(state.get(key, 0) or 0)


class StageFile:
    """Forwards each stage to `on_stage` and keeps adapter/stage.json current (atomically, at most once a
    second for progress within a stage), so `assistant adapt --status` in another process and the chat's
    panel show what a running cycle does; removed when the cycle ends."""

    def __init__(self, path: Path, on_stage: Callable[[str], None] | None):
        self.path, self.on_stage, self._last = path, on_stage, (None, 0.0)

    def __call__(self, text: str) -> None:
        if self.on_stage is not None:
            self.on_stage(text)
        name, now = text.split()[0].rstrip(":"), time.time()
        if name == self._last[0] and now - self._last[1] < 1.0:
            return
        self._last = (name, now)
        try:
            atomic_write_text(self.path, json.dumps({"stage": text, "time": now, "pid": os.getpid()}))
        except OSError:
            pass

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def read_stage(profile_path: Path) -> dict[str, Any] | None:
    """The running cycle's {"stage", "time", "pid"} (None when no cycle runs: absent, or its process died)."""
    try:
        data = json.loads((adapter_dir(profile_path) / STAGE_FILE).read_text())
        os.kill(int(data["pid"]), 0)
        return data
    except ProcessLookupError:
        return None
    except PermissionError:
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_held_out(path: Path, layers, target_name: str):
    """(answers, features) of the user's held-out answers from earlier cycles; ([], None) when there
    are none or they were taken with other feature layers or another target (or the file is damaged:
    the set starts over, nothing else depends on it)."""
    from safetensors import safe_open

    from assistant.adapt.distill import Answer
    from assistant.adapt.features import Features

    if not path.exists():
        return [], None
    try:
        with safe_open(str(path), framework="pt") as f:
            md = f.metadata() or {}
            t = {k: f.get_tensor(k) for k in f.keys()}
        if md.get("target") != target_name or md.get("layers") != ",".join(map(str, layers)):
            return [], None
        answers, p0, a0 = [], 0, 0
        for key, pl, al in zip(t["keys"].tolist(), t["prompt_len"].tolist(), t["answer_len"].tolist()):
            answers.append(Answer(str(key), t["prompt_ids"][p0:p0 + pl].tolist(), t["answer_ids"][a0:a0 + al].tolist()))
            p0, a0 = p0 + pl, a0 + al
        return answers, Features(t["feats"], t["roots"], t["seq"], t["pos"], tuple(layers))
    except Exception:  # noqa: BLE001 - a damaged file: start a new held-out set
        return [], None


def save_held_out(path: Path, answers, feats, target_name: str) -> None:
    """Atomically write the held-out set (one safetensors file: features and the answers' ids)."""
    import torch
    from safetensors.torch import save

    cat = lambda xs: torch.tensor([t for x in xs for t in x], dtype=torch.long)  # noqa: E731
    tensors = {"feats": feats.feats.contiguous(), "roots": feats.roots, "seq": feats.seq, "pos": feats.pos,
               "keys": torch.tensor([int(a.key) for a in answers], dtype=torch.long),
               "prompt_len": torch.tensor([len(a.prompt_ids) for a in answers], dtype=torch.long),
               "answer_len": torch.tensor([len(a.answer_ids) for a in answers], dtype=torch.long),
               "prompt_ids": cat(a.prompt_ids for a in answers), "answer_ids": cat(a.answer_ids for a in answers)}
    atomic_write_bytes(path, save(tensors, metadata={"target": target_name, "layers": ",".join(map(str, feats.layers))}))


def merge_held_out(old_answers, old_feats, new_answers, new_feats, keep: int):
    """The newest `keep` of old + new held-out answers (an old answer with a new one's key is the same
    answer seen again after a kill: the new copy wins)."""
    import torch

    from assistant.adapt.features import Features

    if old_feats is None or not old_answers:
        old_answers = []
    new_keys = {a.key for a in new_answers}
    both = list(old_answers) + list(new_answers)
    if old_answers:
        feats = Features(torch.cat([old_feats.feats, new_feats.feats]), torch.cat([old_feats.roots, new_feats.roots]),
                         torch.cat([old_feats.seq, new_feats.seq + len(old_answers)]),
                         torch.cat([old_feats.pos, new_feats.pos]), new_feats.layers)
    else:
        feats = new_feats
    idx = [i for i, a in enumerate(both) if i >= len(old_answers) or a.key not in new_keys]
    idx = idx[max(len(idx) - keep, 0):]
    return [both[i] for i in idx], feats.subset(idx)


__all__ = ["ADAPTER_DIR", "BUSY_FILE", "HELD_OUT_FILE", "LOCK_FILE", "REPLAY_FILE", "STAGE_FILE", "STATE_FILE",
           "VOCAB_LOG", "AdapterBusy", "AdapterError", "CYCLE_KEY", "CycleCancelled", "StageFile", "adapter_dir",
           "copy_reset", "count", "cycle_lock", "load_held_out", "merge_held_out", "read_stage", "read_state",
           "save_held_out", "write_state"]
