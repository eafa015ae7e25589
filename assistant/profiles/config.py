"""profile.toml: the settings of one profile, validated, written atomically.

Contract: `load_config(path)` returns a frozen `ProfileConfig` (defaults when the
file does not exist) or raises ProfileError with ONE line naming the file and,
where it applies, the key. `save_config(path, config)` writes the file
atomically (assistant.profiles.atomic), so a crash leaves the old or the new file, never a
truncated one. The file layout:

    target = "default"          # "default", a local checkpoint dir, or a model id
    dtype = "auto"              # auto | fp32 | bf16 | int8 (auto: bf16 where the hardware has it, else fp32)
    memory_budget = "8GiB"      # optional: the runtime must fit in it
    tree_width = 16             # verify nodes per pass
    max_new_tokens = 512
    system_prompt = ""
    keep_versions = 5           # head versions kept in heads/
    threads = 2                 # optional: torch threads of the answers (default: measured, fitted to the load)
    history_lookup = true       # draft from this profile's past answers too (assistant.runtime.history_lookup)
    history_tokens = 1000000    # most tokens of past answers it indexes, newest kept (4 bytes each)
    [adapter]
    enabled = true
    min_new_answers = 20        # accepted answers before a cycle
    interval_s = 300            # seconds between cycles at most
    row_budget = 8000           # draft-vocabulary rows
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from assistant.profiles.atomic import atomic_write_text
from assistant.profiles.errors import ProfileError
from assistant.runtime.sizes import parse_size
from assistant.runtime.width import DEFAULT_WIDTH

DTYPES = ("auto", "fp32", "bf16", "int8")


@dataclass(frozen=True)
class ProfileConfig:
    target: str = "default"
    dtype: str = "auto"
    memory_budget: str | None = None
    tree_width: int = DEFAULT_WIDTH
    max_new_tokens: int = 512
    system_prompt: str = ""
    keep_versions: int = 5
    threads: int | None = None
    history_lookup: bool = True
    history_tokens: int = 1_000_000
    adapter_enabled: bool = True
    adapter_min_new_answers: int = 20
    adapter_interval_s: float = 300
    row_budget: int = 8000

    @property
    def memory_budget_bytes(self) -> int | None:
        return None if self.memory_budget is None else parse_size(self.memory_budget)

    def with_changes(self, **changes: Any) -> "ProfileConfig":
        """A validated copy with some fields changed (ProfileError on a bad value)."""
        return from_mapping({**asdict(self), **changes}, source="profile settings", flat=True)

    def to_toml(self) -> str:
        lines = ["# assistant profile settings (see assistant/profiles/config.py for every key)"]
        for key in TOP_KEYS:
            value = getattr(self, key)
            if value is None:
                lines.append(f"# {key} = {_EXAMPLES[key]}")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
        lines += ["", "[adapter]"]
        for key, field_name in ADAPTER_KEYS.items():
            lines.append(f"{key} = {_toml_value(getattr(self, field_name))}")
        return "\n".join(lines) + "\n"


TOP_KEYS = ("target", "dtype", "memory_budget", "tree_width", "max_new_tokens", "system_prompt", "keep_versions",
            "threads", "history_lookup", "history_tokens")
_EXAMPLES = {"memory_budget": '"8GiB"', "threads": "2"}     # optional keys, shown commented out
ADAPTER_KEYS = {"enabled": "adapter_enabled", "min_new_answers": "adapter_min_new_answers",
                "interval_s": "adapter_interval_s", "row_budget": "row_budget"}
_TYPES = {f.name: f.type for f in fields(ProfileConfig)}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v), ensure_ascii=False)  # JSON string escapes are valid TOML basic-string escapes


def _check(field_name: str, key: str, v: Any, where: str) -> Any:
    def bad(msg: str) -> ProfileError:
        return ProfileError(f"{where}: key '{key}': {msg}, got {v!r}")

    t = _TYPES[field_name]
    if "bool" in t:
        if not isinstance(v, bool):
            raise bad("expected true or false")
        return v
    if "float" in t:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise bad("expected a positive number")
        return v
    if v is None and field_name == "threads":
        return None
    if "int" in t:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad("expected a positive integer")
        if field_name == "tree_width" and v > 1024:
            raise bad("expected at most 1024")
        return v
    if v is None and field_name == "memory_budget":
        return None
    if not isinstance(v, str):
        raise bad("expected a string")
    if field_name == "dtype" and v not in DTYPES:
        raise bad(f"expected one of {', '.join(DTYPES)}")
    if field_name == "target" and not v.strip():
        raise bad("expected a model name or directory")
    if field_name == "memory_budget":
        try:
            parse_size(v)
        except ValueError as e:
            raise bad(str(e).split(":")[0]) from None
    return v


def from_mapping(data: Mapping[str, Any], source: str = "profile.toml", flat: bool = False) -> ProfileConfig:
    """Validate a parsed TOML document (or, with flat=True, a field-name mapping)."""
    values: dict[str, Any] = {}
    for key, v in data.items():
        if flat and key in _TYPES:
            values[key] = _check(key, key, v, source)
        elif key in TOP_KEYS:
            values[key] = _check(key, key, v, source)
        elif key == "adapter" and not flat:
            if not isinstance(v, dict):
                raise ProfileError(f"{source}: key 'adapter': expected a table [adapter]")
            for sub, sv in v.items():
                if sub not in ADAPTER_KEYS:
                    raise ProfileError(f"{source}: unknown key 'adapter.{sub}' (known: {', '.join(ADAPTER_KEYS)})")
                values[ADAPTER_KEYS[sub]] = _check(ADAPTER_KEYS[sub], f"adapter.{sub}", sv, source)
        else:
            known = ", ".join((*TOP_KEYS, "[adapter]"))
            raise ProfileError(f"{source}: unknown key '{key}' (known: {known})")
    return ProfileConfig(**values)


def load_config(path: str | Path) -> ProfileConfig:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return ProfileConfig()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML: {e}") from e
    return from_mapping(data, source=str(path))


def save_config(path: str | Path, config: ProfileConfig) -> None:
    atomic_write_text(path, config.to_toml())
