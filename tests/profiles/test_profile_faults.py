"""Faults found by trying the product: concurrent first opens, file modes, damaged heads seen by status
exactly as by the runtime, each problem once (no torch)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from assistant.profiles import Profile
from assistant.profiles.atomic import atomic_write_text, clean_temp

from .profile_helpers import REPO, make_artifact

OPEN = "import sys\nfrom assistant.profiles import Profile\nProfile.open(sys.argv[1]).history.close()\n"


def test_two_processes_opening_a_new_profile_never_fail(tmp_path):
    """Two commands started at once on a NEW profile: opening cleans leftover temp files, and used to
    delete the other process's profile.toml still being written. 50 pairs, 0 failures."""
    env = {**os.environ, "ASSISTANT_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    failures = []
    for batch in range(5):
        procs = [subprocess.Popen([sys.executable, "-c", OPEN, f"p{batch}-{i // 2}"], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(20)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            if p.returncode != 0:
                failures.append(err.strip().splitlines()[-1:])
    assert failures == []


def test_a_live_writers_temp_file_is_not_cleaned(tmp_path):
    mine = tmp_path / f".x.toml.tmp-{os.getpid()}-abc"
    mine.write_text("half")
    dead = tmp_path / ".y.toml.tmp-999999999-abc"
    dead.write_text("left by a crash")
    old_style = tmp_path / ".z.toml.tmp-qwerty"
    old_style.write_text("left by an older version")
    assert sorted(p.name for p in clean_temp(tmp_path)) == [dead.name, old_style.name]
    assert mine.exists()


def test_profile_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_HOME", str(tmp_path))
    old = os.umask(0o022)
    try:
        p = Profile.open("alice")
        conv = p.history.new_conversation("t", "")
        p.history.add_message(conv, "user", "my secret")
        atomic_write_text(p.path / "notes.txt", "x")
        atomic_write_text(p.path / "adapter" / "state.json", "{}")    # a folder made on the way is private too
        assert stat.S_IMODE((p.path / "adapter").stat().st_mode) == 0o700
        files = [p.config_path, p.history_path, p.path / "notes.txt",
                 *[p.path / f"history.sqlite-{s}" for s in ("wal", "shm") if (p.path / f"history.sqlite-{s}").exists()]]
        assert len(files) >= 4
        assert stat.S_IMODE(p.path.stat().st_mode) == 0o700
        for f in files:
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        p.close()
        (tmp_path / "profiles" / "bob").mkdir(mode=0o755)            # made by an older version
        assert stat.S_IMODE(Profile.open("bob").path.stat().st_mode) == 0o700
    finally:
        os.umask(old)


def _status(home, name="default"):
    env = {**os.environ, "ASSISTANT_HOME": str(home), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "assistant", "adapt", "--status", "--profile", name], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=60)
    rj = subprocess.run([sys.executable, "-m", "assistant", "adapt", "--status", "--json", "--profile", name],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    return r, json.loads(rj.stdout) if rj.returncode == 0 else None


def test_status_resolves_the_head_as_answers_do(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_HOME", str(tmp_path))
    p = Profile.open("default")
    v1 = p.heads.publish(make_artifact(tmp_path / "a.safetensors", seed=1))
    v2 = p.heads.publish(make_artifact(tmp_path / "b.safetensors", seed=2))
    cur = p.heads.root / "CURRENT"
    for bad in ("garbage\n", "", "../../etc\n"):
        cur.write_text(bad)
        r, s = _status(tmp_path)
        runtime = Profile.open("default").heads.current()           # what Session.from_profile uses
        assert r.returncode == 0 and s["version"] == runtime.parent.name == v2, (bad, r.stdout, r.stderr)
        assert "damaged pointer" in s["problem"] or "missing" in s["problem"]
        assert r.stdout.count(s["problems"][0]) == 1 and r.stderr.count("damaged") == 0
    cur.write_text("v000009\n")                                        # names a missing version
    r, s = _status(tmp_path)
    assert s["version"] == v2
    (p.heads.root / v2 / "meta.json").write_text("{not json")        # damaged metadata: status still answers
    cur.write_text(v2 + "\n")
    r, s = _status(tmp_path)
    assert r.returncode == 0 and s["version"] in (v1, v2)
    for v in (v1, v2):                                                 # every version damaged
        (p.heads.root / v / "head.safetensors").write_bytes(b"\0" * 10)
    r, s = _status(tmp_path)
    assert r.returncode == 0 and s["version"] is None
    assert any("answers use the shipped head" in x for x in s["problems"])
    assert len(s["problems"]) == len(set(s["problems"]))


def test_status_says_why_pending_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_HOME", str(tmp_path))
    p = Profile.open("default")
    p.close()
    p.history_path.write_bytes(os.urandom(4096))
    r, s = _status(tmp_path)
    assert r.returncode == 0 and s["pending"] is None
    assert any("history.sqlite" in x for x in s["problems"])
