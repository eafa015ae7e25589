"""assistant.runtime.kernels: the native bf16 linear equals a fp32 product rounded once (the fp32 one a float64
product), packs and unpacks exactly, serves the packed layout (eager and compiled), and steps aside with a reason
where it cannot run; the AVX2 build (fp32 alone) equals the AVX512 build bit for bit."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from assistant.runtime import budget, cpuinfo, kernels
from assistant.runtime.layout import _NATIVE, _PACKED, layout_of, native_keys, set_layout

from ..conftest import block_weight, tiny_qwen3

native = pytest.mark.skipif(not (kernels.load() and kernels.bf16()),
                            reason=f"native bf16 kernel unavailable: {kernels.problem() or kernels.running()}")
native_fp32 = pytest.mark.skipif(not kernels.load(), reason=f"native kernels unavailable: {kernels.problem()}")


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().T).to(torch.bfloat16)


@native
@pytest.mark.parametrize("n,k", [(16, 2), (48, 64), (960, 576), (64, 1536)])
@pytest.mark.parametrize("m", [0, 1, 3, 4, 5, 8, 9, 16, 17, 40])
def test_linear_matches_a_product_rounded_once(n, k, m):
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    w = (torch.randn(n, k, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    y = torch.ops.assistant_kernels.linear_packed(x, torch.ops.assistant_kernels.pack(w), n)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    # fp32 accumulation in another order: at most one bf16 step from the exactly rounded product
    torch.testing.assert_close(y.float(), _reference(x, w).float(), rtol=2 ** -7, atol=1e-3)


@native_fp32
@pytest.mark.parametrize("n,k", [(16, 3), (48, 64), (960, 576), (64, 1536)])
@pytest.mark.parametrize("m", [0, 1, 3, 4, 5, 8, 9, 16, 17, 40])
def test_fp32_linear_matches_a_float64_product(n, k, m):
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    w = torch.randn(n, k, generator=g) * 0.1
    x = torch.randn(m, k, generator=g)
    wp = torch.ops.assistant_kernels.pack(w)
    assert wp.dtype == torch.float32 and torch.equal(torch.ops.assistant_kernels.unpack(wp), w)
    y = torch.ops.assistant_kernels.linear_packed(x, wp, n)
    assert y.shape == (m, n) and y.dtype == torch.float32
    # fp32 sums in another order than the float64 one: a few ulps of the row's magnitude
    torch.testing.assert_close(y.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-5 * k ** 0.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", [(64, 576), (48, 66)])
def test_each_row_of_a_product_is_what_that_row_alone_gives(n, k, dtype):
    """Row invariance (what makes a verify pass give every node exactly what a one-token pass gives it): the
    rows of an m-row product equal, bit for bit, the products of each row alone, at every row count, in the
    vector loops and (the amx build, K % 32 == 0) the AMX tiles."""
    if not kernels.load() or (dtype == torch.bfloat16 and not kernels.bf16()):
        pytest.skip(f"no native {dtype} linear here: {kernels.problem() or kernels.running()}")
    g = torch.Generator().manual_seed(n + k)
    w = (torch.randn(n, k, generator=g) * 0.1).to(dtype)
    x = torch.randn(40, k, generator=g).to(dtype)
    wp = torch.ops.assistant_kernels.pack(w)
    alone = torch.cat([torch.ops.assistant_kernels.linear_packed(x[i:i + 1], wp, n) for i in range(40)])
    for m in (2, 3, 4, 8, 9, 16, 17, 40):
        assert torch.equal(torch.ops.assistant_kernels.linear_packed(x[:m], wp, n), alone[:m]), m


@native
def test_leading_dims_and_strided_input():
    w = (torch.randn(32, 64) * 0.1).to(torch.bfloat16)
    x = torch.randn(2, 3, 128).to(torch.bfloat16)[..., ::2]             # not contiguous
    y = torch.ops.assistant_kernels.linear_packed(x, torch.ops.assistant_kernels.pack(w), 32)
    assert y.shape == (2, 3, 32)
    torch.testing.assert_close(y.float(), _reference(x, w).float(), rtol=2 ** -7, atol=1e-3)


@native
def test_pack_round_trip_is_exact_and_bad_shapes_are_refused():
    w = torch.randn(48, 6).to(torch.bfloat16)
    assert torch.equal(torch.ops.assistant_kernels.unpack(torch.ops.assistant_kernels.pack(w)), w)
    assert not kernels.usable(torch.randn(40, 6).to(torch.bfloat16))      # 40 rows: not whole 16-column blocks
    assert not kernels.usable(torch.randn(48, 5).to(torch.bfloat16))      # odd inputs
    assert kernels.usable(torch.randn(48, 5)) and not kernels.usable(torch.randn(40, 6))   # fp32: any K
    assert not kernels.usable(torch.randn(48, 6).half())                  # fp16: oneDNN's
    with pytest.raises(RuntimeError, match="a packed weight of its dtype"):
        torch.ops.assistant_kernels.linear_packed(torch.randn(1, 6), torch.ops.assistant_kernels.pack(w), 48)
    with pytest.raises(RuntimeError, match="no weight registered"):
        torch.ops.assistant_kernels.linear(torch.randn(1, 6).to(torch.bfloat16), -12345, 48)


def _attention_reference(q, k, v, mask, scale):
    g = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    p = torch.softmax(q.double() @ kk.transpose(2, 3) * scale + mask.double(), -1)
    return (p @ vv).transpose(1, 2)


def _attention_dtypes() -> list:
    """bf16 and fp32, each skipped where the loaded build has no attention in it (kernels.attention)."""
    return [pytest.param(dt, marks=pytest.mark.skipif(not (kernels.load() and kernels.attention(dt)),
                                                      reason=f"no native {dt} attention in this build: "
                                                             f"{kernels.problem() or kernels.running()}"))
            for dt in (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("dtype", _attention_dtypes())
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
@pytest.mark.parametrize("q_len,n", [(1, 1), (2, 17), (5, 200), (16, 40), (100, 130)])
def test_attention_matches_softmax_attention(heads, kv_heads, d, q_len, n, dtype):
    g = torch.Generator().manual_seed(heads * 100 + q_len * 10 + n)
    q = torch.randn(1, q_len, heads, d, generator=g).to(dtype).transpose(1, 2)    # the model's strides
    k = torch.randn(1, kv_heads, n + 7, d, generator=g).to(dtype)[:, :, :n]      # a window of a cache
    v = torch.randn(1, kv_heads, n + 7, d, generator=g).to(dtype)[:, :, :n]
    allowed = torch.rand(q_len, n, generator=g) < 0.7
    allowed[:, 0] = True
    mask = torch.zeros(q_len, n, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    out = torch.ops.assistant_kernels.attention(q, k, v, mask[None, None], d ** -0.5)
    assert out.shape == (1, q_len, heads, d) and out.dtype == dtype
    ref = _attention_reference(q, k, v, mask[None, None], d ** -0.5)
    tol = dict(rtol=2 ** -7, atol=2e-3) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref, **tol)


@pytest.mark.parametrize("dtype", _attention_dtypes())
@pytest.mark.parametrize("prefix", [0, 5, 16, 37, 250])
def test_a_tree_node_attends_bit_for_bit_as_a_one_token_pass_would(prefix, dtype):
    """Row invariance: a node whose ancestors sit at scattered slots of a tree gets exactly the output of the
    one-token pass that later sees the same keys at consecutive slots (the softmax sums by rank, not slot).
    A sum grouped otherwise moves the output by an fp32 ulp, which bf16 rounding shows only rarely: hence many
    trees (summed by slot, 2-6 of these 24 trees had a node differ in bf16)."""
    g = torch.Generator().manual_seed(prefix)
    heads, kv_heads, d, nodes = 16, 2, 128, 16
    low = torch.finfo(dtype).min
    differ = []
    for trial in range(24):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, nodes)]   # parents first
        n = prefix + nodes
        k = torch.randn(1, kv_heads, n, d, generator=g).to(dtype)
        v = torch.randn(1, kv_heads, n, d, generator=g).to(dtype)
        q = (torch.randn(1, heads, nodes, d, generator=g) * 2).to(dtype)
        allowed = torch.zeros(nodes, n, dtype=torch.bool)
        allowed[:, :prefix] = True
        for i in range(nodes):
            j = i
            while j >= 0:
                allowed[i, prefix + j], j = True, parent[j]
        mask = torch.zeros(nodes, n, dtype=dtype).masked_fill_(~allowed, low)[None, None]
        tree = torch.ops.assistant_kernels.attention(q, k, v, mask, d ** -0.5)
        for i in range(nodes):
            seen = allowed[i].nonzero().flatten()       # the prefix, then the ancestors root first, the node last
            pad = torch.randn(1, kv_heads, 1, d, generator=g).to(dtype)   # a 2-node pass's padding node
            one_mask = torch.zeros(1, len(seen) + 1, dtype=dtype)
            one_mask[0, -1] = low
            one = torch.ops.assistant_kernels.attention(q[:, :, i:i + 1], torch.cat([k[:, :, seen], pad], 2),
                                                        torch.cat([v[:, :, seen], pad], 2), one_mask[None, None],
                                                        d ** -0.5)
            if not torch.equal(one[:, 0], tree[:, i]):
                differ.append((trial, i))
    assert differ == []


@native
def test_eager_forward_takes_the_native_attention_for_an_additive_mask_only(monkeypatch):
    """The engines' additive 4D masks (a prefill chunk here) run the native attention outside a compiled graph
    too; a forward without one (generate()'s own masks) keeps sdpa."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from assistant.runtime.compiled import register_window_attention

    torch.manual_seed(3)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, initializer_range=0.2)     # head_dim % 32 == 0: native
    model = Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16)
    register_window_attention(model)
    op, calls = torch.ops.assistant_kernels.attention, []
    monkeypatch.setattr(torch.ops.assistant_kernels, "attention", lambda *a: calls.append(a[0].shape) or op(*a))
    ids = torch.tensor([[5, 7, 9, 11, 13, 15, 17]])
    n = ids.shape[1]
    causal = torch.full((n, n), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16).triu(1)[None, None]
    with torch.no_grad():
        ref = model(ids).logits.float()
        assert calls == []
        out = model(ids, attention_mask=causal).logits.float()
    assert len(calls) == cfg.num_hidden_layers and calls[0][2] == n
    torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05)


def _bf16_tiny():
    t = tiny_qwen3(seed=8)
    t.model.to(torch.bfloat16)
    return t


@native
def test_packed_bf16_model_runs_native_and_unpacks_exactly():
    t = _bf16_tiny()
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    x = torch.tensor([[5, 7, 9, 11, 13]])
    with torch.no_grad():
        ref = t.model(x).logits.float()
        set_layout(t.model, "packed")
        assert layout_of(t.model) == "packed"
        keys = native_keys(t.model)
        assert len(keys) == len(t.model.model.layers) * 4 + 1       # qkv, o, gate_up, down; lm_head
        out = t.model(x).logits.float()
        torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05)   # bf16 rounding, other summation order
        set_layout(t.model, "out")
    assert not set(keys) & _NATIVE
    for n, p in t.model.named_parameters():
        assert torch.equal(p, before[n]), n


@native
@pytest.mark.slow
def test_compiled_graph_calls_the_native_kernel():
    """The compiled forward reads the weights through the registry (no Python kernel): a key dropped from it
    makes the graph fail; put back, it answers again."""
    from assistant.runtime.engine import CompiledEngine, make_engine
    from assistant.runtime.layout import _PACKED
    from assistant.runtime.tree import build_tree

    t = _bf16_tiny()
    engine = make_engine(t, "compiled")
    assert isinstance(engine, CompiledEngine) and engine.check_error is not None
    key = native_keys(t.model)[0]
    cache = engine.new_cache(64)
    ids = list(range(10, 30))
    engine.prefill(cache, ids, ())
    tree = build_tree(ids[-1], [[3, 4, 5]])
    want, _ = engine.verify(cache, tree, len(ids))
    torch.ops.assistant_kernels.drop(key)
    try:
        with pytest.raises(RuntimeError, match="no weight registered"):
            engine.verify(cache, tree, len(ids))
    finally:
        torch.ops.assistant_kernels.put(key, _PACKED[key])
    assert engine.verify(cache, tree, len(ids))[0] == want


def test_unavailable_kernel_says_why_and_oneDNN_packs(monkeypatch, tmp_path):
    """A failed build (here: a compiler that fails) is one line in problem() and the packed layout falls back
    to oneDNN; ASSISTANT_KERNELS=0 turns the kernel off."""
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")
    if "avx512_bf16" in cpuinfo.flags():
        assert not kernels.load()
        assert "build failed" in kernels.problem() and "\n" not in kernels.problem()
        assert not list(tmp_path.rglob("*.so"))
        t = _bf16_tiny()
        from assistant.runtime.layout import packing_supported

        if packing_supported(t.model):
            set_layout(t.model, "packed")
            assert layout_of(t.model) == "packed" and native_keys(t.model) == []
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("ASSISTANT_KERNELS", "0")
    assert not kernels.load() and "ASSISTANT_KERNELS=0" in kernels.problem()


def test_first_load_builds_into_the_user_cache_and_says_so(monkeypatch, tmp_path):
    """A fresh cache: load() builds with progress (once), then finds the build (no progress). The library is not
    loaded a second time into this process (its op namespace is registered already): load_library is recorded."""
    if not "avx512_bf16" in cpuinfo.flags():
        pytest.skip("this CPU has no AVX512-BF16")
    loaded: list[str] = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    for first in (True, False):
        monkeypatch.setattr(kernels, "_state", {})
        notes: list[str] = []
        assert kernels.load(lambda stage, fraction: notes.append(stage)), kernels.problem()
        assert any("building" in n for n in notes) == first
    built = list((tmp_path / "kernels").glob("cpu-*.so"))
    assert len(built) == 1 and loaded == [str(built[0])] * 2 and built[0] == kernels.library_path()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the kernels need oneDNN's torch")
def test_a_compiler_without_amx_builds_the_avx512bf16_kernels_instead(monkeypatch, tmp_path):
    """On a CPU with AMX the amx build comes first; where it fails (a compiler too old for -mamx-*), load() builds
    avx512bf16 and says nothing went wrong; asked for by name (ASSISTANT_KERNELS=amx), it does not fall back."""
    xeon = frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16"})
    loaded: list[str] = []
    tried: list[str] = []

    def build(out: Path, target: str) -> None:
        tried.append(target)
        if target == "amx":
            raise RuntimeError("the C++ build failed: unrecognized command-line option '-mamx-tile'")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"")

    monkeypatch.setattr(cpuinfo, "flags", lambda: xeon)
    monkeypatch.setattr(kernels, "_build", build)
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    monkeypatch.setenv("ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.delenv("ASSISTANT_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "_state", {})
    assert kernels.isa() == "amx"
    assert kernels.load() and kernels.problem() is None
    assert tried == ["amx", "avx512bf16"] and kernels.running() == "avx512bf16" and kernels.bf16()
    assert loaded == [str(kernels.library_path("avx512bf16"))]
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("ASSISTANT_KERNELS", "amx")
    assert not kernels.load() and "-mamx-tile" in kernels.problem() and kernels.running() is None


_SHAPES = [(16, 3, m) for m in (1, 7)] + [(960, 576, m) for m in (0, 1, 4, 5, 6, 7, 13, 16)] + [(64, 1536, 17)]

_FP32_BUILD_RUN = """
import json, sys, torch
from safetensors.torch import save_file
from assistant.runtime import kernels
from tests.conftest import block_weight, tiny_qwen3
from assistant.runtime.layout import native_keys, set_layout
assert kernels.load(), kernels.problem()
out = {"isa": kernels.running(), "bf16": kernels.bf16(),
       "usable_bf16": kernels.usable(torch.zeros(16, 4, dtype=torch.bfloat16)), "errors": []}
ys = {}
for n, k, m in json.loads(sys.argv[2]):
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    w, x = torch.randn(n, k, generator=g) * 0.1, torch.randn(m, k, generator=g)
    ys[f"{n},{k},{m}"] = torch.ops.assistant_kernels.linear_packed(x, torch.ops.assistant_kernels.pack(w), n)
    if k % 32 == 0:
        for q8 in (False, True):
            wb = torch.ops.assistant_kernels.pack_blocks(block_weight(n, k, m, q8))
            ys[f"blocks {q8} {n},{k},{m}"] = torch.ops.assistant_kernels.linear_packed(x, wb, n)
if kernels.attention(torch.float32):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, h, n, 64, generator=g) for h, n in ((6, 3), (2, 40), (2, 40)))
    mask = torch.zeros(3, 40).masked_fill_(torch.rand(3, 40, generator=g) < 0.3, torch.finfo(torch.float32).min)
    ys["attention"] = torch.ops.assistant_kernels.attention(q, k, v, mask[None, None], 0.125)
t = tiny_qwen3(seed=8)
set_layout(t.model, "packed")
out["native_keys"] = len(native_keys(t.model))
with torch.no_grad():
    ys["logits"] = t.model(torch.tensor([[5, 7, 9, 11, 13]])).logits
w = torch.zeros(16, 4, dtype=torch.bfloat16)
for call in (lambda: torch.ops.assistant_kernels.linear_packed(torch.zeros(1, 4, dtype=torch.bfloat16),
                                                               torch.ops.assistant_kernels.pack(w), 16),
             lambda: torch.ops.assistant_kernels.attention(*[torch.zeros(1, 1, 1, 32, dtype=torch.bfloat16)] * 3,
                                                          torch.zeros(1, 1, 1, 1), 1.0)):
    try:
        call()
    except RuntimeError as e:
        out["errors"].append(str(e).splitlines()[0])
save_file({k: v.contiguous() for k, v in ys.items()}, sys.argv[1])
print(json.dumps(out))
"""


@pytest.mark.parametrize("build", ["avx512", "avx2"])
def test_fp32_only_builds_equal_the_avx512bf16_build_bit_for_bit(build, tmp_path):
    """ASSISTANT_KERNELS=avx512|avx2 (in a process of its own: one build a process) builds the fp32-only kernels
    a CPU without AVX512-BF16 takes. Their linear sums in the same order with the same FMAs, so on an AVX512-BF16
    CPU its products (of fp32 weights and of weights in block form) and a packed model's logits equal that build's
    bit for bit (and a float64 product's to
    rounding); they refuse bf16 (the weights stay oneDNN's) with a one-line error. Their fp32 attention equals the
    AVX512-BF16 build's too (AVX512F: the same code; AVX2: the same arithmetic on 8-lane vectors)."""
    if not cpuinfo.KERNEL_BUILDS[build] <= cpuinfo.flags():
        pytest.skip(f"this CPU cannot run the {build} build")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, ASSISTANT_KERNELS=build, PYTHONPATH=str(root))
    out = tmp_path / "y.safetensors"
    r = subprocess.run([sys.executable, "-c", _FP32_BUILD_RUN, str(out), json.dumps(_SHAPES)], env=env, cwd=root,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["isa"] == build and not got["bf16"] and not got["usable_bf16"]
    assert got["native_keys"] == 2 * 4 + 1                       # every fp32 linear of the tiny model
    assert len(got["errors"]) == 2 and all("(no AVX512-BF16) has no bf16 kernel" in e for e in got["errors"])
    ys = load_file(out)
    same_build = kernels.load() and kernels.running() in kernels.BF16_BUILDS     # the same fp32 code
    assert "attention" in ys
    if same_build:
        g = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(1, h, n, 64, generator=g) for h, n in ((6, 3), (2, 40), (2, 40)))
        mask = torch.zeros(3, 40).masked_fill_(torch.rand(3, 40, generator=g) < 0.3, torch.finfo(torch.float32).min)
        assert torch.equal(ys["attention"], torch.ops.assistant_kernels.attention(q, k, v, mask[None, None], 0.125))
    for n, k, m in _SHAPES:
        g = torch.Generator().manual_seed(n * 1000 + k + m)
        w, x = torch.randn(n, k, generator=g) * 0.1, torch.randn(m, k, generator=g)
        y = ys[f"{n},{k},{m}"]
        if same_build:
            assert torch.equal(y, torch.ops.assistant_kernels.linear_packed(x, torch.ops.assistant_kernels.pack(w), n))
        torch.testing.assert_close(y.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-5 * k ** 0.5)
        for q8 in (False, True) if k % 32 == 0 else ():      # the block forms: their fp32 weight's product
            wb, yb = block_weight(n, k, m, q8), ys[f"blocks {q8} {n},{k},{m}"]
            if same_build:
                fp32 = torch.ops.assistant_kernels.pack(wb)
                assert torch.equal(yb, torch.ops.assistant_kernels.linear_packed(x, fp32, n))
            torch.testing.assert_close(yb.double(), x.double() @ wb.double().T, rtol=1e-5, atol=1e-5 * k ** 0.5)
    if same_build:
        t = tiny_qwen3(seed=8)
        with torch.no_grad():
            set_layout(t.model, "packed")
            try:
                assert torch.equal(ys["logits"], t.model(torch.tensor([[5, 7, 9, 11, 13]])).logits)
            finally:
                set_layout(t.model, "out")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the packed layout needs oneDNN")
def test_each_cpu_takes_the_best_build_it_runs_or_the_one_asked_for(monkeypatch):
    laptop = frozenset({"sse4_2", "avx", "avx2", "fma"})
    server = laptop | {"avx512f", "avx512bw", "avx512vl"}
    zen4 = server | {"avx512_bf16"}
    xeon = zen4 | {"amx_tile", "amx_bf16", "amx_int8"}
    monkeypatch.delenv("ASSISTANT_KERNELS", raising=False)
    for flags, want in ((xeon, "amx"), (zen4, "avx512bf16"), (server, "avx512"), (laptop, "avx2"),
                        (frozenset({"avx"}), None)):
        monkeypatch.setattr(cpuinfo, "flags", lambda f=flags: f)
        assert kernels.isa() == want
        assert budget._block_form_here() == (want is not None)      # the budget reads the same table, torch-free
    monkeypatch.setattr(cpuinfo, "flags", lambda: zen4)
    monkeypatch.setenv("ASSISTANT_KERNELS", "avx2")
    assert kernels.isa() == "avx2"
    monkeypatch.setattr(cpuinfo, "flags", lambda: laptop)
    monkeypatch.setenv("ASSISTANT_KERNELS", "avx512")
    assert kernels.isa() is None
    monkeypatch.setattr(kernels, "_state", {})
    assert not kernels.load() and kernels.problem() == "this CPU cannot run the avx512 build"
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("ASSISTANT_KERNELS", "0")
    assert kernels.isa() is None


@native_fp32
@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("n,k", [(16, 32), (960, 576), (64, 1536)])
def test_block_form_rebuilds_each_weight_and_the_fp32_product_bit_for_bit(n, k, q8):
    from assistant.runtime.kernels import blocks

    w = block_weight(n, k, n + k, q8)
    wp = torch.ops.assistant_kernels.pack_blocks(w)
    # 0.75 bytes a weight where every q fits 4 bits (Q4_1), 1.25 where some block is Q8_0
    assert wp.dtype == torch.int8 and wp.shape == (n // 16, (20 if q8 else 12) * k)
    assert torch.equal(blocks.unpack(wp, k).view(torch.int32), w.view(torch.int32))
    fp32 = torch.ops.assistant_kernels.pack(w)
    for m in (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 17):   # rows: avx2 1, 2-6, 7-12, 13+; avx512 1-8, 9-16, 17+
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        y = torch.ops.assistant_kernels.linear_packed(x, wp, n)
        assert torch.equal(y.view(torch.int32), torch.ops.assistant_kernels.linear_packed(x, fp32, n).view(torch.int32))


@native_fp32
@pytest.mark.parametrize("n", [576, 960, 3072, 48])     # 36, 60, 192 and 3 blocks of 16 columns
def test_the_threads_split_of_a_product_never_changes_its_values(n):
    """The tasks a product is split into (GROUP or fewer blocks each, whichever evens out the threads) decide who
    computes a column, never how: every thread count gives the same values, bit for bit, in block form and fp32."""
    w = block_weight(n, 576, n + 7)
    packed = {"blocks": torch.ops.assistant_kernels.pack_blocks(w), "fp32": torch.ops.assistant_kernels.pack(w)}
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(n))
    before = torch.get_num_threads()
    try:
        for form, wp in packed.items():
            for m in (1, 2, 5):
                ys = []
                for threads in (1, 2, 3, 4):
                    torch.set_num_threads(threads)
                    ys.append(torch.ops.assistant_kernels.linear_packed(x[:m], wp, n).view(torch.int32))
                assert all(torch.equal(y, ys[0]) for y in ys[1:]), (form, m)
    finally:
        torch.set_num_threads(before)


@native_fp32
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_commit_slots_moves_what_the_tensor_ops_move(dtype):
    """The native commit equals index_select + index_copy of every layer's keys and values at the path's slots,
    then every length set, for paths that start with the tree's first nodes or skip some; a bad path is refused."""
    g = torch.Generator().manual_seed(1)
    for path in ([0], [0, 1, 2], [0, 2, 3], [0, 3, 4, 7], [0, 1, 5]):
        kv = [torch.randn(1, 3, 40, 64, generator=g).to(dtype) for _ in range(4)]
        lengths = [torch.tensor(0) for _ in range(2)]
        want = [t.clone() for t in kv]
        src, dst = 20 + torch.tensor(path), torch.arange(20, 20 + len(path))
        for t in want:
            t.index_copy_(2, dst, t.index_select(2, src))
        torch.ops.assistant_kernels.commit_slots(kv, lengths, 20, path)
        assert all(torch.equal(a, b) for a, b in zip(kv, want)), path
        assert [int(l) for l in lengths] == [20 + len(path)] * 2
    with pytest.raises(RuntimeError, match="increasing path"):
        torch.ops.assistant_kernels.commit_slots(kv, lengths, 20, [0, 2, 1])
    with pytest.raises(RuntimeError, match="past the cache"):
        torch.ops.assistant_kernels.commit_slots(kv, lengths, 35, [0, 5])


@native_fp32
def test_a_weight_without_the_block_form_stays_fp32():
    """One weight off its block's grid (or a weight that was never quantized) and no form is found: an empty
    tensor, and the packed layout packs that weight fp32."""
    w = block_weight(32, 64, 1)
    w[17, 40] = torch.nextafter(w[17, 40], torch.tensor(1.0))
    assert torch.ops.assistant_kernels.pack_blocks(w).numel() == 0
    assert torch.ops.assistant_kernels.pack_blocks(torch.randn(32, 64)).numel() == 0
    t = tiny_qwen3(seed=3)                     # random weights: fp32 packing
    set_layout(t.model, "packed")
    try:
        assert native_keys(t.model) and all(_PACKED[key].dtype == torch.float32 for key in native_keys(t.model))
    finally:
        set_layout(t.model, "out")


@native_fp32
def test_a_model_dequantized_from_blocks_runs_them_and_its_logits_stay_bit_for_bit(monkeypatch):
    """A model whose linears hold block-form weights (as the embedded default does): packed, every one runs in
    block form; its logits equal those of the same model packed fp32 (ASSISTANT_BLOCKS=0) bit for bit, and
    unpacking gives the weights back exactly."""
    t = tiny_qwen3(seed=4)
    with torch.no_grad():
        for i, lin in enumerate(mod for mod in t.model.modules() if isinstance(mod, torch.nn.Linear)):
            if lin.weight.shape[1] % 32 == 0:
                lin.weight.copy_(block_weight(*lin.weight.shape, seed=i, q8=i % 2 == 1))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    ids = torch.tensor([[5, 7, 9, 11, 13, 2, 4]])
    logits = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("ASSISTANT_BLOCKS", flag)
        set_layout(t.model, "packed")
        try:
            kinds = {_PACKED[key].dtype for key in native_keys(t.model)}      # every linear's K is 64 or 128
            assert kinds == ({torch.float32} if flag == "0" else {torch.int8})
            with torch.no_grad():
                logits[flag] = t.model(ids).logits
        finally:
            set_layout(t.model, "out")
        for n, p in t.model.named_parameters():
            assert torch.equal(p.view(torch.int32), before[n].view(torch.int32)), n
    assert torch.equal(logits["0"].view(torch.int32), logits["1"].view(torch.int32))
