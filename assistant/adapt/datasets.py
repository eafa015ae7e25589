"""Training data named portably, and the held-back prompts shipped beside a head.

Contract:
- `describe(sources)` -> [{"file", "sha256", "start", "stop"}]: a head's metadata names each data set
  it was trained on by file name, content hash and record range (0-based, stop exclusive, clamped to
  the records the file has), never by a path of the machine that trained it.
- `trained_ranges(meta)` -> {file name: (sha256 or None, [(start, stop), ...])} from a head's
  `training_data`; entries of the older form [path, start, stop] count by the path's file name.
- `slices_path(head)` is `<head stem>.slices.jsonl` beside the head. `write_slices(head, sources, n)`
  writes there the first `n` prompts of the training files the head was NOT trained on: the records
  right after the first source's range (then right before it, then the next source's), one JSON line
  each: {"file", "sha256", "record", "prompt"}. The online adapter answers them once to check that a
  cycle keeps the original domain (anchor) and to rehearse it (assistant.adapt.slices).
- `read_slices(path)` -> those records; `serves(record, ranges)`: a record of one of the head's data
  sets (same content when both hashes are known) outside the ranges it was trained on.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from assistant.profiles.heads import sha256_file

SLICES_SUFFIX = ".slices.jsonl"


def _records(path: str | Path) -> list[dict]:
    from assistant.runtime.jsonl import read_prompts

    return read_prompts(path)[0]


def describe(sources: Iterable[tuple[str, int, int]]) -> list[dict[str, Any]]:
    out = []
    for path, start, stop in sources:
        n = len(_records(path))
        out.append({"file": Path(path).name, "sha256": sha256_file(path), "start": min(int(start), n),
                    "stop": min(int(stop), n)})
    return out


def trained_ranges(meta: dict[str, Any]) -> dict[str, tuple[str | None, list[tuple[int, int]]]]:
    out: dict[str, tuple[str | None, list[tuple[int, int]]]] = {}
    for src in meta.get("training_data") or []:
        try:
            if isinstance(src, dict):
                name, sha, start, stop = str(src["file"]), src.get("sha256"), int(src["start"]), int(src["stop"])
            else:
                name, sha, start, stop = Path(str(src[0])).name, None, int(src[1]), int(src[2])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        old_sha, ranges = out.get(name, (sha, []))
        out[name] = (old_sha or sha, ranges + [(start, stop)])
    return out


def serves(record: dict[str, Any], ranges: dict[str, tuple[str | None, list[tuple[int, int]]]]) -> bool:
    name, i = record.get("file"), record.get("record")
    if name not in ranges or not isinstance(i, int):
        return False
    sha, spans = ranges[name]
    if sha and record.get("sha256") and sha != record["sha256"]:
        return False
    return not any(a <= i < b for a, b in spans)


def slices_path(head: str | Path) -> Path:
    head = Path(head)
    return head.with_name(head.stem + SLICES_SUFFIX)


def held_back(sources: Sequence[tuple[str, int, int]], n: int) -> list[dict[str, Any]]:
    """The first `n` prompts of the sources' files outside every trained range (see the module contract)."""
    trained: dict[Path, list[tuple[int, int]]] = {}
    for path, start, stop in sources:
        trained.setdefault(Path(path).resolve(), []).append((int(start), int(stop)))
    out: list[dict[str, Any]] = []
    seen: set[Path] = set()
    for path, start, stop in sources:
        key = Path(path).resolve()
        if len(out) >= n or key in seen:
            continue
        seen.add(key)
        recs, sha = _records(path), sha256_file(path)
        free = lambda i: not any(a <= i < b for a, b in trained[key])  # noqa: E731
        after = [i for i in range(min(int(stop), len(recs)), len(recs)) if free(i)]
        before = [i for i in range(min(int(start), len(recs)) - 1, -1, -1) if free(i)]
        picked = sorted((after + before)[: n - len(out)])
        out.extend({"file": Path(path).name, "sha256": sha, "record": i, "prompt": recs[i]["prompt"]} for i in picked)
    return out


def write_slices(head: str | Path, sources: Sequence[tuple[str, int, int]], n: int) -> Path | None:
    """Write the held-back prompts beside `head` (atomically); None when the sources hold none."""
    from assistant.profiles.atomic import atomic_write_text

    records = held_back(sources, n)
    if not records:
        return None
    path = slices_path(head)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def read_slices(path: str | Path) -> list[dict[str, Any]]:
    """The records of a slices file ([] when absent); unreadable lines are skipped."""
    from assistant.runtime.jsonl import read_records

    try:
        records = read_records(path)
    except OSError:
        return []
    return [r for r in records if isinstance(r, dict) and isinstance(r.get("prompt"), str)]


__all__ = ["SLICES_SUFFIX", "describe", "held_back", "read_slices", "serves", "slices_path",
           "trained_ranges", "write_slices"]
