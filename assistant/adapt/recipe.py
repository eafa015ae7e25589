"""A head's build recipe: the TOML file that says how to rebuild it with one `assistant train --recipe`.

Contract: `load_recipe(path, data_dir)` -> Recipe (frozen), or TrainError (a ValueError) naming the file and key.
The file (see assistant/runtime/data/heads/SmolLM2-135M-Instruct.recipe.toml) has:
- `artifact = "NAME.safetensors"`: the head it builds, a file name beside the recipe (the default --out);
- `[[data]]` tables `file`, `start`, `stop`: the training data sets by FILE NAME and record range
  (0-based, stop exclusive), resolved against `data_dir` (the folder given with --data), never a path;
- `[train]`: TrainConfig fields by name (every training flag; absent ones keep TrainConfig's default;
  `sources`, `workdir`, `out` and `distill_only` are not recipe keys);
- `[tune]` (optional): `file`, `start`, `stop` of the held-out answers the tree shape is picked on
  and its grid `nodes`, `top_k`, `chain_depth`, `chain_width` (TuneConfig).
Unknown keys are errors, so a misspelt flag never silently falls back to a default. Lists become tuples.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path, PurePath
from typing import Any

from assistant.adapt.pipeline import MACHINE_FIELDS, TrainConfig, TrainError
from assistant.adapt.tune import TuneConfig

NOT_RECIPE_KEYS = MACHINE_FIELDS + ("distill_only",)   # the command line's, not the recipe's


@dataclass(frozen=True)
class Recipe:
    train: TrainConfig
    tune: TuneConfig | None
    artifact: Path          # the head the recipe builds (beside the recipe file)


def _file_in(data_dir: Path, name: Any, where: str) -> str:
    if not isinstance(name, str) or not name or PurePath(name).name != name:
        raise TrainError(f"{where}: `file` must be a bare file name (found in --data DIR), got {name!r}")
    return str(data_dir / name)


def _range(table: dict, data_dir: Path, where: str) -> tuple[str, int, int]:
    try:
        start, stop = table["start"], table["stop"]
    except KeyError as e:
        raise TrainError(f"{where}: missing {e.args[0]!r}") from None
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop):
        raise TrainError(f"{where}: needs integers 0 <= start < stop, got {start!r}, {stop!r}")
    return _file_in(data_dir, table.get("file"), where), start, stop


def _fields(table: dict, defaults: dict[str, Any], where: str) -> dict[str, Any]:
    """`table`'s keys checked against `defaults` (name -> default value): known names, and values of the
    default's type (an int where a float is expected; a list of integers where a tuple is)."""
    if not isinstance(table, dict):
        raise TrainError(f"{where}: expected a table, got {table!r}")
    unknown = sorted(set(table) - set(defaults))
    if unknown:
        raise TrainError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(defaults))})")
    out = {}
    for key, value in table.items():
        value = tuple(value) if isinstance(value, list) else value
        want = type(defaults[key])
        ok = defaults[key] is None or isinstance(value, want) or (want is float and type(value) is int)
        if want is tuple and ok:   # the tuples of these configs hold integers (layers, grid values)
            ok = all(type(x) is int for x in value)
        if not ok or isinstance(value, bool) is not isinstance(defaults[key], bool):
            raise TrainError(f"{where}: `{key}` should be like {defaults[key]!r}, got {value!r}")
        out[key] = value
    return out


def load_recipe(path: str | Path, data_dir: str | Path) -> Recipe:
    path, data_dir = Path(path), Path(data_dir)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TrainError(f"{path}: unreadable recipe ({e})") from None
    unknown = sorted(set(doc) - {"artifact", "data", "train", "tune"})
    if unknown:
        raise TrainError(f"{path}: unknown key(s) {', '.join(unknown)} (known: artifact, data, train, tune)")
    artifact = doc.get("artifact")
    if not isinstance(artifact, str) or PurePath(artifact).name != artifact:
        raise TrainError(f"{path}: `artifact` must be the built head's file name, got {artifact!r}")
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise TrainError(f"{path}: no [[data]] tables")
    sources = []
    for i, table in enumerate(data):
        where = f"{path}: [[data]] #{i + 1}"
        _fields(table, {"file": "", "start": 0, "stop": 0}, where)
        sources.append(_range(table, data_dir, where))
    train_keys = {f.name: f.default for f in fields(TrainConfig) if f.name not in NOT_RECIPE_KEYS}
    train = TrainConfig(sources=tuple(sources), **_fields(doc.get("train", {}), train_keys, f"{path}: [train]"))
    tune = None
    if "tune" in doc:
        table, where = doc["tune"], f"{path}: [tune]"
        if not isinstance(table, dict):
            raise TrainError(f"{where}: expected a table, got {table!r}")
        held_out = _range(table, data_dir, where)
        grid_keys = {f.name: f.default for f in fields(TuneConfig) if f.name != "held_out"}
        rest = {k: v for k, v in table.items() if k not in ("file", "start", "stop")}
        tune = TuneConfig(held_out=held_out, **_fields(rest, grid_keys, where))
    return Recipe(train=train, tune=tune, artifact=path.parent / artifact)


__all__ = ["NOT_RECIPE_KEYS", "Recipe", "load_recipe"]
