"""`assistant bench`: hf / pld / greedy / phrase (and llama.cpp) side by side on a JSONL prompt set."""
from __future__ import annotations

import argparse
import json
import sys

from assistant.commands import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark decoding methods on a JSONL prompt set",
                       description="Run hf, pld, greedy and phrase decoding on the same prompts and compare.")
    p.add_argument("--dataset", required=True, help="JSONL file; prompt field found by itself")
    p.add_argument("--limit", type=int, default=None, help="first N prompts")
    p.add_argument("--offset", type=int, default=0, help="skip the first K prompts")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "int8"], default="auto",
                   help="auto: bf16 on a GPU or a CPU with native bf16, else fp32")
    p.add_argument("--methods", default="hf,pld,greedy,phrase",
                   help="comma list of hf,pld,greedy,phrase,head,lookup,llamacpp,llamacpp_q4 (phrase: the default "
                        "drafter; head: the phrase head alone; lookup: our in-context lookup alone; llamacpp: "
                        "llama.cpp's plain decode of the same weights as BF16 / Q4_1 GGUF, after "
                        "scripts/build_llamacpp.sh)")
    p.add_argument("--engine", choices=["auto", "eager", "compiled"], default="auto",
                   help="engine of greedy and phrase (assistant/runtime/engine.py); auto: the measured faster on this device, "
                        "as chat and ask use it; hf and pld always run transformers' eager generate()")
    p.add_argument("--tree-width", type=int, default=None,
                   help="verify nodes per pass, root included (default: picked online per pass from the measured "
                        "verify costs and what the head banks, <= 16; assistant/runtime/width.py)")
    p.add_argument("--layout", choices=["auto", "out", "in", "packed"], default="auto",
                   help="weight layout for greedy and phrase (assistant/runtime/layout.py); auto: the measured best "
                        "without --tree-width, as loaded with it")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch threads of every method (default: measured on the engine and fitted to the load at "
                        "the start, as chat and ask pick them)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the verify cost per width and layout again (run alone; the result is cached)")
    p.add_argument("--target", default=None, help="model (default: the profile's target)")
    p.add_argument("--head", default=None, help="head artifact (default: the profile's current head, else shipped)")
    p.add_argument("--profile", default=None, help="profile name")
    p.add_argument("--history", action="store_true",
                   help="phrase also drafts from the profile's past answers (assistant.runtime.history_lookup), "
                        "each answer of the run joining them once it ends, as in a chat session")
    p.add_argument("--ignore-eos", action="store_true", help="decode past EOS up to --max-new-tokens")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the full report here")
    p.set_defaults(func=run)


def resolve_target_head(args) -> tuple[str, str | None]:
    """Target and head from the flags, falling back to the profile when one exists."""
    target, head = args.target, args.head
    if target is None or head is None:
        from assistant.profiles import Profile, paths

        if args.profile is not None or Profile.exists(paths.default_name()):
            prof = Profile.open(args.profile, create=False)
            target = target or prof.config.target
            if head is None and (cur := prof.heads.current()) is not None:
                head = str(cur)
    return target or "default", head


def history_index(args, target):
    """The lookup index of the profile's past answers with --history (else None)."""
    if not args.history:
        return None
    from assistant.profiles import Profile
    from assistant.runtime.history_lookup import AnswerIndex

    prof = Profile.open(args.profile, create=False)
    try:
        texts, limit = prof.history.answer_texts(), prof.config.history_tokens
    finally:
        prof.close()
    return AnswerIndex.from_texts(texts, target.tokenizer, limit)


def run(args) -> int:
    from assistant.runtime.bench import BenchConfig, format_table, run_bench
    from assistant.runtime.defaults import build_drafter
    from assistant.runtime.jsonl import read_prompts
    from assistant.runtime.target import load_target

    from assistant.runtime.bench import LLAMACPP
    from assistant.runtime.llamacpp import find_build

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    llamacpp = find_build() if any(m in LLAMACPP for m in methods) else None
    for m in [m for m in methods if m in LLAMACPP]:
        if llamacpp is None or LLAMACPP[m] not in llamacpp.models:
            print(f"[bench] {m} skipped: no llama.cpp build with a {LLAMACPP[m]} GGUF (scripts/build_llamacpp.sh)",
                  file=sys.stderr)
            methods = tuple(x for x in methods if x != m)
    prompts, errors = read_prompts(args.dataset, args.limit, args.offset)
    for e in errors:
        print(f"skipped {e}", file=sys.stderr)
    if not prompts:
        print(f"assistant: {args.dataset}: no usable prompts", file=sys.stderr)
        return 1
    target_spec, head = resolve_target_head(args)
    from assistant.runtime.budget import resolve_dtype

    target = load_target(target_spec, resolve_dtype(args.dtype))
    drafters, info, history = {}, {}, None
    if "phrase" in methods:
        history = history_index(args, target)
        drafters["phrase"], info = build_drafter(target, head, history=history)
    if "head" in methods:
        # a second load on purpose: each drafter keeps its own row statistics (PhraseDrafter.observe)
        drafters["head"], info_head = build_drafter(target, head, lookup=False)
        info = info or info_head
    if "lookup" in methods:
        from assistant.runtime.drafters import PromptLookupDrafter, UnionDrafter

        drafters["lookup"] = UnionDrafter(PromptLookupDrafter())
    from assistant.runtime.costmodel import pick_engine
    from assistant.runtime.width import DEFAULT_WIDTH, plan_width

    say = lambda s, f=None: print(f"[bench] {s}", file=sys.stderr)  # noqa: E731
    layers = tuple(next((d.feature_layers for d in drafters.values()), (-1,)))
    # the engine is the one "auto" picks over the default widths, also for a fixed --tree-width
    engine, plan = pick_engine(target, DEFAULT_WIDTH, say, refresh=args.recalibrate, kind=args.engine,
                               feature_layers=layers, threads=args.threads)
    from assistant.runtime.threads import ThreadPolicy

    policy = ThreadPolicy.for_engine(target, engine, args.threads, say)
    threads = policy.apply()
    say(f"{threads} thread{'s' if threads > 1 else ''} ({'--threads' if args.threads else 'measured'}"
        f"{'' if args.threads or policy.last_busy is None else f', other processes busy on {policy.last_busy:.1f} cores'})")
    layout = args.layout
    if engine.name != "eager" and layout not in ("auto", engine.layout):
        print(f"assistant: the compiled engine runs {engine.layout} weights; --layout {layout} needs --engine eager",
              file=sys.stderr)
        return 2
    if layout == "auto" and args.tree_width is None:
        layout = plan.layout                  # the measured best
    elif layout == "auto":
        layout = engine.layout if engine.name != "eager" else "out"      # as loaded
    # no --tree-width: picked online per pass up to the default cap, from the costs in the layout used
    widths = plan_width(args.tree_width, verify=plan, auto=args.tree_width is None, layout=layout)
    width, width_costs = widths.cap, tuple(sorted(widths.costs.items()))
    if width_costs:
        base = next(iter(plan.costs.values()))[1]
        first = next(iter(plan.costs))
        for lay, c in plan.costs.items():
            say(f"verify cost on the {engine.name} engine with {lay} weights, relative to 1 token with {first}: "
                + ", ".join(f"w={w} x{s / base:.2f}" for w, s in sorted(c.items())))
    say(f"engine {engine.name}; tree width {'picked online, at most ' if width_costs else ''}{width}, {layout} "
        f"weights for greedy and phrase (hf and pld run transformers' generate() on the weights as loaded)")
    cfg = BenchConfig(max_new_tokens=args.max_new_tokens, methods=methods, tree_width=width,
                      ignore_eos=args.ignore_eos, layout=layout, width_costs=width_costs, engine=engine.name)
    report = run_bench(target, prompts, cfg, drafters, progress=say, engine=engine, llamacpp=llamacpp,
                       history=history)
    report["dataset"] = args.dataset
    report["threads"] = threads
    report["head"] = info
    report["skipped_lines"] = errors
    print(format_table(report))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return 0
