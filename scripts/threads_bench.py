"""Speed by thread count, on an idle machine and beside one busy process (BENCHMARKS.md, "Threads").

    python scripts/threads_bench.py [--prompts 5] [--tokens 64] [--dtype bf16] [--data ../shared/data]

For each load (idle; one other process spinning on one core) and engine (eager, compiled) it runs
`assistant bench` with --threads 1, --threads 2 and the default (measured and fitted to the load,
assistant/runtime/threads.py), greedy and phrase decoding, plus llama.cpp's plain decode of the same BF16
weights at the same thread count when scripts/build_llamacpp.sh has built it. Prints one Markdown
row per run. Run it alone: every other process counts as load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPIN = "import time\nwhile True:\n    pass\n"


def bench(data: Path, args, engine: str, threads: str, out: Path) -> dict:
    methods = "greedy,phrase" + (",llamacpp" if args.llamacpp and engine == "compiled" else "")
    cmd = [sys.executable, "-m", "assistant", "bench", "--dataset", str(data / "gsm8k_test.jsonl"),
           "--limit", str(args.prompts), "--max-new-tokens", str(args.tokens), "--dtype", args.dtype,
           "--engine", engine, "--methods", methods, "--json", str(out)]
    if threads != "auto":
        cmd += ["--threads", threads]
    env = dict(os.environ, ASSISTANT_BACKGROUND_COMPILE="0")
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"bench failed: {r.stderr[-1500:]}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--no-llamacpp", dest="llamacpp", action="store_false")
    args = ap.parse_args()
    data = Path(args.data)
    rows = []
    print("| load | engine | threads | greedy tok/s | phrase tok/s | llama.cpp BF16 tok/s |\n|---|---|---|---|---|---|",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("idle", "one busy core"):
            spin = subprocess.Popen([sys.executable, "-c", SPIN]) if load != "idle" else None
            try:
                for engine in ("eager", "compiled"):
                    for threads in ("1", "2", "auto"):
                        rep = bench(data, args, engine, threads, Path(tmp) / "r.json")
                        m = rep["methods"]
                        tps = {k: m[k]["tokens_per_second"] for k in m}
                        used = rep.get("threads")
                        label = f"default ({used})" if threads == "auto" else threads
                        row = {"load": load, "engine": engine, "threads": threads, "used": used, **tps}
                        rows.append(row)
                        cells = [f"{tps[k]:.1f}" if k in tps else "" for k in ("greedy", "phrase", "llamacpp")]
                        print(f"| {load} | {engine} | {label} | " + " | ".join(cells) + " |", flush=True)
            finally:
                if spin is not None:
                    spin.kill()
                    spin.wait()
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
