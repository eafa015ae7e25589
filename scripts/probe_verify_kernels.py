"""Why a tree verify of w>=4 nodes costs so much more than one of 1-3 on this CPU.

Times one verify forward of w nodes (SmolLM2-135M-Instruct fp32, 128-token KV cache, median of 7,
variants interleaved) with the model's nn.Linear layers run three ways:
  dense   torch's F.linear (MKL sgemm, weight [out, in])
  T       x @ W.T stored contiguous ([in, out]): no per-call repacking, same memory
  mkl     weights packed once with MKL's sgemm pack API for exactly w rows (what inductor's CPU
          freezing does; the packed copy costs ~1 GB RSS more for this 135M model)
usage: python scripts/probe_verify_kernels.py [WIDTHS]     (e.g. 1,2,3,4,8,16,32; run it alone)
"""
from __future__ import annotations

import sys
import time

import torch

from assistant.runtime.decode import prefill, verify
from assistant.runtime.target import load_target
from assistant.runtime.tree import build_tree


class _Variant(torch.nn.Module):
    def __init__(self, lin: torch.nn.Linear, kind: str, rows: int):
        super().__init__()
        self.kind, self.rows, self.bias = kind, rows, lin.bias
        self.w = lin.weight.detach().contiguous()
        if kind == "T":
            self.wt = self.w.t().contiguous()
        elif kind == "mkl":
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(self.w, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "T":
            y = x @ self.wt
            return y + self.bias if self.bias is not None else y
        return torch.ops.mkl._mkl_linear(x, self.packed, self.w, self.bias, self.rows)


def main(widths: list[int]) -> None:
    t = load_target("default", "fp32", progress=lambda *a: None)
    model = t.model
    sites = [(p, n, c) for p in model.modules() for n, c in p.named_children() if isinstance(c, torch.nn.Linear)]
    ids = list(range(300, 428))

    def one(w: int) -> float:
        cache, root, _ = prefill(model, ids, ())
        tree = build_tree(root, [list(range(200, 200 + w - 1))])
        t0 = time.perf_counter()
        verify(model, cache, tree, len(ids), hidden=False)
        return time.perf_counter() - t0

    print(f"{'w':>3} {'dense':>8} {'T':>8} {'mkl':>8}   (ms per verify forward; x = over dense w=1)")
    base = None
    with torch.inference_mode():
        for w in widths:
            mods = {"dense": [c for _, _, c in sites],
                    "T": [_Variant(c, "T", w) for _, _, c in sites],
                    "mkl": [_Variant(c, "mkl", w) for _, _, c in sites]}
            samples: dict[str, list[float]] = {k: [] for k in mods}
            for _ in range(7):
                for k, ms in mods.items():
                    for (p, n, _), m in zip(sites, ms):
                        setattr(p, n, m)
                    samples[k].append(one(w))
            for (p, n, c) in sites:
                setattr(p, n, c)
            med = {k: sorted(v)[3] * 1e3 for k, v in samples.items()}
            base = base or med["dense"]
            print(f"{w:>3} " + " ".join(f"{med[k]:6.0f}ms" for k in mods) + "   "
                  + " ".join(f"x{med[k] / base:.2f}" for k in mods), flush=True)


if __name__ == "__main__":
    main([int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,2,3,4,8,16,32").split(",")])
