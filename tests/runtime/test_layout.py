"""runtime.layout: re-strided linear weights keep values, tying and decode output."""
import pytest
import torch

from runtime.decode import DecodeConfig, run_to_end, speculative_generate
from runtime.drafters import OracleDrafter
from runtime.layout import layout_of, set_layout

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

    from runtime.layout import packing_supported

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
