"""assistant.runtime.threads: the thread count follows measurement and load; a fixed count always wins; the count
is set in the thread that runs the forwards."""
import subprocess
import sys
import threading
import time

import pytest
import torch

from assistant.runtime import threads
from assistant.runtime.engine import EagerEngine
from assistant.runtime.threads import ThreadPolicy, busy_cores, choose

from ..conftest import tiny_qwen3


def test_choose_fastest_idle_count_capped_by_the_load():
    times = {1: 0.030, 2: 0.020, 3: 0.019, 4: 0.025}
    assert choose(times, 4, 0.0) == 3              # idle: the fastest measured
    assert choose(times, 4, 0.4) == 3              # a little background noise takes no core
    assert choose(times, 4, 0.6) == 3              # one core taken: 3 are left
    assert choose(times, 4, 1.7) == 2
    assert choose(times, 4, 3.9) == 1              # never below one
    assert choose({1: 0.05, 2: 0.05}, 2, 0.0) == 1   # a tie goes to fewer threads
    assert choose({}, 2, None) == 2                # nothing measured, nothing known: all cores
    assert choose({1: 0.03, 2: 0.02}, 2, None) == 2


def test_busy_cores_sees_another_process():
    if busy_cores(0.05) is None:
        pytest.skip("no /proc here")
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 20: pass"])
    try:
        time.sleep(0.3)
        busy = busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy >= 0.7, busy


def test_own_work_is_not_counted_as_load():
    if busy_cores(0.05) is None:
        pytest.skip("no /proc here")
    others = busy_cores(0.3)                        # what other processes on this machine use meanwhile
    mark = threads.snapshot()
    t = time.perf_counter()
    x = 0
    while time.perf_counter() - t < 0.4:           # this process busy on one core
        x += 1
    assert busy_cores(0.1, since=mark) < others + 0.5


def test_fixed_count_wins_over_measurement_and_load(monkeypatch):
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 5.0)
    assert ThreadPolicy(times={1: 1.0, 2: 0.5}, fixed=2, cores=2).apply() == 2 == torch.get_num_threads()
    assert ThreadPolicy(times={1: 1.0, 2: 0.5}, cores=2).apply() == 1 == torch.get_num_threads()


def test_measure_times_every_count(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    target = tiny_qwen3(seed=31)
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 0.0)
    before = torch.get_num_threads()
    times = threads.calibrate(target, EagerEngine(target.model))
    assert sorted(times) == list(range(1, threads.available_cores() + 1)) and all(s > 0 for s in times.values())
    assert torch.get_num_threads() == before
    assert threads.calibrate(target, EagerEngine(target.model)) == times          # cached
    monkeypatch.setattr(threads, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert threads.calibrate(target, EagerEngine(target.model)) == times


def test_a_busy_machine_is_not_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 1.0)
    monkeypatch.setattr(threads, "measure", lambda *a, **k: pytest.fail("measured while busy"))
    target = tiny_qwen3(seed=32)
    assert threads.calibrate(target, EagerEngine(target.model)) == {}


def test_session_sets_the_count_in_the_thread_that_decodes(monkeypatch, tiny_target):
    """The chat answers in a worker thread: the count must be the policy's there, inside the decode loop,
    and an explicit count wins."""
    from assistant.session import Session, SessionConfig
    from assistant.runtime.width import WidthController

    seen = []

    class Spy:
        feature_layers = (-1,)

        def propose(self, ctx):
            seen.append(torch.get_num_threads())
            return []

        def observe(self, tree, path):
            pass

    for fixed, load, want in ((None, 1.2, 1), (None, 0.0, 2), (2, 1.2, 2), (1, 0.0, 1)):
        monkeypatch.setattr(threads, "busy_cores", lambda *a, _l=load, **k: _l)
        s = Session(SessionConfig(max_new_tokens=4, threads=fixed))
        s.target, s.drafter, s.engine = tiny_target, Spy(), EagerEngine(tiny_target.model)
        s.width_ctl = WidthController({w: 1.0 for w in (1, 2, 4, 8, 16)}, 16)
        s.thread_policy = ThreadPolicy(times={1: 1.0, 2: 0.5}, fixed=fixed, cores=2)
        s.prompt_ids = lambda messages: [5, 6, 7]
        seen.clear()
        out = []
        worker = threading.Thread(target=lambda: out.extend(s.answer([{"role": "user", "content": "x"}])))
        worker.start()
        worker.join()
        assert seen and set(seen) == {want}, (fixed, load, seen)
        assert s.info()["threads"] == want


def test_a_fixed_thread_count_is_set_before_the_verify_costs_are_read(monkeypatch, tiny_target):
    """Verify costs are cached per thread count (costmodel._key): a session with `threads` fixed must read
    (or measure) the table of that count, not the default count's."""
    from assistant.runtime import costmodel
    from assistant.session import Session, SessionConfig

    seen = []

    class Stop(Exception):
        pass

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        raise Stop

    monkeypatch.setattr(costmodel, "calibrate", spy)
    before = torch.get_num_threads()
    try:
        for fixed in (1, 2):
            s = Session(SessionConfig(max_new_tokens=4, threads=fixed))
            s.target = tiny_target
            with pytest.raises(Stop):
                s._use_engine("eager", lambda *a: None)
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 2]
