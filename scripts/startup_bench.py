"""Time to the first answer token of `assistant ask` at a first start (nothing compiled or measured yet)
and at the starts after it, as a user runs it (BENCHMARKS.md, "Startup").

    python scripts/startup_bench.py [--dtype bf16] [--tokens 16] [--runs 2]

A fresh cache folder holding only a copy of the converted default model stands for a first start
(no compiled engine, no cost measurements, no inductor kernels); the same folder afterwards for the
starts that follow. Each start is one `python -m assistant ask PROMPT --json` process with its own
profile home; the first token is the first byte of the answer on stdout (ask streams). After the
first start the script waits for the background build of the compiled engine and reports how long
it took. Run it alone: the numbers are wall-clock seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "What is 17 times 23?"


def start(env: dict, dtype: str, tokens: int, engine: str) -> dict:
    cmd = [sys.executable, "-m", "assistant", "ask", PROMPT, "--dtype", dtype, "--max-new-tokens", str(tokens),
           "--engine", engine]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = None
    while True:
        b = proc.stdout.read(1)
        if not b:
            break
        if first is None and not b.isspace():
            first = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.wait()
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"ask failed ({proc.returncode}): {err[-1500:]}")
    notes = [line for line in err.splitlines() if line.startswith("[assistant]")]
    return {"first_token_s": round(first or total, 2), "total_s": round(total, 2), "notes": notes}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--runs", type=int, default=2, help="starts after the first")
    p.add_argument("--engine", default="auto", choices=["auto", "compiled", "eager"])
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from assistant.runtime.fetch import ensure_default_model

    model = ensure_default_model()
    work = Path(tempfile.mkdtemp(prefix="startup-"))
    cache = work / "cache"
    shutil.copytree(model, cache / "models" / model.name)
    env = dict(os.environ, ASSISTANT_CACHE=str(cache), ASSISTANT_HOME=str(work / "home"),
               ASSISTANT_BACKGROUND_COMPILE="1")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    rows = []
    t0 = time.time()
    rows.append({"start": "first", **start(env, args.dtype, args.tokens, args.engine)})
    compiled = cache / "compiled"
    built = None
    while time.time() - t0 < 1800:
        if list(compiled.glob("*.aot")) and not list(compiled.glob("*.lock")):
            built = round(time.time() - t0, 1)
            break
        if list(compiled.glob("*.failed")):
            break
        time.sleep(1)
    for i in range(args.runs):
        rows.append({"start": f"next {i + 1}", **start(env, args.dtype, args.tokens, args.engine)})
    for r in rows:
        engine = next((n for n in r["notes"] if "engine" in n or "compiled" in n), "")
        print(f"{r['start']:>7}: first token {r['first_token_s']:6.2f} s, done {r['total_s']:6.2f} s   {engine}")
    print(f"background build finished {built} s after the first start began" if built else "no background build")
    print(json.dumps({"dtype": args.dtype, "engine": args.engine, "rows": rows, "background_build_s": built}))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
