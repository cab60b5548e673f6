"""The pair's health as ``amqha console status`` judges it from the servers' answers.

Owns: asking every server for its status at once, and the verdict: healthy, or the
error code (``ERROR_EXITS``) that says why not: a refused login, a server down, two
servers ACTIVE, a failed disk, none ACTIVE, a lost peer, a PASSIVE not in sync, a witness unheard
(docs/operations.md, "Console").

Must not know: how the verdict is printed (``console_text.py``), the commands.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .console import ConsoleClient, ConsoleError, Server
from .console_text import replication_text, witness_problems
from .dual import dual_active


async def status_all(servers: list[Server], timeout: float) -> list[tuple[Server, Any]]:
    async def one(server: Server) -> dict[str, Any]:
        try:
            async with ConsoleClient(server, timeout) as console:
                return dict(await console.call("status"))
        except ConsoleError as error:
            return {"error": {"code": error.code, "message": error.message}}

    answers = await asyncio.gather(*(one(server) for server in servers))
    return list(zip(servers, answers, strict=True))


def health(results: list[tuple[Server, Any]]) -> tuple[str, str]:
    """The pair's health from the servers' answers: ("healthy", text) or an error code
    (ERROR_EXITS) and why. A login refused comes first: nothing else can be known then."""
    for wanted in ("auth_failed", "access_refused", "not_authorised"):
        for server, status in results:
            if status.get("error", {}).get("code") == wanted:
                return wanted, f"{server.where}: {status['error']['message']}"
    planned = _maintenance(results)
    if planned is not None:
        return "maintenance", planned
    for server, status in results:
        if "error" in status:
            return status["error"][
                "code"
            ], f"{server.where} does not answer: {status['error']['message']}"
    statuses = [status for _, status in results]
    active = [s for s in statuses if s.get("state") == "ACTIVE"]
    split = dual_active(statuses)  # both servers named, and what resolves it
    if split is not None:
        return "split", split
    for status in statuses:
        failed = (status.get("store") or {}).get("disk_failed")
        if failed:
            return "disk_failed", (
                f"{status.get('name')}'s disk failed ({failed}): it stores and confirms"
                " nothing until it is restarted on a mended disk"
            )
    if not active:
        peer_active = [
            s
            for s in statuses
            if (s.get("peer") or {}).get("state") == "ACTIVE" and (s.get("peer") or {}).get("alive")
        ]
        if len(statuses) == 1 and peer_active:
            return _sync_health(statuses)
        waiting = [s for s in statuses if s.get("takeover")]
        why = f": {waiting[0]['name']}'s {waiting[0]['takeover']}" if waiting else ""
        return "no_active", f"no server is ACTIVE{why}"
    leader = active[0]
    peer = leader.get("peer")
    if leader.get("role") != "standalone" and not (peer and peer.get("alive")):
        return "peer_lost", (
            f"{leader.get('name')} is ACTIVE alone: its peer is lost, nothing it confirms is"
            " held by a second server"
        )
    return _sync_health(statuses)


def _maintenance(results: list[tuple[Server, Any]]) -> str | None:
    """A server in maintenance beside one ACTIVE that is not: unprotected, as planned (no
    alarm: docs/failover.md, "Maintenance"), whether the other answers or not."""
    answered = [status for _, status in results if "error" not in status]
    on = sorted({role for status in answered for role in status.get("maintenance") or []})
    active = [s for s in answered if s.get("state") == "ACTIVE"]
    if not on or len(active) != 1 or dual_active(answered) is not None:
        return None
    leader = active[0]
    if leader.get("role") in on:
        return None
    alone = "alone" if not (leader.get("peer") or {}).get("alive") else "with no takeover ready"
    return (
        f"unprotected (maintenance): the {on[0]} is in maintenance; {leader.get('name')} is"
        f" ACTIVE {alone}"
    )


def _sync_health(statuses: list[dict[str, Any]]) -> tuple[str, str]:
    for status in statuses:
        replication = status.get("replication") or {}
        if not replication.get("enabled"):
            continue
        feed, follower = replication.get("feed"), replication.get("follower")
        if feed is not None and feed.get("state") != "in_sync":
            return (
                "not_in_sync",
                f"not in sync: {status.get('name')} is ACTIVE, {replication_text(status)}",
            )
        if follower is not None and not follower.get("in_sync"):
            return "not_in_sync", (
                f"not in sync: {status.get('name')} is PASSIVE, {replication_text(status)}"
            )
        if status.get("state") == "PASSIVE" and not status.get("in_sync", True):
            return "not_in_sync", f"not in sync: {status.get('name')} is PASSIVE and behind"
    for status in statuses:
        for problem in witness_problems(status):
            return "witness_unheard", problem
    for status in statuses:
        keys = status.get("config_drift") or []
        if keys:
            shown = ", ".join(keys[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")
            return "config_drift", (
                f"config drift: {status.get('name')}'s settings differ from its peer's: {shown}"
                " (amqha console config-diff shows them)"
            )
    return "healthy", "healthy: one ACTIVE, its PASSIVE in sync"
