"""assistant.adapt.replay: bounded, crash-safe, labels recomputed under a changed vocabulary."""
from __future__ import annotations

import pytest
import torch

from assistant.adapt.replay import FOLLOW, ReplayBuffer
from assistant.runtime.vocab import DraftVocab


def _batch(answers, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq, pos = [], []
    for s, a in enumerate(answers):
        for t in range(len(a) - 1):
            seq.append(s)
            pos.append(t)
    seq, pos = torch.tensor(seq), torch.tensor(pos)
    roots = torch.tensor([answers[s][t] for s, t in zip(seq.tolist(), pos.tolist())])
    return torch.randn(len(seq), dim, generator=g), roots, seq, pos


def test_add_dedup_trim_and_roundtrip(tmp_path):
    answers = [[5, 6, 7, 8, 9], [10, 11, 12]]
    feats, roots, seq, pos = _batch(answers)
    buf = ReplayBuffer.open(tmp_path / "r.safetensors", capacity=100)
    assert len(buf) == 0 and buf.ensure_layout((-1,), 8, "t")
    assert buf.add(feats, roots, answers, seq, pos, [101, 102]) == 6
    assert buf.add(feats, roots, answers, seq, pos, [101, 102]) == 0        # a rerun adds nothing twice
    assert buf.follow.shape == (6, FOLLOW) and buf.follow[0, :4].tolist() == [6, 7, 8, 9]
    assert buf.follow[0, 4:].eq(-1).all()
    buf.save()
    again = ReplayBuffer.open(tmp_path / "r.safetensors", capacity=100)
    assert again.feats.dtype == torch.float16 and torch.allclose(again.feats.float(), feats, atol=1e-2)
    assert again.messages == {101, 102} and not again.ensure_layout((-1,), 8, "t")
    assert again.sequences() == answers
    # bounded: the oldest records go first
    small = ReplayBuffer.open(tmp_path / "r.safetensors", capacity=4)
    assert len(small) == 4 and small.msg.tolist() == [101, 101, 102, 102]
    more = [[20, 21, 22, 23]]
    f2, r2, s2, p2 = _batch(more, seed=1)
    small.add(f2, r2, more, s2, p2, [103])
    assert len(small) == 4 and small.msg.tolist() == [102, 103, 103, 103]
    # no temp files left behind by the atomic save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.safetensors"]


def test_labels_follow_the_vocabulary(tmp_path):
    answers = [[5, 6, 7, 8, 9]]
    buf = ReplayBuffer.empty(tmp_path / "r.safetensors", 10, 8, (-1,), 8, "t")
    buf.add(*_batch(answers)[:2], answers, *_batch(answers)[2:], [1])
    v = DraftVocab()
    a = v.add((6,))
    assert buf.targets(v).tolist() == [a, -1, -1, -1]
    b = v.add((6, 7, 8))
    assert buf.targets(v).tolist() == [b, -1, -1, -1]          # the longest row wins
    v.remove(b)
    c = v.add((8, 9))                                           # reuses b's id for another phrase
    assert c == b and buf.targets(v).tolist() == [a, -1, c, -1]


def test_layout_change_resets_and_damage_names_the_file(tmp_path):
    answers = [[5, 6, 7]]
    buf = ReplayBuffer.empty(tmp_path / "r.safetensors", 10, 8, (-1,), 8, "t")
    f, r, s, p = _batch(answers)
    buf.add(f, r, answers, s, p, [1])
    assert buf.ensure_layout((-1, 2), 8, "t") and len(buf) == 0 and buf.feats.shape[1] == 16
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match="bad.safetensors: damaged replay buffer"):
        ReplayBuffer.open(bad)
