"""`assistant bench`: hf / pld / greedy / phrase side by side on a JSONL prompt set."""
from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark decoding methods on a JSONL prompt set",
                       description="Run hf, pld, greedy and phrase decoding on the same prompts and compare.")
    p.add_argument("--dataset", required=True, help="JSONL file; prompt field found by itself")
    p.add_argument("--limit", type=int, default=None, help="first N prompts")
    p.add_argument("--offset", type=int, default=0, help="skip the first K prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="auto: bf16 on a GPU or a CPU with native bf16, else fp32")
    p.add_argument("--methods", default="hf,pld,greedy,phrase", help="comma list of hf,pld,greedy,phrase")
    p.add_argument("--tree-width", type=int, default=None,
                   help="verify nodes per pass, root included (default: picked online per pass from the measured "
                        "verify costs and what the head banks, <= 16; runtime/width.py)")
    p.add_argument("--layout", choices=["auto", "out", "in"], default="auto",
                   help="weight layout for greedy and phrase (runtime/layout.py); auto: the measured best "
                        "without --tree-width, as loaded with it")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the verify cost per width and layout again (run alone; the result is cached)")
    p.add_argument("--target", default=None, help="model (default: the profile's target)")
    p.add_argument("--head", default=None, help="head artifact (default: the profile's current head, else shipped)")
    p.add_argument("--profile", default=None, help="profile name")
    p.add_argument("--ignore-eos", action="store_true", help="decode past EOS up to --max-new-tokens")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the full report here")
    p.set_defaults(func=run)


def _resolve(args) -> tuple[str, str | None]:
    """Target and head from the flags, falling back to the profile when one exists."""
    target, head = args.target, args.head
    if target is None or head is None:
        from profiles import Profile, paths

        if args.profile is not None or Profile.exists(paths.default_name()):
            prof = Profile.open(args.profile, create=False)
            target = target or prof.config.target
            if head is None and (cur := prof.heads.current()) is not None:
                head = str(cur)
    return target or "default", head


def run(args) -> int:
    from runtime.bench import BenchConfig, format_table, run_bench
    from runtime.defaults import build_drafter
    from runtime.jsonl import read_prompts
    from runtime.target import load_target

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    prompts, errors = read_prompts(args.dataset, args.limit, args.offset)
    for e in errors:
        print(f"skipped {e}", file=sys.stderr)
    if not prompts:
        print(f"assistant: {args.dataset}: no usable prompts", file=sys.stderr)
        return 1
    target_spec, head = _resolve(args)
    from runtime.budget import resolve_dtype

    target = load_target(target_spec, resolve_dtype(args.dtype))
    drafter, info = build_drafter(target, head) if "phrase" in methods else (None, {})
    width, layout, width_costs = args.tree_width, args.layout, ()
    if width is None:
        from runtime.costmodel import calibrate

        plan = calibrate(target, 16, lambda s, f: print(f"[bench] {s}", file=sys.stderr), refresh=args.recalibrate)
        layout = plan.layout if layout == "auto" else layout
        width, width_costs = 16, tuple(sorted(plan.costs[layout].items()))
        base = plan.costs["out"][1]
        for lay, c in plan.costs.items():
            print(f"[bench] verify cost with {lay}-major weights, relative to 1 token as loaded: "
                  + ", ".join(f"w={w} x{s / base:.2f}" for w, s in sorted(c.items())), file=sys.stderr)
    elif layout == "auto":
        layout = "out"
    print(f"[bench] tree width {'picked online, at most ' if width_costs else ''}{width}, {layout}-major weights "
          f"for greedy and phrase (hf and pld run on the weights as loaded)", file=sys.stderr)
    cfg = BenchConfig(max_new_tokens=args.max_new_tokens, methods=methods, tree_width=width,
                      ignore_eos=args.ignore_eos, layout=layout, width_costs=width_costs)
    report = run_bench(target, prompts, cfg, drafter, progress=lambda s: print(f"[bench] {s}", file=sys.stderr))
    report["dataset"] = args.dataset
    report["head"] = info
    report["skipped_lines"] = errors
    print(format_table(report))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return 0
