"""Replay a bench run offline: the default drafter's tokens per pass on the answers it produced, in seconds.

Reads an `assistant bench --json` report, takes the greedy answers of one drafted method (they are the
target's own greedy output: exactness is checked by the bench), computes the target's hidden states over
them in one teacher-forced forward per batch, and replays the decode loop with
assistant.adapt.evaluate.simulate_decode: the same drafter (`build_drafter`: shipped head + prompt
lookup, ranked on one scale), the same width controller over the same verify costs, one drafter and one
controller for the whole run, after the bench's warm-up answer, as the bench keeps them. Tokens per pass
do not depend on timing, so the replay runs in ~30 s instead of ~20 min and may share the machine. It is
within 2% of live decoding, not equal (gsm8k_test 20 x 128, compiled, 2 threads: 2.805 replayed, 2.789
live; mt_bench 81-90: 1.582 and 1.615; the compiled engine's hidden states differ in the last bits and
the ranking is path-dependent): compare changes with it, report speed from `assistant bench`.

It also prints tokens per unit of verify cost (sum over passes of cost(width) / cost(1), from the cost
table) and, with --oracle, the ceiling of the ranking: the same candidates and widths, but the nodes on
the target's path taken first (what a perfect value of each node would bank).

With --calibration it also prints how well the ranking's values held: per source, key kind and depth (1, 2-5,
6-10, 11+), how many verified nodes, how often accepted and their mean value (a ratio under 1: valued above what
they bank; the values steer both the ranking and the width).

With --ceiling it prints instead what the sources hold, before any ranking or width: at every position of
every answer, the longest run of the target's own continuation (up to the cap - 1 tokens) that any candidate of a
source proposes; then tokens per pass if every pass took that run, for all sources and for all but each one
(BENCHMARKS.md, "A user who comes back to their own answers": the ceiling of the returning user's set).

The drafter is the bench's: the head given by --head, else the profile's current head (--profile, as
`assistant bench` resolves it), else the shipped one; --history adds the lookup in the profile's past
answers (`bench --history`; each replayed answer joins that index once it ends, as in the bench). So a
user's gain is replayed as: the report's answers, the shipped head with no history, against their adapted
head with their history.

The verify costs are the report's own (`config.verify_costs`: the table the live run's widths came from)
unless --costs names a cost-model cache file; reports written before the bench recorded them need --costs.

usage: python scripts/replay_bench.py REPORT.json [--costs <cache>/costmodel/<model>-...-compiled-<tag>.json]
           [--method phrase] [--data ../shared/data] [--oracle | --ceiling] [--calibration] [--profile NAME] [--head PATH]
           [--history] [--target DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--costs", default=None, help="a cost-model cache file (assistant.runtime.costmodel); "
                                                  "default: the report's config.verify_costs")
    ap.add_argument("--method", default="phrase")
    ap.add_argument("--data", default=None, help="folder holding the report's data set, if not at its path")
    ap.add_argument("--oracle", action="store_true", help="take the nodes on the target's path first")
    ap.add_argument("--ceiling", action="store_true", help="what the sources hold, before ranking and width")
    ap.add_argument("--calibration", action="store_true", help="the values of the verified nodes against how often "
                                                               "they were accepted")
    ap.add_argument("--profile", default=None, help="profile whose current head (and, with --history, past answers) "
                                                    "draft")
    ap.add_argument("--head", default=None, help="head artifact (default: the profile's current head, else shipped)")
    ap.add_argument("--history", action="store_true", help="also draft from the profile's past answers")
    ap.add_argument("--target", default=None, help="the report's target, where it is a checkpoint dir (the report "
                                                   "records only its name)")
    a = ap.parse_args()

    import torch

    from assistant.adapt.distill import Answer
    from assistant.adapt.evaluate import simulate_decode
    from assistant.adapt.features import collect_features
    from assistant.commands.bench import history_index, resolve_target_head
    from assistant.runtime.bench import WARM_PROMPT, WARM_TOKENS
    from assistant.runtime.defaults import build_drafter
    from assistant.runtime.jsonl import read_prompts
    from assistant.runtime.target import load_target
    from assistant.runtime.width import WidthController

    report = json.loads(Path(a.report).read_text())
    if a.costs:
        table = json.loads(Path(a.costs).read_text())["costs"]
        costs = {int(w): float(s) for w, s in (table.get(report["config"].get("layout", "packed")) or
                                               next(iter(table.values()))).items()}
    elif report["config"].get("verify_costs"):
        costs = {int(w): float(s) for w, s in report["config"]["verify_costs"].items()}
    else:
        sys.exit("the report does not record its verify costs (an older bench): name a cost table with --costs")
    data = Path(report["dataset"])
    if a.data or not data.exists():
        data = Path(a.data or ".") / data.name
    prompts = {str(p["id"]): p["prompt"] for p in read_prompts(data)[0]}
    rows = [r for r in report["per_prompt"] if r["method"] == a.method]
    torch.set_num_threads(1)
    target = load_target(a.target or report.get("target", "default"), report.get("dtype", "fp32"), "cpu")
    answers = []
    for r in rows:
        ids = target.encode_chat([{"role": "user", "content": prompts[str(r["id"])]}])
        if len(ids) != r["prompt_tokens"]:
            sys.exit(f"{r['id']}: the prompt has {len(ids)} tokens here, {r['prompt_tokens']} in the report")
        answers.append(Answer(str(r["id"]), ids, r["tokens"]))
    feats = collect_features(target, answers, (-1,), batch_size=4, progress=lambda *_: None)

    _, head = resolve_target_head(a)
    index = history_index(a, target)
    drafter, info = build_drafter(target, head, history=index)
    width = WidthController(costs, report["config"].get("tree_width", 16))
    if a.ceiling:
        print(json.dumps(_ceiling(drafter, answers, feats, width.cap, index), indent=1))
        return
    # the bench's warm-up, at the full width, which the drafter's calibration sees too
    warm_ids = target.encode_chat([{"role": "user", "content": WARM_PROMPT}])
    with torch.inference_mode():
        out = target.model.generate(torch.tensor([warm_ids]), max_new_tokens=WARM_TOKENS, do_sample=False)
    warm = [Answer("warm-up", warm_ids, out[0, len(warm_ids):].tolist())]
    if a.oracle:
        _rank_target_path_first(drafter, warm + answers)
    simulate_decode(drafter, warm, collect_features(target, warm, (-1,), progress=lambda *_: None), width.cap)
    used: list[int] = []
    pick = width.next_width
    width.next_width = lambda *x, **k: used.append(pick(*x, **k)) or used[-1]
    held = _watch_calibration(drafter) if a.calibration else None
    res = simulate_decode(drafter, answers, feats, max_nodes=width.cap, width=width, history=index)
    drafted = res["tokens"] - len(answers)          # the first token of each answer comes from the prefill
    print(json.dumps({"drafter": info["drafter"], "head": Path(head).parent.name if head else "shipped",
                      "report_tokens_per_pass": report["methods"][a.method]["tokens_per_pass"],
                      "replay_tokens_per_pass": res["tokens_per_pass"], "oracle_ranking": a.oracle,
                      "tokens_per_verify_cost": drafted / (sum(costs[w] for w in used) / costs[1]),
                      "mean_width": res["mean_width"], "banked_by_source": dict(getattr(drafter, "banked", {})),
                      "accepted_histogram": res["hist"],
                      **({"calibration": _calibration_table(held)} if held is not None else {})}, indent=1))


def _depths(depth: int) -> str:
    return "1" if depth == 1 else "2-5" if depth <= 5 else "6-10" if depth <= 10 else "11+"


def _watch_calibration(drafter) -> dict:
    """Count, per (source, key kind[, match], depth bucket), the verified nodes, the accepted ones and their values."""
    held: dict = {}
    calibrate = drafter.calibrate

    def watched(tree, path):
        origin = calibrate(tree, path)
        accepted = set(path)
        for i, o in enumerate(origin):
            if o is None:
                continue
            kind = o.key if isinstance(o.key, tuple) else (o.key,)
            key = (drafter.names[o.source],) + tuple(str(k) for k in kind[:2] if k != "phrase") + (_depths(o.depth),)
            c = held.setdefault(key, [0, 0, 0.0])
            c[0], c[1], c[2] = c[0] + 1, c[1] + (i in accepted), c[2] + o.value
        return origin

    drafter.calibrate = watched
    return held


def _calibration_table(held: dict, least: int = 30) -> list[dict]:
    rows = [{"node": " ".join(k), "verified": n, "accepted": round(a / n, 3), "value": round(v / n, 3),
             "ratio": round(a / v, 2) if v else None} for k, (n, a, v) in held.items() if n >= least]
    return sorted(rows, key=lambda r: -r["verified"])


def _ceiling(drafter, answers, feats, cap: int, index) -> dict:
    """Tokens per pass if every pass banked the longest run of the answer that a source's candidates hold."""
    from assistant.runtime.decode import DraftContext
    from assistant.runtime.prefix import common_prefix

    where = {(q, p): k for k, (q, p) in enumerate(zip(feats.seq.tolist(), feats.pos.tolist()))}
    runs = []                                        # per answer, per position: {source: longest run}
    for ai, x in enumerate(answers):
        ref, held = x.answer_ids, []
        for i in range(len(ref) - 1):
            ctx = DraftContext(ids=x.prompt_ids + ref[: i + 1], root=ref[i], features=feats.feats[where[(ai, i)]][None],
                               max_nodes=cap)
            want, got = ref[i + 1: i + cap], {}
            for name, d in zip(drafter.names, drafter.drafters):
                got[name] = max((common_prefix(cand, want) for cand in d.propose(ctx)), default=0)
            held.append(got)
        runs.append(held)
        if index is not None:
            index.add(ref)

    def tokens_per_pass(names) -> float:
        passes = tokens = 0
        for held, x in zip(runs, answers):
            n, i = len(x.answer_ids), 0
            passes, tokens = passes + 1, tokens + n              # the prefill gives the first token
            while i < n - 1:
                i += 1 + max(held[i][s] for s in names)
                passes += 1
        return tokens / max(passes, 1)

    out = {"all sources": tokens_per_pass(drafter.names)}
    for name in drafter.names:
        out[f"without {name}"] = tokens_per_pass([s for s in drafter.names if s != name])
    return out


def _rank_target_path_first(drafter, answers) -> None:
    """Make `drafter.propose` put the nodes on the reference path (those any source proposed) first."""
    refs = [(tuple(x.prompt_ids), x.answer_ids) for x in answers]
    propose = drafter.propose

    def oracle(ctx):
        paths = propose(ctx)
        cont = next(ref[len(ctx.ids) - len(p):] for p, ref in refs if tuple(ctx.ids[:len(p)]) == p)
        nodes = {tuple(c[:k]) for d in drafter.drafters for c in d.propose(ctx) for k in range(1, len(c) + 1)}
        true: list[list[int]] = []
        while len(true) < len(cont) and tuple(cont[:len(true) + 1]) in nodes:
            true.append(list(cont[:len(true) + 1]))
        return true + [p for p in paths if p not in true]

    drafter.propose = oracle


if __name__ == "__main__":
    main()
