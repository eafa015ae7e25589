"""kill -9 in the middle of publishing a head and of writing history; a reader and writers at once."""
from __future__ import annotations

import os
import signal
import time

import pytest
from tests.profiles.profile_helpers import child, drain, make_artifact, read_until, use_home

from assistant.profiles import Profile
from assistant.profiles.heads import HeadStore


@pytest.fixture
def home(tmp_path, monkeypatch):
    return use_home(tmp_path, monkeypatch)

PUBLISH_SCRIPT = r"""
import sys, time
import assistant.profiles.atomic as A
import assistant.profiles.heads as H
from assistant.profiles import Profile

stage, n, src, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
p = Profile.open("crash")
for i in range(n):
    print("PUBLISHED", p.heads.publish(src, {"i": i}), flush=True)

def hang():
    print("HANG", flush=True)
    time.sleep(600)

calls = {"n": 0}
orig_write = A.write_chunks
def half_write(fd, data):             # writes 1: artifact copy, 2: meta.json, 3: CURRENT temp
    calls["n"] += 1
    if calls["n"] == {"artifact": 1, "meta": 2, "pointer": 3}.get(stage):
        orig_write(fd, data[: len(data) // 2])
        hang()
    orig_write(fd, data)
A.write_chunks = half_write
if stage == "before-pointer":
    H.HeadStore._set_current = lambda self, v: hang()
if stage == "prune":
    H.shutil.rmtree = lambda *a, **k: hang()
    p.heads.keep = 1
p.heads.publish(extra, {"i": n})
print("DONE", flush=True)
"""


@pytest.mark.parametrize("stage", ["artifact", "meta", "pointer", "before-pointer", "prune"])
def test_kill_during_publish(home, tmp_path, stage):
    Profile.open("crash")
    src = make_artifact(tmp_path / "a.safetensors", 1, n=200)  # < 1 MiB: one write per file
    extra = make_artifact(tmp_path / "b.safetensors", 2, n=200)
    proc = child(PUBLISH_SCRIPT, home, stage, "3", str(src), str(extra))
    lines = read_until(proc, "HANG")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    published = [ln.split()[1] for ln in lines if ln.startswith("PUBLISHED")]
    assert published == ["v000001", "v000002", "v000003"]

    p = Profile.open("crash")
    reports: list[str] = []
    store = HeadStore(p.path / "heads", keep=100, report=reports.append)
    cur = store.current()
    assert reports == [] and cur is not None and store.check(cur.parent.name, deep=True) is None
    if stage in ("prune",):
        assert cur.parent.name == "v000004" and cur.read_bytes() == extra.read_bytes()
    else:
        assert cur.parent.name == "v000003" and cur.read_bytes() == src.read_bytes()
        assert set(published) <= set(store.versions())   # everything committed before the kill is there
    # the lock died with the process: the next writer gets it, cleans leftovers and publishes
    store.lock_timeout = 10
    v = store.publish(extra, {})
    assert store.current().parent.name == v and store.check(v, deep=True) is None
    leftovers = [x.name for x in (p.path / "heads").iterdir() if x.name.startswith(".")]
    assert leftovers == [".lock"]


HISTORY_SCRIPT = r"""
import sys, time
from assistant.profiles import Profile
from assistant.types import AnswerStats

mode, n = sys.argv[1], int(sys.argv[2])
h = Profile.open("crash").history
for i in range(n):
    with h.transaction():
        c = h.new_conversation(f"c{i}")
        h.add_message(c, "user", f"q{i}")
        m = h.add_message(c, "assistant", f"a{i}" * 50, accepted=True, stats=AnswerStats(tokens=i + 1))
    print("COMMITTED", c, m, flush=True)
if mode == "in-transaction":
    with h.transaction():
        c = h.new_conversation("uncommitted")
        h.add_message(c, "user", "lost")
        print("HANG", flush=True)
        time.sleep(600)
else:
    i = n
    while True:                       # keep committing until killed
        c = h.new_conversation(f"c{i}")
        m = h.add_message(c, "assistant", f"a{i}" * 50, accepted=True)
        print("COMMITTED", c, m, flush=True)
        i += 1
        if i == n + 5:
            print("HANG", flush=True)
"""


@pytest.mark.parametrize("mode", ["in-transaction", "while-committing"])
def test_kill_during_history_write(home, mode):
    Profile.open("crash")
    proc = child(HISTORY_SCRIPT, home, mode, "20")
    lines = read_until(proc, "HANG")
    if mode == "while-committing":
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    lines += drain(proc)                                       # whatever it printed before dying
    committed = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("COMMITTED")]
    assert len(committed) >= 20

    p = Profile.open("crash")
    h = p.history
    assert h.check() is None
    convs = {c.id: c for c in h.list_conversations()}
    for conv_id, msg_id in committed:
        assert conv_id in convs
        assert msg_id in [m.id for m in h.messages(conv_id)]
    first = h.messages(committed[0][0])
    assert [m.content for m in first] == ["q0", "a0" * 50] and first[1].accepted and first[1].stats.tokens == 1
    if mode == "in-transaction":
        assert "uncommitted" not in [c.title for c in convs.values()]
        assert len(convs) == 20
    answers = h.accepted_answers()
    assert len(answers) >= 20
    c = h.new_conversation("after")                            # writable again
    h.add_message(c, "user", "ok")
    p.close()


WRITER_SCRIPT = r"""
import sys
from assistant.profiles import Profile

n, src = int(sys.argv[1]), sys.argv[2]
p = Profile.open("shared")
p.heads.keep = 1000
h = p.history
for i in range(n):
    with h.transaction():
        c = h.new_conversation(f"w{i}")
        h.add_message(c, "user", f"q{i}")
        h.add_message(c, "assistant", f"a{i}", accepted=True)
    p.heads.publish(src, {"i": i})
print("DONE", flush=True)
"""


def test_reader_while_writer_runs(home, tmp_path):
    """A reader in this process never sees a half-published head or a half-written exchange."""
    p = Profile.open("shared")
    src = make_artifact(tmp_path / "a.safetensors", 3, n=300)
    proc = child(WRITER_SCRIPT, home, "40", str(src))
    reports: list[str] = []
    store = HeadStore(p.path / "heads", report=reports.append)
    h = p.history
    seen_versions = seen_convs = 0
    reads = 0
    while proc.poll() is None or reads == 0:
        cur = store.current()
        if cur is not None:
            assert store.check(cur.parent.name) is None
            n = int(cur.parent.name[1:])
            assert n >= seen_versions
            seen_versions = n
        convs = h.list_conversations()
        assert len(convs) >= seen_convs
        seen_convs = len(convs)
        for c in convs[:3]:
            assert len(h.messages(c.id)) == 2          # the exchange is all there or not at all
        reads += 1
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "DONE" in out and reports == []
    assert len(h.list_conversations()) == 40 and store.versions()[-1] == "v000040"
    assert reads > 5
    p.close()


TWO_WRITERS = r"""
import sys
from assistant.profiles import Profile

p = Profile.open("shared")
p.heads.keep = 1000
out = [p.heads.publish(sys.argv[2], {"who": sys.argv[1]}) for _ in range(int(sys.argv[3]))]
print("VERSIONS", *out, flush=True)
"""


def test_two_writers_take_turns(home, tmp_path):
    Profile.open("shared")
    a = make_artifact(tmp_path / "a.safetensors", 1)
    b = make_artifact(tmp_path / "b.safetensors", 2)
    procs = [child(TWO_WRITERS, home, "a", str(a), "8"), child(TWO_WRITERS, home, "b", str(b), "8")]
    got = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        got += out.split()[1:]
    store = Profile.open("shared").heads
    assert sorted(got) == store.versions() and len(set(got)) == 16
    assert all(store.check(v, deep=True) is None for v in got)
    assert store.current() is not None
