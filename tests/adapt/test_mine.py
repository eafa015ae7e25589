from assistant.adapt.mine import MineConfig, candidate_spans, chain_table, coverage, longest_match, mine, segment, word_starts
from assistant.runtime.vocab import DraftVocab

TEXT = ("Natalia sold 48 clips in April. She sold half as many clips in May. "
        "So she sold 48 + 24 = 72 clips in April and May. The answer is 72.\n") * 3


def test_word_starts_from_token_bytes(table):
    ws = word_starts(table)
    ids = table.expand(" clips in April")
    assert all(ws[t] for t in ids if table.id_bytes[t].startswith(b" "))
    assert not ws[table.expand("April")[0]]


def test_spans_respect_word_limit(table):
    seq = table.expand(TEXT)
    starts = word_starts(table)
    counts = candidate_spans([seq], starts, MineConfig(max_words=2))
    for span in counts:
        inner_words = sum(starts[t] for t in span[1:]) + 1
        assert inner_words <= 2
    assert tuple(table.expand(" clips in")) in counts


def test_mine_budget_existing_and_coverage(table):
    seqs = [table.expand(TEXT)]
    rows = mine(seqs, table, 20)
    assert 0 < len(rows) <= 20 and len(set(rows)) == len(rows)
    vocab = DraftVocab()
    for r in rows[:5]:
        vocab.add(r)
    more = mine(seqs, table, 10, existing=vocab)
    assert not set(more) & set(rows[:5])
    cov = coverage(seqs, set(rows))
    assert cov["tokens_per_pass"] > 1.5      # the text repeats, phrases bank several tokens


def test_segment_and_chain_table(table):
    seq = table.expand(TEXT)
    vocab = DraftVocab()
    for r in mine([seq], table, 30):
        vocab.add(r, table.text_of(r))
    index = vocab._index
    max_len = max(map(len, index))
    segs = segment(seq, index, max_len)
    assert sum(len(s) or 1 for s in segs) == len(seq)
    chain = chain_table([seq], vocab, width=3)
    assert chain.shape == (vocab.capacity, 3)
    # every chained pair occurs adjacently in the text
    pairs = [(a, int(b)) for a in vocab.live_ids() for b in chain[a] if b >= 0]
    assert pairs
    for a, b in pairs[:10]:
        ta, tb = list(vocab.rows[a].tokens), list(vocab.rows[b].tokens)
        both = ta + tb
        assert any(seq[i:i + len(both)] == both for i in range(len(seq)))
    first = next(s for s in segs if s)
    assert longest_match(seq, seq.index(first[0]), index, max_len) >= 1
