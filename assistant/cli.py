"""`assistant` command line: one subcommand per module in assistant/commands/.

Contract: each module in assistant.commands defines `register(subparsers)` that
adds its parser and sets `func=run` (a callable taking the parsed args and
returning an exit code). Modules import torch only inside `run`, so `--help` and
`adapt --status` stay fast. Errors a user can act on (UserError, ModelFetchError,
ValueError from bad files) print one line to stderr and exit 1; Ctrl-C exits 130.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import assistant.commands as commands_pkg


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="assistant",
        description="On-device assistant with lossless phrase-level speculative decoding.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        importlib.import_module(f"assistant.commands.{mod.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("assistant: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into one line
        from assistant.errors import is_user_error, one_line

        if is_user_error(e):
            print(f"assistant: {one_line(e)}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
