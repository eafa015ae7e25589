"""`assistant train`: build a draft vocabulary and phrase head from distillation data.

Contract: `assistant train --recipe FILE --data DIR [--out PATH]` rebuilds the head a recipe
describes (assistant.adapt.recipe: data sets by file name, found in DIR; every training flag; the
held-out answers and grid its tree shape is picked on) in one run: distil, mine, features, train,
write, tune the tree shape and store it. --out defaults to the recipe's artifact beside the recipe
file; --no-tune skips the tree shape. Without --recipe, `--data FILE[:START:STOP]` is required and
may repeat (0-based record range) and the flags alone configure the build (no tree-shape step).
Each training flag maps onto the assistant.adapt.pipeline.TrainConfig field of the same name
(frozen); a flag given explicitly wins over the recipe, an absent one keeps the recipe's value (or
TrainConfig's default). The stages are resumable in the work directory, so rerunning the same command
continues an interrupted build. Prints the artifact path (or JSON with --json); with --distill-only
it stops after the answers and prints their file. The artifact's metadata names each data set by
file name, sha256 and record range (no paths), and <artifact stem>.slices.jsonl beside it holds the
prompts just past the training range, which the online adapter answers for its anchor check and
rehearsal (assistant.adapt.datasets). torch is imported inside `run` only.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable

from assistant.commands import positive_int

_ints: Callable[[str], tuple[int, ...]] = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
# flag -> (TrainConfig field, argparse type, help); every one defaults to "not given" (None)
FLAGS: dict[str, tuple[str, Any, str]] = {
    "--target": ("target", str, "target model"),
    "--dtype": ("dtype", str, "target precision for distillation (fp32, bf16)"),
    "--max-new-tokens": ("max_new_tokens", positive_int, "answer length cap"),
    "--gen-batch": ("gen_batch", int, "distillation batch size"),
    "--rows": ("rows", int, "draft-vocabulary row budget"),
    "--max-words": ("max_words", int, "words a row covers at most"),
    "--chain-width": ("chain_width", int, "next rows kept per row in the chain table"),
    "--layers": ("layers", _ints, "hidden-state layers the head reads, comma-separated"),
    "--feature-layers": ("feature_layers", _ints, "hidden states kept during distillation (saves a prefill stage)"),
    "--inner": ("inner", int, "head trunk width"),
    "--width": ("width", int, "head output width"),
    "--epochs": ("epochs", int, "training epochs"),
    "--lr": ("lr", float, "learning rate"),
    "--batch-size": ("batch_size", int, "training batch size"),
    "--holdout": ("holdout", float, "share of positions held out for the top-k report"),
    "--seed": ("seed", int, "random seed"),
    "--store-dtype": ("store_dtype", str, "artifact precision of the head weights (fp16, fp32)"),
    "--threads": ("threads", int, "torch threads (0: torch's default; the bytes written depend on it)"),
}
CHOICES = {"--dtype": ["fp32", "bf16"], "--store-dtype": ["fp16", "fp32"]}


def _source(spec: str) -> tuple[str, int, int]:
    parts = spec.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2])
    return spec, 0, 10 ** 9


def register(subparsers) -> None:
    from assistant.adapt.pipeline import TrainConfig

    defaults = {f.name: f.default for f in fields(TrainConfig)}
    p = subparsers.add_parser("train", help="distil answers, mine phrases and train a phrase head",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", metavar="FILE", default=None,
                   help="a head's recipe (e.g. assistant/runtime/data/heads/SmolLM2-135M-Instruct.recipe.toml)")
    p.add_argument("--data", action="append", metavar="DIR | FILE[:START:STOP]", required=True,
                   help="with --recipe: the folder holding its data sets; without: training prompts "
                        "(JSONL; repeatable), e.g. gsm8k_train.jsonl:0:1000")
    for flag, (field, kind, text) in FLAGS.items():
        shown = ",".join(map(str, defaults[field])) if isinstance(defaults[field], tuple) else defaults[field]
        p.add_argument(flag, dest=field, type=kind, default=None, choices=CHOICES.get(flag),
                       help=f"{text} (default: the recipe's, else {shown})")
    p.add_argument("--workdir", default=None, help="stage outputs (default: user cache dir /train/<target>)")
    p.add_argument("--out", default=None, help="artifact path (default: the recipe's artifact)")
    p.add_argument("--no-tune", action="store_true", help="with --recipe: keep the drafter's default tree shape")
    p.add_argument("--distill-only", action="store_true",
                   help="stop after distilling the answers (with --recipe: the held-out ones too)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """(TrainConfig, TuneConfig or None) for the parsed flags: the recipe's, with the explicit flags over it."""
    from assistant.adapt.pipeline import TrainConfig, TrainError

    given = {field: getattr(args, field) for field, _, _ in FLAGS.values() if getattr(args, field) is not None}
    common = {"workdir": args.workdir, "distill_only": args.distill_only}
    if args.recipe is None:
        if args.no_tune:
            raise TrainError("--no-tune goes with --recipe")
        return TrainConfig(sources=tuple(_source(s) for s in args.data), out=args.out, **common, **given), None
    from assistant.adapt.recipe import load_recipe

    if len(args.data) != 1 or not Path(args.data[0]).is_dir():
        raise TrainError(f"with --recipe, --data names the one folder holding the recipe's data sets, "
                         f"got {' '.join(args.data)}")
    recipe = load_recipe(args.recipe, args.data[0])
    out = args.out or str(recipe.artifact)
    return replace(recipe.train, out=out, **common, **given), None if args.no_tune else recipe.tune


def run(args: argparse.Namespace) -> int:
    from assistant.adapt.pipeline import run_pipeline
    from assistant.runtime.head import load_artifact

    config, tune = config_from_args(args)
    out = run_pipeline(config, tune=tune)
    if config.distill_only:
        print(json.dumps({"answers": str(out)}) if args.json else out)
    elif args.json:
        art = load_artifact(out)
        print(json.dumps({"artifact": str(out), **art.meta}, default=str))
    else:
        print(out)
    return 0
