"""The management API's routes for the pair's history: the event logs and the timeline.

Owns: GET /api/amqha/events (this server's event log), /api/amqha/peer-events (the
peer's, asked of its management listener, ``management.peer``, with the caller's own
credentials), /api/amqha/history (this server's records for its peer's timeline) and
/api/amqha/timeline (both servers' states for the page: docs/operations.md, "Web page");
the HTTP session to the peer (PEER_TIMEOUT an answer), the peer's last history kept for a
peer that stopped answering, and this server's history read again only when its log has
changed, at most HISTORY_BYTES of it, HISTORY_SECONDS back.

Must not know: the listener, its sockets and logins (``api``), how the timeline is
computed (``timeline``), the broker's objects.
"""

from __future__ import annotations

import asyncio
import math
import os
import ssl
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from .. import clock
from ..console_service import read_events
from . import access, timeline
from .replies import ApiError, int_query, json_reply, need

if TYPE_CHECKING:
    from ..host import ManagementSource

PEER_TIMEOUT = 2.0
# The history reads at most this much of the end of an event log, and answers at most two
# days back (docs/operations.md, "Web page").
HISTORY_BYTES = 4 * 1024 * 1024
HISTORY_SECONDS = 2 * 86400.0


class PairHistory:
    """The history routes; ``ManagementEndpoint`` adds them to its app and closes it."""

    def __init__(self, broker: ManagementSource) -> None:
        self.broker = broker
        self.config = broker.config.management
        self.session: aiohttp.ClientSession | None = None
        # The peer's history as last answered: kept so that the timeline still shows a
        # peer that stopped answering (killed), up to its last sign of life.
        self.peer_history: dict[str, Any] | None = None
        # (inode, size, since) -> this server's history, read once per change of its log.
        self.own_history: tuple[tuple[int, int, float], list[dict[str, Any]]] | None = None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    # -- the event log -------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        need(access.is_monitor(request["user"]))
        limit = int_query(request, "limit", 100, 1, 1000)
        answer = read_events(self.broker.config.event_log_path, -1, limit)
        answer["server"] = self.broker.config.name
        return json_reply(answer)

    async def peer_events(self, request: web.Request) -> web.StreamResponse:
        """The peer's event log, asked of the peer's management listener
        (``management.peer``) with the caller's own credentials."""
        need(access.is_monitor(request["user"]))
        assert self.config is not None
        peer = self.config.peer
        if peer is None:
            return json_reply({"available": False, "reason": "management.peer is not configured"})
        limit = int_query(request, "limit", 100, 1, 1000)
        answer = await self._ask_peer(request, f"/api/amqha/events?limit={limit}")
        return json_reply(answer)

    async def _ask_peer(self, request: web.Request, path: str) -> dict[str, Any]:
        """GET ``path`` of the peer's management listener with the caller's credentials:
        its JSON with ``available`` true, or ``available`` false and why."""
        assert self.config is not None
        peer = self.config.peer
        if peer is None:
            return {"available": False, "reason": "management.peer is not configured"}
        scheme = "https" if self.config.tls else "http"
        host = f"[{peer[0]}]" if ":" in peer[0] else peer[0]
        url = f"{scheme}://{host}:{peer[1]}{path}"
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT))
        try:
            async with self.session.get(
                url,
                headers={"Authorization": request.headers.get("Authorization", "")},
                ssl=self._peer_ssl(),
            ) as answer:
                if answer.status != 200:
                    return {"available": False, "reason": f"the peer answered {answer.status}"}
                body = await answer.json()
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as error:
            return {
                "available": False,
                "reason": f"the peer did not answer: {type(error).__name__}",
            }
        if not isinstance(body, dict):
            return {"available": False, "reason": "the peer's answer is not a JSON object"}
        return {"available": True, **body}

    # -- the pair's history (the page's timeline) ------------------------------------------

    async def history(self, request: web.Request) -> web.StreamResponse:
        """This server's records from ``since`` (epoch seconds; at most HISTORY_SECONDS
        back), for its peer's timeline."""
        need(access.is_monitor(request["user"]))
        now = clock.now()
        try:
            since = float(request.query.get("since", now - 3600))
        except ValueError:
            raise ApiError(400, "bad_request", "since must be a number (epoch seconds)") from None
        if not math.isfinite(since):
            raise ApiError(400, "bad_request", "since must be a finite number (epoch seconds)")
        since = max(now - HISTORY_SECONDS, min(now, since))
        records = await self._own_history(since)
        return json_reply({"server": self.broker.config.name, "since": since, "records": records})

    async def timeline(self, request: web.Request) -> web.StreamResponse:
        """Both servers' states over the last ``hours`` (1, 3, 12 or 24), the unprotected
        spans, outages, dual-active spells and incidents, and the pair's unprotected time
        since UTC midnight (docs/operations.md, "Web page")."""
        need(access.is_monitor(request["user"]))
        hours = int_query(request, "hours", timeline.DEFAULT_HOURS, 1, 24)
        if hours not in timeline.HOURS:
            raise ApiError(400, "bad_request", f"hours must be one of {timeline.HOURS}")
        now = clock.now()
        since = now - hours * 3600.0
        # On a minute's boundary: the same read serves a minute of the page's refreshes.
        read_from = math.floor(min(since, timeline.midnight(now)) / 60) * 60.0
        own = await self._own_history(read_from)
        name = self.broker.config.name
        logs: dict[str, list[dict[str, Any]]] = {name: own}
        answer = await self._ask_peer(request, f"/api/amqha/history?since={read_from!r}")
        if answer["available"] and isinstance(answer.get("records"), list):
            self.peer_history = {
                "server": answer.get("server"),
                "records": [r for r in answer["records"] if timeline.good(r)],
                "at": now,
            }
            peer = {"available": True}
        else:
            peer = {"available": False, "reason": answer.get("reason", "no records")}
        cached = self.peer_history
        if cached is not None and cached["server"] and cached["server"] != name:
            logs[cached["server"]] = [r for r in cached["records"] if r["node"] == cached["server"]]
            if not peer["available"]:
                peer["as_of"] = cached["at"]
        found = await asyncio.to_thread(timeline.pair_timeline, logs, since, now)
        return json_reply({"hours": hours, "server": name, "peer": peer, **found})

    async def _own_history(self, since: float) -> list[dict[str, Any]]:
        path = self.broker.config.event_log_path
        try:
            stat = await asyncio.to_thread(os.stat, path)
        except OSError:
            return []
        key = (stat.st_ino, stat.st_size, since)
        if self.own_history is not None and self.own_history[0] == key:
            return self.own_history[1]
        records = await asyncio.to_thread(read_history, path, since)
        self.own_history = (key, records)
        return records

    def _peer_ssl(self) -> ssl.SSLContext | bool:
        tls = self.broker.config.tls
        if self.config is None or not self.config.tls or tls is None:
            return True
        context = (
            ssl.create_default_context(cafile=tls.ca) if tls.ca else ssl.create_default_context()
        )
        return context


def read_history(path: str, since: float) -> list[dict[str, Any]]:
    """An event log's records for a history from ``since`` (``timeline.history_from_lines``),
    from at most its last HISTORY_BYTES, whole lines only."""
    try:
        with open(path, "rb") as log_file:
            size = log_file.seek(0, 2)
            start = max(0, size - HISTORY_BYTES)
            log_file.seek(start)
            data = log_file.read(HISTORY_BYTES)
    except OSError:
        return []
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    if start > 0:
        lines = lines[1:]  # the window may begin mid-line
    return timeline.history_from_lines(lines, since)
