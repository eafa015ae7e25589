"""Fixtures for adapt/: a tiny random Llama target with the REAL SmolLM2 tokenizer."""
from __future__ import annotations

import pytest
import torch

from assistant.runtime.target import Target


@pytest.fixture(scope="session")
def tiny_llama(smol_tokenizer) -> Target:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                      tie_word_embeddings=True, eos_token_id=2, bos_token_id=1, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 2
    return Target(model=model, tokenizer=smol_tokenizer, name="tiny-llama", dtype="fp32", device=torch.device("cpu"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_llama, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama.model.save_pretrained(d)
    tiny_llama.tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def table(smol_tokenizer):
    from assistant.runtime.vocab import TokenTable

    return TokenTable.from_tokenizer(smol_tokenizer)
