"""The online adapter's settings: one frozen `CycleConfig` read by every stage of a cycle.

Contract: a plain frozen dataclass without imports beyond the standard library, so the cycle's
modules (assistant.adapt.cycle, slices, judge, train, features) share it without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass

NEW_ROW_INITS = ("quiet", "mean_trunk")


@dataclass(frozen=True)
class CycleConfig:
    dtype: str | None = None          # target dtype for features (None: the profile's)
    max_answer_tokens: int = 512
    max_new_rows: int = 2000          # rows mined per cycle at most
    mine_max_words: int = 3
    chain_width: int = 4
    replay_capacity: int = 20000      # positions
    steps: int = 1200                 # fine-tune steps at most
    epochs: float = 30.0              # 3 epochs (126 steps on 300 answers) left the loss at 4.5 nats and the
                                      # new rows half-trained: they displaced good rows on the anchor (-5.5%);
                                      # 600 -> 1200 steps: held-out user +22.1% -> +26.0% (BENCHMARKS.md)
    batch_size: int = 256
    lr: float = 1e-3                  # output rows
    trunk_lr_scale: float = 0.1       # the shared trunk moves slower: it serves the original domain too
    old_rows_scale: float = 1.0       # how far rows that existed before this cycle may move (0: frozen)
    keep_base: bool = True            # the frozen head adaptation started from drafts beside the adapted one:
                                      # arena user on a no-arena head, judged: replacing it user +5.3% / anchor
                                      # -8.1% (rejected), beside it +5.6% / -0.3% (published; BENCHMARKS.md A17)
    eval_every: int = 5               # every 5th new answer is held out for the tokens-per-pass check
    held_out_keep: int = 60           # held-out answers kept across cycles (the newest): a cycle of 12
                                      # answers holds out 2, too few to judge on (20-cycle run, BENCHMARKS.md)
    anchor_prompts: int = 16
    anchor_max_new_tokens: int = 128
    anchor_sources: tuple[tuple[str, int, int], ...] | None = None   # None: the base head's held-back prompts
    rehearsal_prompts: int = 32       # original-domain answers mixed into every fine-tune (0: none)
    rehearsal_share: float = 0.3      # share of each fine-tune batch drawn from them
    margin: float = 0.03              # allowed relative drop of anchor tokens/pass
    history_lookup: bool | None = None  # judge with the runtime's lookup in past answers (None: the profile's setting)
    max_nodes: int | None = None      # None: the runtime's widths on this device (online control, <= tree_width)
    feature_batch: int = 1            # answers per prefill, and
    feature_chunk: int | None = 64    # tokens per piece of it: pause() runs between pieces, so a chat answer
                                      # that starts meanwhile shares the CPU with at most one piece (~0.1 s)
    half_life_s: float = 7 * 24 * 3600.0
    new_row_init: str = "quiet"       # grown rows start at zero weight and a bias quiet_below under every old
                                      # row's, so they outscore no old row until the fine-tune raises them where
                                      # their phrase follows; "mean_trunk" starts them at the trunk's mean there,
                                      # which fired them in the original domain's contexts too: anchor -27%
                                      # before any step on the code user, -8.4% vs quiet's -3.0% after the
                                      # cycle on the arena user (BENCHMARKS.md, A12 and A14)
    quiet_below: float = 10.0        # 10 below: anchor -0.9%, user +6.8%; 5 below: anchor -4.8% (A12)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.new_row_init not in NEW_ROW_INITS:
            raise ValueError(f"new_row_init must be one of {', '.join(NEW_ROW_INITS)}, not {self.new_row_init!r}")


__all__ = ["CycleConfig"]
