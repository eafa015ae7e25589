"""history.sqlite: conversations, messages, accepted answers and their decoding statistics.

Contract: `HistoryStore(path)` opens (creating) the database in WAL mode with
synchronous=FULL (a returned write survives a crash and a power loss) and brings
the schema to the newest version with the numbered MIGRATIONS (SQL, or a function
of the connection for a step that rewrites data), each applied in its own
transaction and recorded in PRAGMA user_version. Rows are the data model of
assistant.types: `Conversation`, and `Message` whose `stats` (an `AnswerStats`)
is stored as `AnswerStats.to_dict()` JSON and read back with `from_dict`. Every
public write is one transaction: a crash leaves it wholly in or wholly out.
Several processes may read while one writes (WAL); writers wait up to `timeout`
seconds for each other. A file that is not a SQLite database, or one written by
a newer program, raises ProfileError with one line naming the file. Timestamps
are Unix seconds. Safe to share between threads (one connection behind a lock).
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from assistant.profiles.atomic import private_file
from assistant.profiles.errors import ProfileError
from assistant.types import ROLES, AnswerStats, Conversation, Message

# `assistant ask` once stored its counts under the names of its --json output
_OLD_ASK_NAMES = {"new_tokens": "tokens", "forward_passes": "passes", "drafted_tokens": "drafted"}


def _rename_ask_stats(db: sqlite3.Connection) -> None:
    """Rewrite answer statistics stored in the old `ask` shape (new_tokens, forward_passes,
    drafted_tokens, tokens_per_second) in the shape of AnswerStats.to_dict(), keeping other keys."""
    rows = db.execute("SELECT id, stats FROM messages "
                      "WHERE stats LIKE '%new_tokens%' OR stats LIKE '%forward_passes%'").fetchall()
    for msg_id, text in rows:
        try:
            old = json.loads(text)
        except ValueError:
            continue
        if not isinstance(old, dict) or not any(k in old for k in _OLD_ASK_NAMES):
            continue
        new = {_OLD_ASK_NAMES.get(k, k): v for k, v in old.items() if k != "tokens_per_second"}
        try:
            tokens, passes = int(new.get("tokens") or 0), int(new.get("passes") or 0)
            seconds = float(new.get("seconds") or 0.0)
        except (TypeError, ValueError):
            tokens = passes = 0
            seconds = 0.0
        new["tok_per_s"] = round(tokens / seconds, 2) if seconds > 0 else 0.0
        new["tokens_per_pass"] = round(tokens / passes, 3) if passes else 0.0
        new.setdefault("banked", [])
        db.execute("UPDATE messages SET stats = ? WHERE id = ?", (json.dumps(new, sort_keys=True), msg_id))


MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
    # 1: conversations and messages
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL DEFAULT '',
        system_prompt TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        accepted INTEGER NOT NULL DEFAULT 0,
        stats TEXT,
        created REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # 2: find accepted answers fast; a key/value table for consumers (e.g. the adapter's cursor)
    """
    CREATE INDEX messages_accepted ON messages(accepted, id);
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated REAL NOT NULL);
    """,
    # 3: answer statistics written by `assistant ask` in the shape the chat reads
    _rename_ask_stats,
]
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryStore:
    def __init__(self, path: str | Path, timeout: float = 30.0):
        self.path = Path(path)
        self._lock = threading.RLock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # SQLite gives the -wal and -shm files the database file's mode: create it private first
            for p in (self.path, self.path.with_name(self.path.name + "-wal"), self.path.with_name(self.path.name + "-shm")):
                if p == self.path or p.exists():
                    private_file(p)
        except OSError as e:
            raise ProfileError(f"{self.path}: cannot create ({e.strerror or e})") from e
        try:
            self._db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None,
                                       check_same_thread=False)
        except sqlite3.Error as e:
            raise self._error(e) from e
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            mode = self._switch_to_wal(timeout)
            if str(mode).lower() != "wal":
                raise ProfileError(f"{self.path}: cannot switch to WAL mode (got {mode})")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as e:
            self._db.close()
            raise self._error(e) from e
        except ProfileError:
            self._db.close()
            raise

    def _switch_to_wal(self, timeout: float) -> str:
        """Switching a new database to WAL takes an exclusive lock and SQLite answers "database is
        locked" at once, without its busy handler, while another process opens the same new file:
        retry until `timeout` like every other write waits."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                return self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _error(self, e: Exception) -> ProfileError:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = "; move it away to start a new history" if "not a database" in msg or "malformed" in msg else ""
        return ProfileError(f"{self.path}: history database unusable ({msg}){hint}")

    def _migrate(self) -> None:
        have = self._db.execute("PRAGMA user_version").fetchone()[0]
        if have > SCHEMA_VERSION:
            raise ProfileError(f"{self.path}: schema version {have} is newer than this program knows "
                               f"({SCHEMA_VERSION}); upgrade assistant")
        for version in range(have + 1, SCHEMA_VERSION + 1):
            with self._tx() as db:
                # re-check inside the write lock: another process may have migrated meanwhile
                if db.execute("PRAGMA user_version").fetchone()[0] >= version:
                    continue
                step = MIGRATIONS[version - 1]
                if callable(step):
                    step(db)
                else:
                    for stmt in step.split(";"):
                        if stmt.strip():
                            db.execute(stmt)
                db.execute(f"PRAGMA user_version = {version}")

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator["HistoryStore"]:
        """Group several writes into one atomic transaction (nesting is allowed)."""
        with self._lock:
            if self._db.in_transaction:
                yield self
                return
            with self._wrap(), self._tx():
                yield self

    @contextmanager
    def _wrap(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise self._error(e) from e

    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        with self._lock, self._wrap():
            if self._db.in_transaction:
                return self._db.execute(sql, args)
            with self._tx() as db:
                return db.execute(sql, args)

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock, self._wrap():
            return self._db.execute(sql, args).fetchall()

    # ---- conversations -------------------------------------------------------------------
    def new_conversation(self, title: str, system_prompt: str = "") -> int:
        now = time.time()
        cur = self._write("INSERT INTO conversations (title, system_prompt, created, updated) VALUES (?, ?, ?, ?)",
                          (title, system_prompt, now, now))
        return int(cur.lastrowid)

    def list_conversations(self) -> list[Conversation]:
        rows = self._read("SELECT id, title, system_prompt, created, updated FROM conversations "
                          "ORDER BY updated DESC, id DESC")
        return [Conversation(*r) for r in rows]

    def get_conversation(self, conv_id: int) -> Conversation:
        rows = self._read("SELECT id, title, system_prompt, created, updated FROM conversations WHERE id = ?",
                          (conv_id,))
        if not rows:
            raise ProfileError(f"{self.path}: no conversation {conv_id}")
        return Conversation(*rows[0])

    def _touch(self, sql: str, args: tuple, conv_id: int) -> None:
        with self.transaction():
            if self._write(sql, args).rowcount == 0:
                raise ProfileError(f"{self.path}: no conversation {conv_id}")

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self._touch("UPDATE conversations SET title = ?, updated = ? WHERE id = ?", (title, time.time(), conv_id), conv_id)

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        self._touch("UPDATE conversations SET system_prompt = ?, updated = ? WHERE id = ?",
                    (text, time.time(), conv_id), conv_id)

    def delete_conversation(self, conv_id: int) -> None:
        self._touch("DELETE FROM conversations WHERE id = ?", (conv_id,), conv_id)

    # ---- messages ----------------------------------------------------------------------
    def add_message(self, conv_id: int, role: str, content: str, accepted: bool = False,
                    stats: AnswerStats | None = None) -> int:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        now = time.time()
        with self.transaction():
            self._touch("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id), conv_id)
            cur = self._write("INSERT INTO messages (conversation_id, role, content, accepted, stats, created) "
                              "VALUES (?, ?, ?, ?, ?, ?)",
                              (conv_id, role, content, int(bool(accepted)),
                               None if stats is None else json.dumps(stats.to_dict(), sort_keys=True), now))
            return int(cur.lastrowid)

    def messages(self, conv_id: int) -> list[Message]:
        rows = self._read("SELECT id, conversation_id, role, content, accepted, stats, created FROM messages "
                          "WHERE conversation_id = ? ORDER BY id", (conv_id,))
        return [self._message(r) for r in rows]

    @staticmethod
    def _message(r: tuple) -> Message:
        stats = None if r[5] is None else AnswerStats.from_dict(json.loads(r[5]), r[3])
        return Message(id=r[0], conversation_id=r[1], role=r[2], content=r[3], accepted=bool(r[4]),
                       stats=stats, created=r[6])

    def mark_accepted(self, msg_id: int, accepted: bool = True) -> None:
        with self.transaction():
            if self._write("UPDATE messages SET accepted = ? WHERE id = ?", (int(accepted), msg_id)).rowcount == 0:
                raise ProfileError(f"{self.path}: no message {msg_id}")

    def accepted_answers(self, since_id: int = 0) -> list[tuple[int, list[dict[str, str]], str]]:
        """(answer id, the conversation before it as role/content dicts, answer) for accepted
        assistant messages with id > since_id, oldest first. The conversation's system prompt,
        when set, comes first as a system message."""
        with self._lock, self._wrap():
            self._db.execute("BEGIN")  # one snapshot for the whole read
            try:
                answers = self._db.execute(
                    "SELECT m.id, m.conversation_id, m.content, c.system_prompt FROM messages m "
                    "JOIN conversations c ON c.id = m.conversation_id "
                    "WHERE m.accepted = 1 AND m.role = 'assistant' AND m.id > ? ORDER BY m.id", (since_id,)).fetchall()
                out = []
                for msg_id, conv_id, content, system_prompt in answers:
                    before = self._db.execute("SELECT role, content FROM messages WHERE conversation_id = ? "
                                              "AND id < ? ORDER BY id", (conv_id, msg_id)).fetchall()
                    ctx = [{"role": r, "content": c} for r, c in before]
                    if system_prompt and not any(m["role"] == "system" for m in ctx):
                        ctx.insert(0, {"role": "system", "content": system_prompt})
                    out.append((msg_id, ctx, content))
            finally:
                self._db.execute("COMMIT")
        return out

    def answer_texts(self, since_id: int = 0) -> list[str]:
        """The text of accepted assistant messages with id > since_id, oldest first (the runtime's lookup in
        the user's past answers reads them at start)."""
        return [c for (c,) in self._read("SELECT content FROM messages WHERE accepted = 1 AND role = 'assistant' "
                                         "AND id > ? ORDER BY id", (since_id,))]

    def count_accepted(self, since_id: int = 0) -> int:
        """How many accepted assistant messages have id > since_id (the answers an adapter has not read yet)."""
        (n,), = self._read("SELECT COUNT(*) FROM messages WHERE accepted = 1 AND role = 'assistant' AND id > ?",
                           (since_id,))
        return int(n)

    def counts(self) -> dict[str, int]:
        (c,), = self._read("SELECT COUNT(*) FROM conversations")
        (m, a), = self._read("SELECT COUNT(*), COALESCE(SUM(accepted), 0) FROM messages")
        return {"conversations": c, "messages": m, "accepted": a}

    # ---- key/value state for consumers ---------------------------------------------------
    def get_state(self, key: str, default: Any = None) -> Any:
        rows = self._read("SELECT value FROM kv WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    def set_state(self, key: str, value: Any) -> None:
        self._write("INSERT INTO kv (key, value, updated) VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                    "value = excluded.value, updated = excluded.updated", (key, json.dumps(value), time.time()))

    def check(self) -> str | None:
        """None when SQLite's integrity check passes, else a one-line problem naming the file."""
        rows = self._read("PRAGMA integrity_check")
        ok = rows and rows[0][0] == "ok"
        return None if ok else f"{self.path}: integrity check failed ({rows[0][0] if rows else 'no answer'})"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "HistoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
