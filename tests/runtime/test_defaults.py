"""assistant.runtime.defaults: the drafter a target gets, and the dtype its head drafts in."""
from __future__ import annotations

import pytest
import torch

from assistant.runtime.decode import DraftContext
from assistant.runtime.defaults import build_drafter, head_dtype, shipped_head
from assistant.runtime.target import Target

SMOL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def wide_llama():
    """A one-layer random Llama as wide as SmolLM2 (576 features, its vocabulary), so the shipped head reads it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


def phrase_head(drafter):
    return next(d for d in drafter.drafters if getattr(d, "name", None) == "phrase").head


def test_a_head_drafts_in_bf16_beside_a_bf16_target_and_proposes_the_same(wide_llama):
    assert shipped_head(SMOL) is not None
    fp32 = Target(model=wide_llama, tokenizer=None, name=SMOL, dtype="fp32", device=torch.device("cpu"))
    bf16 = Target(model=wide_llama, tokenizer=None, name=SMOL, dtype="bf16", device=torch.device("cpu"))
    assert head_dtype(fp32) == torch.float32 and head_dtype(bf16) == torch.bfloat16
    d32, _ = build_drafter(fp32)
    d16, _ = build_drafter(bf16)
    h32, h16 = phrase_head(d32), phrase_head(d16)
    assert {p.dtype for p in h32.parameters()} == {torch.float32}
    assert {p.dtype for p in h16.parameters()} == {torch.bfloat16}
    # the head reads bf16 features and returns fp32 logits; its ranking of the rows barely moves
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(8, 576, generator=g)
    emb = wide_llama.get_input_embeddings()(torch.arange(100, 108))
    with torch.inference_mode():
        l32 = h32(feats, emb)
        l16 = h16(feats.bfloat16(), emb.bfloat16())
    assert l16.dtype == torch.float32 and l16.shape == l32.shape
    top = l32.topk(6).indices
    agree = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(top, l16.topk(6).indices)) / top.numel()
    assert agree >= 0.8
    # and the whole drafter proposes from bf16 features
    ctx = DraftContext(ids=[100, 101, 102], root=102, features=feats[:1].bfloat16(), max_nodes=16)
    with torch.inference_mode():
        paths = d16.propose(ctx)
    assert paths and all(len(p) >= 1 for p in paths) and len(d16.node_values) == len(paths)


def test_a_cpu_head_is_packed_with_keys_apart_from_the_targets(wide_llama):
    """The runtime's head reads packed weights (no reorder inside oneDNN at every call) under keys of its own
    range, so the keys the target's packing takes next, which a compiled graph bakes in, do not move."""
    from assistant.runtime import layout
    from assistant.runtime.head import load_artifact

    fp32 = Target(model=wide_llama, tokenizer=None, name=SMOL, dtype="fp32", device=torch.device("cpu"))
    if not layout.packing_supported(wide_llama):
        pytest.skip("no oneDNN packing here")
    before = layout._next_key
    head = phrase_head(build_drafter(fp32)[0])
    assert layout._next_key == before
    assert layout.layout_of(head) == "packed" and min(layout.packed_keys(head)) >= 1 << 40
    dense = load_artifact(shipped_head(SMOL)).head.float()
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(3, 576, generator=g)
    emb = wide_llama.get_input_embeddings()(torch.arange(200, 203))
    with torch.inference_mode():
        torch.testing.assert_close(head(feats, emb), dense(feats, emb), rtol=1e-4, atol=1e-4)
