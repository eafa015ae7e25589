"""assistant.runtime.layout: re-strided linear weights keep values, tying and decode output."""
import pytest
import torch

from assistant.runtime.decode import DecodeConfig, run_to_end, speculative_generate
from assistant.runtime.drafters import OracleDrafter
from assistant.runtime.layout import layout_of, set_layout

from ..conftest import tiny_qwen3
from .test_decode_tiny import hf_greedy, prompts, random_phrase_drafter


def test_round_trip_keeps_values_and_identity():
    t = tiny_qwen3(seed=3)
    params = {n: p for n, p in t.model.named_parameters()}
    before = {n: p.detach().clone() for n, p in params.items()}
    linears = [m for m in t.model.modules() if isinstance(m, torch.nn.Linear)]
    assert layout_of(t.model) == "out"
    assert set_layout(t.model, "in") == len(linears)
    assert layout_of(t.model) == "in"
    for m in linears:
        assert m.weight.stride() == (1, m.weight.shape[0])
    assert set_layout(t.model, "in") == 0
    assert {n: p for n, p in t.model.named_parameters()} == params
    for n, p in t.model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert set_layout(t.model, "out") == len(linears)
    assert all(m.weight.is_contiguous() for m in linears)


def test_tied_embedding_stays_tied():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    assert model.lm_head.weight is model.get_input_embeddings().weight
    x = torch.tensor([[5, 7, 9, 11]])
    with torch.no_grad():
        ref = model(x).logits
        set_layout(model, "in")
        out = model(x).logits
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert model.lm_head.weight.stride() == (1, 96)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_unknown_layout():
    with pytest.raises(ValueError, match="unknown weight layout"):
        set_layout(tiny_qwen3().model, "diagonal")


@pytest.mark.parametrize("kind", ["oracle", "phrase"])
def test_in_layout_decode_equals_generate_as_loaded(kind):
    t = tiny_qwen3(seed=4)
    refs = [(ids, hf_greedy(t, ids, 40)) for ids in prompts(k=4, seed=7)]
    set_layout(t.model, "in")
    for ids, ref in refs:
        drafter = OracleDrafter(ids + ref) if kind == "oracle" else random_phrase_drafter(t)
        out, _ = run_to_end(speculative_generate(t, ids, drafter, DecodeConfig(max_new_tokens=40, max_nodes=12,
                                                                               ignore_eos=True)))
        assert out == ref


def test_packed_after_in_leaves_the_tied_embedding_out():
    """A compiled graph bakes in the strides of what it reads: "packed" must mean one set of strides for the
    tied embedding whatever layout came before (the cost model measures "in" before "packed")."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from assistant.runtime.layout import packing_supported

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    if not packing_supported(model):
        pytest.skip("no oneDNN on this build")
    x = torch.tensor([[5, 7, 9, 11]])
    with torch.no_grad():
        ref = model(x).logits
        set_layout(model, "in")
        set_layout(model, "packed")
        out = model(x).logits
    emb = model.get_input_embeddings().weight
    assert model.lm_head.weight is emb and emb.is_contiguous()
    assert layout_of(model) == "packed"
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _packed_tiny():
    from assistant.runtime.layout import packing_supported

    t = tiny_qwen3(seed=6)
    if not packing_supported(t.model):
        pytest.skip("no oneDNN on this build")
    return t


def test_siblings_share_one_packed_gemm_and_round_trip():
    """q/k/v and gate/up of a layer are one packed weight; each linear reads its own columns of the product,
    and unpacking gives every weight back exactly."""
    from assistant.runtime.layout import _PACKED, packed_columns

    t = _packed_tiny()
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    x = torch.tensor([[5, 7, 9, 11, 13]])
    with torch.no_grad():
        ref = t.model(x).logits
        n_linears = sum(isinstance(m, torch.nn.Linear) for m in t.model.modules())
        keys_before = set(_PACKED)
        assert set_layout(t.model, "packed") == n_linears
        layers = len(t.model.model.layers)
        assert len(set(_PACKED) - keys_before) == layers * 4 + 1     # qkv, o, gate_up, down; lm_head
        attn, mlp = t.model.model.layers[0].self_attn, t.model.model.layers[0].mlp
        cols = dict(zip([id(m) for m in t.model.modules() if isinstance(m, torch.nn.Linear)], packed_columns(t.model)))
        q, k, v = (cols[id(m)] for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        assert q[0] == k[0] == v[0] and (q[1], k[1], v[1]) == (0, q[2], q[2] + k[2])
        assert cols[id(mlp.gate_proj)][0] == cols[id(mlp.up_proj)][0] != cols[id(mlp.down_proj)][0]
        out = t.model(x).logits
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        set_layout(t.model, "out")
    for n, p in t.model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_a_sibling_never_reuses_a_product_of_other_input():
    """The eager path shares the group's GEMM only between calls on the same, unchanged input."""
    t = _packed_tiny()
    attn = t.model.model.layers[0].self_attn
    w = {n: getattr(attn, n).weight.detach().clone() for n in ("q_proj", "k_proj", "v_proj")}
    set_layout(t.model, "packed")
    x, other = torch.randn(1, 3, w["q_proj"].shape[1]), torch.randn(1, 3, w["q_proj"].shape[1])
    with torch.no_grad():
        torch.testing.assert_close(attn.q_proj(x), x @ w["q_proj"].T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(attn.k_proj(other), other @ w["k_proj"].T, rtol=1e-5, atol=1e-5)
        attn.q_proj(x)
        x.mul_(2)                                  # changed in place after q: k must not reuse q's product
        torch.testing.assert_close(attn.k_proj(x), x @ w["k_proj"].T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(attn.v_proj(x), x @ w["v_proj"].T, rtol=1e-5, atol=1e-5)


def test_dedup_pass_merges_calls_of_one_input_and_key():
    from assistant.runtime.layout import DedupPackedLinear

    op = torch.ops.assistant.packed_linear.default
    g = torch.fx.Graph()
    x, z = g.placeholder("x"), g.placeholder("z")
    calls = [g.call_function(op, (x, 3, 8)), g.call_function(op, (x, 3, 8)), g.call_function(op, (z, 3, 8)),
             g.call_function(op, (x, 4, 8))]
    g.output(tuple(calls))
    DedupPackedLinear()(g)
    left = [n for n in g.nodes if n.target is op]
    assert [n.args[1:] for n in left] == [(3, 8), (3, 8), (4, 8)]
    assert list(g.nodes)[-1].args[0][1] is calls[0]
    assert repr(DedupPackedLinear()) == "DedupPackedLinear" and DedupPackedLinear().uuid()
