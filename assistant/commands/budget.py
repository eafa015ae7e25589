"""`assistant budget`: will a target + phrase head fit a memory budget? (no weights, no torch)

Contract: `assistant budget --target T --memory SIZE [--json] [--dtype auto|int8|bf16|fp32]
[--device auto|cpu|cuda] [--tree-width N] [--min-context N] [--profile P]` plans T
("Qwen/Qwen3-4B", "default" = SmolLM2-135M-Instruct, or a local dir with config.json)
with assistant.runtime.budget.plan and prints the byte terms, the largest context and tree width
(--json: the BudgetPlan as a JSON object: fits, max_context, tree_width, terms, total,
shortfall, ...). Values not given come from the profile (target, dtype, memory_budget,
tree_width, row_budget) when --profile is given. Exit 0 when it fits, 1 when it does not
(the output says by how much).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("budget", help="plan memory: does a target fit, with how much context",
                              description="Plan a target's memory from its config alone (no weights loaded).")
    p.add_argument("--target", default=None, help="Qwen/Qwen3-4B, default (SmolLM2-135M-Instruct) or a checkpoint dir")
    p.add_argument("--memory", default=None, help="budget, e.g. 8GiB, 6GB, 512MiB")
    p.add_argument("--dtype", choices=("auto", "int8", "bf16", "fp32"), default=None,
                   help="precision (auto: bf16 when it fits, else int8)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--tree-width", type=int, default=None, help="verify nodes per pass wanted (default 16)")
    p.add_argument("--min-context", type=int, default=None, help="least context worth running (default 2048)")
    p.add_argument("--head-rows", type=int, default=None, help="draft-vocabulary rows of the head (default 8000)")
    p.add_argument("--profile", default=None, help="take unset values from this profile")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from assistant.runtime.budget import DEFAULT_MIN_CONTEXT, BudgetError, plan
    from assistant.runtime.width import DEFAULT_WIDTH

    target, dtype, memory, width, rows = args.target, args.dtype, args.memory, args.tree_width, args.head_rows
    if args.profile is not None:
        from assistant.profiles import Profile

        cfg = Profile.open(args.profile, create=False).config
        target = target or cfg.target
        dtype = dtype or cfg.dtype
        memory = memory or cfg.memory_budget
        width = width or cfg.tree_width
        rows = rows if rows is not None else cfg.row_budget
    if memory is None:
        raise BudgetError("give --memory SIZE (e.g. 8GiB), or a --profile with memory_budget set")
    p = plan(target or "default", memory, dtype=dtype or "auto", device=args.device, tree_width=width or DEFAULT_WIDTH,
             min_context=args.min_context or DEFAULT_MIN_CONTEXT, head_rows=8000 if rows is None else rows)
    if args.json:
        print(json.dumps(p.to_dict(), indent=2))
    else:
        print(p.table())
    if not p.fits:
        print(f"assistant: {p.message()}", file=sys.stderr)
    return 0 if p.fits else 1
