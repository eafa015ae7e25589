"""The anchor and rehearsal slices: answers of the original domain that a cycle checks and rehearses.

Contract: `ensure_anchor(...)` and `ensure_rehearsal(...)` -> (answers, features, info). A slice is
built once per profile: the target answers its prompts greedily (announced as "<name> answers k/n"),
their features are taken ("<name> features k/n"), and both are kept in adapter/<name>.jsonl,
<name>.safetensors and <name>.json (every write atomic, assistant.profiles.atomic); later cycles read
them back (features are retaken when the layers or the target changed; a damaged or incomplete slice,
e.g. an info file cut by a full disk, is built again).
The prompts are the base head's held-back prompts (assistant.adapt.datasets): the slices file beside
the base head's artifact, else the one beside the shipped head for the target, keeping only prompts
of the data sets the base head names in its metadata and outside the ranges it was trained on. The
anchor takes the first `config.anchor_prompts`, rehearsal the next `config.rehearsal_prompts`, so the
check stays held-out. Explicit `config.anchor_sources` ((file, start, stop) triples) replace the
anchor's prompts and turn rehearsal off (no known place for its prompts). With no prompts, info is
{"available": False, "reason": ...} and the cycle goes on without that slice.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

from assistant.adapt.config import CycleConfig

Prompts = list[tuple[str, str]]


def held_back_records(base_path: Path, meta: dict[str, Any], target_name: str) -> tuple[list[dict], str | None]:
    """(the base head's held-back prompt records, None) or ([], why there are none)."""
    from assistant.adapt.datasets import SLICES_SUFFIX, read_slices, serves, slices_path, trained_ranges
    from assistant.runtime.defaults import shipped_head

    ranges = trained_ranges(meta)
    if not ranges:
        return [], "the base head names no training data"
    shipped = shipped_head(target_name)
    for path in dict.fromkeys([slices_path(base_path)] + ([slices_path(shipped)] if shipped else [])):
        records = [r for r in read_slices(path) if serves(r, ranges)]
        if records:
            return records, None
    return [], (f"no held-back prompts of the base head's training data ({', '.join(sorted(ranges))}): "
                f"no {SLICES_SUFFIX} file beside it or beside the shipped head for {target_name} holds prompts of "
                f"these data sets that it was not trained on")


def _from_records(records: list[dict]) -> tuple[Prompts, dict[str, Any]]:
    """(key, prompt) pairs (keys "<file stem>:<record>", as assistant.adapt.distill.training_prompts
    names them) and the info naming their ranges: [[file, start, stop], ...]."""
    sources: list[list] = []
    for r in records:
        if sources and sources[-1][0] == r["file"] and sources[-1][2] == r["record"]:
            sources[-1][2] += 1
        else:
            sources.append([r["file"], r["record"], r["record"] + 1])
    prompts = [(f"{Path(r['file']).stem}:{r['record']}", r["prompt"]) for r in records]
    return prompts, {"sources": sources, "unseen_by_base_head": True, "prompts": len(prompts)}


def ensure_anchor(adir: Path, target, layers, base_path: Path, meta: dict[str, Any], config: CycleConfig, pause,
                  features: Callable, on_stage=None):
    """(answers, features, info) of the held-back original data the check measures."""
    def pick() -> tuple[Prompts, dict[str, Any] | str]:
        from assistant.adapt.distill import training_prompts

        if config.anchor_sources is not None:
            sources = [tuple(s) for s in config.anchor_sources]
            if not sources:
                return [], "no anchor sources given"
            return training_prompts(sources), {"sources": [list(s) for s in sources], "unseen_by_base_head": True}
        records, why = held_back_records(base_path, meta, target.name)
        return _from_records(records[:config.anchor_prompts]) if records else ([], why)

    return _ensure_slice(adir, "anchor", target, layers, config, pause, features, pick, on_stage)


def ensure_rehearsal(adir: Path, target, layers, base_path: Path, meta: dict[str, Any], config: CycleConfig, pause,
                     features: Callable, on_stage=None):
    """(answers, features, info) of original-domain answers the fine-tune rehearses, so the head keeps
    what it knew (measured without them: the anchor's tokens/pass fell 9-15% after one arena cycle)."""
    if config.rehearsal_prompts <= 0 or config.anchor_sources is not None:
        return [], None, {"available": False}

    def pick() -> tuple[Prompts, dict[str, Any] | str]:
        records, why = held_back_records(base_path, meta, target.name)
        part = records[config.anchor_prompts:config.anchor_prompts + config.rehearsal_prompts]
        if not part:
            return [], why or "no held-back prompts left after the anchor's"
        return _from_records(part)

    return _ensure_slice(adir, "rehearsal", target, layers, config, pause, features, pick, on_stage)


def _ensure_slice(adir: Path, name: str, target, layers, config: CycleConfig, pause, features: Callable,
                  pick: Callable[[], tuple[Prompts, dict[str, Any] | str]], on_stage=None):
    from assistant.adapt.distill import DistillConfig, distill, load_answers
    from assistant.adapt.features import Features
    from assistant.profiles.atomic import atomic_write_bytes, atomic_write_text

    say = on_stage or (lambda s: None)
    fpath, apath, info_path = adir / f"{name}.safetensors", adir / f"{name}.jsonl", adir / f"{name}.json"
    answers, info = _read_slice(apath, info_path)
    if not answers:
        prompts, info = pick()
        if not prompts:
            return [], None, {"available": False, "reason": info}
        info = {**info, "prompts": len(prompts)}
        pause()
        with tempfile.TemporaryDirectory(prefix=f"adapter-{name}-") as tmp:
            # answered outside the profile, then written whole: a kill leaves no half-written slice
            out = Path(tmp) / apath.name
            distill(target, prompts, out, DistillConfig(batch_size=8, max_new_tokens=config.anchor_max_new_tokens),
                    progress=lambda stage, done, total: say(f"{name} answers {done}/{total}"))
            atomic_write_bytes(apath, out.read_bytes())
        answers = load_answers(apath)
        atomic_write_text(info_path, json.dumps(info))
    feats = None
    if fpath.exists():
        try:
            feats, md = Features.load(fpath)
        except Exception:      # noqa: BLE001 - a damaged cache of features (safetensors raises its own errors)
            md = {}
        if feats is None or feats.layers != tuple(layers) or md.get("target") != target.name:
            feats = None
    if feats is None:
        feats = features(target, answers, layers, config, pause, lambda s: say(f"{name} {s}"))
        feats.save(fpath, {"target": target.name})
    return answers, feats, {"available": True, **info, "answers": len(answers)}


def _read_slice(apath: Path, info_path: Path) -> tuple[list, dict[str, Any]]:
    """(answers, info) of a slice built before, or ([], {}) when it is absent, damaged or incomplete: a slice
    is derived data, so a damaged one is answered again rather than trusted or reported."""
    from assistant.adapt.distill import load_answers

    try:
        info = json.loads(info_path.read_text("utf-8"))
        answers = load_answers(apath)
    except (OSError, ValueError, TypeError, KeyError):
        return [], {}
    if not isinstance(info, dict) or info.get("prompts") != len(answers):
        return [], {}
    return answers, info


__all__ = ["ensure_anchor", "ensure_rehearsal", "held_back_records"]
