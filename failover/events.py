"""The failover event log: one JSON Lines file per server, schema v1 (docs/failover.md).

Owns: the record envelope (`v`, `ts`, `node`, `role`, `epoch`, `state`, `event`, and `pair`
when the server names its pair: an additive v1 field), appending
records so each is in the file as a whole line once `write()` returns (one write(2) per
record; an fsync follows within ``SYNC_WITHIN`` seconds, in a thread of its own, so a
power cut loses at most the last second's records), and reading a log back while
skipping lines a crash tore or garbage left behind. A failing write (a full disk, an I/O error) never raises: the log is a side
resource and failover must go on without it. The record goes to stderr instead, at most once
a second, and ``lost`` counts it.

Must not know: which events exist or when to write them (the failover controller decides),
the state machine, or how the Spark job aggregates the log.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from amqha import clock as steady

SCHEMA_VERSION = 1
SYNC_WITHIN = 1.0  # seconds from a record to its fsync (docs/failover.md, "The event log")

_ENVELOPE = ("v", "ts", "node", "role", "epoch", "state", "event", "pair")


def record(
    ts: float,
    node: str,
    role: str,
    epoch: int,
    state: str,
    event: str,
    /,
    pair: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One v1 record: the envelope first, then the event's own fields. ``pair`` is left out
    when None, so logs of servers that name no pair are as before."""
    clashing = sorted(set(fields) & set(_ENVELOPE))
    if clashing:
        raise ValueError(f"event fields {clashing} would overwrite the record envelope")
    entry: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "ts": ts,
        "node": node,
        "role": role,
        "epoch": epoch,
        "state": state,
        "event": event,
    }
    if pair is not None:
        entry["pair"] = pair
    entry.update(fields)
    return entry


class EventLog:
    """Appends this server's failover events to `path`, one flushed JSON line per record."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        node: str,
        role: str,
        clock: Callable[[], float] = steady.now,
        pair: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.node = node
        self.role = role
        self.pair = pair
        self._clock = clock
        self.lost = 0
        self._last_complaint = 0.0
        self._torn = False
        self._closed = False
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file open
        # The fsync behind the writes: one Timer at a time, the lock keeps close() from
        # closing the descriptor under it.
        self._sync_lock = threading.Lock()
        self._sync_timer: threading.Timer | None = None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._open()
        except OSError as error:
            self._complain(error, "(opening the log: every record is lost until a restart)")
            return
        self._end_torn_line()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        # Whatever the umask, and however an older version left the file: the log names
        # clients and users, for this server's user only.
        os.fchmod(fd, 0o600)
        opened = os.fstat(fd)
        with self._sync_lock:
            if self._fd is not None:
                os.close(self._fd)  # its records were synced (or are lost) with it
            self._fd, self._file = fd, (opened.st_dev, opened.st_ino)

    def _follow_rotation(self) -> None:
        """The file at the path is not the one open (logrotate renamed it, and maybe made
        a new one): records go to the path's from now on (docs/deploy.md, "Logs")."""
        try:
            found = os.stat(self.path)
            if (found.st_dev, found.st_ino) == self._file:
                return
        except FileNotFoundError:
            pass
        self._open()
        self._torn = False
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        # A crash mid-record leaves a line without its newline; our first record would be
        # glued to it and both lost to readers. Ending the torn line keeps ours readable.
        try:
            with self.path.open("rb") as existing:
                if existing.seek(0, os.SEEK_END) == 0:
                    return
                existing.seek(-1, os.SEEK_END)
                self._torn = existing.read(1) != b"\n"
        except OSError:
            self._torn = True

    def write(self, event: str, state: str, epoch: int, /, **fields: Any) -> dict[str, Any]:
        """Append one record stamped with the injected wall clock; returns the record."""
        if self._closed:
            raise ValueError(f"event log {self.path} is closed")
        if "pair" in fields:
            raise ValueError("event fields ['pair'] would overwrite the record envelope")
        entry = record(
            self._clock(), self.node, self.role, epoch, state, event, pair=self.pair, **fields
        )
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        try:
            if self._fd is None:
                raise OSError("the event log could not be opened")
            self._follow_rotation()
            data = ("\n" if self._torn else "").encode() + line.encode() + b"\n"
            written = os.write(self._fd, data)
            while written < len(data):
                written += os.write(self._fd, data[written:])
            self._torn = False
            self._sync_soon()
        except OSError as error:
            # Whatever part of the line reached the file, the next record starts a new line.
            self._torn = True
            self.lost += 1
            self._complain(error, line)
        return entry

    def _sync_soon(self) -> None:
        with self._sync_lock:
            if self._sync_timer is None and not self._closed:
                self._sync_timer = threading.Timer(SYNC_WITHIN, self._sync)
                self._sync_timer.daemon = True
                self._sync_timer.start()

    def _sync(self) -> None:
        # The fsync runs on a descriptor of its own, outside the lock: a slow disk must not
        # hold up a record being written (the loop's, or the heartbeat thread's).
        with self._sync_lock:
            self._sync_timer = None
            if self._fd is None:
                return
            try:
                fd = os.dup(self._fd)
            except OSError as error:
                self._complain(error, "(fsync)")
                return
        try:
            os.fsync(fd)
        except OSError as error:
            self._complain(error, "(fsync)")
        finally:
            os.close(fd)

    def _complain(self, error: OSError, line: str) -> None:
        now = time.monotonic()
        if now - self._last_complaint < 1.0:
            return
        self._last_complaint = now
        print(
            f"amqha: cannot write the event log {self.path} ({error}); {self.lost} record(s) "
            f"lost so far, this one was: {line}",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        """fsync and close, so the log survives a power cut after a clean stop."""
        with self._sync_lock:
            self._closed = True
            if self._sync_timer is not None:
                self._sync_timer.cancel()
                self._sync_timer = None
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as error:
            self._complain(error, "(fsync at close)")
        finally:
            os.close(fd)

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class RecordThrottle:
    """At most one record of each kind per ``interval`` seconds, for the records a peer or a
    client can cause at will (a refused state message, a refused or redirected login): a
    flood cannot fill the log's disk. The ones held back are counted, and the next record
    of their kind says how many (its ``unrecorded`` field), so the log still tells how big
    the flood was. The caller passes the time."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held_back: dict[str, int] = {}

    def admit(self, kind: str, now: float) -> int | None:
        """None: leave this one out (it is counted). Otherwise record it, with the returned
        number of its kind left out since the last one recorded."""
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._held_back[kind] = self._held_back.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._held_back.pop(kind, 0)


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The log's records in file order, skipping torn, blank and non-object lines."""
    events: list[dict[str, Any]] = []
    with Path(path).open("rb") as log:
        for raw in log:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict):
                events.append(entry)
    return events
