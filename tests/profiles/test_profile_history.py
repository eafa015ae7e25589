"""history.sqlite: WAL, migrations, the store's API, damaged files."""
from __future__ import annotations

import json
import sqlite3

import pytest
from tests.profiles.profile_helpers import make_artifact, use_home

from assistant.profiles import Profile, ProfileError
from assistant.profiles.history import MIGRATIONS, SCHEMA_VERSION, HistoryStore
from assistant.types import AnswerStats


@pytest.fixture
def home(tmp_path, monkeypatch):
    return use_home(tmp_path, monkeypatch)


def test_wal_and_schema(tmp_path):
    h = HistoryStore(tmp_path / "h.sqlite")
    assert h._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert h.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
    h.close()


def test_conversations_and_messages(tmp_path):
    h = HistoryStore(tmp_path / "h.sqlite")
    a = h.new_conversation("first", "be brief")
    b = h.new_conversation("second")
    u = h.add_message(a, "user", "2+2?")
    m = h.add_message(a, "assistant", "4", accepted=True, stats=AnswerStats(tokens=1, passes=1, banked=[(0, 1)]))
    h.add_message(b, "user", "hi")
    h.add_message(b, "assistant", "hello")
    assert [c.id for c in h.list_conversations()] == [b, a]  # most recently updated first
    msgs = h.messages(a)
    assert [(x.role, x.content, x.accepted) for x in msgs] == [("user", "2+2?", False), ("assistant", "4", True)]
    assert msgs[1].stats == AnswerStats(tokens=1, passes=1, chars=1, banked=[(0, 1)]) and msgs[0].stats is None
    assert msgs[1].stats.tokens_per_pass == 1.0
    assert h.accepted_answers() == [(m, [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "2+2?"}], "4")]
    assert h.accepted_answers(since_id=m) == []
    h.mark_accepted(h.messages(b)[1].id)
    assert [x[2] for x in h.accepted_answers(since_id=m)] == ["hello"]
    h.rename_conversation(a, "renamed")
    h.set_system_prompt(a, "")
    conv = h.get_conversation(a)
    assert conv.title == "renamed" and conv.system_prompt == ""
    h.delete_conversation(b)
    assert [c.id for c in h.list_conversations()] == [a] and h.messages(b) == []
    assert h.counts() == {"conversations": 1, "messages": 2, "accepted": 1}
    with pytest.raises(ProfileError, match="no conversation"):
        h.add_message(999, "user", "x")
    with pytest.raises(ValueError):
        h.add_message(a, "robot", "x")
    h.set_state("adapter.cursor", {"since": m})
    assert h.get_state("adapter.cursor") == {"since": m} and h.get_state("nope", 3) == 3
    assert h.check() is None
    h.close()


def test_transaction_is_atomic(tmp_path):
    h = HistoryStore(tmp_path / "h.sqlite")
    with pytest.raises(RuntimeError):
        with h.transaction():
            c = h.new_conversation("half")
            h.add_message(c, "user", "q")
            raise RuntimeError("boom")
    assert h.list_conversations() == [] and h.counts()["messages"] == 0


def test_migrates_an_old_database(tmp_path):
    path = tmp_path / "h.sqlite"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])
    db.execute("INSERT INTO conversations (title, system_prompt, created, updated) VALUES ('old', '', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, accepted, created) VALUES (1, 'assistant', 'a', 1, 1)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    h = HistoryStore(path)
    assert h.schema_version == SCHEMA_VERSION
    assert h.list_conversations()[0].title == "old" and h.accepted_answers()[0][2] == "a"
    h.set_state("k", 1)  # the table added by migration 2
    h.close()


def test_migration_3_rewrites_answers_recorded_by_ask_in_the_chats_shape(tmp_path):
    """`assistant ask` once stored new_tokens/forward_passes/...: migration 3 renames them, keeping the rest."""
    path = tmp_path / "h.sqlite"
    db = sqlite3.connect(path)
    for step in MIGRATIONS[:2]:
        db.executescript(step)
    db.execute("INSERT INTO conversations (title, system_prompt, created, updated) VALUES ('old', '', 1, 1)")
    ask = {"new_tokens": 8, "forward_passes": 4, "tokens_per_pass": 2.0, "drafted_tokens": 3, "seconds": 0.5,
           "tokens_per_second": 16.0, "finish": "eos", "target": "SmolLM2", "dtype": "fp32", "head": "h/v1"}
    chat = AnswerStats(tokens=2, drafted=1, passes=1, seconds=0.1, finish="eos", banked=[(0, 2)]).to_dict()
    for content, stats in (("ask answer", json.dumps(ask)), ("chat answer", json.dumps(chat)), ("bare", None)):
        db.execute("INSERT INTO messages (conversation_id, role, content, accepted, stats, created) "
                   "VALUES (1, 'assistant', ?, 1, ?, 1)", (content, stats))
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    h = HistoryStore(path)
    assert h.schema_version == SCHEMA_VERSION >= 3
    old, kept, bare = h.messages(1)
    assert old.stats == AnswerStats(tokens=8, drafted=3, passes=4, seconds=0.5, chars=len("ask answer"),
                                    finish="eos", target="SmolLM2", dtype="fp32", head="h/v1")
    assert kept.stats == AnswerStats.from_dict(chat, "chat answer") and kept.stats.banked == [(0, 2)]
    assert bare.stats is None
    (raw,), = h._read("SELECT stats FROM messages WHERE id = ?", (old.id,))
    assert json.loads(raw) == old.stats.to_dict()              # the stored row is in the one shape now
    h.close()


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    HistoryStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(ProfileError, match="newer"):
        HistoryStore(path)


@pytest.mark.parametrize("garbage", [b"this is not a database at all " * 200, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_garbage_history_one_line_error_and_nothing_else_lost(home, tmp_path, garbage):
    p = Profile.open()
    p.update_config(tree_width=8)
    v = p.heads.publish(make_artifact(tmp_path / "a.safetensors"), {})
    p.history_path.write_bytes(garbage)
    with pytest.raises(ProfileError) as e:
        p.history
    msg = str(e.value)
    assert "\n" not in msg and str(p.history_path) in msg
    assert p.history_path.read_bytes() == garbage           # not overwritten
    again = Profile.open()
    assert again.config.tree_width == 8 and again.heads.current().parent.name == v
