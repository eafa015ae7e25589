"""Crash-safe file writes: temp file in the same folder, fsync, os.replace, fsync the folder.

Contract: after `atomic_write_bytes(path, data)` returns, `path` holds exactly
`data` and survives a crash or power loss; if the process dies at any point
before that, `path` holds its old content (or does not exist) and at most a
`.<name>.tmp-<pid>-*` file is left behind, which `clean_temp(folder)` removes once
its writer is gone (a live writer's temp file is never touched: two processes
opening one profile at once must not delete each other's half-written files).
Every file written here is private to the user (0600). `copy_file_durably(src, dst)`
copies and fsyncs (dst must be a fresh path). `private_file(path)` creates an empty
0600 file (or narrows an existing one) for writers that are not atomic (SQLite, logs).
`read_json(path, damaged)` reads back a JSON file written here: {} when absent, `damaged(reason)`
raised (chained) when it cannot be read or parsed.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

TMP_MARK = ".tmp-"
CHUNK = 1 << 20


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so that renames/creations inside it are durable (no-op where unsupported)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_chunks(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:CHUNK])
        view = view[n:]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)      # a profile's folders are private too
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}{os.getpid()}-")
    try:
        write_chunks(fd, data)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_json(path: str | os.PathLike, damaged: Callable[[str], Exception]) -> Any:
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise damaged(str(e)) from e


def copy_file_durably(src: str | os.PathLike, dst: str | os.PathLike) -> int:
    """Copy src to a NEW file dst (fails if it exists) and fsync it; returns the byte count."""
    n = 0
    with open(src, "rb") as fin:
        fd = os.open(os.fspath(dst), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            while chunk := fin.read(CHUNK):
                write_chunks(fd, chunk)
                n += len(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
    return n


def private_file(path: str | os.PathLike) -> Path:
    """Make sure `path` exists and only its owner can read or write it (0600)."""
    path = Path(path)
    try:
        os.close(os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:          # removed between the two calls (SQLite drops -wal/-shm on close)
            return path
        if mode & 0o077 and not path.is_dir():
            try:
                os.chmod(path, mode & 0o700)
            except OSError:                # not ours to change: reading it still works
                pass
    return path


def _writer_alive(name: str) -> bool:
    """Whether the process that named a temp file `.<x>.tmp-<pid>-*` still runs (True when unsure)."""
    try:
        pid = int(name.split(TMP_MARK, 1)[1].split("-", 1)[0])
    except (IndexError, ValueError):
        return False                       # an old-style name: its writer finished long ago
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def clean_temp(folder: str | os.PathLike) -> list[Path]:
    """Remove temp files left by crashed atomic writes in `folder` (not those of live writers);
    returns what was removed."""
    removed = []
    for p in Path(folder).glob(f".*{TMP_MARK}*"):
        if p.is_file() and not _writer_alive(p.name):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed
