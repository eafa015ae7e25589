"""heads/: immutable versions, atomic CURRENT, prune, fallback to the last good version."""
from __future__ import annotations

import json

import pytest
from tests.profiles.profile_helpers import make_artifact, use_home

from assistant.profiles import Profile, ProfileError
from assistant.profiles.heads import HeadStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    return use_home(tmp_path, monkeypatch)


def test_publish_current_versions(home, tmp_path):
    p = Profile.open()
    assert p.heads.current() is None and p.heads.versions() == []
    v1 = p.heads.publish(make_artifact(tmp_path / "a.safetensors", 1), {"rows": 10})
    v2 = p.heads.publish(make_artifact(tmp_path / "b.safetensors", 2), {"rows": 20})
    assert (v1, v2) == ("v000001", "v000002")
    assert p.heads.versions() == [v1, v2]
    cur = p.heads.current()
    assert cur == p.path / "heads" / v2 / "head.safetensors"
    assert cur.read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    meta = p.heads.meta(v2)
    assert meta["rows"] == 20 and meta["version"] == v2 and meta["size"] == cur.stat().st_size
    assert (p.path / "heads" / "CURRENT").read_text() == v2 + "\n"
    assert p.heads.problems == []


def test_publish_rejects_damaged_source(home, tmp_path):
    p = Profile.open()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(make_artifact(tmp_path / "ok.safetensors").read_bytes()[:-10])
    with pytest.raises(ProfileError) as e:
        p.heads.publish(bad, {})
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    assert p.heads.versions() == []


def test_publish_copies_companion_files(home, tmp_path):
    """A version carries the files its artifact needs beside it (the head's held-back prompts)."""
    p = Profile.open()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "q"}\n')
    v = p.heads.publish(make_artifact(tmp_path / "a.safetensors", 1), {}, companions={"head.slices.jsonl": prompts})
    assert (p.path / "heads" / v / "head.slices.jsonl").read_bytes() == prompts.read_bytes()
    # the version's metadata names its source file, never a path of this machine
    assert p.heads.meta(v)["source"] == "a.safetensors" and str(tmp_path) not in json.dumps(p.heads.meta(v))
    for bad in ("head.safetensors", "meta.json", "../x.jsonl", ".hidden"):
        with pytest.raises(ProfileError) as e:
            p.heads.publish(make_artifact(tmp_path / "b.safetensors", 2), {}, companions={bad: prompts})
        assert repr(bad) in str(e.value) and "\n" not in str(e.value)
    assert p.heads.versions() == [v]


def test_prune_keeps_newest_and_current(home, tmp_path):
    p = Profile.open()
    p.update_config(keep_versions=2)
    for i in range(4):
        p.heads.publish(make_artifact(tmp_path / f"{i}.safetensors", i), {})
    assert p.heads.versions() == ["v000003", "v000004"]
    p.heads.set_current("v000003")                         # roll back, then prune hard
    assert p.heads.prune(1) == ["v000004"]
    assert p.heads.versions() == ["v000003"] and p.heads.current().parent.name == "v000003"
    assert not [x for x in (p.path / "heads").iterdir() if x.name.startswith(".trash")]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "meta"])
def test_damaged_current_falls_back_to_last_good(home, tmp_path, damage):
    p = Profile.open()
    conv = p.history.new_conversation("kept")
    for i in range(3):
        p.heads.publish(make_artifact(tmp_path / f"{i}.safetensors", i), {})
    art = p.path / "heads" / "v000003" / "head.safetensors"
    if damage == "truncate":
        art.write_bytes(art.read_bytes()[: art.stat().st_size // 2])
    elif damage == "garbage":
        art.write_bytes(b"\x00garbage" * 100)
    elif damage == "delete":
        art.unlink()
    else:
        (art.parent / "meta.json").write_text("{not json")
    reports: list[str] = []
    store = HeadStore(p.path / "heads", report=reports.append)
    cur = store.current()
    assert cur == p.path / "heads" / "v000002" / "head.safetensors"
    assert store.check("v000002") is None
    assert len(reports) == 2 and all("\n" not in r for r in reports)
    assert str(art.parent) in reports[0]                   # names the damaged file (or its meta.json)
    assert "falling back" in reports[1] and "v000002" in reports[1]
    # nothing else lost: the other versions, the history and the config still work
    assert store.versions() == ["v000001", "v000002", "v000003"]
    assert p.history.get_conversation(conv).title == "kept"
    assert Profile.open().config.tree_width == 16
    # the next publish works and becomes CURRENT
    v = store.publish(make_artifact(tmp_path / "new.safetensors", 9), {})
    assert v == "v000004" and store.current().parent.name == v
    p.close()


def test_damaged_pointer_uses_newest(home, tmp_path):
    p = Profile.open()
    p.heads.publish(make_artifact(tmp_path / "a.safetensors", 1), {})
    p.heads.publish(make_artifact(tmp_path / "b.safetensors", 2), {})
    (p.path / "heads" / "CURRENT").write_bytes(b"\xff\xfe")
    cur = p.heads.current()
    assert cur.parent.name == "v000002" and "CURRENT" in p.heads.problems[0]


def test_all_damaged_gives_none(home, tmp_path):
    p = Profile.open()
    p.heads.publish(make_artifact(tmp_path / "a.safetensors", 1), {})
    (p.path / "heads" / "v000001" / "head.safetensors").write_bytes(b"")
    assert p.heads.current() is None and p.heads.problems


def test_deep_check_detects_bit_flip(home, tmp_path):
    p = Profile.open()
    v = p.heads.publish(make_artifact(tmp_path / "a.safetensors", 1), {})
    f = p.heads.path_of(v)
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    assert p.heads.check(v) is None                   # the cheap check reads the header only
    assert "sha256" in p.heads.check(v, deep=True)
    with pytest.raises(ProfileError, match="sha256"):
        p.heads.set_current(v)


def test_real_head_artifact_round_trip(home, tmp_path):
    """A file written by assistant.runtime.head.save_artifact publishes and loads back (safetensors, no pickle)."""
    torch = pytest.importorskip("torch")
    from assistant.runtime.head import HeadConfig, PhraseHead, load_artifact, save_artifact
    from assistant.runtime.vocab import DraftVocab

    vocab = DraftVocab()
    for i in range(8):
        vocab.add([i + 1, i + 2], f"p{i}")
    head = PhraseHead(HeadConfig(hidden_size=16, inner=32, width=8), vocab.capacity)
    src = tmp_path / "h.safetensors"
    save_artifact(src, head, vocab, {"note": "test"})
    p = Profile.open()
    v = p.heads.publish(src, {"rows": vocab.capacity})
    art = load_artifact(p.heads.current())
    assert art.meta == {"note": "test"} and art.head.rows == vocab.capacity
    assert json.loads((p.path / "heads" / v / "meta.json").read_text())["rows"] == vocab.capacity
    assert torch.equal(art.head.out.weight, head.out.weight)
