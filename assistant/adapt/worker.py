"""The background adapter: runs cycles beside the chat without blocking it.

Contract: `AdapterWorker(profile_name, target=None, busy=None, ...)`:
- `start()` runs the loop in a daemon thread whose nice value is raised by `nice`
  (os.nice in that thread: on Linux a thread's nice value is its own), and, with
  `watch=True`, a watchdog observer on the profile folder: any change of
  history.sqlite or its -wal file (an atomic replace arrives as FileMovedEvent:
  its dest_path is checked too) wakes the loop; `notify()` does the same from the
  session. `run_forever()` is the same loop in the calling thread (`assistant
  adapt --watch`).
- The schedule is the profile's [adapter] table, re-read every wake-up: nothing
  runs when `enabled` is false; a cycle runs when at least `min_new_answers`
  accepted answers are pending, or when some are pending and `interval_s` passed
  since the last cycle (or, for a profile that never adapted, since start()).
- Threads: the loop's thread runs torch on `threads` intra-op threads (default 1; None:
  as the process, for `assistant adapt --watch`), see `limit_torch_threads`.
- Yielding: `pause()` (called by assistant.adapt.cycle between units of work) blocks while
  an answer is being generated: the `busy` Event is set (same process) or the
  profile's adapter/generating marker names a live process and is fresh (another
  process; see `generating()`). `stop()` makes pause() raise CycleCancelled.
- Failures never reach the chat: an exception in a cycle is logged, recorded as
  state.last_error and retried after a back-off. Killing the worker at any point
  is safe: the head publish is atomic and the state is written after it.
- `state` says what the loop does (idle | waiting | running | failed | stopped), `stage`
  which stage of assistant.adapt.cycle a running cycle is in (None between cycles).
- `on_publish(version, path)` is called after a new head was published (the
  session swaps it in between answers: `Session.maybe_reload_head(path)`).
`generating(profile_path, busy)` is the context manager a session wraps around
an answer; assistant.session.Session.answer does that itself.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from assistant.adapt.config import CycleConfig
from assistant.adapt.state import BUSY_FILE, AdapterBusy, CycleCancelled, adapter_dir, read_state, write_state
from assistant.profiles.atomic import atomic_write_text

log = logging.getLogger("assistant.adapt.worker")
BUSY_FRESH_S = 600.0      # a marker older than this is from a process that died mid-answer


def limit_torch_threads(n: int) -> None:
    """Run this thread's torch CPU ops on `n` intra-op threads, leaving every other thread as it was.

    A second thread that runs torch ops on all cores keeps its own OpenMP team alive, and the chat's
    answers then ran 15-30% slower even while that thread slept (scripts/adapt_latency.py,
    BENCHMARKS.md). torch.set_num_threads sets the calling thread's OpenMP/MKL count but also the
    default that threads which have not run a parallel op yet pick up (the chat answers in fresh
    threads), so the default is put back from a throwaway thread afterwards."""
    import torch

    default = torch.get_num_threads()      # also initialises this thread's count, so the next call sticks
    if n >= default:
        return
    torch.set_num_threads(max(1, n))
    restore = threading.Thread(target=torch.set_num_threads, args=(default,), name="torch-threads")
    restore.start()
    restore.join()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def marker_busy(profile_path: str | Path) -> bool:
    """True while another process marks the profile as generating an answer."""
    p = adapter_dir(profile_path) / BUSY_FILE
    try:
        st = p.stat()
        pid = int(p.read_text().strip() or 0)
    except (FileNotFoundError, ValueError, OSError):
        return False
    return time.time() - st.st_mtime < BUSY_FRESH_S and pid > 0 and _alive(pid)


@contextmanager
def generating(profile_path: str | Path | None = None, busy: threading.Event | None = None) -> Iterator[None]:
    """Mark an answer in progress (Event for this process, marker file for others)."""
    marker = adapter_dir(profile_path) / BUSY_FILE if profile_path is not None else None
    if busy is not None:
        busy.set()
    if marker is not None:
        try:
            atomic_write_text(marker, str(os.getpid()))
        except OSError:
            marker = None
    try:
        yield
    finally:
        if busy is not None:
            busy.clear()
        if marker is not None:
            try:
                marker.unlink()
            except OSError:
                pass


def pending_answers(profile) -> int:
    """Accepted answers newer than the adapter's cursor."""
    since = int(read_state(profile.path).get("last_msg_id", 0) or 0)
    return profile.history.count_accepted(since)


def is_due(config, pending: int, last_cycle_time: float | None, now: float) -> bool:
    if not config.adapter_enabled or pending <= 0:
        return False
    if pending >= config.adapter_min_new_answers:
        return True
    return last_cycle_time is None or now - last_cycle_time >= config.adapter_interval_s


class AdapterWorker:
    def __init__(self, profile_name: str | None = None, target: Any = None, busy: threading.Event | None = None,
                 config: CycleConfig = CycleConfig(), watch: bool = True, nice: int = 10, poll_s: float = 30.0,
                 backoff_s: float = 60.0, on_publish: Callable[[str, Path], None] | None = None,
                 on_report: Callable[[dict], None] | None = None, cycle_fn: Callable | None = None,
                 threads: int | None = 1):
        self.profile_name = profile_name
        self.target = target
        self.busy = busy if busy is not None else threading.Event()
        self.config = config
        self.watch, self.nice, self.poll_s, self.backoff_s = watch, nice, poll_s, backoff_s
        self.on_publish, self.on_report = on_publish, on_report
        self.cycle_fn = cycle_fn
        self.threads = threads      # torch threads of the loop's thread (None: as the process)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer = None
        self.reports: list[dict] = []
        self.errors: list[str] = []
        self.last_attempt: float | None = None
        self.pending_head: Path | None = None   # the newest published head, for the session to swap in
        self.state = "idle"         # idle | waiting | running | failed | stopped
        self.stage: str | None = None   # the running cycle's stage (assistant.adapt.cycle on_stage), None between cycles
        self.started_at = time.time()   # a profile that never adapted waits interval_s from here

    # -- wiring ------------------------------------------------------------
    def _profile(self):
        from assistant.profiles import Profile

        return Profile.open(self.profile_name)

    def notify(self) -> None:
        self._wake.set()

    def _start_observer(self, path: Path) -> None:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        names = {"history.sqlite", "history.sqlite-wal"}
        worker = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                for p in (getattr(event, "src_path", None), getattr(event, "dest_path", None)):
                    if p and os.path.basename(os.fsdecode(p)) in names:
                        worker.notify()
                        return

        obs = Observer()
        obs.schedule(Handler(), str(path), recursive=False)
        obs.daemon = True
        obs.start()
        self._observer = obs

    def start(self) -> "AdapterWorker":
        self.started_at = time.time()
        self._thread = threading.Thread(target=self.run_forever, name="adapter", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._observer is not None:
            self._observer.stop()
            self._observer = None
        self.state = "stopped"

    @property
    def alive(self) -> bool:
        """True while the loop's thread still runs (e.g. inside a long torch call after stop())."""
        return self._thread is not None and self._thread.is_alive()

    # -- yielding ------------------------------------------------------------
    def pause(self, profile_path: Path | None = None) -> None:
        """Block while an answer is being generated; raise CycleCancelled when stopping."""
        while True:
            if self._stop.is_set():
                raise CycleCancelled("adapter stopping")
            if not (self.busy.is_set() or (profile_path is not None and marker_busy(profile_path))):
                return
            self.state = "waiting"
            time.sleep(0.1)     # each wake-up takes the GIL from the answering thread: poll gently

    # -- the loop ----------------------------------------------------------------
    def run_forever(self) -> None:
        if self.nice:
            try:
                os.nice(self.nice)
            except OSError:
                pass
        if self.threads is not None:
            limit_torch_threads(self.threads)
        try:
            prof = self._profile()
            if self.watch:
                self._start_observer(prof.path)
            prof.close()
        except Exception as e:  # noqa: BLE001 - a worker never takes the chat down
            self._fail(f"adapter cannot start: {e}")
            return
        self._wake.set()
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.step()

    def step(self, force: bool = False) -> dict | None:
        """Run one cycle when due (or `force`); returns its report or None."""
        prof = None
        try:
            prof = self._profile()
            st = read_state(prof.path)
            last = (st.get("last_cycle") or {}).get("time") or self.started_at
            pending = pending_answers(prof)
            now = time.time()
            if not force:
                if self.errors and self.last_attempt and now - self.last_attempt < self.backoff_s:
                    return None
                if not is_due(prof.config, pending, last, now):
                    return None
            self.last_attempt = now
            self.state = "running"
            fn = self.cycle_fn
            if fn is None:
                from assistant.adapt.cycle import run_cycle as fn
            report = fn(prof, target=self.target, config=self.config, pause=lambda: self.pause(prof.path),
                        on_stage=lambda name: setattr(self, "stage", name))
            self.reports.append(report)
            self.errors.clear()
            self.state = "idle"
            if self.on_report:
                self.on_report(report)
            if report.get("version"):
                self.pending_head = prof.heads.path_of(report["version"])
                if self.on_publish:
                    self.on_publish(report["version"], self.pending_head)
            return report
        except CycleCancelled:
            self.state = "stopped"
            return None
        except AdapterBusy as e:
            self.state = "idle"
            log.info("%s", e)
            return None
        except Exception as e:  # noqa: BLE001
            self._fail(f"{type(e).__name__}: {e}", prof)
            return None
        finally:
            self.stage = None
            if prof is not None:
                prof.close()

    def _fail(self, message: str, prof=None) -> None:
        self.state = "failed"
        self.errors.append(message)
        log.warning("adapter cycle failed: %s", message)
        if prof is not None:
            try:
                st = read_state(prof.path)
                write_state(prof.path, {**st, "last_error": {"time": time.time(), "message": message[:500]}})
            except Exception:  # noqa: BLE001
                pass


__all__ = ["AdapterWorker", "generating", "is_due", "limit_torch_threads", "marker_busy", "pending_answers"]
