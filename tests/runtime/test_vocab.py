"""Draft vocabulary: stable ids, reuse, statistics, safetensors round trip, longest-match expansion."""
import pytest

from assistant.runtime.vocab import DraftVocab, TokenTable


def test_add_remove_reuses_freed_ids():
    v = DraftVocab()
    a = v.add([1, 2], "a")
    b = v.add([3], "b")
    c = v.add([4, 5, 6], "c")
    assert (a, b, c) == (0, 1, 2) and len(v) == 3
    assert v.add([1, 2]) == a                      # duplicate returns the existing id
    v.remove(b)
    assert len(v) == 2 and v.capacity == 3 and v.rows[b] is None
    assert v.add([9, 9], "d") == b                  # freed id reused
    assert v[c].tokens == (4, 5, 6) and v.id_of([9, 9]) == b
    with pytest.raises(ValueError):
        v.add([])


def test_statistics_and_round_trip(tmp_path):
    v = DraftVocab(meta={"target": "x"})
    r = v.add([10, 11], "hello world")
    v.add([12], "x")
    v.remove(1)
    v.record(r, proposed=3, banked=2, now=123.0)
    path = tmp_path / "v.safetensors"
    v.save(path)
    w = DraftVocab.load(path)
    assert w.capacity == 2 and len(w) == 1 and w.rows[1] is None
    assert w[r].tokens == (10, 11) and w[r].text == "hello world"
    assert (w[r].proposed, w[r].accepted, w[r].banked, w[r].last_used) == (3, 1, 2, 123.0)
    assert w.meta == {"target": "x"}
    assert w.add([1]) == 1


def test_utility_decays_with_age():
    v = DraftVocab()
    r = v.add([1, 2])
    v.record(r, proposed=1, banked=4, now=1000.0)
    fresh = v[r].utility(now=1000.0, half_life_s=100.0)
    old = v[r].utility(now=1100.0, half_life_s=100.0)
    assert fresh > 0 and old == pytest.approx(fresh / 2)


@pytest.mark.slow
def test_longest_match_expansion_matches_target_tokenizer(smol_tokenizer):
    table = TokenTable.from_tokenizer(smol_tokenizer)
    for text in [" United States of America", " the answer is", " 42.", "Hello, world!", " naïve café"]:
        ids = table.expand(text)
        assert table.text_of(ids) == text
        assert smol_tokenizer.decode(ids) == text
    # the target emits " of the" as two tokens; the expansion agrees
    assert table.expand(" of the") == smol_tokenizer(" of the")["input_ids"]
