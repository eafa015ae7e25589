"""`assistant bench` on the real SmolLM2: the DESIGN.md JSON contract, fp32 exactness, bad lines skipped."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_json_contract(tmp_path):
    data = tmp_path / "mini.jsonl"
    data.write_text(json.dumps({"question": "What is 2+3?"}) + "\n{broken\n"
                    + json.dumps({"turns": ["Name a color.", "x"]}) + "\n")
    out = tmp_path / "out.json"
    env = dict(os.environ, ASSISTANT_HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-m", "assistant.cli", "bench", "--dataset", str(data), "--max-new-tokens", "12",
                        "--dtype", "fp32", "--methods", "hf,pld,greedy,phrase,head,lookup", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{data}:2: not JSON" in r.stderr
    rep = json.loads(out.read_text())
    for m in ("hf", "pld", "greedy", "phrase", "head", "lookup"):
        s = rep["methods"][m]
        for key in ("tokens_per_pass", "tokens_per_second", "speedup_vs_hf", "exact_match_vs_hf"):
            assert isinstance(s[key], float), (m, key)
        assert s["exact_match_vs_hf"] == 1.0          # fp32: every method equals generate()
    assert rep["methods"]["greedy"]["tokens_per_pass"] == pytest.approx(1.0)
    split = rep["methods"]["phrase"]["ms_per_pass"]          # where a pass's time goes
    assert set(split) == {"propose", "tree", "verify", "accept", "commit", "other"}
    assert split["verify"] > 0 and rep["methods"]["phrase"]["prefill_ms_per_prompt"] > 0
    assert "ms per decode pass" in r.stdout
    rows = rep["per_prompt"]
    assert len(rows) == 12
    # which source banked the drafted tokens: the head alone only "phrase", our lookup alone only "prompt"
    assert set(rep["methods"]["phrase"].get("banked_by_source", {})) <= {"phrase", "prompt"}
    assert set(rep["methods"]["head"].get("banked_by_source", {})) <= {"phrase"}
    assert set(rep["methods"]["lookup"].get("banked_by_source", {})) <= {"prompt"}
    assert sum(rep["methods"]["phrase"]["banked_by_source"].values()) > 0
    for row in rows:
        assert {"id", "method", "new_tokens", "forward_passes", "seconds", "tokens"} <= set(row)
        assert row["new_tokens"] == len(row["tokens"]) and row["forward_passes"] >= 1
