"""The management API's routes for the broker's objects, as RabbitMQ answers them.

Owns: what GET /api/vhosts, /api/users, /api/permissions, /api/policies, /api/queues,
/api/exchanges, /api/bindings, /api/connections, /api/channels, /api/consumers, the
aliveness test, the health checks and /api/definitions answer for a login, and the
changes they make (delete and purge a queue, close a connection, import definitions; a
change only on a server that serves). One definitions import at a time, parsed and checked
off the event loop (docs/operations.md, "Management API").

Must not know: the listener, its sockets and logins (``api``), the JSON's shapes
(``shapes``), who may see and do what (``access``), the event log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pamqp import commands
from pamqp.header import ContentHeader

from .. import access_admin, clock
from ..core.kinds import new_queue
from ..core.message import Message
from ..gate import ConsoleRefused
from ..logtext import escaped
from ..wire import address_of
from . import access, definitions, guard, shapes
from .replies import ApiError, check_reply, json_reply, need, not_found

if TYPE_CHECKING:
    from ..host import ManagementSource

log = logging.getLogger("amqha.management")

ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"


class ObjectRoutes:
    """The routes of the broker's objects; ``ManagementEndpoint`` adds them to its app."""

    def __init__(self, broker: ManagementSource) -> None:
        self.broker = broker
        self.rates = shapes.Rates()
        # One definitions import at a time (each may check password hashes off the loop).
        self.importing = asyncio.Lock()

    def node(self) -> str:
        return shapes.node_name(self.broker.config.name)

    # -- vhosts, users --------------------------------------------------------------------

    async def vhosts(self, request: web.Request) -> web.StreamResponse:
        user = request["user"]
        return json_reply(
            [
                shapes.vhost_shape(v)
                for name, v in sorted(self.broker.vhosts.items())
                if access.sees_vhost(user, name)
            ]
        )

    async def vhost(self, request: web.Request) -> web.StreamResponse:
        return json_reply(shapes.vhost_shape(self._vhost(request)))

    def _vhosts(self, request: web.Request) -> list[Any]:
        """The vhost the route names, or every vhost the login may see, by name."""
        if "vhost" in request.match_info:
            return [self._vhost(request)]
        user = request["user"]
        return [v for n, v in sorted(self.broker.vhosts.items()) if access.sees_vhost(user, n)]

    def _vhost(self, request: web.Request) -> Any:
        name = request.match_info["vhost"]
        vhost = self.broker.vhosts.get(name)
        if vhost is None or not access.sees_vhost(request["user"], name):
            raise not_found()
        return vhost

    async def users(self, request: web.Request) -> web.StreamResponse:
        need(access.is_admin(request["user"]))
        return json_reply(
            [
                {
                    "name": u.name,
                    "tags": list(u.tags),
                    "hashing_algorithm": definitions.hashing_algorithm(u),
                    "limits": {},
                }
                for u in access_admin.known_users(self.broker)
                if not access.is_internal_user(u)
            ]
        )

    async def permissions(self, request: web.Request) -> web.StreamResponse:
        """Each user's vhosts, with the full rights amqha gives on them."""
        need(access.is_admin(request["user"]))
        return json_reply(
            definitions.export(access_admin.known_users(self.broker), ())["permissions"]
        )

    async def aliveness(self, request: web.Request) -> web.StreamResponse:
        """RabbitMQ's aliveness test: a message through a queue of the vhost, on a server
        that serves. The queue is the check's own, made for it and in no vhost's table: an
        application's queue named ``aliveness-test`` is never touched (RabbitMQ declares
        and reads that name; docs/operations.md)."""
        vhost = self._vhost(request)
        need(access.may_change_queue(request["user"], vhost.name))
        if not self.broker.pair.serving():
            return json_reply({"status": "failed", "reason": "this server is not serving"}, 503)
        now = self.broker.now()
        queue = new_queue(ALIVENESS_QUEUE, vhost=vhost.name)
        vhost.enqueue(aliveness_message(), (queue,), now)
        got = queue.get(now, no_ack=True)
        if got is None or got[0].body != ALIVENESS_BODY:
            return json_reply(
                {"status": "failed", "reason": "the test message did not come back"}, 503
            )
        return json_reply({"status": "ok"})

    # -- queues ---------------------------------------------------------------------------

    async def queues(self, request: web.Request) -> web.StreamResponse:
        vhosts = self._vhosts(request)
        node, now = self.node(), clock.now()
        found = [
            shapes.queue_shape(v.name, q, node, shapes.queue_rates(self.rates, v.name, q, now))
            for v in vhosts
            for q in v.visible_queues()
        ]
        if "vhost" not in request.match_info:
            self.rates.sweep()
        return json_reply(shapes.sorted_by_name(found))

    def _queue(self, request: web.Request) -> tuple[Any, Any]:
        vhost = self._vhost(request)
        queue = vhost.queues.get(request.match_info["name"])
        if queue is None or vhost.hidden_queue(queue.name) is not None:
            raise not_found()
        return vhost, queue

    async def queue(self, request: web.Request) -> web.StreamResponse:
        vhost, queue = self._queue(request)
        rates = shapes.queue_rates(self.rates, vhost.name, queue, clock.now())
        shape = shapes.queue_shape(vhost.name, queue, self.node(), rates)
        shape["consumer_details"] = [
            c
            for c in self._consumers(request["user"])
            if c["queue"]["name"] == queue.name and c["queue"]["vhost"] == vhost.name
        ]
        return json_reply(shape)

    def _may_change(self, request: web.Request, vhost: Any, queue: str = "") -> None:
        need(access.may_change_queue(request["user"], vhost.name, queue))
        self._serving()

    async def safe(self) -> None:
        """Return once every change logged so far is safe (``access_admin.safe``); its
        refusal as RabbitMQ's JSON."""
        try:
            await access_admin.safe(self.broker)
        except access_admin.Refused as refused:
            raise ApiError(refused.status, refused.word, str(refused)) from None

    def _serving(self) -> None:
        """503, naming the ACTIVE, unless this server serves: a change is made there."""
        if not self.broker.pair.serving():
            status = self.broker.pair.status()
            peer = status.get("peer") or {}
            where = f" (the ACTIVE: {peer.get('listen')})" if peer.get("listen") else ""
            raise ApiError(
                503,
                "not_active",
                f"this server is {status.get('state')}, not serving: its queues follow the "
                f"ACTIVE's; change them there{where}",
            )

    async def delete_queue(self, request: web.Request) -> web.StreamResponse:
        vhost, queue = self._queue(request)
        self._may_change(request, vhost, queue.name)
        if request.query.get("if-empty") == "true" and queue.message_count:
            raise ApiError(
                400, "bad_request", f"PRECONDITION_FAILED - queue '{queue.name}' not empty"
            )
        if request.query.get("if-unused") == "true" and queue.consumers:
            raise ApiError(400, "bad_request", f"PRECONDITION_FAILED - queue '{queue.name}' in use")
        owner = queue.exclusive_owner
        vhost.remove_queue(queue)
        if owner is not None:
            owner.exclusive_queues.pop(queue.name, None)
        log.info(
            "queue '%s' in vhost '%s' deleted by %s (management)",
            escaped(queue.name),
            escaped(vhost.name),
            escaped(request["user"].name),
        )
        await self.safe()
        return web.Response(status=204)

    async def purge_queue(self, request: web.Request) -> web.StreamResponse:
        vhost, queue = self._queue(request)
        self._may_change(request, vhost, queue.name)
        count = queue.purge()
        log.info(
            "queue '%s' in vhost '%s' purged of %d messages by %s (management)",
            escaped(queue.name),
            escaped(vhost.name),
            count,
            escaped(request["user"].name),
        )
        await self.safe()
        return web.Response(status=204)

    # -- exchanges, bindings -------------------------------------------------------------

    async def exchanges(self, request: web.Request) -> web.StreamResponse:
        vhosts = self._vhosts(request)
        return json_reply(
            [
                shapes.exchange_shape(v.name, e)
                for v in vhosts
                for e in sorted(shapes.visible_exchanges(v), key=lambda e: e.name)
            ]
        )

    async def exchange(self, request: web.Request) -> web.StreamResponse:
        vhost = self._vhost(request)
        exchange = vhost.exchanges.get(request.match_info["name"])
        if exchange is None or exchange.control:
            raise not_found()
        return json_reply(shapes.exchange_shape(vhost.name, exchange))

    async def bindings(self, request: web.Request) -> web.StreamResponse:
        vhosts = self._vhosts(request)
        return json_reply([b for v in vhosts for b in shapes.bindings_of(v)])

    # -- connections, channels, consumers ------------------------------------------------

    def visible_connections(self, user: Any) -> list[Any]:
        """Open client connections ``user`` may see; the pair's own (peering) never."""
        return [
            c
            for c in self.broker.open_connections()
            if c.user is not None
            and not access.is_internal_user(c.user)
            and access.sees_connection(user, c.user.name)
        ]

    async def connections(self, request: web.Request) -> web.StreamResponse:
        node = self.node()
        found = [
            shapes.connection_shape(c, node) for c in self.visible_connections(request["user"])
        ]
        return json_reply(sorted(found, key=lambda c: c["name"]))

    def _connection(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        for connection in self.visible_connections(request["user"]):
            if shapes.connection_name(connection) == name:
                return connection
        raise not_found()

    async def connection(self, request: web.Request) -> web.StreamResponse:
        return json_reply(shapes.connection_shape(self._connection(request), self.node()))

    async def close_connection(self, request: web.Request) -> web.StreamResponse:
        connection = self._connection(request)
        user = request["user"]
        need(access.may_close_connection(user, connection.user.name))
        given = request.headers.get("X-Reason", "Closed via management plugin")
        # The close text is a shortstr: at most 255 bytes with its prefix.
        reason = given.encode("utf-8", "replace")[:200].decode("utf-8", "ignore")
        log.info(
            "connection %s closed by %s (management): %s",
            connection.peer,
            escaped(user.name),
            escaped(reason),
        )
        connection.close_forced(f"CONNECTION_FORCED - {reason}")
        return web.Response(status=204)

    async def channels(self, request: web.Request) -> web.StreamResponse:
        node = self.node()
        found = [
            shapes.channel_shape(c, channel, node)
            for c in self.visible_connections(request["user"])
            for channel in list(c.channels.values())
        ]
        return json_reply(sorted(found, key=lambda c: c["name"]))

    def _consumers(self, user: Any) -> list[dict[str, Any]]:
        found = []
        for connection in self.visible_connections(user):
            for channel in list(connection.channels.values()):
                for consumer in channel.consumers.values():
                    found.append(shapes.consumer_shape(connection, channel, consumer))
        return found

    async def consumers(self, request: web.Request) -> web.StreamResponse:
        found = self._consumers(request["user"])
        if "vhost" in request.match_info:
            vhost = self._vhost(request)
            found = [c for c in found if c["queue"]["vhost"] == vhost.name]
        return json_reply(found)

    # -- health checks ------------------------------------------------------------------

    async def alarms(self, request: web.Request) -> web.StreamResponse:
        broker = self.broker
        found = shapes.alarms(
            self.node(), broker.memory.over, bool(broker.store_status().get("failing"))
        )
        if found:
            return json_reply(
                {"status": "failed", "reason": "resource alarm(s) in effect", "alarms": found},
                503,
            )
        return json_reply({"status": "ok"})

    async def check_active(self, request: web.Request) -> web.StreamResponse:
        status = self.broker.pair.status()
        status["serving"] = self.broker.pair.serving()
        return check_reply(*shapes.is_active(status))

    async def check_active_in_sync(self, request: web.Request) -> web.StreamResponse:
        status = self.broker.pair.status()
        status["serving"] = self.broker.pair.serving()
        return check_reply(*shapes.active_in_sync(status, self.broker.replication_status()))

    async def post_switchover(self, request: web.Request) -> web.StreamResponse:
        """A planned switchover (docs/failover.md), as ``amqha console switchover``: on the
        ACTIVE, by an administrator; ``{"wait": S}`` waits for the PASSIVE to be in sync."""
        need(access.is_admin(request["user"]))
        text = await request.text()
        try:
            body = json.loads(text) if text.strip() else {}
        except ValueError:
            raise ApiError(400, "bad_request", 'the body must be JSON: {"wait": SECONDS}') from None
        wait = body.get("wait", 0) if isinstance(body, dict) else None
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 3600:
            raise ApiError(400, "bad_request", "wait must be a number of seconds from 0 to 3600")
        try:
            result = self.broker.pair.command("switchover", {"wait": wait}, request["user"].name)
            if asyncio.iscoroutine(result):
                result = await result
        except ConsoleRefused as refused:
            raise ApiError(409, "refused", str(refused)) from None
        return json_reply(result)

    async def check_config_match(self, request: web.Request) -> web.StreamResponse:
        return check_reply(*shapes.config_match(self.broker.pair.status()))

    # -- definitions ----------------------------------------------------------------------

    async def get_definitions(self, request: web.Request) -> web.StreamResponse:
        need(access.is_admin(request["user"]))
        users = access_admin.known_users(self.broker)
        return json_reply(definitions.export(users, self.broker.vhosts.values()))

    async def post_definitions(self, request: web.Request) -> web.StreamResponse:
        need(access.is_admin(request["user"]))
        if not self.broker.pair.serving():
            raise ApiError(503, "not_active", "this server is not serving: import on the ACTIVE")
        text = await request.text()
        async with self.importing:
            # Parsed and checked off the loop: a large file, and the scrypt hashes it may
            # carry (config.passwords caps their cost), must not hold up every client.
            try:
                plan = await asyncio.to_thread(_plan, text, self.broker.config)
            except definitions.Refused as error:
                raise ApiError(error.status, "bad_request", str(error)) from None
            try:
                # Against what the broker holds now, on the loop: nothing is applied
                # unless all of it can be.
                definitions.check_against(plan, self.broker.vhosts, self.broker.config)
                definitions.apply(plan, self.broker, self.broker.now())
            except definitions.Refused as error:
                raise ApiError(error.status, "bad_request", str(error)) from None
        log.info(
            "definitions imported by %s (management): %s",
            escaped(request["user"].name),
            plan.summary(),
        )
        await self.safe()
        return web.Response(status=204)


def aliveness_message() -> Message:
    header = ContentHeader(body_size=len(ALIVENESS_BODY), properties=commands.Basic.Properties())
    return Message(address_of("", ALIVENESS_QUEUE), header.marshal(), ALIVENESS_BODY)


def _plan(text: str, config: Any) -> definitions.Plan:
    """A definitions file's plan (on a worker thread): Refused if it is not JSON or not
    importable."""
    try:
        body = guard.loads(text)
    except ValueError as error:
        raise definitions.Refused(f"not JSON: {error}") from None
    return definitions.plan_import(body, config)
