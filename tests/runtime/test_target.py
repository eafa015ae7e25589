"""assistant.runtime.target.load_model: the model half of load_target, on a saved tiny Qwen3 (no tokenizer)."""
import pytest
import torch

from assistant.runtime.fetch import ModelFetchError
from assistant.runtime.target import load_model
from tests.conftest import tiny_qwen3

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-qwen3")
    tiny_qwen3().model.save_pretrained(d)
    return str(d)


@pytest.mark.parametrize("dtype, torch_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_loads_frozen_in_eval_mode(checkpoint, dtype, torch_dtype):
    m = load_model(checkpoint, dtype, CPU)
    assert m.dtype == torch_dtype and not m.training
    assert not any(p.requires_grad for p in m.parameters())
    ref = tiny_qwen3().model
    assert torch.equal(m.lm_head.weight.float(), ref.lm_head.weight.to(torch_dtype).float())


def test_refusals_are_one_line(checkpoint, tmp_path):
    with pytest.raises(ModelFetchError, match="int8 .* needs a CUDA device"):
        load_model(checkpoint, "int8", CPU)
    with pytest.raises(ModelFetchError, match="unknown dtype 'fp8'"):
        load_model(checkpoint, "fp8", CPU)
    with pytest.raises(ModelFetchError, match="cannot load model") as e:
        load_model(str(tmp_path / "empty"), "fp32", CPU)
    assert "\n" not in str(e.value)


def test_load_target_refuses_int8_on_the_cpu_before_any_tokenizer_io(checkpoint):
    from assistant.runtime.target import load_target

    with pytest.raises(ModelFetchError, match="int8 .* needs a CUDA device"):
        load_target(checkpoint, "int8", "cpu")      # the checkpoint has no tokenizer: that error would come later
