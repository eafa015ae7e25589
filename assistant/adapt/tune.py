"""The tree shape a phrase head drafts with, picked on held-out distilled answers.

Contract:
- `TuneConfig` (frozen): the held-out data set (file, first record, stop record; records the head
  was not trained on), the tree's node budget and the grid of PhraseDrafter settings (top_k,
  chain_depth, chain_width) tried.
- `held_out_key(source)` -> "STEM:START:STOP", the form the artifact's "drafter" metadata names it by.
- `trained_keys(meta)` -> the answer keys ("STEM:RECORD") an artifact's metadata says it was trained on.
- `tune_tree_shape(art, embeddings, answers, features, hidden, grid, nodes, on_result)` -> (best
  settings, their tokens per pass, every (settings, tokens per pass)): assistant.adapt.evaluate.simulate_decode
  (phrase head + prompt lookup in one tree of `nodes` nodes, what the runtime builds) for each
  setting in grid order; the first best wins ties, so the choice is deterministic.
- `drafter_meta(best, tpp, source)` -> the artifact's "drafter" entry, which
  PhraseDrafter.from_artifact reads.
Tokens per pass do not depend on timing. torch is imported inside the functions that need it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

Settings = dict[str, int]


@dataclass(frozen=True)
class TuneConfig:
    held_out: tuple[str, int, int]            # (file, first record, stop record), never trained on
    nodes: int = 16
    top_k: tuple[int, ...] = (6, 10, 16)
    chain_depth: tuple[int, ...] = (2, 3)
    chain_width: tuple[int, ...] = (2, 4)

    def grid(self) -> list[Settings]:
        return [{"top_k": k, "chain_depth": d, "chain_width": w}
                for k, d, w in itertools.product(self.top_k, self.chain_depth, self.chain_width)]


def held_out_key(source: tuple[str, int, int]) -> str:
    path, start, stop = source
    return f"{Path(path).stem}:{int(start)}:{int(stop)}"


def trained_keys(meta: dict[str, Any]) -> set[str]:
    from assistant.adapt.datasets import trained_ranges

    return {f"{Path(name).stem}:{i}" for name, (_, spans) in trained_ranges(meta).items()
            for a, b in spans for i in range(a, b)}


def tune_tree_shape(art, embeddings, answers: Sequence, features, hidden: int, grid: Sequence[Settings],
                    nodes: int = 16, on_result: Callable[[Settings, float], None] | None = None
                    ) -> tuple[Settings, float, list[tuple[Settings, float]]]:
    import torch

    from assistant.adapt.evaluate import simulate_decode
    from assistant.runtime.drafters import artifact_drafter

    if not grid:
        raise ValueError("empty tree-shape grid")
    results: list[tuple[Settings, float]] = []
    with torch.inference_mode():
        for settings in grid:
            drafter = artifact_drafter(art, embeddings, max_nodes=nodes, **settings)
            sim = simulate_decode(drafter, answers, features, nodes, hidden)
            results.append((dict(settings), sim["tokens_per_pass"]))
            if on_result is not None:
                on_result(settings, sim["tokens_per_pass"])
    best, tpp = max(results, key=lambda r: r[1])
    return best, tpp, results


def drafter_meta(best: Settings, tokens_per_pass: float, source: tuple[str, int, int]) -> dict[str, Any]:
    return {**best, "tuned_on": held_out_key(source), "tokens_per_pass": round(tokens_per_pass, 3)}


__all__ = ["TuneConfig", "drafter_meta", "held_out_key", "trained_keys", "tune_tree_shape"]
