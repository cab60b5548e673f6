"""Whether the quarantine files the logs name have been replayed, as this host sees them.

Owns: reading a quarantine file's replay state (``amqha quarantine replay`` marks each
message it had confirmed in the file's ``replayed`` table, and renames the file to
``FILE.replayed`` once all are: docs/durability.md) and writing it beside each quarantine
of the summary and the tables, for the pages and the text. The event log says only that a
file was written; a replay writes no record. So the answer is as the report's host sees the
path: where the file is not there (the report runs on another host) it says so. Reads
files, read-only; must not know Spark or the figures.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

NOT_HERE = "not found on this host (amqha quarantine list on its server)"


def replay_state(path: str | None, messages: int | None) -> str:
    """``replayed``, ``not replayed``, ``N of M replayed``, or why it is not known."""
    if not path:
        return "unknown (no file named)"
    if os.path.exists(path + ".replayed"):
        return "replayed"
    if not os.path.exists(path):
        return NOT_HERE
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            table = db.execute(
                "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'replayed'"
            ).fetchone()
            done = db.execute("SELECT count(*) FROM replayed").fetchone()[0] if table else 0
        finally:
            db.close()
    except sqlite3.Error as error:
        return f"unreadable here ({error})"
    if not done:
        return "not replayed"
    return f"{done} of {messages if messages is not None else '?'} replayed"


def annotate(
    summary: Mapping[str, Any], tables: Mapping[str, Sequence[MutableMapping[str, Any]]]
) -> None:
    """Give each quarantine of the summary and of the ``quarantines`` rows its ``replayed``
    state (the table's files keep their columns: the state is not a figure of the logs)."""
    for pair in summary["pairs"].values():
        for q in pair["quarantines"]["listed"]:
            q["replayed"] = replay_state(q["path"], q["messages"])
    for row in tables.get("quarantines", ()):
        row["replayed"] = replay_state(row["path"], row["messages"])
