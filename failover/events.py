"""The failover event log: one JSON Lines file per server, schema v1 (DESIGN.md §5).

Owns: the record envelope (`v`, `ts`, `node`, `role`, `epoch`, `state`, `event`), appending
records so each is on disk as a whole line once `write()` returns (flushed, not fsynced), and
reading a log back while skipping lines a crash tore or garbage left behind.

Must not know: which events exist or when to write them (the failover controller decides),
the state machine, or how the Spark job aggregates the log.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

SCHEMA_VERSION = 1

_ENVELOPE = ("v", "ts", "node", "role", "epoch", "state", "event")


def record(
    ts: float, node: str, role: str, epoch: int, state: str, event: str, /, **fields: Any
) -> dict[str, Any]:
    """One v1 record: the envelope first, then the event's own fields."""
    clashing = sorted(set(fields) & set(_ENVELOPE))
    if clashing:
        raise ValueError(f"event fields {clashing} would overwrite the record envelope")
    return {
        "v": SCHEMA_VERSION,
        "ts": ts,
        "node": node,
        "role": role,
        "epoch": epoch,
        "state": state,
        "event": event,
        **fields,
    }


class EventLog:
    """Appends this server's failover events to `path`, one flushed JSON line per record."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        node: str,
        role: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.node = node
        self.role = role
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", buffering=1, encoding="utf-8")
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        # A crash mid-record leaves a line without its newline; our first record would be
        # glued to it and both lost to readers. Ending the torn line keeps ours readable.
        if self._file.tell() == 0:
            return
        with self.path.open("rb") as existing:
            existing.seek(-1, os.SEEK_END)
            if existing.read(1) != b"\n":
                self._file.write("\n")

    def write(self, event: str, state: str, epoch: int, /, **fields: Any) -> dict[str, Any]:
        """Append one record stamped with the injected wall clock; returns the record."""
        entry = record(self._clock(), self.node, self.role, epoch, state, event, **fields)
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()
        return entry

    def close(self) -> None:
        """Flush and fsync, so the log survives a power cut after a clean stop."""
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


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
