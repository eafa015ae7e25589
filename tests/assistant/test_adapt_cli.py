"""`assistant adapt`: --status without torch, --once on a tiny profile, --json output."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from assistant.cli import main
from tests.adapt.conftest import table, tiny_llama, tiny_llama_dir  # noqa: F401 (fixtures)
from tests.adapt.test_cycle import adapt_profile, add_answers, base_artifact  # noqa: F401 (fixtures)


def test_status_does_not_import_torch(tmp_path):
    env = dict(os.environ, ASSISTANT_HOME=str(tmp_path / "home"))
    code = ("import sys, time; t = time.perf_counter(); from assistant.cli import main; "
            "rc = main(['adapt', '--status', '--json']); "
            "print('TORCH', 'torch' in sys.modules, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout[: out.stdout.rindex("TORCH")])
    assert status["version"] is None and status["pending"] == 0 and status["cycles"] == 0
    assert status["rows"] > 0 and status["capacity"] >= status["rows"]   # the shipped head it would adapt
    assert "TORCH False" in out.stdout


def test_once_then_status(adapt_profile, capsys):
    p = adapt_profile
    ids = add_answers(p, 0, 6)
    assert main(["adapt", "--status", "--json", "--profile", "u"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["version"] == "v000001" and s["pending"] == 6 and s["row_budget"] == 60 and s["held_out"] == 0
    assert s["rows"] is not None and s["rows"] <= s["row_budget"]
    rc = main(["adapt", "--once", "--json", "--profile", "u", "--dtype", "fp32"])
    rep = json.loads(capsys.readouterr().out)
    assert rep["status"] in ("published", "rejected") and rep["last_msg_id"] == ids[-1]
    assert rc == (0 if rep["status"] == "published" else 2)              # rejected: exit 2
    t0 = time.perf_counter()
    assert main(["adapt", "--status", "--json", "--profile", "u"]) == 0
    assert time.perf_counter() - t0 < 1.0
    s = json.loads(capsys.readouterr().out)
    assert s["pending"] == 0 and s["cycles"] == 1 and s["last_cycle"]["status"] == rep["status"]
    assert s["held_out"] == rep["held_out_answers"] == 1                  # every 5th of 6 answers
    if rep["status"] == "published":
        assert s["version"] == rep["version"] and s["grown"] == rep["grown"] and s["rows"] == rep["rows"]
    assert set(s["tokens_per_pass"]) == {"user_before", "user_after", "anchor_before", "anchor_after"}
    assert main(["adapt", "--status", "--profile", "u"]) == 0
    text = capsys.readouterr().out
    assert "rows" in text and "/ 60 budget" in text and "tokens/pass" in text
    assert main(["adapt", "--once", "--profile", "u"]) == 0
    assert "no new accepted answers" in capsys.readouterr().out
