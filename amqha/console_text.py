"""What ``amqha console`` prints: tables, JSON, times, errors, the status table.

Owns: the words and layout of the console's output (docs/operations.md, "Console"): a
table of rows, a command's answer as text or JSON, an error, a log record's time in
ISO 8601, an event line, the status table and its replication cell.

Must not know: servers and connections (``console.py``), what the pair's health is
(``console_health.py``), the commands.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import click

from .console import ConsoleError, Server


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def done(as_json: bool, command: str, server: Server, result: Any, text: str) -> None:
    if as_json:
        echo_json({"ok": True, "command": command, "server": server.where, "result": result})
    else:
        click.echo(text)


def emit_error(error: ConsoleError, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(error.as_json(), indent=2))
    else:
        click.echo(f"error: {error.message}", err=True)


def print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    # Every key any row has, in the order first seen (an orphan buffer queue's `orphan`).
    keys = list(dict.fromkeys(key for row in rows for key in row))
    cells = [{k: cell(row.get(k)) for k in keys} for row in rows]
    widths = {k: max(len(k), *(len(c[k]) for c in cells)) for k in keys}
    click.echo("  ".join(k.ljust(widths[k]) for k in keys).rstrip())
    for texts in cells:
        click.echo("  ".join(texts[k].ljust(widths[k]) for k in keys).rstrip())


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, default=str) if value else ""
    return str(value)


def iso_time(ts: Any) -> str:
    """A log record's wall-clock time as ISO 8601 in UTC, to the millisecond."""
    try:
        moment = datetime.datetime.fromtimestamp(float(ts), tz=datetime.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ts)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Fields of event records that hold a wall-clock time (seconds since the epoch).
_TIME_FIELDS = frozenset({"ts", "last_seen"})


def _format_event(event: dict[str, Any]) -> str:
    extra = {
        k: v
        for k, v in event.items()
        # The envelope (the pair is the same on every line of a server's log), and what
        # a record leaves out: a field with no value is not printed.
        if k not in ("v", "ts", "pair", "node", "role", "epoch", "state", "event") and v is not None
    }
    details = " ".join(
        f"{k}={iso_time(v) if k in _TIME_FIELDS else cell(v)}" for k, v in extra.items()
    )
    return (
        f"{iso_time(event.get('ts'))} {event.get('node')} [{event.get('state')} "
        f"e{event.get('epoch')}] {event.get('event')} {details}"
    ).rstrip()


def event_time(event: dict[str, Any]) -> float:
    ts = event.get("ts")
    return float(ts) if isinstance(ts, int | float) else 0.0


def print_events(events: list[dict[str, Any]], as_json: bool) -> None:
    for event in events:
        if as_json:
            click.echo(json.dumps({"time": iso_time(event.get("ts")), **event}, default=str))
        else:
            click.echo(_format_event(event))


def witness_problems(status: dict[str, Any]) -> list[str]:
    """A server's witnesses that do not answer it, or whose answers fail verification."""
    witnesses = (status.get("witness") or {}).get("witnesses") or []
    return [
        f"{status.get('name')}'s witness {w.get('address')} {w['problem']}"
        for w in witnesses
        if isinstance(w, dict) and w.get("problem")
    ]


def replication_text(status: dict[str, Any]) -> str:
    """One cell: an ACTIVE's feed, a PASSIVE's catch-up, quarantined files."""
    replication = status.get("replication") or {}
    if not replication.get("enabled"):
        return "off" if replication else ""
    feed, follower = replication.get("feed"), replication.get("follower")
    if feed is not None:
        text = {"in_sync": "in sync", "catching_up": "catching up", "none": "unprotected"}.get(
            feed.get("state"), str(feed.get("state"))
        )
        if feed.get("phase") == "closing":
            # The snapshot is acked and confirms wait for the PASSIVE; it is in sync
            # once it holds what was confirmed without it.
            text += f" (snapshot acked, in sync at LSN {feed.get('sync_lsn')})"
        elif feed.get("state") == "catching_up" and feed.get("lag_changes") is not None:
            text += f" (lag {feed.get('lag_changes')})"
    elif follower is not None:
        state = follower.get("state")
        if follower.get("in_sync"):
            text = "following, in sync"
        elif state == "closing":
            text = "following, snapshot on disk, not yet in sync"
        else:
            text = f"following, {str(state).replace('_', ' ')}"
        if follower.get("unapplied_runs"):
            # Acked (on its disk) and still to apply: a takeover applies them first.
            text += f", {follower['unapplied_runs']} runs to apply"
    else:
        text = ""
    quarantined = replication.get("quarantined") or []
    if quarantined:
        text += f", {len(quarantined)} quarantined"
    if replication.get("store_damaged"):
        text += f", damaged store set aside: {replication['store_damaged']['path']}"
    return text


def print_status(results: list[tuple[Server, Any]], verdict: tuple[str, str]) -> None:
    header = (
        f"{'server':24} {'name':10} {'role':8} {'state':8} {'epoch':>5} {'peer':22} "
        f"{'clients':>7} {'queues':>6}  replication"
    )
    click.echo(header)
    for server, status in results:
        if "error" in status:
            click.echo(f"{server.where:24} {status['error']['message']}")
            continue
        peer = status.get("peer") or {}
        peer_text = (
            f"{peer.get('name')} {peer.get('state')}{'' if peer.get('alive') else ' (lost)'}"
            if peer
            else "not seen"
        )
        click.echo(
            f"{server.where:24} {status.get('name', ''):10} {status.get('role', ''):8} "
            f"{status.get('state', ''):8} {status.get('epoch', 0):>5} {peer_text:22} "
            f"{status.get('clients', 0):>7} {status.get('queues', 0):>6}"
            f"  {replication_text(status)}"
        )
        if status.get("takeover"):
            click.echo(f"{'':24} {status.get('name')}: {status['takeover']}")
        spoken = status.get("protocol") or {}
        if spoken.get("peer") is not None and spoken.get("peer") != spoken.get("this"):
            click.echo(
                f"{'':24} {status.get('name')}: upgrade in progress: this release speaks protocol"
                f" {spoken['this']}, its peer {spoken['peer']}; the pair speaks {spoken['spoken']}"
            )
        for problem in witness_problems(status):
            click.echo(f"{'':24} {problem}")
    click.echo(f"pair: {verdict[1]}")


def states(results: list[tuple[Server, Any]]) -> str:
    return "\n".join(
        f"  {s.where}: {status.get('name', '?')} "
        f"{status.get('state') or status.get('error', {}).get('message')}"
        for s, status in results
    )
