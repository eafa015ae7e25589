"""`assistant profile list|create|show|path`."""
from __future__ import annotations

import json

import pytest

from assistant.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("ASSISTANT_HOME", str(h))
    monkeypatch.delenv("ASSISTANT_PROFILE", raising=False)
    return h


def test_create_list_path_show(home, capsys):
    assert main(["profile", "list"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["profile", "create", "work"]) == 0
    assert "created" in capsys.readouterr().out
    assert main(["profile", "create", "work"]) == 0
    assert "exists" in capsys.readouterr().out
    main(["profile", "create", "default"])
    capsys.readouterr()
    assert main(["profile", "list"]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == ["* default", "  work"]
    assert main(["profile", "path", "work"]) == 0
    assert capsys.readouterr().out.strip() == str(home / "profiles" / "work")
    assert main(["profile", "show", "work", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["name"] == "work" and d["config"]["dtype"] == "auto" and d["problems"] == []
    assert d["history"] == {"conversations": 0, "messages": 0, "accepted": 0}
    assert main(["profile", "show", "work"]) == 0
    assert "tree_width = 16" in capsys.readouterr().out


def test_show_reports_damage_without_failing(home, capsys):
    main(["profile", "create", "x"])
    prof_dir = home / "profiles" / "x"
    (prof_dir / "profile.toml").write_text("dtype = [\n")
    (prof_dir / "history.sqlite").write_bytes(b"garbage" * 1000)
    capsys.readouterr()
    assert main(["profile", "show", "x", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["problems"]) == 2 and all("\n" not in p for p in d["problems"])
    assert "profile.toml" in d["problems"][0] and "history.sqlite" in d["problems"][1]


def test_missing_profile_is_one_line_error(home, capsys):
    assert main(["profile", "show", "nope"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("assistant: ") and "nope" in err and len(err.strip().splitlines()) == 1
