"""One user's profile: a directory holding profile.toml, heads/ and history.sqlite.

Contract: `Profile.open(name=None, create=True)` opens `paths.profile_dir(name)`
(name None: $ASSISTANT_PROFILE or "default"), creating the directory and a
default profile.toml when `create` is true, else raising ProfileError when it
does not exist; the folder is made private to the user (0700) and every file the
project writes in it is 0600. It reads profile.toml at once: a malformed file raises
ProfileError naming it (with strict=False the defaults are used and the problem
is kept in `problems`); the file itself is never rewritten by opening. `heads`
and `history` open lazily, so a damaged history.sqlite does not stop the
config or the heads from working (and vice versa).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from assistant.profiles.atomic import clean_temp
from assistant.profiles.config import ProfileConfig, load_config, save_config
from assistant.profiles.errors import ProfileError
from assistant.profiles.heads import HeadStore
from assistant.profiles.history import HistoryStore
from assistant.profiles.paths import (CONFIG_FILE, HEADS_DIR, HISTORY_FILE, NAME_RE, check_name, default_name,
                                      profile_dir, profiles_root)


def _make_private(path: Path) -> None:
    """A profile holds one person's chats: its folder is the owner's alone (0700)."""
    try:
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError:
        pass


@dataclass
class Profile:
    name: str
    path: Path
    config: ProfileConfig
    problems: list[str] = field(default_factory=list)
    _heads: HeadStore | None = field(default=None, repr=False)
    _history: HistoryStore | None = field(default=None, repr=False)

    @classmethod
    def open(cls, name: str | None = None, create: bool = True, strict: bool = True) -> "Profile":
        name = check_name(name or default_name())
        path = profile_dir(name)
        cfg_path = path / CONFIG_FILE
        if not path.is_dir():
            if not create:
                raise ProfileError(f"{path}: no profile named {name!r} (create it with: assistant profile create {name})")
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.mkdir(exist_ok=True, mode=0o700)
        _make_private(path)
        if not cfg_path.exists() and create:
            save_config(cfg_path, ProfileConfig())
        clean_temp(path)
        problems: list[str] = []
        try:
            config = load_config(cfg_path)
        except ProfileError as e:
            if strict:
                raise
            problems.append(str(e))
            config = ProfileConfig()
        return cls(name=name, path=path, config=config, problems=problems)

    @staticmethod
    def list() -> list[str]:
        root = profiles_root()
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if p.is_dir() and NAME_RE.match(p.name))

    @staticmethod
    def exists(name: str) -> bool:
        return profile_dir(name).is_dir()

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def history_path(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def heads(self) -> HeadStore:
        if self._heads is None:
            self._heads = HeadStore(self.path / HEADS_DIR, keep=self.config.keep_versions)
        return self._heads

    @property
    def history(self) -> HistoryStore:
        if self._history is None:
            self._history = HistoryStore(self.history_path)
        return self._history

    def update_config(self, **changes: object) -> ProfileConfig:
        """Validate, save atomically and use new settings."""
        self.config = self.config.with_changes(**changes)
        save_config(self.config_path, self.config)
        if self._heads is not None:
            self._heads.keep = self.config.keep_versions
        return self.config

    def close(self) -> None:
        if self._history is not None:
            self._history.close()
            self._history = None

    def __enter__(self) -> "Profile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
