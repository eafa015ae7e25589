"""assistant.adapt.worker: schedule, watchdog trigger, yielding to the chat, failures, and a kill mid-cycle."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

from assistant.adapt.cycle import run_cycle
from assistant.adapt.replay import ReplayBuffer
from assistant.adapt.state import read_state
from assistant.adapt.worker import AdapterWorker, generating, is_due, marker_busy
from assistant.profiles import Profile
from assistant.runtime.head import load_artifact
from tests.adapt.test_cycle import FAST, adapt_profile, add_answers, base_artifact  # noqa: F401 (fixtures)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ASSISTANT_PROFILE", raising=False)
    return tmp_path / "home"


def _wait(cond, timeout=20.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_schedule():
    cfg = SimpleNamespace(adapter_enabled=True, adapter_min_new_answers=5, adapter_interval_s=100)
    assert not is_due(cfg, 0, None, 1000)
    assert is_due(cfg, 5, 999, 1000)                       # enough answers
    assert not is_due(cfg, 2, 950, 1000)                   # too few, too soon
    assert is_due(cfg, 2, 800, 1000)                       # too few, but the interval passed
    assert is_due(cfg, 1, None, 1000)                      # never ran
    assert not is_due(SimpleNamespace(**{**cfg.__dict__, "adapter_enabled": False}), 9, None, 1000)


def test_history_write_wakes_worker_and_failures_do_not_escape(home):
    p = Profile.open("w")
    p.update_config(adapter_min_new_answers=2)
    calls = []

    def cycle(prof, target=None, config=None, pause=None, on_stage=None):
        calls.append(time.time())
        if len(calls) == 1:
            raise RuntimeError("boom")                     # the chat must not see this
        return {"status": "published", "version": None}

    w = AdapterWorker("w", cycle_fn=cycle, nice=0, poll_s=30.0, backoff_s=0.0).start()
    try:
        time.sleep(0.3)
        assert calls == []                                 # nothing pending
        add_answers(p, 0, 1)
        time.sleep(0.5)
        assert calls == []      # never adapted, one answer: waits for min_new_answers or interval_s
        add_answers(p, 1, 1)                               # a write to history.sqlite(-wal) wakes it
        assert _wait(lambda: len(calls) >= 1)
        assert _wait(lambda: read_state(p.path).get("last_error") is not None)
        assert "boom" in read_state(p.path)["last_error"]["message"]
        assert w._thread.is_alive()
        add_answers(p, 2, 1)
        assert _wait(lambda: len(calls) >= 2) and _wait(lambda: w.state == "idle")
    finally:
        w.stop()
    assert not w._thread.is_alive()


def test_moved_event_is_seen_through_dest_path(home):
    from watchdog.events import FileMovedEvent

    p = Profile.open("m")
    w = AdapterWorker("m", nice=0)
    w._start_observer(p.path)
    try:
        handler = next(iter(w._observer._handlers.values()))
        h = next(iter(handler))
        w._wake.clear()
        h.dispatch(FileMovedEvent(str(p.path / ".tmp-x"), str(p.path / "history.sqlite")))
        assert w._wake.is_set()
        w._wake.clear()
        h.dispatch(FileMovedEvent(str(p.path / ".tmp-x"), str(p.path / "profile.toml")))
        assert not w._wake.is_set()
    finally:
        w._observer.stop()


def test_yields_while_an_answer_is_generated(home):
    p = Profile.open("y")
    busy = threading.Event()
    seen_busy = []

    def cycle(prof, target=None, config=None, pause=None, on_stage=None):
        for _ in range(200):
            pause()
            seen_busy.append(busy.is_set())
            time.sleep(0.002)
        return {"status": "published", "version": None}

    add_answers(p, 0, 1)
    w = AdapterWorker("y", busy=busy, cycle_fn=cycle, watch=False, nice=0)
    t = threading.Thread(target=lambda: w.step(force=True))
    t.start()
    for _ in range(5):
        with generating(None, busy):                     # the session answers
            time.sleep(0.05)
        time.sleep(0.02)
    t.join(20)
    # work stops while an answer is generated: at most the one unit already past pause() when an
    # answer starts may overlap it (the yield granularity is one unit of work)
    assert len(seen_busy) == 200 and sum(seen_busy) <= 5
    # across processes: the marker file names a live pid
    with generating(p.path, None):
        assert marker_busy(p.path)
    assert not marker_busy(p.path)


KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    from assistant.adapt.cycle import CycleConfig, run_cycle
    from assistant.profiles import Profile
    from assistant.runtime.target import load_target
    import json
    cfg = CycleConfig(**json.loads(sys.argv[2]))
    p = Profile.open("u")
    t = load_target(p.config.target, "fp32", progress=lambda *a: None)
    def stage(s):
        print("STAGE", s, flush=True)
        if s == sys.argv[1]:
            time.sleep(120)
    run_cycle(p, target=t, config=cfg, on_stage=stage)
    print("DONE", flush=True)
""")


@pytest.mark.parametrize("stage", ["finetune", "state"])
def test_killed_mid_cycle_leaves_profile_usable(adapt_profile, tiny_llama, stage, tmp_path):
    p = adapt_profile
    ids = add_answers(p, 0, 8)
    cfg = {k: v for k, v in FAST.__dict__.items() if k != "anchor_sources"}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, stage, __import__("json").dumps(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        for line in proc.stdout:
            if line.strip() == f"STAGE {stage}":
                break
        else:
            pytest.fail(proc.stderr.read())
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    expect = "v000002" if stage == "state" else "v000001"   # 'state' comes after the publish
    assert p.heads.current_version() == expect
    from assistant.adapt.grow import ChangeLog

    log = ChangeLog(p.path / "adapter" / "vocab_log.jsonl")
    if stage == "finetune":                                # killed before the publish: nothing logged
        assert log.read() == []
    load_artifact(p.heads.current())                       # the current head loads
    assert read_state(p.path).get("last_msg_id", 0) == 0   # the cursor did not move
    # the next cycle redoes the same answers without duplicating replay records
    rep = run_cycle(p, target=tiny_llama, config=FAST)
    assert rep["status"] == "published" and read_state(p.path)["last_msg_id"] == ids[-1]
    buf = ReplayBuffer.open(p.path / "adapter" / "replay.safetensors")
    pairs = list(zip(buf.msg.tolist(), buf.pos.tolist()))
    assert len(pairs) == len(set(pairs))
    if stage == "finetune":                                # the rerun's rows, each logged once
        adds = [(r["cycle"], r["row"]) for r in log.read() if r["op"] == "add"]
        assert adds and len(adds) == len(set(adds)) and {c for c, _ in adds} == {rep["cycle"]}


def test_limit_torch_threads_changes_only_the_calling_thread():
    import torch

    from assistant.adapt.worker import limit_torch_threads

    default = torch.get_num_threads()
    seen = {}

    def worker():
        limit_torch_threads(1)
        torch.ones(64, 64) @ torch.ones(64, 64)
        seen["worker"] = torch.get_num_threads()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    fresh = threading.Thread(target=lambda: seen.setdefault("fresh", torch.get_num_threads()))
    fresh.start()
    fresh.join()
    assert seen == {"worker": 1, "fresh": default} and torch.get_num_threads() == default
