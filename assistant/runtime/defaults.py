"""Which drafter a target gets: its shipped default head, a given artifact, or none.

Contract: `build_drafter(target, path)` returns (drafter, info). With `path` it
loads that head artifact; with None it loads the head shipped for the target
(assistant/runtime/data/heads/<target name>.safetensors) when one exists. The phrase head
is combined with in-context prompt lookup (unless `lookup` is False) in one tree, ranked on one scale
(assistant.runtime.drafters.artifact_drafter),
and `history` (an assistant.runtime.history_lookup.AnswerIndex of the user's past answers) adds the
lookup in them; an adapted head with its frozen base head beside it (assistant.runtime.headconfig.base_companion)
drafts with both (`load_heads`); a head drafts in bf16 beside a bf16 target (`head_dtype`). On a CPU the heads
the drafter reads are packed like the target's weights (assistant.runtime.layout "packed"; they are loaded
for it alone and never trained or saved from here). Without a head, prompt lookup drafts alone. A head whose
hidden size does not match the target raises ValueError naming the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).parent / "data" / "heads"


def shipped_head(target_name: str) -> Path | None:
    p = SHIPPED / f"{target_name}.safetensors"
    return p if p.exists() else None


def head_dtype(target) -> "torch.dtype":
    """The dtype a head drafts in beside `target`: bf16 beside a bf16 target, else fp32. Its forward reads
    ~10 MB of fp32 weights a pass, streamed back into the cache after every verify (1.2-1.3 ms a pass in fp32,
    0.8 in bf16 on an avx512_bf16 CPU, ~1.5% of a bf16 pass), and its proposals bank the same tokens per
    verify cost in bf16 (BENCHMARKS.md, "More distilled answers for the head")."""
    import torch

    return torch.bfloat16 if target.dtype == "bf16" else torch.float32


def load_heads(path: str | Path, hidden_size: int, target_name: str = "the target"):
    """(the artifact at `path`, its base companion's artifact or None); ValueError naming the file when one
    does not read `hidden_size` features. A damaged companion is reported (one line) and left out: the
    adapted head drafts alone, the answers are the same."""
    from assistant.runtime.head import load_artifact
    from assistant.runtime.headconfig import base_companion

    def load(p: Path):
        art = load_artifact(p)
        if art.head.config.hidden_size != hidden_size:
            raise ValueError(f"{p}: head reads hidden size {art.head.config.hidden_size}, "
                             f"{target_name} has {hidden_size}")
        return art

    art, base = load(Path(path)), base_companion(path)
    if not base.is_file():
        return art, None
    try:
        return art, load(base)
    except ValueError as e:
        import logging

        logging.getLogger("assistant.runtime.defaults").warning("%s; drafting without it", e)
        return art, None


def build_drafter(target, path: str | Path | None = None, top_k: int | None = None,
                  history: Any = None, lookup: bool = True) -> tuple[Any, dict[str, Any]]:
    from assistant.runtime.drafters import PromptLookupDrafter, UnionDrafter, artifact_drafter
    from assistant.runtime.headconfig import base_companion

    path = Path(path) if path else shipped_head(target.name)
    if path is None:
        from assistant.runtime.history_lookup import HistoryDrafter

        return UnionDrafter(HistoryDrafter(history) if history is not None else None, PromptLookupDrafter()), \
            {"head": None, "drafter": ("history+" if history is not None else "") + "prompt-lookup"}
    art, base = load_heads(path, target.hidden_size, f"target {target.name}")
    dtype = head_dtype(target)
    head = art.head.to(target.device, dtype)
    if base is not None:
        base.head.to(target.device, dtype)
    for h in (head, base.head if base is not None else None):
        _pack(h)
    kw = {"top_k": top_k} if top_k is not None else {}   # else the artifact's measured setting, else 6
    info = {"head": str(path), "drafter": ("history+" if history is not None else "")
            + ("base+" if base is not None else "") + "phrase" + ("+prompt-lookup" if lookup else ""),
            **head.describe(target.num_parameters), "meta": art.meta}
    if base is not None:
        info["base_head"] = str(base_companion(path))
    return artifact_drafter(art, target.model.get_input_embeddings(), history=history, lookup=lookup, base=base,
                            **kw), info


def _pack(head) -> None:
    """Pack a CPU head's linears once (assistant.runtime.layout): a dense bf16 F.linear reorders its weight
    inside oneDNN at every call, and each pass reads the head's ~8 MB from memory again after the target's
    forward (the head's forward in a bf16 pass 0.56 -> 0.38 ms, propose 1.12 -> 0.93 ms; BENCHMARKS.md)."""
    from assistant.runtime.layout import packing_supported, set_layout

    if head is not None and packing_supported(head):       # CPU weights in fp32 / bf16 only
        set_layout(head, "packed", side=True)

