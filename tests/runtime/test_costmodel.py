"""assistant.runtime.costmodel: the (layout, width) choice, its cache, and the target left as it came."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from assistant.runtime import costmodel
from assistant.runtime import threads
from assistant.runtime.costmodel import (VerifyPlan, calibrate, choose, expected_tokens_per_pass, monotone,
                                          verify_costs)
from assistant.runtime.layout import layout_of

from ..conftest import tiny_qwen3


def test_choose_trades_tokens_against_cost():
    flat = {1: 1.0, 3: 1.0, 16: 1.0}
    assert choose({"out": flat}) == ("out", 16)
    assert choose({"out": flat}, cap=3) == ("out", 3)
    # fp32 on a 2-core CPU, as loaded ("out") and [in, out] ("in"), relative to 1 token as loaded
    steep = {1: 1.0, 3: 1.07, 12: 2.17, 16: 2.98}
    cheap_wide = {1: 0.87, 3: 1.33, 12: 1.51, 16: 1.75}
    assert choose({"out": steep, "in": cheap_wide}) == ("in", 12)
    assert expected_tokens_per_pass(12) / 1.51 > expected_tokens_per_pass(3) / 1.07
    assert choose({"out": steep, "in": {1: 1.3, 3: 1.5, 12: 4.0, 16: 4.0}}) == ("out", 3)


def test_monotone_pools_widths_measured_cheaper_than_narrower_ones():
    # machine E's bench table of S10: w=2 measured below w=1 (which runs as 2 rows), w=16 below w=12
    got = monotone({1: 1.0, 2: 0.9194, 4: 1.0064, 8: 1.1055, 12: 1.2011, 16: 1.1947})
    assert got == pytest.approx({1: 0.9597, 2: 0.9597, 4: 1.0064, 8: 1.1055, 12: 1.1979, 16: 1.1979})
    rising = {1: 1.0, 3: 1.0, 16: 1.8}
    assert monotone(rising) == rising
    assert monotone({1: 3.0, 2: 2.0, 4: 1.0}) == pytest.approx({1: 2.0, 2: 2.0, 4: 2.0})


def test_verify_costs_leaves_layout():
    t = tiny_qwen3()
    costs = verify_costs(t, (1, 4), layout="in", prefix=16, repeats=2)
    assert set(costs) == {1, 4} and all(s > 0 for s in costs.values())
    assert layout_of(t.model) == "out"


def test_calibrate_caches_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    calls = []

    def fake(target, widths, layout=None, **kw):
        calls.append(layout)
        return {w: (1.0 + w / 4 if layout == "out" else 0.9 + w / 100) for w in widths}

    monkeypatch.setattr(costmodel, "verify_costs", fake)
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 0.0)
    t = tiny_qwen3()
    plan = calibrate(t, 16)
    assert isinstance(plan, VerifyPlan) and plan.layout == "in" and plan.width == 16
    assert sorted(calls) == ["in", "out", "packed"]                # the eager engine measures every CPU layout
    assert calibrate(t, 16) == plan and len(calls) == 3          # read back, not re-measured
    assert calibrate(t, 3).width == 3 and len(calls) == 3
    (f,) = (tmp_path / "costmodel").glob("*.json")
    data = json.loads(f.read_text())
    assert data["relative_to_out_w1"]["in"]["16"] == pytest.approx((0.9 + 0.16) / 1.25, abs=1e-3)
    f.write_text(json.dumps({"costs": {"1": 1.0, "16": 2.0}}))  # the old single-layout format
    calibrate(t, 16)
    assert len(calls) == 6
    f.write_text("{not json")
    calibrate(t, 16)
    assert len(calls) == 9
    calibrate(t, 16, refresh=True)
    assert len(calls) == 12 and "measured" in json.loads(f.read_text())


REPO = Path(__file__).resolve().parents[2]


def _table_script(*args: str):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "verify_cost_table.py"), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_gpu_table_script_runs_its_whole_path_on_a_tiny_qwen3(tmp_path):
    """scripts/verify_cost_table.py --smoke: build, save, reload per dtype, time, tabulate (the GPU verify-cost table)."""
    out = tmp_path / "t.json"
    p = _table_script("--smoke", "--widths", "1,4,16", "--repeats", "1", "--json", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"fp32", "bf16"}
    for r in data["results"].values():
        assert set(r["seconds"]) == {"1", "4", "16"} and all(s > 0 for s in r["seconds"].values())
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| w | fp32 t(w)/t(1) | bf16 t(w)/t(1) |"
    assert rows[1] == "| 1 | 1.00 | 1.00 |" and rows[3].startswith("| 16 | ")


def test_gpu_table_script_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    p = _table_script()
    assert p.returncode == 2 and "no CUDA device here" in p.stderr and p.stdout == ""


def test_a_measurement_under_load_is_used_but_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setattr(costmodel, "verify_costs", lambda target, widths, layout=None, **kw: {w: 1.0 + w for w in widths})
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 1.0)
    notes = []
    plan = calibrate(tiny_qwen3(), 16, lambda m, f=None: notes.append(m))
    assert plan.width >= 1 and not list((tmp_path / "costmodel").glob("*.json"))
    assert any("not cached" in n for n in notes)


def test_a_load_that_begins_during_the_measurement_is_not_cached_either(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setattr(costmodel, "verify_costs", lambda target, widths, layout=None, **kw: {w: 1.0 + w for w in widths})
    monkeypatch.setattr(threads, "snapshot", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(threads, "busy_cores", lambda *a, since=None, **k: 0.0 if since is None else 1.0)
    notes = []
    calibrate(tiny_qwen3(), 16, lambda m, f=None: notes.append(m))
    assert not list((tmp_path / "costmodel").glob("*.json")) and any("not cached" in n for n in notes)


def test_a_changed_compiled_engine_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 0.0)
    calls = []
    monkeypatch.setattr(costmodel, "verify_costs",
                        lambda target, widths, layout=None, **kw: calls.append(1) or {w: 1.0 for w in widths})

    class Engine:
        name, layout, tag = "compiled", "packed", "aaa"

    t = tiny_qwen3()
    calibrate(t, 16, engine=Engine())
    calibrate(t, 16, engine=Engine())
    assert len(calls) == 1
    Engine.tag = "bbb"
    calibrate(t, 16, engine=Engine())
    assert len(calls) == 2
    # each tag keeps its own table: going back to the first engine reads it, it is not measured again
    Engine.tag = "aaa"
    calibrate(t, 16, engine=Engine())
    assert len(calls) == 2
    assert len(list((tmp_path / "costmodel").glob("*-compiled-*.json"))) == 2


def test_runtime_plan_reads_the_compiled_table_measured_last(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setattr(threads, "busy_cores", lambda *a, **k: 0.0)
    t = tiny_qwen3()
    # eager: every width costs the same as one token, so the widest tree wins on it
    monkeypatch.setattr(costmodel, "verify_costs", lambda target, widths, layout=None, **kw: {w: 1.0 for w in widths})
    assert costmodel.runtime_plan(t, 16).width == 16

    class Engine:
        name, layout, tag = "compiled", "packed", "old"

    # a compiled engine measured cheaper at 3 nodes than anything wider, twice: the newer table decides
    for tag, c3, when in (("new", 0.4, 2e9), ("old", 0.5, 1e9)):
        Engine.tag = tag
        monkeypatch.setattr(costmodel, "verify_costs",
                            lambda target, widths, layout=None, c3=c3, **kw: {w: (c3 if w <= 3 else 9.0) for w in widths})
        calibrate(t, 16, engine=Engine())
        os.utime(next((tmp_path / "costmodel").glob(f"*-{tag}.json")), (when, when))
    plan = costmodel.runtime_plan(t, 16)
    assert plan.layout == "packed" and plan.width == 3 and plan.costs["packed"][3] == pytest.approx(0.4)
