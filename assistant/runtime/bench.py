"""Side-by-side decoding benchmark: hf, pld, greedy and our drafters on the same prompts.

Contract: `run_bench(target, prompts, config, drafters)` runs every method on
every prompt (methods interleaved per prompt, so drifting machine load hits all
of them alike, after one untimed warm-up) and returns the JSON-ready report of
DESIGN.md: `methods.<name>.{tokens_per_pass, tokens_per_second, speedup_vs_hf,
exact_match_vs_hf, ...}` and `per_prompt[]` rows `{id, method, new_tokens,
forward_passes, seconds, tokens}`. Where greedy runs too, each drafted method's
`same_as_greedy` is the share of its answers equal token for token to our own greedy loop's on the same
engine: 1.0 in fp32 and in bf16 alike where every verify pass is row-invariant (a node gets bit for bit
what a one-token pass would give it: assistant.runtime.kernels), whatever generate()'s kernels round. `drafters` maps each of our speculative methods (DRAFTED:
phrase = the default drafter, head = the phrase head alone, lookup = the in-context lookup alone) to
its drafter; each keeps one width controller for the run, as a chat session does, and a drafter
that counts `banked` tokens per source (assistant.runtime.drafters.UnionDrafter) reports
`banked_by_source`. `history` (the AnswerIndex of the user's past answers that the phrase drafter looks
up) takes each answer once it ends, as a chat session's index does (assistant.session), so a run
over a user's next questions banks from the earlier of them as that user would. Forward passes of generate() are counted by a
hook on the target model; our loops count their own passes (a compiled forward runs
no module hooks), the prefill as one pass either way. When hf runs, each other method's
first divergence from it is recorded with the reference's top-1 minus top-2
logit margin at that index (how tie-breaking is told from a bug). `config.verify_costs` is the
width controller's verify cost table relative to one token (`relative_costs`).
"""
from __future__ import annotations

import platform
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from assistant.runtime import cpuinfo
from assistant.runtime.layout import set_layout
from assistant.runtime.width import DEFAULT_WIDTH, WidthController
from assistant.runtime.prefix import common_prefix
from assistant.runtime.decode import PHASES, DecodeConfig, DecodeStats, greedy_generate, run_to_end, speculative_generate

METHODS = ("hf", "pld", "greedy", "phrase")
DRAFTED = ("phrase", "head", "lookup")    # our speculative methods: the drafter of each is given to run_bench
LLAMACPP = {"llamacpp": "BF16", "llamacpp_q4": "Q4_1"}    # method -> GGUF of the same weights (assistant.runtime.llamacpp)
WARM_PROMPT, WARM_TOKENS = "Hi", 4    # every method first answers this, untimed (a drafter's calibration sees it)


@dataclass(frozen=True)
class BenchConfig:
    max_new_tokens: int = 128
    methods: tuple[str, ...] = METHODS
    tree_width: int = DEFAULT_WIDTH
    pld_tokens: int = 10
    ignore_eos: bool = False
    layout: str = "out"            # assistant.runtime.layout of the weights for greedy and phrase (hf, pld: as loaded)
    width_costs: tuple[tuple[int, float], ...] = ()   # (w, seconds): phrase picks its width online (assistant.runtime.width)
    engine: str = "eager"          # assistant.runtime.engine that greedy and phrase run on (hf, pld: transformers' eager generate)


class PassCounter:
    """Counts target forward calls through a forward hook."""

    def __init__(self, model):
        self.n = 0
        self._h = model.register_forward_hook(lambda *a: self._tick())

    def _tick(self) -> None:
        self.n += 1

    def close(self) -> None:
        self._h.remove()


def _hf(target, ids: list[int], cfg: BenchConfig, pld: bool) -> tuple[list[int], list[float]]:
    model = target.model
    x = torch.tensor([ids], device=target.device)
    kw: dict[str, Any] = dict(do_sample=False, max_new_tokens=cfg.max_new_tokens,
                              attention_mask=torch.ones_like(x), pad_token_id=target.tokenizer.pad_token_id
                              or next(iter(target.eos_token_ids), 0))
    if cfg.ignore_eos:
        kw["eos_token_id"] = None
    if pld:
        kw["prompt_lookup_num_tokens"] = cfg.pld_tokens
        out = model.generate(x, **kw)
        return out[0, len(ids):].tolist(), []
    out = model.generate(x, output_logits=True, return_dict_in_generate=True, **kw)
    margins = []
    for logit in out.logits:
        top2 = logit[0].float().topk(2).values
        margins.append(float(top2[0] - top2[1]))
    return out.sequences[0, len(ids):].tolist(), margins


def _run_one(method: str, target, ids: list[int], cfg: BenchConfig, drafter,
             width: WidthController | None = None, engine=None) -> tuple[list[int], list[float], DecodeStats]:
    dcfg = DecodeConfig(max_new_tokens=cfg.max_new_tokens, max_nodes=cfg.tree_width, ignore_eos=cfg.ignore_eos)
    if method in ("hf", "pld"):
        toks, margins = _hf(target, ids, cfg, pld=(method == "pld"))
        return toks, margins, DecodeStats()
    if method == "greedy":
        toks, stats = run_to_end(greedy_generate(target, ids, dcfg, engine=engine))
    elif method in DRAFTED:
        toks, stats = run_to_end(speculative_generate(target, ids, drafter, dcfg, width=width, engine=engine))
    else:
        raise ValueError(f"unknown method {method!r}: choose from {', '.join(METHODS + DRAFTED[1:] + tuple(LLAMACPP))}")
    return toks, [], stats


def _llamacpp(build, method: str, target, ids: list[int], cfg: BenchConfig) -> tuple[list[int], float, int]:
    """(tokens, seconds of prompt + decode as llama.cpp times them, forward passes) of llama.cpp's plain
    greedy decode of the same prompt tokens; its text is tokenized back with the target's tokenizer."""
    text, seconds, passes, ended = build.generate(LLAMACPP[method], ids, target.tokenizer, cfg.max_new_tokens,
                                                  ignore_eos=cfg.ignore_eos)
    toks = list(target.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
    if ended and target.tokenizer.eos_token_id is not None:   # the EOS token itself, as generate() returns it
        toks.append(int(target.tokenizer.eos_token_id))
    return toks[:cfg.max_new_tokens], seconds, passes


def _layout_for(method: str, cfg: BenchConfig) -> str:
    """hf and pld run on the weights as loaded; our loops on the configured layout."""
    return "out" if method in ("hf", "pld") else cfg.layout


def first_divergence(ref: Sequence[int], out: Sequence[int]) -> int | None:
    """The index of the first token where `out` differs from `ref` (None: the same tokens)."""
    n = common_prefix(ref, out)
    return None if n == len(ref) == len(out) else n


def run_bench(target, prompts: list[dict], cfg: BenchConfig, drafters: dict[str, Any] | None = None,
              progress: Callable[[str], None] | None = None, engine=None, llamacpp=None,
              history=None) -> dict[str, Any]:
    """Benchmark `cfg.methods` on `prompts` ([{id, prompt}]); see the module docstring. greedy and
    the drafted methods run on `engine` (assistant.runtime.engine; None: eager); the llamacpp methods on `llamacpp`
    (assistant.runtime.llamacpp.Build; methods without a build are dropped by the caller)."""
    counter = PassCounter(target.model)
    rows: list[dict[str, Any]] = []
    hist: dict[str, Counter] = {m: Counter() for m in cfg.methods}
    phases: dict[str, Counter] = {m: Counter() for m in cfg.methods}
    divergences: list[dict[str, Any]] = []
    drafters = drafters or {}
    # one controller per method for the whole run, as one chat session keeps one (it learns from the answers so far)
    widths = {m: WidthController(dict(cfg.width_costs), cfg.tree_width) for m in drafters} if cfg.width_costs else {}
    build = None
    try:
        warm = target.encode_chat([{"role": "user", "content": WARM_PROMPT}])
        warm_cfg = BenchConfig(max_new_tokens=WARM_TOKENS, methods=cfg.methods, tree_width=cfg.tree_width,
                               layout=cfg.layout)
        for m in cfg.methods:
            if m in LLAMACPP:
                _llamacpp(llamacpp, m, target, warm, warm_cfg)
                continue
            set_layout(target.model, _layout_for(m, cfg))
            if m not in ("hf", "pld"):            # the build (and block form) greedy and phrase run on
                build = native_build(target)
            _run_one(m, target, warm, warm_cfg, drafters.get(m), engine=engine)
        banked0 = {m: Counter(getattr(d, "banked", {})) for m, d in drafters.items()}
        for pi, p in enumerate(prompts):
            ids = target.encode_chat([{"role": "user", "content": p["prompt"]}])
            ref, margins = None, []
            for m in cfg.methods:
                if m in LLAMACPP:
                    toks, dt, passes = _llamacpp(llamacpp, m, target, ids, cfg)
                    rows.append({"id": p["id"], "method": m, "new_tokens": len(toks), "forward_passes": passes,
                                 "seconds": dt, "tokens": toks, "prompt_tokens": len(ids), "tree_sizes": {}})
                    if progress:
                        progress(f"prompt {pi + 1}/{len(prompts)} {m}: {len(toks)} tokens, {len(toks) / dt:.1f} tok/s")
                    continue
                set_layout(target.model, _layout_for(m, cfg))
                counter.n = 0
                t0 = time.perf_counter()
                toks, mg, stats = _run_one(m, target, ids, cfg, drafters.get(m), widths.get(m), engine=engine)
                dt = time.perf_counter() - t0
                hist[m].update(stats.accepted_hist)
                phases[m].update(stats.phases)
                if m == "hf":
                    ref, margins = toks, mg
                passes = counter.n if m in ("hf", "pld") else stats.passes
                rows.append({"id": p["id"], "method": m, "new_tokens": len(toks), "forward_passes": passes,
                             "seconds": dt, "tokens": toks, "prompt_tokens": len(ids),
                             "tree_sizes": dict(sorted(stats.tree_sizes.items()))})
                if progress:
                    progress(f"prompt {pi + 1}/{len(prompts)} {m}: {len(toks)} tokens, "
                             f"{len(toks) / max(passes, 1):.2f}/pass, {len(toks) / dt:.1f} tok/s")
            answer = next((r["tokens"] for r in rows[-len(cfg.methods):] if r["method"] == "phrase"), None)
            if history is not None and answer:
                history.add(answer)
            mine = rows[-len(cfg.methods):]
            plain = next((r["tokens"] for r in mine if r["method"] == "greedy"), None)
            for r in mine if plain is not None else ():
                if r["method"] in DRAFTED:
                    r["same_as_greedy"] = r["tokens"] == plain
            if ref is not None:
                for r in mine:
                    if r["method"] == "hf":
                        continue
                    d = first_divergence(ref, r["tokens"])
                    r["exact_match_vs_hf"] = d is None
                    if d is not None:
                        divergences.append({"id": p["id"], "method": r["method"], "index": d,
                                            "ref_margin": margins[d] if d < len(margins) else None})
    finally:
        counter.close()
        set_layout(target.model, "out")
    report = summarize(rows, hist, divergences, target, cfg, phases, build)
    for m, d in drafters.items():
        if m not in report["methods"]:
            continue
        if m in widths:
            report["methods"][m]["width_estimates"] = widths[m].summary()
        if hasattr(d, "banked"):
            report["methods"][m]["banked_by_source"] = dict(Counter(d.banked) - banked0[m])
    return report


def summarize(rows: list[dict], hist: dict[str, Counter], divergences: list[dict], target, cfg: BenchConfig,
              phases: dict[str, Counter] | None = None, build: str | None = None) -> dict:
    methods: dict[str, Any] = {}
    for m in cfg.methods:
        mine = [r for r in rows if r["method"] == m]
        tokens = sum(r["new_tokens"] for r in mine)
        passes = sum(r["forward_passes"] for r in mine)
        secs = sum(r["seconds"] for r in mine)
        methods[m] = {"prompts": len(mine), "new_tokens": tokens, "forward_passes": passes, "seconds": secs,
                      "tokens_per_pass": tokens / max(passes, 1), "tokens_per_second": tokens / max(secs, 1e-9)}
        if hist[m]:
            methods[m]["accepted_histogram"] = {str(k): v for k, v in sorted(hist[m].items())}
        if phases and phases[m]:
            # where the time goes: ms per decode pass of each stage (the prefill pass of each prompt apart)
            decode_passes = max(passes - len(mine), 1)
            methods[m]["ms_per_pass"] = {k: 1000 * v / decode_passes for k, v in phases[m].items() if k != "prefill"}
            methods[m]["prefill_ms_per_prompt"] = 1000 * phases[m]["prefill"] / max(len(mine), 1)
    for m, s in methods.items():
        flags = [r["same_as_greedy"] for r in rows if r["method"] == m and "same_as_greedy" in r]
        if flags:
            s["same_as_greedy"] = sum(flags) / len(flags)
    if "hf" in methods:
        base = methods["hf"]["tokens_per_second"]
        for m, s in methods.items():
            s["speedup_vs_hf"] = s["tokens_per_second"] / base
            if m == "hf":
                s["exact_match_vs_hf"] = 1.0
            else:
                flags = [r.get("exact_match_vs_hf", False) for r in rows if r["method"] == m]
                s["exact_match_vs_hf"] = sum(flags) / max(len(flags), 1)
    return {
        "target": target.name, "dtype": target.dtype, "device": str(target.device),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": {"max_new_tokens": cfg.max_new_tokens, "tree_width": cfg.tree_width, "methods": list(cfg.methods),
                   "layout": cfg.layout, "engine": cfg.engine, "verify_costs": relative_costs(cfg.width_costs)},
        "cpu_flags": cpu_flags(), "kernels": build or native_build(target),
        "methods": methods, "divergences": divergences, "per_prompt": rows,
    }


def relative_costs(width_costs: Sequence[tuple[int, float]]) -> dict[str, float]:
    """{width: verify seconds / those of width 1} of the online width choice ({} at a fixed width): the
    table that decided every pass's width, so two runs can be checked to have used the same one and a
    replay (scripts/replay_bench.py) can use it again. Tokens per pass depend on it: a table measured
    while other processes were busy is used for that run only, and differs from run to run."""
    costs = dict(width_costs)
    if not costs:
        return {}
    base = costs.get(1) or costs[min(costs)]
    return {str(w): round(s / base, 4) for w, s in sorted(costs.items())}


def cpu_flags() -> str:
    """The /proc/cpuinfo flags that decide CPU speed here: the native kernels' builds, native bf16 and AMX
    (or "n/a")."""
    flags = cpuinfo.flags()
    if not flags:
        return "n/a"
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return " ".join(f for f in wanted if f in flags) or "none of " + ",".join(wanted)


def native_build(target) -> str:
    """Which build of the native kernels ran greedy and phrase (assistant.runtime.kernels): "amx", "avx512bf16",
    "avx512", "avx2" (with how many of the target's packed weights ran in block form, if any), or "none (why)"
    on a CPU where oneDNN ran them; "n/a" off the CPU."""
    from assistant.runtime import kernels
    from assistant.runtime.layout import block_keys, native_keys

    if target.device.type != "cpu":
        return "n/a"
    if not kernels.running():
        return f"none ({kernels.problem() or 'not loaded'})"
    held = len(block_keys(target.model))
    return kernels.running() + (f", {held} of {len(native_keys(target.model))} weights in block form" if held else "")


def format_table(report: dict) -> str:
    kernels = f"; kernels {report['kernels']}" if "kernels" in report else ""
    lines = [f"{report['target']} {report['dtype']} on {report['device']} ({report['machine']}; "
             f"engine {report.get('config', {}).get('engine', 'eager')}{kernels}; "
             f"cpu flags: {report.get('cpu_flags', 'n/a')})",
             f"{'method':8} {'tok/pass':>9} {'tok/s':>8} {'vs hf':>7} {'exact':>7} {'=greedy':>8}"]
    for m, s in report["methods"].items():
        # without hf in the run there is nothing to compare with: "-", not "nanx"
        vs = f"{s['speedup_vs_hf']:6.2f}x" if "speedup_vs_hf" in s else f"{'-':>7}"
        ex = f"{s['exact_match_vs_hf']:7.2f}" if "exact_match_vs_hf" in s else f"{'-':>7}"
        same = f"{s['same_as_greedy']:8.2f}" if "same_as_greedy" in s else f"{'-':>8}"
        lines.append(f"{m:8} {s['tokens_per_pass']:9.2f} {s['tokens_per_second']:8.2f} {vs} {ex} {same}")
    for m, s in report["methods"].items():
        banked = s.get("banked_by_source") or {}
        total = sum(banked.values())
        if total:
            lines.append(f"drafted tokens of {m} by source: "
                         + ", ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in sorted(banked.items())))
    split = {m: s["ms_per_pass"] for m, s in report["methods"].items() if s.get("ms_per_pass")}
    if split:
        stages = tuple(p for p in PHASES if p != "prefill") + ("other",)
        lines.append("ms per decode pass: " + f"{'method':8} " + " ".join(f"{k:>8}" for k in stages))
        for m, ms in split.items():
            lines.append(" " * 20 + f"{m:8} " + " ".join(f"{ms.get(k, 0.0):8.2f}" for k in stages))
    return "\n".join(lines)
