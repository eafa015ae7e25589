"""Tokens per pass of phrase heads on held-out distilled answers, and their best tree shape.

Replays the decode loop offline (assistant.adapt.evaluate.simulate_decode: phrase head + prompt lookup in one
tree of --nodes nodes, exactly what the runtime builds) on distilled answers the head was NOT trained
on, with the hidden states kept from their generation, for a grid of PhraseDrafter settings (top_k,
chain_depth, chain_width); prints tokens per pass for each and, with --write, stores the best in the
artifact's metadata ("drafter"), which PhraseDrafter.from_artifact reads. Tokens per pass do not
depend on timing, so this may share the machine.

With several heads (scripts/head_sweep.sh) it ends with a table: rows, parameters, share of the
target and the best tokens per pass of each.

usage: python scripts/tune_drafter.py HEAD.safetensors [HEAD ...] --answers <cache>/train/<target>/answers.jsonl
           --keys gsm8k_train:1400:1500 [--nodes 16] [--write]
"""
from __future__ import annotations

import argparse
import itertools
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

    import torch

    from assistant.adapt.datasets import trained_ranges
    from assistant.adapt.distill import load_answers
    from assistant.adapt.features import load_generation_features
    from assistant.adapt.evaluate import simulate_decode
    from assistant.adapt.train import write_artifact
    from assistant.runtime.drafters import PhraseDrafter, PromptLookupDrafter, UnionDrafter
    from assistant.runtime.head import load_artifact
    from assistant.runtime.target import load_target

    stem, start, stop = args.keys.rsplit(":", 2)
    wanted = {f"{stem}:{i}" for i in range(int(start), int(stop))}
    answers = [a for a in load_answers(args.answers) if a.key in wanted]
    feats = load_generation_features(args.answers, answers)
    if not answers or feats is None:
        sys.exit(f"tune_drafter: no answers with generation features for {args.keys} in {args.answers}")
    grid = list(itertools.product(*(map(int, s.split(",")) for s in (args.top_k, args.depth, args.chain_width))))
    print(f"{len(answers)} held-out answers ({sum(len(a.answer_ids) for a in answers)} tokens), "
          f"{args.nodes}-node trees", flush=True)
    target, table = None, []
    for path in args.heads:
        art = load_artifact(path)
        trained = {f"{Path(f).stem}:{i}" for f, (_, spans) in trained_ranges(art.meta).items() for a, b in spans
                   for i in range(a, b)}
        if wanted & trained:
            sys.exit(f"tune_drafter: {len(wanted & trained)} of the keys were training data for {path}")
        target = target or load_target(art.meta.get("target", "default"), "fp32")
        emb = target.model.get_input_embeddings()
        results = []
        with torch.inference_mode():
            for top_k, depth, width in grid:
                phrase = PhraseDrafter.from_artifact(art, emb, top_k=top_k, chain_depth=depth, chain_width=width,
                                                     max_nodes=args.nodes)
                sim = simulate_decode(UnionDrafter(phrase, PromptLookupDrafter()), answers, feats, args.nodes,
                                      target.hidden_size)
                results.append(({"top_k": top_k, "chain_depth": depth, "chain_width": width}, sim["tokens_per_pass"]))
                print(f"{Path(path).name}: top_k {top_k:3d} chain_depth {depth} chain_width {width}: "
                      f"{sim['tokens_per_pass']:.3f} tokens/pass", flush=True)
        best, tpp = max(results, key=lambda r: r[1])
        print(json.dumps({"head": path, "best": best, "tokens_per_pass": round(tpp, 3)}), flush=True)
        n = art.head.parameter_count()
        table.append((art.head.rows, art.head.config.inner, art.head.config.width, n, n / target.num_parameters, tpp,
                      ",".join(map(str, art.head.config.feature_layers))))
        if args.write:
            meta = dict(art.meta)
            meta["drafter"] = {**best, "tuned_on": args.keys, "tokens_per_pass": round(tpp, 3)}
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
