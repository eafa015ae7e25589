"""Where profiles live on disk.

Contract: `home()` is $ASSISTANT_HOME when set, else platformdirs'
user_data_dir("assistant"); profiles live in `home()/profiles/<name>/`.
Profile names are 1-64 characters of letters, digits, '.', '_' and '-', not
starting with '.' or '-' (so a name is never a path). `default_name()` is
$ASSISTANT_PROFILE when set, else "default".
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import platformdirs

from assistant.profiles.errors import ProfileError

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")

CONFIG_FILE = "profile.toml"
HEADS_DIR = "heads"
HISTORY_FILE = "history.sqlite"
LOCK_FILE = ".lock"


def home() -> Path:
    root = os.environ.get("ASSISTANT_HOME") or platformdirs.user_data_dir("assistant")
    return Path(root).expanduser()


def profiles_root() -> Path:
    return home() / "profiles"


def default_name() -> str:
    return os.environ.get("ASSISTANT_PROFILE") or "default"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ProfileError(f"invalid profile name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


def profile_dir(name: str) -> Path:
    return profiles_root() / check_name(name)
