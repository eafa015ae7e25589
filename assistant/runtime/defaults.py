"""Which drafter a target gets: its shipped default head, a given artifact, or none.

Contract: `build_drafter(target, path)` returns (drafter, info). With `path` it
loads that head artifact; with None it loads the head shipped for the target
(assistant/runtime/data/heads/<target name>.safetensors) when one exists. The phrase head
is combined with in-context prompt lookup (unless `lookup` is False) in one tree, ranked on one scale
(assistant.runtime.drafters.artifact_drafter),
and `history` (an assistant.runtime.history_lookup.AnswerIndex of the user's past answers) adds the
lookup in them;
without a head, prompt lookup drafts alone. A head whose hidden size
does not match the target raises ValueError naming the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).parent / "data" / "heads"


def shipped_head(target_name: str) -> Path | None:
    p = SHIPPED / f"{target_name}.safetensors"
    return p if p.exists() else None


def build_drafter(target, path: str | Path | None = None, top_k: int | None = None,
                  history: Any = None, lookup: bool = True) -> tuple[Any, dict[str, Any]]:
    from assistant.runtime.drafters import PromptLookupDrafter, UnionDrafter, artifact_drafter
    from assistant.runtime.head import load_artifact

    path = Path(path) if path else shipped_head(target.name)
    if path is None:
        from assistant.runtime.history_lookup import HistoryDrafter

        return UnionDrafter(HistoryDrafter(history) if history is not None else None, PromptLookupDrafter()), \
            {"head": None, "drafter": ("history+" if history is not None else "") + "prompt-lookup"}
    art = load_artifact(path)
    if art.head.config.hidden_size != target.hidden_size:
        raise ValueError(f"{path}: head reads hidden size {art.head.config.hidden_size}, "
                         f"target {target.name} has {target.hidden_size}")
    head = art.head.to(target.device)
    kw = {"top_k": top_k} if top_k is not None else {}   # else the artifact's measured setting, else 6
    info = {"head": str(path), "drafter": ("history+" if history is not None else "") + "phrase"
            + ("+prompt-lookup" if lookup else ""),
            **head.describe(target.num_parameters), "meta": art.meta}
    return artifact_drafter(art, target.model.get_input_embeddings(), history=history, lookup=lookup, **kw), info
