"""assistant.runtime.engine: the compiled static-cache engine decodes exactly what the eager one and generate() do.

Tiny random Qwen3 (untied, GQA 4/2), Llama (tied embeddings, GQA 4/1) and Qwen2 (biases on q/k/v, as
Qwen2.5 checkpoints have) targets, each compiled
once per module (inductor, ~20 s on 2 cores: marked slow). Trees that accept a non-first branch
check the compaction of a non-prefix path; a root-only tree is padded to two nodes; EOS inside an
accepted run, cancel, and a cache full at the budget's context stop as greedy would, never with a
wrong token.
"""
import pytest
import torch

from assistant.runtime.decode import DecodeConfig, greedy_generate, run_to_end, speculative_generate
from assistant.runtime.drafters import AdversarialDrafter, OracleDrafter, PromptLookupDrafter, UnionDrafter
from assistant.runtime.engine import CompiledEngine, EagerEngine, make_engine
from assistant.runtime.layout import layout_of
from assistant.runtime.target import Target
from assistant.runtime.tree import build_tree

from ..conftest import IdTokenizer, tiny_qwen3
from .test_decode_tiny import hf_greedy, prompts, random_phrase_drafter

pytestmark = pytest.mark.slow


def tiny_family(family: str, seed: int) -> Target:
    """A tiny random target of a transformers family: "Llama" (tied embeddings, GQA 4/1) or "Qwen2" (q/k/v biases,
    untied, GQA 4/2)."""
    import transformers

    torch.manual_seed(seed)
    tied = family == "Llama"
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1 if tied else 2, max_position_embeddings=512, tie_word_embeddings=tied,
        initializer_range=0.2, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval().requires_grad_(False)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return Target(model=model, tokenizer=IdTokenizer(), name=f"tiny-{family.lower()}", dtype="fp32",
                  device=torch.device("cpu"))


class SecondBranchOracle:
    """Proposes a wrong branch FIRST and the true continuation second, so the accepted nodes are not
    the first ones of the block: commit must move them."""

    feature_layers = (-1,)

    def __init__(self, reference, depth=5):
        self.reference, self.depth = list(reference), depth
        self.mod = max(self.reference) + 1

    def propose(self, ctx):
        n = len(ctx.ids)
        true = self.reference[n: n + self.depth]
        if not true:
            return []
        return [[(true[0] + 1) % self.mod, 7, 9], true]

    def observe(self, tree, path):
        assert path == [0] or path[1] != 1          # the first branch is never the accepted one


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2"])
def compiled(request):
    target = tiny_qwen3(seed=11) if request.param == "qwen3" else tiny_family(request.param.capitalize(), seed=5)
    notes = []
    engine = make_engine(target, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(engine, CompiledEngine), notes
    assert any("compiling" in n or "loaded the compiled" in n for n in notes)
    return target, engine


@pytest.mark.parametrize("kind", ["none", "oracle", "second-branch", "adversarial", "phrase", "union"])
def test_compiled_equals_generate(compiled, kind):
    target, engine = compiled
    n = 40
    for ids in prompts(k=3, seed=4):
        ref = hf_greedy(target, ids, n)
        make = {"none": lambda: None, "oracle": lambda: OracleDrafter(ids + ref),
                "second-branch": lambda: SecondBranchOracle(ids + ref),
                "adversarial": lambda: AdversarialDrafter(ids + ref),
                "phrase": lambda: random_phrase_drafter(target),
                "union": lambda: UnionDrafter(random_phrase_drafter(target), PromptLookupDrafter())}[kind]
        cfg = DecodeConfig(max_new_tokens=n, ignore_eos=True)
        out, stats = run_to_end(speculative_generate(target, ids, make(), cfg, engine=engine))
        eager, _ = run_to_end(speculative_generate(target, ids, make(), cfg, engine=EagerEngine(target.model)))
        assert out == ref == eager
        if kind in ("oracle", "second-branch"):
            assert stats.tokens_per_pass > 3.0
        if kind == "adversarial":
            assert stats.tokens_per_pass == pytest.approx(1.0)


def test_compiled_weights_are_packed(compiled):
    target, engine = compiled
    assert engine.layout == layout_of(target.model) == "packed"


def test_padding_nodes_are_never_accepted(compiled):
    target, engine = compiled
    ids = prompts(k=1, seed=9)[0]
    cache = engine.new_cache(len(ids) + 8)
    root, _ = engine.prefill(cache, ids, ())
    argmax, feats = engine.verify(cache, build_tree(root, []), len(ids), (-1,))
    assert len(argmax) == 1 and feats.shape == (1, 1, target.hidden_size)   # padded to 2, one node returned
    eager = EagerEngine(target.model)
    ec = eager.new_cache()
    eroot, _ = eager.prefill(ec, ids, ())
    assert eroot == root and eager.verify(ec, build_tree(root, []), len(ids))[0] == argmax


def test_non_prefix_path_is_compacted(compiled):
    """After accepting the second branch, the cache holds exactly the keys/values of prompt + path."""
    target, engine = compiled
    ids = prompts(k=1, seed=2)[0]
    cache = engine.new_cache(len(ids) + 16)
    root, _ = engine.prefill(cache, ids, ())
    tree = build_tree(root, [[11, 12, 13], [14, 15]])
    engine.verify(cache, tree, len(ids), ())
    path = [0, 4, 5]                                   # root -> 14 -> 15: nodes 4 and 5
    assert engine.commit(cache, len(ids), path) == len(ids) + 3
    eager = EagerEngine(target.model)
    ref = eager.new_cache()
    eager.prefill(ref, ids + [root, 14], ())
    with torch.inference_mode():
        target.model(input_ids=torch.tensor([[15]]), cache=ref, position_ids=torch.tensor([[len(ids) + 2]]),
                     use_cache=True)
    k = len(ids) + 3
    for got, want in zip(cache.layers, ref.layers):
        torch.testing.assert_close(got.keys[:, :, :k], want.keys[:, :, :k])
        torch.testing.assert_close(got.values[:, :, :k], want.values[:, :, :k])


def test_eos_inside_an_accepted_run(compiled):
    target, engine = compiled
    ids = prompts(k=1, seed=3)[0]
    long = hf_greedy(target, ids, 30)
    eos = long[7]                                      # a token the oracle's run will contain
    ref = hf_greedy(target, ids, 30, eos=eos)
    steps = list(speculative_generate(target, ids, OracleDrafter(ids + long, depth=12),
                                      DecodeConfig(max_new_tokens=30, eos_token_ids=(eos,)), engine=engine))
    assert [t for s in steps for t in s.tokens] == ref
    assert steps[-1].finish == "eos"


def test_cancel_between_passes(compiled):
    target, engine = compiled
    ids = prompts(k=1)[0]
    calls = []
    steps = list(greedy_generate(target, ids, DecodeConfig(max_new_tokens=30, ignore_eos=True),
                                 cancel=lambda: calls.append(1) or len(calls) > 3, engine=engine))
    # polled once before the prompt's one prefill chunk, then between passes: 3 polls say go on
    assert steps[-1].finish == "cancelled" and sum(len(s.tokens) for s in steps) == 3


def test_cache_full_stops_gracefully(compiled):
    """A static cache sized for a 24-token context: the answer stops at the context with "length",
    every token it gave equal to greedy's."""
    target, _ = compiled
    small = CompiledEngine(target.model, max_len=24)
    small._fns = compiled[1]._fns                      # the same compiled graph: no second compile
    ids = prompts(k=1, seed=6)[0][:10]
    ref = hf_greedy(target, ids, 40)
    steps = list(speculative_generate(target, ids, OracleDrafter(ids + ref), DecodeConfig(max_new_tokens=40,
                                                                                           ignore_eos=True),
                                      engine=small))
    out = [t for s in steps for t in s.tokens]
    assert steps[-1].finish == "length"
    assert out == ref[:len(out)] and len(ids) + len(out) - 1 == 24
    with pytest.raises(Exception, match="context holds 24"):
        list(greedy_generate(target, list(range(3, 30)), DecodeConfig(max_new_tokens=4), engine=small))


def test_kept_cache_is_resumed_grown_and_in_place(compiled):
    """A second turn on the static cache: its prompt needs more room than the first answer's cache has
    (the cache grows, the kept prefix copied over), then a shorter prompt reuses it as it is; each
    equals generate() on the whole conversation."""
    from assistant.runtime.prefix import KeptCache

    target, engine = compiled
    kept = KeptCache()
    first = prompts(k=1, seed=7)[0]
    cfg = DecodeConfig(max_new_tokens=20, ignore_eos=True)
    a1 = [t for s in speculative_generate(target, first, random_phrase_drafter(target), cfg, engine=engine, kept=kept)
          for t in s.tokens]
    cache = kept.slot[1]
    small = cache.layers[0].keys.shape[2]
    follow = first + a1 + [9, 8, 7]
    steps = list(speculative_generate(target, follow, random_phrase_drafter(target), cfg, engine=engine, kept=kept))
    assert steps[0].tree_size == 4 and kept.slot[1] is cache and cache.layers[0].keys.shape[2] > small
    assert [t for s in steps for t in s.tokens] == hf_greedy(target, follow, 20)
    grown = cache.layers[0].keys.shape[2]
    edited = follow[:len(first) + 3] + [5, 6]
    steps = list(speculative_generate(target, edited, random_phrase_drafter(target), cfg, engine=engine, kept=kept))
    assert steps[0].tree_size == 2 and cache.layers[0].keys.shape[2] == grown
    assert [t for s in steps for t in s.tokens] == hf_greedy(target, edited, 20)
    other = [(first[0] + 1) % 256 or 3] + first[1:]          # shares nothing: the same cache from slot 0
    steps = list(speculative_generate(target, other, random_phrase_drafter(target), cfg, engine=engine, kept=kept))
    assert steps[0].tree_size == len(other) and kept.slot[1] is cache
    assert [t for s in steps for t in s.tokens] == hf_greedy(target, other, 20)


def test_unknown_engine_is_refused(tiny_target):
    with pytest.raises(ValueError, match="choose eager, compiled"):
        make_engine(tiny_target, "turbo")


def test_compile_failure_falls_back_to_eager_with_one_line(monkeypatch):
    target = tiny_qwen3(seed=12)

    def broken(self):
        raise RuntimeError("inductor: no C++ compiler\nmore detail")

    monkeypatch.setattr(CompiledEngine, "warm_up", broken)
    notes = []
    engine = make_engine(target, "compiled", progress=lambda s, f: notes.append(s))
    assert isinstance(engine, EagerEngine)
    assert notes == ["compiled engine unavailable (RuntimeError: inductor: no C++ compiler); using the eager engine"]
