"""The block form of an fp32 weight that was dequantized from blocks of 32 inputs, exactly.

Contract: `assistant_kernels::pack_blocks(w)` (cpu.cpp) takes an fp32 [N, K] weight (N % 16 == 0, K % 32 == 0)
and finds, for every block of 32 inputs of a row, int8 q and fp32 d, m with each weight equal bit for bit to
fl(fl(d * q) + m): the product rounded, then the sum, no fused multiply-add (GGUF Q4_1: m the block's least
weight, q 0..15; Q8_0: m = 0, q -127..127; d an fp16 value). It returns them packed for
`assistant_kernels::linear` (int8 [N/16, K * Q + K/32 * 128]: per 16 output columns, the K steps' q, Q = 8 bytes
a step where every q is 0..15 (two 4-bit q a byte: column i low, column i + 8 high), else Q = 16 (one int8
each), then per 32 inputs 16 d and 16 m as fp32 bytes), or an empty tensor when a block has no such form: that
weight is packed fp32 (assistant.runtime.layout). `unpack(wp, K)` here gives the fp32 weight back, bit for bit.

Why: the embedded default target comes from a GGUF (assistant.runtime.fetch) whose linears are Q4_1 and whose
tied output layer is Q8_0; converted to fp32 once, every weight keeps that form. A decode pass reads every
weight once, so the fp32 model is bound by its 540 MB of weights. In block form the kernel reads 0.75 bytes a
weight (1.25 for the Q8_0 output layer), 115 MB a pass, and rebuilds each fp32 weight in registers with the
converter's two roundings: the same values into the same fused multiply-adds in the same order, so every product
equals the fp32 kernel's bit for bit, and fp32 decoding stays equal to transformers' fp32 generate(). Finding the
form of all SmolLM2 weights takes ~0.3 s (BENCHMARKS.md, "fp32 weights in block form").
"""
from __future__ import annotations

import torch

BLOCK = 32


def unpack(wp: torch.Tensor, k: int) -> torch.Tensor:
    """The fp32 [N, k] weight of a packed block form ([N/16, 12k] int8 of 4-bit q, or [N/16, 20k] of 8-bit q)."""
    blocks, row = wp.shape
    nibbles = row == 12 * k
    q = wp[:, : k * (8 if nibbles else 16)]
    if nibbles:             # byte i of a step: column i in the low 4 bits, column i + 8 in the high 4
        b = q.reshape(blocks, k, 8).to(torch.int16) & 0xFF
        q = torch.cat([b & 0x0F, b >> 4], 2)
    q = q.reshape(blocks, k, 16).transpose(1, 2).float()                         # [N/16, 16, k]
    sc = wp[:, k * (8 if nibbles else 16):].contiguous().view(torch.float32).reshape(blocks, k // BLOCK, 2, 16)
    d = sc[:, :, 0].transpose(1, 2).repeat_interleave(BLOCK, 2)                 # [N/16, 16, k]
    m = sc[:, :, 1].transpose(1, 2).repeat_interleave(BLOCK, 2)
    return ((d * q) + m).reshape(blocks * 16, k).contiguous()                   # two roundings, as packed


__all__ = ["BLOCK", "unpack"]
