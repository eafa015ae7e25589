"""Tokens per pass of phrase heads on held-out distilled answers, and their best tree shape.

Replays the decode loop offline (assistant.adapt.evaluate.simulate_decode: phrase head + prompt lookup in one
tree of --nodes nodes, exactly what the runtime builds) on distilled answers the head was NOT trained
on, with the hidden states kept from their generation, for a grid of PhraseDrafter settings (top_k,
chain_depth, chain_width; assistant.adapt.tune, the step `assistant train --recipe` ends with); prints
tokens per pass for each and, with --write, stores the best in the artifact's metadata ("drafter"),
which PhraseDrafter.from_artifact reads. Tokens per pass do not depend on timing, so this may share
the machine.

With several heads (scripts/head_sweep.sh) it ends with a table: rows, parameters, share of the
target and the best tokens per pass of each.

usage: python scripts/tune_drafter.py HEAD.safetensors [HEAD ...] --answers <cache>/train/<target>/answers.jsonl
           --keys gsm8k_train:1400:1500 [--nodes 16] [--write]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+")
    ap.add_argument("--answers", required=True, help="answers.jsonl written by `assistant train`")
    ap.add_argument("--keys", required=True, help="STEM:START:STOP, e.g. gsm8k_train:1400:1500 (held out)")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--top-k", default="6,10,16")
    ap.add_argument("--depth", default="2,3")
    ap.add_argument("--chain-width", default="2,4")
    ap.add_argument("--write", action="store_true", help="store the best settings in the artifact")
    args = ap.parse_args()

    from assistant.adapt.distill import load_answers
    from assistant.adapt.features import load_generation_features
    from assistant.adapt.train import write_artifact
    from assistant.adapt.tune import TuneConfig, drafter_meta, trained_keys, tune_tree_shape
    from assistant.runtime.head import load_artifact
    from assistant.runtime.target import load_target

    stem, start, stop = args.keys.rsplit(":", 2)
    ints = lambda s: tuple(map(int, s.split(",")))  # noqa: E731
    tune = TuneConfig(held_out=(stem, int(start), int(stop)), nodes=args.nodes, top_k=ints(args.top_k),
                      chain_depth=ints(args.depth), chain_width=ints(args.chain_width))
    wanted = {f"{stem}:{i}" for i in range(int(start), int(stop))}
    answers = [a for a in load_answers(args.answers) if a.key in wanted]
    feats = load_generation_features(args.answers, answers)
    if not answers or feats is None:
        sys.exit(f"tune_drafter: no answers with generation features for {args.keys} in {args.answers}")
    print(f"{len(answers)} held-out answers ({sum(len(a.answer_ids) for a in answers)} tokens), "
          f"{args.nodes}-node trees", flush=True)
    target, table = None, []
    for path in args.heads:
        art = load_artifact(path)
        clash = wanted & trained_keys(art.meta)
        if clash:
            sys.exit(f"tune_drafter: {len(clash)} of the keys were training data for {path}")
        target = target or load_target(art.meta.get("target", "default"), "fp32")
        show = lambda s, v: print(f"{Path(path).name}: top_k {s['top_k']:3d} chain_depth {s['chain_depth']} "  # noqa: E731
                                  f"chain_width {s['chain_width']}: {v:.3f} tokens/pass", flush=True)
        best, tpp, _ = tune_tree_shape(art, target.model.get_input_embeddings(), answers, feats, target.hidden_size,
                                       tune.grid(), args.nodes, on_result=show)
        print(json.dumps({"head": path, "best": best, "tokens_per_pass": round(tpp, 3)}), flush=True)
        n = art.head.parameter_count()
        table.append((art.head.rows, art.head.config.inner, art.head.config.width, n, n / target.num_parameters, tpp,
                      ",".join(map(str, art.head.config.feature_layers))))
        if args.write:
            meta = {**art.meta, "drafter": drafter_meta(best, tpp, tune.held_out)}
            store = meta.get("train_config", {}).get("store_dtype", "fp16")   # as the head was written
            write_artifact(path, art.head, art.vocab, art.extra.get("chain"), meta, store, art.extra.get("chain_p"))
            print(f"wrote the settings into {path}")
    if len(table) > 1:
        top = max(r[5] for r in table)
        print("| rows | inner | width | layers | parameters | share of target | tokens/pass | of the best |")
        print("|---|---|---|---|---|---|---|---|")
        for r in table:
            print(f"| {r[0]:,} | {r[1]} | {r[2]} | {r[6]} | {r[3]:,} | {100 * r[4]:.3f}% | {r[5]:.3f} | "
                  f"{100 * r[5] / top:.1f}% |")


if __name__ == "__main__":
    main()
