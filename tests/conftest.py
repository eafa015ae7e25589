"""Shared fixtures: a tiny random Qwen3 target (unit tests) and the real SmolLM2 (integration)."""
from __future__ import annotations

import pytest
import torch

from assistant.runtime.target import Target


class IdTokenizer:
    """A stand-in tokenizer for tiny random models: token i decodes to "<i>"."""

    eos_token_id = 2
    pad_token_id = 0
    all_special_ids = [0, 1, 2]
    chat_template = None

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"<{int(i)}>" for i in ids if not (skip_special_tokens and int(i) in self.all_special_ids))

    def __call__(self, text: str):
        return {"input_ids": [3 + (ord(c) % 200) for c in text]}


def tiny_qwen3(vocab: int = 256, seed: int = 0) -> Target:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=False, initializer_range=0.2, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).eval().requires_grad_(False)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return Target(model=model, tokenizer=IdTokenizer(), name="tiny-qwen3", dtype="fp32", device=torch.device("cpu"))


def block_weight(n: int, k: int, seed: int, q8: bool = True) -> torch.Tensor:
    """An fp32 [n, k] weight dequantized from blocks of 32 inputs as transformers converts a GGUF: Q4_1 rows
    (w = d * q + m, q 0..15, the least and greatest q in every block), with `q8` every other row Q8_0 instead
    (w = d * q, q -127..127)."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float().repeat_interleave(32, 1)
    m = (-torch.rand(n, k // 32, generator=g) * 0.1).half().float().repeat_interleave(32, 1)
    q4 = torch.randint(0, 16, (n, k), generator=g).float()
    q4[:, 0::32], q4[:, 1::32] = 0, 15
    q8s = torch.randint(-127, 128, (n, k), generator=g).float()
    q8s[:, 0::32] = 127
    q4_rows = ((torch.arange(n) % 2 == 0) | (not q8))[:, None]
    return torch.where(q4_rows, (d * q4) + m, d * q8s)        # the product rounded, then the sum


@pytest.fixture(scope="session")
def tiny_target() -> Target:
    return tiny_qwen3()


@pytest.fixture(scope="session")
def smol_fp32() -> Target:
    from assistant.runtime.target import load_target

    return load_target("default", "fp32")


@pytest.fixture(scope="session")
def smol_tokenizer():
    from transformers import AutoTokenizer

    from assistant.runtime.fetch import ensure_default_model

    return AutoTokenizer.from_pretrained(ensure_default_model())


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu run only where torch sees a CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A session on engine "auto" builds a missing compiled engine in a background process; tests compile in the
# foreground instead, so which engine answers does not depend on timing (tests of the background build
# turn it back on).
import os as _os  # noqa: E402

_os.environ.setdefault("ASSISTANT_BACKGROUND_COMPILE", "0")
