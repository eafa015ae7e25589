"""Versioned, immutable head artifacts with an atomically switched CURRENT pointer.

Layout under `<profile>/heads/`:
    v000001/head.safetensors   the artifact (one safetensors file: head + vocabulary, never a pickle)
    v000001/meta.json          {"version", "created", "size", "sha256", ...caller's meta}
    v000001/head.slices.jsonl  (optional) a companion file published with it: its held-back prompts
    CURRENT                    one line: the version in use
    .lock                      filelock: one writer (publish/prune/set_current) at a time

Contract:
- `publish(src, meta, companions=)` validates src (safetensors header), copies it (and the companion
  files) into a
  hidden staging folder, fsyncs, renames the folder to the next version,
  fsyncs heads/, then replaces CURRENT atomically, then prunes to `keep`
  versions. A crash at any point leaves CURRENT at the old version or the new
  complete one; staging leftovers are ignored by readers and removed by the next
  writer.
- `current()` returns the artifact path of CURRENT's version when it validates
  (header + size), else the newest good version, reporting the damaged one
  (one line naming the file) through `report` (once per store) and in `problems`.
  None when no version is good (also reported: the shipped head answers then). Readers take no lock: versions are immutable once visible.
- `versions()` lists complete versions, oldest first; `prune(keep)` removes the
  oldest beyond `keep`, never CURRENT's.
Nothing here imports torch.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from filelock import FileLock, Timeout

from assistant.profiles.atomic import atomic_write_text, clean_temp, copy_file_durably, fsync_dir, read_json
from assistant.profiles.errors import ProfileError

ARTIFACT = "head.safetensors"
META = "meta.json"
CURRENT = "CURRENT"
LOCK = ".lock"
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"
VERSION_RE = re.compile(r"^v(\d{6,})$")

log = logging.getLogger("assistant.profiles.heads")


def check_artifact(path: str | Path, expected_size: int | None = None) -> str | None:
    """None when `path` is a readable safetensors file, else a one-line reason naming it (no torch)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path}: missing"
    except OSError as e:
        return f"{path}: unreadable ({e.strerror or e})"
    if expected_size is not None and size != expected_size:
        return f"{path}: damaged head artifact ({size} bytes, expected {expected_size}: truncated or overwritten)"
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            f.keys()
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a damaged file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return f"{path}: damaged head artifact ({first})"
    return None


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class HeadStore:
    def __init__(self, root: str | Path, keep: int = 5, lock_timeout: float = 60.0,
                 report: Callable[[str], None] | None = None):
        self.root = Path(root)
        self.keep = keep
        self.lock_timeout = lock_timeout
        self.report = report or log.warning
        self.problems: list[str] = []
        self._reported: set[str] = set()      # each damaged file is reported once per store, not per read

    # ---- reading (no lock) -------------------------------------------------------------
    def versions(self) -> list[str]:
        """Complete versions (their folder exists under its final name), oldest first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p.name) for p in self.root.iterdir()
                 if (m := VERSION_RE.match(p.name)) and p.is_dir()]
        return [name for _, name in sorted(found)]

    def path_of(self, version: str) -> Path:
        if not VERSION_RE.match(version):
            raise ProfileError(f"{self.root}: not a head version: {version!r}")
        return self.root / version / ARTIFACT

    def meta(self, version: str) -> dict[str, Any]:
        p = self.root / version / META
        return read_json(p, lambda e: ProfileError(f"{p}: damaged version metadata ({e})"))

    def check(self, version: str, deep: bool = False) -> str | None:
        """None when the version is good, else a one-line reason naming the damaged file."""
        try:
            meta = self.meta(version)
        except ProfileError as e:
            return str(e)
        path = self.path_of(version)
        size = meta.get("size") if isinstance(meta.get("size"), int) else None
        problem = check_artifact(path, size)
        if problem is None and deep and meta.get("sha256") and sha256_file(path) != meta["sha256"]:
            problem = f"{path}: damaged head artifact (sha256 does not match meta.json)"
        return problem

    def _read_pointer(self) -> tuple[bool, str | None]:
        """(CURRENT exists, the version it names or None when it is unreadable), from one read."""
        try:
            text = (self.root / CURRENT).read_text("utf-8").strip()
        except FileNotFoundError:
            return False, None
        except (OSError, UnicodeDecodeError):
            return True, None
        return True, (text if VERSION_RE.match(text) else None)

    def current_version(self) -> str | None:
        """The version CURRENT names (unchecked), or None when there is no usable pointer."""
        return self._read_pointer()[1]

    def current(self) -> Path | None:
        """The artifact to use: CURRENT's if good, else the newest good version (reported)."""
        for _ in range(3):
            exists, wanted = self._read_pointer()
            if wanted is None or wanted in self.versions() or self._read_pointer()[1] == wanted:
                break  # else a writer switched and pruned meanwhile: read again
        return self._resolve(exists, wanted)

    def _resolve(self, exists: bool, wanted: str | None) -> Path | None:
        self.problems = []
        versions = self.versions()  # listed after reading the pointer: a version exists before CURRENT names it
        if exists and wanted is None:
            self._problem(f"{self.root / CURRENT}: damaged pointer, using the newest good version")
        if wanted is not None:
            problem = self.check(wanted) if wanted in versions else f"{self.path_of(wanted)}: missing"
            if problem is None:
                return self.path_of(wanted)
            self._problem(problem)
        for v in reversed(versions):
            if v == wanted:
                continue
            problem = self.check(v)
            if problem is None:
                if wanted is not None:
                    self._problem(f"{self.root}: falling back to head version {v} (CURRENT names {wanted})")
                return self.path_of(v)
            self._problem(problem)
        if versions:
            self._problem(f"{self.root}: no head version is usable; answers use the shipped head")
        return None

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        if message not in self._reported:
            self._reported.add(message)
            self.report(message)

    # ---- writing (under the lock) ----------------------------------------------------------
    def lock(self, timeout: float | None = None) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return FileLock(str(self.root / LOCK), timeout=self.lock_timeout if timeout is None else timeout)

    def _acquire(self):
        lk = self.lock()
        try:
            lk.acquire()
        except Timeout as e:
            raise ProfileError(f"{self.root / LOCK}: another process is writing head versions "
                               f"(waited {self.lock_timeout:.0f}s)") from e
        return lk

    def publish(self, src_file: str | Path, meta: dict[str, Any] | None = None, prune: bool = True,
                companions: Mapping[str, str | Path] | None = None) -> str:
        """Copy `src_file` in as a new immutable version and make it CURRENT; returns the version id.
        `companions` ({file name: source file}) are copied into the version beside its artifact (e.g. the
        head's held-back prompts, assistant.adapt.datasets.slices_path), in the same atomic step."""
        src = Path(src_file)
        problem = check_artifact(src)
        if problem is not None:
            raise ProfileError(problem)
        for name in companions or {}:
            if name in (ARTIFACT, META) or Path(name).name != name or name.startswith("."):
                raise ProfileError(f"{self.root}: {name!r} cannot be a file beside a head version's artifact")
        lk = self._acquire()
        try:
            self._clean()
            versions = self.versions()
            n = int(VERSION_RE.match(versions[-1]).group(1)) + 1 if versions else 1
            version = f"v{n:06d}"
            staging = self.root / f"{STAGING_PREFIX}{version}-{uuid.uuid4().hex[:8]}"
            staging.mkdir()
            size = copy_file_durably(src, staging / ARTIFACT)
            for name, path in (companions or {}).items():
                copy_file_durably(path, staging / name)
            full_meta = {**(meta or {}), "version": version, "created": time.time(), "size": size,
                         "sha256": sha256_file(staging / ARTIFACT), "source": src.name}
            atomic_write_text(staging / META, json.dumps(full_meta, indent=1, sort_keys=True))
            fsync_dir(staging)
            os.rename(staging, self.root / version)
            fsync_dir(self.root)
            self._set_current(version)
            if prune:
                self._prune(self.keep)
            return version
        finally:
            lk.release()

    def set_current(self, version: str) -> None:
        """Point CURRENT at an existing good version (e.g. a rollback)."""
        lk = self._acquire()
        try:
            if version not in self.versions():
                raise ProfileError(f"{self.path_of(version).parent}: no such head version")
            problem = self.check(version, deep=True)
            if problem:
                raise ProfileError(problem)
            self._set_current(version)
        finally:
            lk.release()

    def _set_current(self, version: str) -> None:
        atomic_write_text(self.root / CURRENT, version + "\n")

    def prune(self, keep: int | None = None) -> list[str]:
        """Remove the oldest versions beyond `keep` (never CURRENT's); returns the removed ids."""
        lk = self._acquire()
        try:
            return self._prune(self.keep if keep is None else keep)
        finally:
            lk.release()

    def _prune(self, keep: int) -> list[str]:
        keep = max(1, keep)
        versions = self.versions()
        current = self.current_version()
        removable = [v for v in versions if v != current]
        excess = len(versions) - keep
        removed = []
        for v in removable[:max(0, excess)]:
            trash = self.root / f"{TRASH_PREFIX}{v}-{uuid.uuid4().hex[:8]}"
            os.rename(self.root / v, trash)  # atomic: readers never see a half-deleted version
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(v)
        if removed:
            fsync_dir(self.root)
        return removed

    def _clean(self) -> None:
        """Remove leftovers of crashed writers (caller holds the lock)."""
        for p in self.root.iterdir():
            if p.name.startswith((STAGING_PREFIX, TRASH_PREFIX)) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        clean_temp(self.root)
