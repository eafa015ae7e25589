"""Read JSON Lines files: prompts from any data set, and the project's own record files.

Contract: `read_records(path)` returns the JSON values of a file's lines, oldest first, skipping lines
that are not JSON (a torn last line after a crash); a missing file is [] unless `missing_ok=False`.
`read_prompts(path)` returns ([{"id", "prompt"}], [error lines]). The
prompt field is found by itself: prompt, question, problem, instruction, input,
or the first of `turns`. A line that is not JSON or has no prompt field is
reported as "FILE:LINE: reason" and skipped; it never raises for bad lines.
A missing file raises FileNotFoundError.
"""
from __future__ import annotations

import json
from pathlib import Path

PROMPT_FIELDS = ("prompt", "question", "problem", "instruction", "input")


def find_prompt(record: dict) -> str | None:
    for key in PROMPT_FIELDS:
        v = record.get(key)
        if isinstance(v, str) and v.strip():
            return v
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    return None


def read_records(path: str | Path, missing_ok: bool = True) -> list:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        if not missing_ok:
            raise
    return out


def read_prompts(path: str | Path, limit: int | None = None, offset: int = 0) -> tuple[list[dict], list[str]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise IsADirectoryError(21, "a directory, not a JSON Lines file", str(path))
    prompts: list[dict] = []
    errors: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{path}:{lineno}: not JSON ({e.msg})")
                continue
            prompt = find_prompt(rec) if isinstance(rec, dict) else None
            if prompt is None:
                errors.append(f"{path}:{lineno}: no prompt field ({', '.join(PROMPT_FIELDS)} or turns)")
                continue
            rid = rec.get("id", rec.get("question_id", lineno)) if isinstance(rec, dict) else lineno
            prompts.append({"id": rid, "prompt": prompt, "line": lineno})
    prompts = prompts[offset:]
    if limit is not None:
        prompts = prompts[:limit]
    return prompts, errors
