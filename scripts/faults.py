"""Replay every bad-input and fault case a user can hit and print `case | result | ok` as a Markdown table
(BENCHMARKS.md, "Reliability", is its output).

    python scripts/faults.py [--quick]

Each case runs the real `assistant` command line in a fresh profile home (the model cache is the user's,
so the default model is fetched once). --quick leaves out the cases that load the model.
The same cases are asserted by the tests (tests/assistant/test_bad_input.py, tests/profiles/
test_profile_faults.py, tests/profiles/test_profile_crash.py, tests/adapt/test_worker.py).
"""
from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(home: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    e = {**os.environ, "ASSISTANT_HOME": str(home), "PYTHONPATH": str(REPO), "ASSISTANT_BACKGROUND_COMPILE": "0",
         **(env or {})}
    e.pop("ASSISTANT_PROFILE", None)
    return subprocess.run([sys.executable, "-m", "assistant", *args], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=timeout)


def error_line(r: subprocess.CompletedProcess) -> tuple[str, bool]:
    """The one error line a failing command printed, and whether it was exactly one line, no traceback."""
    lines = [x for x in r.stderr.strip().splitlines() if x.strip() and not x.startswith("[")]
    ok = r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr
    return (f"exit {r.returncode}: " + (lines[-1] if lines else "(nothing)"))[:150], ok


def ask_with_toml(text: str):
    """A case: `assistant ask` on a default profile whose profile.toml is `text` ({home}: the profile home)."""
    def case(home):
        p = home / "profiles" / "default"
        p.mkdir(parents=True)
        (p / "profile.toml").write_text(text.format(home=home))
        return error_line(run(home, "ask", "hi"))

    return case


case_broken_toml = ask_with_toml("tree_width = [1, 2\n")
case_bad_value = ask_with_toml('dtype = "fp64"\n')
case_missing_model = ask_with_toml('target = "{home}/no/such/model"\n')
case_budget_too_small = ask_with_toml('memory_budget = "64MiB"\n')


def case_dir_as_prompts(home):
    (home / "prompts").mkdir(parents=True)
    return error_line(run(home, "ask", "--file", str(home / "prompts")))


def case_dir_as_dataset(home):
    (home / "data").mkdir(parents=True)
    return error_line(run(home, "bench", "--dataset", str(home / "data"), "--methods", "greedy"))


def case_home_is_file(home):
    f = home / "file"
    home.mkdir(parents=True, exist_ok=True)
    f.write_text("x")
    return error_line(run(f, "adapt", "--status"))


def case_cache_is_file(home):
    home.mkdir(parents=True, exist_ok=True)
    f = home / "cache-file"
    f.write_text("x")
    return error_line(run(home, "ask", "hi", env={"ASSISTANT_CACHE": str(f)}))


def case_zero_tokens(home):
    r = run(home, "ask", "hi", "--max-new-tokens", "0")
    return f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1][:120]}", r.returncode == 2


def case_negative_tokens(home):
    r = run(home, "ask", "hi", "--max-new-tokens", "-3")
    return f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1][:120]}", r.returncode == 2


def case_adapter_busy(home):
    from filelock import FileLock

    assert run(home, "profile", "create", "p").returncode == 0
    adir = home / "profiles" / "p" / "adapter"
    adir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(adir / ".lock")):
        return error_line(run(home, "adapt", "--once", "--profile", "p"))


def case_concurrent_new_profiles(home):
    code = "import sys\nfrom assistant.profiles import Profile\nProfile.open(sys.argv[1]).history.close()\n"
    env = {**os.environ, "ASSISTANT_HOME": str(home), "PYTHONPATH": str(REPO)}
    fails = 0
    for batch in range(5):
        procs = [subprocess.Popen([sys.executable, "-c", code, f"p{batch}-{i // 2}"], cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(20)]
        fails += sum(p.wait() != 0 for p in procs)
    return f"50 pairs of processes opening a new profile at once: {fails} failures", fails == 0


def case_modes(home):
    old = os.umask(0o022)
    try:
        assert run(home, "profile", "create", "p").returncode == 0
        sys.path.insert(0, str(REPO))
        os.environ["ASSISTANT_HOME"] = str(home)
        from assistant.profiles import Profile

        p = Profile.open("p")
        p.history.add_message(p.history.new_conversation("t", ""), "user", "secret")
        files = [f for f in p.path.iterdir() if f.is_file()]
        bad = [f.name for f in files if stat.S_IMODE(f.stat().st_mode) != 0o600]
        folder = oct(stat.S_IMODE(p.path.stat().st_mode))
        p.close()
    finally:
        os.umask(old)
    return f"folder {folder}, {len(files)} files, not 0600: {bad or 'none'}", folder == "0o700" and not bad


def case_damaged_current(home):
    assert run(home, "profile", "create", "default").returncode == 0
    sys.path.insert(0, str(REPO))
    os.environ["ASSISTANT_HOME"] = str(home)
    import numpy as np
    from safetensors.numpy import save_file

    from assistant.profiles import Profile

    p = Profile.open("default")
    art = home / "a.safetensors"
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(art))
    v = p.heads.publish(art)
    (p.heads.root / "CURRENT").write_text("garbage\n")
    r = run(home, "adapt", "--status")
    shown = next((x for x in r.stdout.splitlines() if x.startswith("head version")), "")
    used = Profile.open("default").heads.current()
    ok = r.returncode == 0 and v in shown and used is not None and used.parent.name == v and r.stdout.count("damaged") == 1
    return f"status shows '{shown.split(maxsplit=2)[-1]}', answers use {used.parent.name}; problem printed once", ok


def case_huge_prompt(home):
    home.mkdir(parents=True, exist_ok=True)
    f = home / "huge.jsonl"                      # one 250 KB prompt (too long for one argv string)
    f.write_text('{"prompt": "' + "word " * 50_000 + '"}\n')
    t0 = time.time()
    r = run(home, "ask", "--file", str(f), "--max-new-tokens", "4")
    skipped = [x for x in r.stderr.splitlines() if x.startswith("[ask] skipped")]
    ok = r.returncode == 1 and len(skipped) == 1 and "context holds" in skipped[0] and "Traceback" not in r.stderr
    return (f"exit {r.returncode}: {(skipped or ['(nothing)'])[0][:120]} ({time.time() - t0:.1f} s with the model "
            "load)"), ok


def case_malformed_jsonl(home):
    f = home / "p.jsonl"
    home.mkdir(parents=True, exist_ok=True)
    f.write_text('{"prompt": "Say hi."}\n{not json\n{"nothing": 1}\n{"prompt": "Say bye."}\n')
    r = run(home, "ask", "--file", str(f), "--max-new-tokens", "4", "--json")
    answered = sum(1 for x in r.stdout.splitlines() if x.startswith("{"))
    skipped = [x for x in r.stderr.splitlines() if x.startswith("[ask] skipped")]
    return f"exit {r.returncode}: {answered} answered, {len(skipped)} lines skipped with their line numbers", \
        answered == 2 and len(skipped) == 2 and all(":2" in s or ":3" in s for s in skipped)


def case_ctrl_c(home):
    e = {**os.environ, "ASSISTANT_HOME": str(home), "PYTHONPATH": str(REPO), "ASSISTANT_BACKGROUND_COMPILE": "0"}
    f = home / "p.jsonl"
    home.mkdir(parents=True, exist_ok=True)
    f.write_text("".join(f'{{"prompt": "Count from 1 to 50, number {i}."}}\n' for i in range(6)))
    proc = subprocess.Popen([sys.executable, "-m", "assistant", "ask", "--file", str(f), "--max-new-tokens", "48",
                             "--json"], cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()                     # one answer finished
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "did not stop within 10 s of Ctrl-C", False
    stopped = time.time() - t0
    db = home / "profiles" / "default" / "history.sqlite"
    con = sqlite3.connect(str(db))
    kept = con.execute("SELECT COUNT(*) FROM messages WHERE role = 'assistant' AND accepted = 1").fetchone()[0]
    check = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    ok = proc.returncode == 130 and kept >= 1 and first.startswith("{") and check == "ok"
    return f"exit {proc.returncode} {stopped:.1f} s after Ctrl-C; {kept} finished answers kept; integrity {check}", ok


CASES = [
    ("profile.toml not valid TOML", case_broken_toml, False),
    ("profile.toml with a bad value", case_bad_value, False),
    ("a model directory that does not exist", case_missing_model, False),
    ("a memory budget that cannot fit", case_budget_too_small, False),
    ("ask --file DIR", case_dir_as_prompts, False),
    ("bench --dataset DIR", case_dir_as_dataset, False),
    ("ASSISTANT_HOME names a file", case_home_is_file, False),
    ("ASSISTANT_CACHE names a file", case_cache_is_file, False),
    ("--max-new-tokens 0", case_zero_tokens, False),
    ("--max-new-tokens -3", case_negative_tokens, False),
    ("two adapter cycles at once", case_adapter_busy, False),
    ("two processes create one profile", case_concurrent_new_profiles, False),
    ("file modes of a profile (umask 022)", case_modes, False),
    ("damaged CURRENT: status vs answers", case_damaged_current, False),
    ("a 250 KB prompt (past the context)", case_huge_prompt, True),
    ("malformed JSONL lines", case_malformed_jsonl, True),
    ("Ctrl-C during ask --file", case_ctrl_c, True),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="leave out the cases that load the model")
    args = ap.parse_args()
    print("| case | result | ok |\n|---|---|---|")
    failed = 0
    for name, fn, loads in CASES:
        if loads and args.quick:
            continue
        with tempfile.TemporaryDirectory(prefix="faults-") as d:
            try:
                result, ok = fn(Path(d) / "home")
            except Exception as e:  # noqa: BLE001 - a case that crashes the harness is a failed case
                result, ok = f"harness error: {type(e).__name__}: {e}", False
        failed += not ok
        print(f"| {name} | {result.replace('|', '/')} | {'yes' if ok else '**no**'} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
