"""`assistant train`: build a draft vocabulary and phrase head from distillation data.

Contract: flags map one-to-one onto assistant.adapt.pipeline.TrainConfig (frozen); the
stages (distil, mine, features, train, write) are resumable in the work
directory, so rerunning the same command continues an interrupted build.
`--data FILE[:START:STOP]` is required and may repeat (0-based record range).
Prints the artifact path (or JSON with --json); with --distill-only it stops
after the answers and prints their file. The artifact's metadata names each data
set by file name, sha256 and record range (no paths), and <artifact stem>.slices.jsonl
beside it holds the prompts just past the training range, which the online adapter
answers for its anchor check and rehearsal (assistant.adapt.datasets).
torch is imported inside `run` only.
"""
from __future__ import annotations

import argparse
import json

from assistant.commands import positive_int

def _source(spec: str) -> tuple[str, int, int]:
    parts = spec.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2])
    return spec, 0, 10 ** 9


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="distil answers, mine phrases and train a phrase head",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default", help="target model (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="target precision for distillation")
    p.add_argument("--data", action="append", metavar="FILE[:START:STOP]",
                   required=True,
                   help="training prompts (JSONL; repeatable), e.g. gsm8k_train.jsonl:0:1000")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--gen-batch", type=int, default=16, help="distillation batch size")
    p.add_argument("--rows", type=int, default=8000, help="draft-vocabulary row budget")
    p.add_argument("--max-words", type=int, default=3)
    p.add_argument("--chain-width", type=int, default=4, help="next rows kept per row in the chain table")
    p.add_argument("--layers", default="-1", help="hidden-state layers the head reads, comma-separated")
    p.add_argument("--feature-layers", default="-1,8,16,24",
                   help="hidden states kept during distillation (saves a prefill stage)")
    p.add_argument("--inner", type=int, default=1024)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store-dtype", default="fp16", choices=["fp16", "fp32"])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--workdir", default=None, help="stage outputs (default: user cache dir /train/<target>)")
    p.add_argument("--out", default=None, help="artifact path")
    p.add_argument("--distill-only", action="store_true",
                   help="stop after distilling the answers (e.g. held-out ones for scripts/tune_drafter.py)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from assistant.adapt.pipeline import TrainConfig

    return TrainConfig(
        target=args.target, dtype=args.dtype, sources=tuple(_source(s) for s in args.data),
        max_new_tokens=args.max_new_tokens, gen_batch=args.gen_batch, rows=args.rows, max_words=args.max_words,
        chain_width=args.chain_width, layers=tuple(int(x) for x in args.layers.split(",")),
        feature_layers=tuple(int(x) for x in args.feature_layers.split(",")), inner=args.inner,
        width=args.width, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed,
        store_dtype=args.store_dtype, workdir=args.workdir, out=args.out, threads=args.threads,
        distill_only=args.distill_only)


def run(args: argparse.Namespace) -> int:
    from assistant.adapt.pipeline import run_pipeline
    from assistant.runtime.head import load_artifact

    config = config_from_args(args)
    out = run_pipeline(config)
    if config.distill_only:
        print(json.dumps({"answers": str(out)}) if args.json else out)
    elif args.json:
        art = load_artifact(out)
        print(json.dumps({"artifact": str(out), **art.meta}, default=str))
    else:
        print(out)
    return 0
