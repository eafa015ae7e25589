"""PhraseDrafter's best-first policy (chain probabilities) stays within the node budget."""
from __future__ import annotations

import torch

from assistant.runtime.decode import DraftContext
from assistant.runtime.drafters import PhraseDrafter
from assistant.runtime.head import HeadConfig, PhraseHead
from assistant.runtime.tree import build_tree
from assistant.runtime.vocab import DraftVocab


def _drafter(max_nodes=None):
    torch.manual_seed(0)
    vocab = DraftVocab()
    for i in range(12):
        vocab.add([10 + i, 40 + i, 70 + i], f"r{i}")
    head = PhraseHead(HeadConfig(hidden_size=8, inner=16, width=8), vocab.capacity)
    with torch.no_grad():
        head.out.bias[:] = torch.linspace(5, 0, vocab.capacity)   # row 0 most likely
        head.out.weight.zero_()
    chain = torch.full((vocab.capacity, 2), -1, dtype=torch.long)
    chain_p = torch.zeros(vocab.capacity, 2)
    chain[0] = torch.tensor([5, 6])
    chain_p[0] = torch.tensor([0.9, 0.1])
    emb = torch.nn.Embedding(200, 8)
    return PhraseDrafter(head, vocab, emb, top_k=6, chain=chain, chain_p=chain_p, chain_depth=2,
                         max_nodes=max_nodes)


def test_best_first_uses_the_budget_and_chains_the_likely_row():
    d = _drafter()
    ctx = DraftContext(ids=[1, 2, 3], root=3, features=torch.zeros(1, 8), max_nodes=10)
    cands = d.propose(ctx)
    tree = build_tree(3, cands, 10)
    assert tree.size <= 10
    assert cands[0] == [10, 40, 70]                    # the best row first
    assert [10, 40, 70, 15, 45, 75] in cands[:3]       # row 0 then its likely successor, early
    assert sum(len(c) for c in cands) >= 9             # the budget is spent


def test_best_first_respects_its_own_budget():
    d = _drafter(max_nodes=4)
    ctx = DraftContext(ids=[1, 2, 3], root=3, features=torch.zeros(1, 8), max_nodes=16)
    cands = d.propose(ctx)
    nodes = {tuple(c[:i + 1]) for c in cands for i in range(len(c))}
    assert len(nodes) <= 3 + 2   # the last candidate may overshoot by less than one row


def test_artifact_settings_apply_unless_given_explicitly():
    from assistant.runtime.head import Artifact

    d = _drafter()
    art = Artifact(head=d.head, vocab=d.vocab, meta={"drafter": {"top_k": 10, "chain_depth": 3, "tuned_on": "x"}},
                   extra={"chain": d.chain, "chain_p": d.chain_p})
    got = PhraseDrafter.from_artifact(art, d.embeddings)
    assert (got.top_k, got.chain_depth) == (10, 3)
    got = PhraseDrafter.from_artifact(art, d.embeddings, top_k=4)
    assert (got.top_k, got.chain_depth) == (4, 3)


def test_the_prior_of_a_shared_prefix_is_the_mass_of_every_row_under_it():
    torch.manual_seed(0)
    vocab = DraftVocab()
    for toks in ([5, 6], [5, 7], [5, 8, 9], [3]):
        vocab.add(toks, str(toks))
    head = PhraseHead(HeadConfig(hidden_size=8, inner=16, width=8), vocab.capacity)
    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.fill_(-1e4)
        head.out.bias[:4] = torch.log(torch.tensor([0.3, 0.2, 0.1, 0.4]))
    d = PhraseDrafter(head, vocab, torch.nn.Embedding(20, 8), top_k=4)
    cands = d.propose(DraftContext(ids=[1], root=1, features=torch.zeros(1, 8), max_nodes=16))
    prior = {tuple(c): c.prior for c in cands}
    assert abs(prior[(5, 6)][0] - 0.6) < 1e-4 and abs(prior[(5, 6)][1] - 0.3) < 1e-4   # 5 starts three rows
    assert abs(prior[(5, 8, 9)][1] - 0.1) < 1e-4 and abs(prior[(3,)][0] - 0.4) < 1e-4
    keys = {tuple(c): c.key for c in cands}
    assert keys[(5, 6)] == ("phrase", 0) and keys[(3,)] == ("phrase", 1)   # by halvings of the first token's mass
