"""Integration: phrase speculation on the real SmolLM2-135M-Instruct equals generate(do_sample=False) in fp32.

Twenty varied prompts x 64 new tokens (decoding forced past EOS, as transformers'
own assisted-decoding test does), with three drafters: an oracle that proposes the
true continuation (must bank well over one token per pass), an adversarial one
whose every proposal is wrong, and the phrase head (untrained) + prompt lookup.
"""
import pytest
import torch

from assistant.runtime.decode import DecodeConfig, run_to_end, speculative_generate
from assistant.runtime.drafters import AdversarialDrafter, OracleDrafter, PhraseDrafter, PromptLookupDrafter, UnionDrafter
from assistant.runtime.head import HeadConfig, PhraseHead
from assistant.runtime.vocab import DraftVocab, TokenTable

from .prompts import PROMPTS

pytestmark = pytest.mark.slow
N = 64


def untrained_phrase_drafter(target):
    table = TokenTable.from_tokenizer(target.tokenizer)
    vocab = DraftVocab()
    for text in [" the", " of the", " is", " =", " + ", " * ", " def", "(self", " return", " in the",
                 " United States", " you", " can", "\n\n", ". The", " to", " and", ",", " a", " it"]:
        vocab.add(table.expand(text), text)
    torch.manual_seed(0)
    head = PhraseHead(HeadConfig(hidden_size=target.hidden_size), vocab.capacity)
    return UnionDrafter(PhraseDrafter(head, vocab, target.model.get_input_embeddings(), top_k=6), PromptLookupDrafter())


@pytest.fixture(scope="module")
def references(smol_fp32):
    refs = []
    for p in PROMPTS:
        ids = smol_fp32.encode_chat([{"role": "user", "content": p}])
        x = torch.tensor([ids])
        out = smol_fp32.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                       max_new_tokens=N, eos_token_id=None, pad_token_id=0)
        refs.append((ids, out[0, len(ids):].tolist()))
    return refs


def test_twenty_prompts(references):
    assert len(references) >= 20
    assert len({tuple(r) for _, r in references}) == len(references)


@pytest.mark.parametrize("kind", ["oracle", "adversarial", "phrase"])
def test_equals_generate_fp32(smol_fp32, references, kind):
    passes = tokens = 0
    for ids, ref in references:
        drafter = {"oracle": lambda: OracleDrafter(ids + ref),
                   "adversarial": lambda: AdversarialDrafter(ids + ref, width=3, depth=2),
                   "phrase": lambda: untrained_phrase_drafter(smol_fp32)}[kind]()
        out, stats = run_to_end(speculative_generate(smol_fp32, ids, drafter,
                                                     DecodeConfig(max_new_tokens=N, ignore_eos=True)))
        assert out == ref, f"diverged at {next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)}"
        passes += stats.passes
        tokens += stats.new_tokens
    if kind == "oracle":
        assert tokens / passes > 4.0
    if kind == "adversarial":
        assert tokens / passes == pytest.approx(1.0)


def test_natural_eos_inside_oracle_run(smol_fp32):
    ids = smol_fp32.encode_chat([{"role": "user", "content": "Reply with just the word yes."}])
    x = torch.tensor([ids])
    long = smol_fp32.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=24,
                                    eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    ref = smol_fp32.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=24,
                                   pad_token_id=0)[0, len(ids):].tolist()
    assert ref[-1] in smol_fp32.eos_token_ids and len(ref) < len(long)
    steps = list(speculative_generate(smol_fp32, ids, OracleDrafter(ids + long, depth=12),
                                      DecodeConfig(max_new_tokens=24)))
    assert [t for s in steps for t in s.tokens] == ref
    assert steps[-1].finish == "eos" and steps[-1].truncated > 0


@pytest.mark.parametrize("kind", ["oracle", "phrase"])
def test_in_major_weights_equal_generate_as_loaded(smol_fp32, references, kind):
    """The runtime may re-stride the weights (assistant.runtime.layout, picked by the cost model on CPUs): the
    references above come from generate() on the weights as loaded, the decode runs on [in, out] ones."""
    from assistant.runtime.layout import set_layout

    set_layout(smol_fp32.model, "in")
    try:
        for ids, ref in references:
            drafter = OracleDrafter(ids + ref) if kind == "oracle" else untrained_phrase_drafter(smol_fp32)
            out, _ = run_to_end(speculative_generate(smol_fp32, ids, drafter,
                                                     DecodeConfig(max_new_tokens=N, max_nodes=12, ignore_eos=True)))
            assert out == ref, f"diverged at {next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)}"
    finally:
        set_layout(smol_fp32.model, "out")


@pytest.fixture(scope="module")
def compiled_fp32(smol_fp32, references):
    """The compiled static-cache engine on the same fp32 weights (references are taken first, by
    generate() on the weights as loaded); the weights go back to as loaded afterwards."""
    from assistant.runtime.engine import CompiledEngine, make_engine
    from assistant.runtime.layout import set_layout

    engine = make_engine(smol_fp32, "compiled")
    assert isinstance(engine, CompiledEngine)
    yield engine
    set_layout(smol_fp32.model, "out")


@pytest.mark.parametrize("kind", ["oracle", "adversarial", "phrase"])
def test_compiled_engine_equals_generate_fp32(smol_fp32, references, compiled_fp32, kind):
    """The compiled engine (packed weights, window attention, static cache) is exact in fp32. With the native
    kernels every weight of the embedded default runs in block form (its GGUF's Q4_1 / Q8_0 blocks, rebuilt bit
    for bit), so this is the exactness of that form too."""
    from assistant.runtime import kernels
    from assistant.runtime.decode import greedy_generate
    from assistant.runtime.layout import block_keys, native_keys

    if kernels.loaded():
        assert block_keys(smol_fp32.model) == native_keys(smol_fp32.model) != []

    passes = tokens = 0
    for ids, ref in references:
        drafter = {"oracle": lambda: OracleDrafter(ids + ref),
                   "adversarial": lambda: AdversarialDrafter(ids + ref, width=3, depth=2),
                   "phrase": lambda: untrained_phrase_drafter(smol_fp32)}[kind]()
        cfg = DecodeConfig(max_new_tokens=N, ignore_eos=True)
        out, stats = run_to_end(speculative_generate(smol_fp32, ids, drafter, cfg, engine=compiled_fp32))
        assert out == ref, f"diverged at {next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)}"
        passes += stats.passes
        tokens += stats.new_tokens
    if kind == "oracle":
        assert tokens / passes > 4.0
        ids, ref = references[0]
        assert run_to_end(greedy_generate(smol_fp32, ids, DecodeConfig(max_new_tokens=N, ignore_eos=True),
                                          engine=compiled_fp32))[0] == ref


def test_compiled_engine_chat_turns_from_the_kept_cache_equal_generate_fp32(smol_fp32, compiled_fp32):
    """Five conversations of three turns on the compiled engine, each turn from the cache the last answer left
    (assistant.runtime.prefix; conversations follow one another as in one chat session, so a new one reuses
    the chat template's opening): every turn equals generate() on the whole conversation."""
    from assistant.runtime.prefix import KeptCache

    kept, tok = KeptCache(), smol_fp32.tokenizer
    for c in range(5):
        messages = []
        for t in range(3):
            messages.append({"role": "user", "content": PROMPTS[(3 * c + t) % len(PROMPTS)]})
            ids = smol_fp32.encode_chat(messages)
            steps = list(speculative_generate(smol_fp32, ids, untrained_phrase_drafter(smol_fp32),
                                              DecodeConfig(max_new_tokens=32), engine=compiled_fp32, kept=kept))
            out = [x for s in steps for x in s.tokens]
            x = torch.tensor([ids])
            ref = smol_fp32.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=32,
                                           pad_token_id=0)[0, len(ids):].tolist()
            assert out == ref, (c, t)
            # after the first prompt, the chat template's opening at least comes from the cache
            assert steps[0].tree_size < len(ids) or c == t == 0
            messages.append({"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)})
