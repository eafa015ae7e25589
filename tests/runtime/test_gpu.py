"""On a CUDA device (skipped without one): the decode loop stays exact in fp32, and the production int8
load path (bitsandbytes) verifies trees. `scripts/gpu_bench.sh table` runs these on the device machine."""
import pytest
import torch

from assistant.runtime.decode import DecodeConfig, greedy_generate, run_to_end, speculative_generate
from assistant.runtime.drafters import OracleDrafter, PromptLookupDrafter, UnionDrafter
from assistant.runtime.target import Target, load_model
from tests.conftest import IdTokenizer, tiny_qwen3
from tests.runtime.test_decode_tiny import prompts, random_phrase_drafter

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _generate(model, ids, n):
    x = torch.tensor([ids], device=CUDA)
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_cuda_fp32_tree_verify_matches_generate():
    cpu = tiny_qwen3()
    target = Target(model=cpu.model.to(CUDA), tokenizer=cpu.tokenizer, name="tiny-qwen3", dtype="fp32", device=CUDA)
    n = 40
    for ids in prompts():
        ref = _generate(target.model, ids, n)
        for drafter in (OracleDrafter(ids + ref), UnionDrafter(random_phrase_drafter(target), PromptLookupDrafter())):
            out, stats = run_to_end(speculative_generate(target, ids, drafter,
                                                         DecodeConfig(max_new_tokens=n, ignore_eos=True)))
            assert out == ref
            assert stats.new_tokens == n


def test_int8_load_path_verifies_trees(tmp_path):
    tiny_qwen3().model.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), "int8", CUDA)
    import bitsandbytes as bnb
    assert any(isinstance(m, bnb.nn.Linear8bitLt) for m in model.modules())
    target = Target(model=model, tokenizer=IdTokenizer(), name="tiny-qwen3-int8", dtype="int8", device=CUDA)
    ids = prompts()[0]
    cfg = DecodeConfig(max_new_tokens=32, ignore_eos=True)
    ref, _ = run_to_end(greedy_generate(target, ids, cfg))
    out, stats = run_to_end(speculative_generate(target, ids, OracleDrafter(ids + ref), cfg))
    assert len(out) == 32
    # int8 rounds a w-token pass differently from a 1-token one, so equality is measured, not assumed:
    # the oracle's tree is only accepted where the two agree, and the first token always is.
    assert out[0] == ref[0] and stats.tokens_per_pass > 1.0


def test_cuda_compiled_engine_matches_generate_fp32():
    """The compiled static-cache engine on CUDA (CUDA graphs through inductor, node buckets and 256-slot
    windows) decodes what generate() does in fp32."""
    from assistant.runtime.engine import CompiledEngine, make_engine

    cpu = tiny_qwen3()
    target = Target(model=cpu.model.to(CUDA), tokenizer=cpu.tokenizer, name="tiny-qwen3", dtype="fp32", device=CUDA)
    notes = []
    engine = make_engine(target, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(engine, CompiledEngine), notes
    n = 40
    for ids in prompts():
        ref = _generate(target.model, ids, n)
        for drafter in (None, OracleDrafter(ids + ref)):
            out, _ = run_to_end(speculative_generate(target, ids, drafter, DecodeConfig(max_new_tokens=n, ignore_eos=True),
                                                     engine=engine))
            assert out == ref
