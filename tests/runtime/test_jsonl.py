"""Prompt reader: finds the prompt field by itself, reports malformed lines with their number."""
import json

import pytest

from assistant.runtime.jsonl import read_prompts


def test_fields_and_bad_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([
        json.dumps({"question": "q1", "answer": "a"}),
        "{not json",
        json.dumps({"turns": ["t1", "t2"], "question_id": 81}),
        json.dumps({"nothing": 1}),
        "",
        json.dumps({"prompt": "p1", "id": "x"}),
        json.dumps({"problem": "pr"}),
        json.dumps([1, 2]),
    ]) + "\n")
    prompts, errors = read_prompts(f)
    assert [p["prompt"] for p in prompts] == ["q1", "t1", "p1", "pr"]
    assert [p["id"] for p in prompts][1:3] == [81, "x"]
    assert len(errors) == 3
    assert errors[0].startswith(f"{f}:2: not JSON")
    assert errors[1].startswith(f"{f}:4: no prompt field")
    assert errors[2].startswith(f"{f}:8:")
    assert [p["prompt"] for p in read_prompts(f, limit=2, offset=1)[0]] == ["t1", "p1"]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_prompts(tmp_path / "nope.jsonl")
