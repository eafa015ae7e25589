"""`assistant adapt`: the online adapter's status, one cycle now, or the worker in the foreground.

Contract:
- `assistant adapt --status [--json] [--profile P]` never imports torch (it reads
  adapter/state.json, heads/ and the history database read-only): head version,
  rows used / row budget, rows grown and evicted, the last cycle (status, time,
  tokens per pass before and after), accepted answers pending, the last error.
- `assistant adapt --once [--json]` runs one full cycle now (assistant.adapt.cycle.run_cycle)
  and prints its report; exit 0 when published or nothing to do, 2 when rejected.
- `assistant adapt --watch` runs the background worker in the foreground (lower
  priority, watchdog on the history store, the profile's schedule) until Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("adapt", help="online adaptation: status, one cycle now, or run the worker",
                              description="Learn from accepted answers: mine phrases, grow/evict rows, "
                                          "fine-tune and publish a new head version.")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--status", action="store_true", help="show the adapter's state (default)")
    g.add_argument("--once", action="store_true", help="run one full cycle now")
    g.add_argument("--watch", action="store_true", help="run the background adapter in the foreground")
    p.add_argument("--profile", default=None, help="profile name (default: $ASSISTANT_PROFILE or 'default')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="target dtype for the cycle's features")
    p.set_defaults(func=run)


def _fmt_status(s: dict[str, Any]) -> str:
    def ago(t):
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))}" if t else "never"

    last = s.get("last_cycle") or {}
    tpp = s.get("tokens_per_pass") or {}
    lines = [
        f"profile        {s['profile']}",
        f"head version   {s['version'] or 'none (shipped default)'}"
        + (" (drafting beside the base head it was adapted from)" if s.get("base_beside") else ""),
        f"rows           {s['rows'] if s['rows'] is not None else '?'} / {s['row_budget']} budget"
        + (f" ({s['capacity']} slots)" if s.get("capacity") else ""),
        f"grown/evicted  {s['grown']} / {s['evicted']}  over {s['cycles']} cycles "
        f"({s['published']} published, {s['rejected']} rejected)",
        f"last cycle     {ago(last.get('time'))} {last.get('status', '')}",
        *([f"running now    {s['running']['stage']} (pid {s['running']['pid']})"] if s.get("running") else []),
        f"pending        {s['pending'] if s['pending'] is not None else '?'} accepted answers"
        + (f", {s['held_out']} held out to judge cycles" if s.get("held_out") else ""),
    ]
    if tpp:
        lines.append(f"tokens/pass    user {tpp.get('user_before')} -> {tpp.get('user_after')}, "
                     f"original data {tpp.get('anchor_before')} -> {tpp.get('anchor_after')}")
    lines.append(f"schedule       {'on' if s['enabled'] else 'off'}, every {s['schedule']['min_new_answers']} "
                 f"answers or {s['schedule']['interval_s']:g} s")
    if s.get("last_error"):
        lines.append(f"last error     {s['last_error'].get('message')}")
    for i, problem in enumerate(s.get("problems") or ([s["problem"]] if s.get("problem") else [])):
        lines.append(f"{'problem' if i == 0 else '':<15}{problem}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from assistant.profiles import Profile

    profile = Profile.open(args.profile, create=args.profile is None)
    if args.once:
        return _once(profile, args)
    if args.watch:
        return _watch(profile, args)
    from assistant.adapt.status import status

    s = status(profile)
    print(json.dumps(s, indent=1, default=str) if args.json else _fmt_status(s))
    return 0


def _once(profile, args) -> int:
    from assistant.adapt.cycle import CycleConfig, run_cycle

    stage = lambda s: print(f"[adapt] {s}", file=sys.stderr, flush=True)  # noqa: E731 - stderr: --json stays clean
    report = run_cycle(profile, config=CycleConfig(dtype=args.dtype), on_stage=stage)
    profile.close()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    elif report["status"] == "nothing":
        print("[adapt] no new accepted answers")
    else:
        t = report["tokens_per_pass"]
        print(f"[adapt] cycle {report['cycle']} {report['status']}: {report['answers']} answers, "
              f"+{report['grown']} -{report['evicted']} rows ({report['rows']}/{report['row_budget']}), "
              f"tokens/pass user {t['user_before']} -> {t['user_after']}, "
              f"original data {t['anchor_before']} -> {t['anchor_after']}"
              + (f", version {report['version']}" if report.get("version") else "")
              + (f" ({'; '.join(report['reasons'])})" if report["reasons"] else ""))
    return 2 if report["status"] == "rejected" else 0


def _watch(profile, args) -> int:
    from assistant.adapt.cycle import CycleConfig
    from assistant.adapt.worker import AdapterWorker

    def show(r):
        print(f"[adapt] cycle {r.get('cycle')} {r.get('status')} version={r.get('version')} "
              f"tokens/pass={json.dumps(r.get('tokens_per_pass'))}", file=sys.stderr, flush=True)

    name = profile.name
    profile.close()
    print(f"[adapt] watching profile {name} (Ctrl-C stops)", file=sys.stderr, flush=True)
    w = AdapterWorker(name, config=CycleConfig(dtype=args.dtype), on_report=show, threads=None)
    try:
        w.run_forever()
    except KeyboardInterrupt:
        w.stop(timeout=0)
        return 130
    return 0
