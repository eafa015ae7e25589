"""t(w)/t(1) of one tree-verify forward on a randomly initialised Qwen3-4B-shaped model (a GPU check).

Builds Qwen3ForCausalLM from the public Qwen3-4B shapes with random weights (the weights cannot be
fetched here and do not change the cost), saves it once, loads it back through assistant.runtime.target's
load_model in each dtype (bf16; int8 = bitsandbytes LLM.int8, the production load path), and times
assistant.runtime.costmodel.verify_costs: one verify forward of w tree nodes on a KV cache of --prefix tokens,
median of --repeats, after a warm-up. Prints a markdown table and writes the numbers as JSON.

usage: python scripts/verify_cost_table.py [--dtypes bf16,int8] [--engines eager,compiled]
                                           [--widths 1,2,...,64] [--prefix 128] [--repeats 7] [--json OUT] [--smoke]
--engines: assistant.runtime.engine engines to time (compiled: the static-cache engine, CUDA graphs on a GPU; a
compiled engine that cannot be built falls back to eager and the column says so).
--smoke runs a 2-layer model of the same head layout on the CPU (fp32, bf16): it checks the script,
it measures nothing worth keeping. Without a GPU and without --smoke it refuses.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from assistant.runtime.costmodel import verify_costs
from assistant.runtime.target import load_model

QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
SMOKE = dict(QWEN3_4B, vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64)
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def build_checkpoint(shape: dict, out: Path, dev: torch.device) -> int:
    """Save a random Qwen3 of `shape` (bf16) to `out`; returns its parameter count."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with dev:
            model = Qwen3ForCausalLM(Qwen3Config(**shape))
    finally:
        torch.set_default_dtype(default)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    del model
    return n


def time_dtype(ckpt: Path, dtype: str, dev: torch.device, widths: tuple[int, ...], prefix: int,
               repeats: int, engine_kind: str = "eager") -> dict:
    from assistant.runtime.engine import make_engine

    t0 = time.perf_counter()
    model = load_model(str(ckpt), dtype, dev)
    load_s = time.perf_counter() - t0
    target = SimpleNamespace(model=model)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    engine = make_engine(target, engine_kind, max_len=prefix + max(widths) + 8,
                         progress=lambda s, f: print(f"{dtype}/{engine_kind}: {s}", file=sys.stderr))
    compile_s = time.perf_counter() - t0
    verify_costs(target, (1, max(widths)), prefix=prefix, repeats=2, engine=engine)   # warm-up: kernels, allocator
    costs = verify_costs(target, widths, prefix=prefix, repeats=repeats, engine=engine)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    del model, target
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"seconds": {str(w): s for w, s in costs.items()}, "load_s": load_s, "peak_gib": peak,
            "engine": engine.name, "engine_s": compile_s}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def table(results: dict[str, dict], widths: tuple[int, ...]) -> str:
    dtypes = list(results)
    lines = ["| w | " + " | ".join(f"{d} t(w)/t(1)" for d in dtypes) + " |",
             "|---|" + "---|" * len(dtypes)]
    for w in widths:
        cells = [f"{r['seconds'][str(w)] / r['seconds']['1']:.2f}" for r in results.values()]
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    lines.append("| t(1) | " + " | ".join(f"{r['seconds']['1'] * 1e3:.1f} ms" for r in results.values()) + " |")
    if all(r["peak_gib"] is not None for r in results.values()):
        lines.append("| peak memory | " + " | ".join(f"{r['peak_gib']:.2f} GiB" for r in results.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default=None, help="comma list (default: bf16,int8 on a GPU; fp32,bf16 with --smoke)")
    ap.add_argument("--engines", default="eager", help="comma list of eager,compiled (assistant.runtime.engine)")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--prefix", type=int, default=128, help="KV-cache tokens under the tree")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write the measurements here")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU: checks the script only")
    args = ap.parse_args(argv)
    widths = tuple(sorted({1, *(int(w) for w in args.widths.split(","))}))
    if args.smoke:
        dev, shape, dtypes = torch.device("cpu"), SMOKE, (args.dtypes or "fp32,bf16").split(",")
    elif torch.cuda.is_available():
        dev, shape, dtypes = torch.device("cuda"), QWEN3_4B, (args.dtypes or "bf16,int8").split(",")
    else:
        print("verify_cost_table: no CUDA device here (use --smoke to check the script on the CPU)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="qwen3-shaped-") as tmp:
        t0 = time.perf_counter()
        n = build_checkpoint(shape, Path(tmp), dev)
        print(f"random Qwen3 ({_count(n)} parameters) saved in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        results = {}
        engines = args.engines.split(",")
        for dtype in dtypes:
            for kind in engines:
                r = time_dtype(Path(tmp), dtype, dev, widths, args.prefix, args.repeats, kind)
                key = dtype if engines == ["eager"] else f"{dtype} {kind}" + ("" if r["engine"] == kind else
                                                                             f" (fell back to {r['engine']})")
                results[key] = r
                print(f"{key}: loaded in {r['load_s']:.0f} s, engine ready in {r['engine_s']:.0f} s, t(1) "
                      f"{r['seconds']['1'] * 1e3:.1f} ms", file=sys.stderr)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"Qwen3 shape {'smoke' if args.smoke else '4B'}, {_count(n)} parameters, {device}, "
          f"KV cache {args.prefix}, median of {args.repeats}, torch {torch.__version__}\n")
    print(table(results, widths))
    if args.json:
        args.json.write_text(json.dumps({"device": device, "parameters": n, "prefix": args.prefix,
                                         "repeats": args.repeats, "torch": torch.__version__,
                                         "shape": shape, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
