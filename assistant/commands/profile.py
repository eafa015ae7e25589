"""`assistant profile list|create NAME|show [NAME]|path [NAME]`: manage per-user profiles.

Contract: `list` prints one profile name a line (the default one marked with *);
`create NAME` makes the directory and a default profile.toml (an existing profile is
left as it is); `show [NAME]` prints the settings, the head versions and history
counts (--json for a JSON object), reporting damaged files as lines without
failing; `path [NAME]` prints the directory. NAME defaults to $ASSISTANT_PROFILE or
"default". No torch import.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("profile", help="list, create, show profiles and where they live",
                              description="Per-user profiles: settings, head versions, history.")
    sub = p.add_subparsers(dest="profile_command", metavar="ACTION")
    sub.add_parser("list", help="list profiles")
    c = sub.add_parser("create", help="create a profile")
    c.add_argument("name")
    s = sub.add_parser("show", help="show a profile's settings, heads and history")
    s.add_argument("name", nargs="?")
    s.add_argument("--json", action="store_true")
    pa = sub.add_parser("path", help="print a profile's directory")
    pa.add_argument("name", nargs="?")
    p.set_defaults(func=run, _parser=p)


def describe(name: str | None) -> dict[str, Any]:
    """Everything `show` prints, collecting problems instead of failing on them."""
    from assistant.profiles import Profile, ProfileError

    prof = Profile.open(name, create=False, strict=False)
    problems = list(prof.problems)
    heads = prof.heads
    current = heads.current()
    problems += heads.problems
    out: dict[str, Any] = {"name": prof.name, "path": str(prof.path), "config": asdict(prof.config),
                           "heads": {"versions": heads.versions(), "current_version": heads.current_version(),
                                     "current": str(current) if current else None}}
    try:
        out["history"] = prof.history.counts()
    except ProfileError as e:
        out["history"] = None
        problems.append(str(e))
    prof.close()
    out["problems"] = problems
    return out


def run(args: argparse.Namespace) -> int:
    from assistant.profiles import Profile, paths

    action = args.profile_command
    if action is None:
        args._parser.print_help()
        return 0
    if action == "list":
        default = paths.default_name()
        for n in Profile.list():
            print(f"{'*' if n == default else ' '} {n}")
        return 0
    if action == "create":
        existed = Profile.exists(args.name)
        prof = Profile.open(args.name, create=True)
        print(f"{'exists' if existed else 'created'}: {prof.path}")
        return 0
    if action == "path":
        print(paths.profile_dir(args.name or paths.default_name()))
        return 0
    d = describe(args.name)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"profile {d['name']}: {d['path']}")
    for k, v in d["config"].items():
        print(f"  {k} = {v!r}")
    h = d["heads"]
    print(f"  heads: {len(h['versions'])} versions, CURRENT {h['current_version'] or '-'}"
          + (f" -> {h['current']}" if h["current"] else ""))
    if d["history"] is not None:
        c = d["history"]
        print(f"  history: {c['conversations']} conversations, {c['messages']} messages, {c['accepted']} accepted")
    for p in d["problems"]:
        print(f"  problem: {p}")
    return 0
