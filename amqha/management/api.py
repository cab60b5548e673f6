"""The management listener: RabbitMQ's HTTP API and the pair's web page, on aiohttp.

Owns: the ``management.listen`` listener (an aiohttp.web application on the broker's
loop, TLS with the amqps listener's certificate when ``management.tls``), HTTP basic
auth against the broker's users (the same logins as AMQP, the same refusal delay), the
routes of docs/operations.md ("Management API"), the changes they make (purge, delete,
close, definitions import) and the page at ``/``.

Bounds: aiohttp parses requests with the limits of HANDLER_OPTIONS; a body is at most
MAX_BODY (a definitions file); the sockets are ``sockets``' (at most MAX_CONNECTIONS, a
share per address, a socket that has not logged in closed after its answer, so none can
keep an operator out); a change must pass ``guard`` (same origin, a JSON body); a
successful login is remembered for LOGIN_CACHE_SECONDS (at most LOGIN_CACHE_SIZE of them)
so the page's polling does not cost an scrypt check every two seconds; a refused one costs
its sender ``auth.failed_login_delay``. A definitions file is parsed and checked off the
event loop (its password hashes may cost scrypt), one import at a time. The page's
history reads at most HISTORY_BYTES of an event log, HISTORY_SECONDS back, and reads this
server's again only when its log has changed (``timeline`` computes from it).

Must not know: how the model routes or stores (``core``), how failover decides (it reads
the broker's ``gate.Pair``); what a user may see is ``access``, the JSON is ``shapes``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import math
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from pamqp import commands
from pamqp.header import ContentHeader

from config.tls import server_context

from .. import __version__
from ..console_service import read_events
from ..core.kinds import new_queue
from ..core.message import Message
from ..logtext import escaped
from ..wire import address_of
from . import access, definitions, guard, shapes, timeline
from .sockets import REQUEST_TIMEOUT, ManagedSocket, SocketTable

if TYPE_CHECKING:
    from ..host import ManagementSource

log = logging.getLogger("amqha.management")

MAX_BODY = 16 * 1024 * 1024
LOGIN_CACHE_SECONDS = 60.0
LOGIN_CACHE_SIZE = 1024
SHUTDOWN_TIMEOUT = 0.5
PEER_TIMEOUT = 2.0
# The history reads at most this much of the end of an event log, and answers at most two
# days back (docs/operations.md, "Web page").
HISTORY_BYTES = 4 * 1024 * 1024
HISTORY_SECONDS = 2 * 86400.0
HANDLER_OPTIONS: dict[str, Any] = {
    "max_line_size": 8192,
    "max_field_size": 8192,
    "keepalive_timeout": 15.0,
    "access_log": None,
}
REALM = 'Basic realm="amqha management", charset="UTF-8"'
# Sent by the web page: its own login form handles a 401, so no WWW-Authenticate (which
# would make the browser show its dialog).
PAGE_HEADER = "X-Amqha-Page"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def not_found(what: str = "Not Found") -> ApiError:
    return ApiError(404, "Object Not Found", what)


class ManagementEndpoint:
    """The listener; started with the broker when ``management.listen`` is set."""

    def __init__(self, broker: ManagementSource) -> None:
        self.broker = broker
        self.config = broker.config.management
        self.runner: web.AppRunner | None = None
        self.rates = shapes.Rates()
        # sha256(authorization header) -> (user, expiry on the loop's clock)
        self.logins: OrderedDict[bytes, tuple[Any, float]] = OrderedDict()
        self.session: aiohttp.ClientSession | None = None
        # The peer's history as last answered: kept so that the timeline still shows a
        # peer that stopped answering (killed), up to its last sign of life.
        self.peer_history: dict[str, Any] | None = None
        # (inode, size, since) -> this server's history, read once per change of its log.
        self.own_history: tuple[tuple[int, int, float], list[dict[str, Any]]] | None = None
        self.listener: asyncio.base_events.Server | None = None
        self.sockets = SocketTable()
        # One definitions import at a time (each may check password hashes off the loop).
        self.importing = asyncio.Lock()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.config is None:
            return
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._middleware])
        self._routes(app)
        self.runner = web.AppRunner(
            app, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT, **HANDLER_OPTIONS
        )
        await self.runner.setup()
        context = None
        if self.config.tls:
            tls = self.broker.config.tls
            assert tls is not None  # the loader refuses management.tls without it
            context = server_context(tls, self.broker.config.source)
            context.verify_mode = ssl.CERT_NONE  # logins are HTTP basic auth
        loop = asyncio.get_running_loop()
        manager = self.runner.server
        assert manager is not None
        self.listener = await loop.create_server(
            lambda: ManagedSocket(manager, self.sockets, loop=loop, **HANDLER_OPTIONS),
            self.config.host,
            self.config.port,
            ssl=context,
            ssl_handshake_timeout=REQUEST_TIMEOUT if context is not None else None,
            reuse_address=True,
            backlog=128,
        )
        scheme = "https" if context is not None else "http"
        log.info("management on %s://%s:%d/", scheme, self.config.host, self.port)

    @property
    def port(self) -> int:
        assert self.listener is not None
        return int(self.listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Answers under way get SHUTDOWN_TIMEOUT to finish; then every socket is closed."""
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
        self.sockets.drop_all()

    # -- routes ---------------------------------------------------------------------------

    def _routes(self, app: web.Application) -> None:
        get, delete, post = app.router.add_get, app.router.add_delete, app.router.add_post
        get("/", self.page)
        get("/api/overview", self.overview)
        get("/api/whoami", self.whoami)
        get("/api/nodes", self.nodes)
        get("/api/nodes/{node}", self.node)
        get("/api/vhosts", self.vhosts)
        get("/api/vhosts/{vhost}", self.vhost)
        get("/api/users", self.users)
        get("/api/permissions", self.permissions)
        get("/api/policies", self.policies)
        get("/api/policies/{vhost}", self.policies)
        get("/api/aliveness-test/{vhost}", self.aliveness)
        get("/api/queues", self.queues)
        get("/api/queues/{vhost}", self.queues)
        get("/api/queues/{vhost}/{name}", self.queue)
        delete("/api/queues/{vhost}/{name}", self.delete_queue)
        delete("/api/queues/{vhost}/{name}/contents", self.purge_queue)
        get("/api/exchanges", self.exchanges)
        get("/api/exchanges/{vhost}", self.exchanges)
        get("/api/exchanges/{vhost}/{name}", self.exchange)
        get("/api/bindings", self.bindings)
        get("/api/bindings/{vhost}", self.bindings)
        get("/api/connections", self.connections)
        get("/api/connections/{name}", self.connection)
        delete("/api/connections/{name}", self.close_connection)
        get("/api/channels", self.channels)
        get("/api/consumers", self.consumers)
        get("/api/consumers/{vhost}", self.consumers)
        get("/api/health/checks/alarms", self.alarms)
        get("/api/health/checks/local-alarms", self.alarms)
        get("/api/health/checks/amqha-active", self.check_active)
        get("/api/health/checks/amqha-active-in-sync", self.check_active_in_sync)
        get("/api/definitions", self.get_definitions)
        post("/api/definitions", self.post_definitions)
        get("/api/amqha/events", self.events)
        get("/api/amqha/peer-events", self.peer_events)
        get("/api/amqha/history", self.history)
        get("/api/amqha/timeline", self.timeline)
        # A listing also answers with a trailing slash, as RabbitMQ's router does: Celery
        # Flower asks for /api/queues/ (its URL join drops the default vhost's "/").
        for resource in list(app.router.resources()):
            path = resource.canonical
            if path.startswith("/api/") and "{" not in path and "/amqha/" not in path:
                for route in resource:
                    if route.method == "GET":
                        get(path + "/", route.handler)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every API route needs a management login; a change must pass ``guard``; errors
        are RabbitMQ's JSON. A socket whose request did not log in closes after the answer
        (``sockets``)."""
        socket = request.protocol if isinstance(request.protocol, ManagedSocket) else None
        if socket is not None:
            socket.request_in()
        logged_in = False
        try:
            response = await self._answer(request, handler)
            logged_in = "user" in request
        finally:
            if socket is not None:
                socket.busy = False
        if socket is not None:
            socket.answered(response, logged_in)
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path.startswith("/api/"):
                user = await self._login(request)
                request["user"] = user
                guard.check_change(request.method, request.headers, request.scheme)
            return await handler(request)
        except ApiError as error:
            headers = {}
            if error.status == 401 and PAGE_HEADER not in request.headers:
                headers["WWW-Authenticate"] = REALM
            return web.json_response(
                {"error": error.error, "reason": error.reason},
                status=error.status,
                headers=headers,
            )
        except guard.Forbidden as error:
            return web.json_response(
                {"error": error.error, "reason": error.reason}, status=error.status
            )
        except web.HTTPException as error:
            if error.status < 400:
                raise
            return guard.error_body(error, request.method, request.path)

    async def _login(self, request: web.Request) -> Any:
        header = request.headers.get("Authorization")
        if header is None:
            raise ApiError(401, "not_authorised", "Login failed")
        # The address is part of the key: a login remembered from loopback says nothing of
        # the same credentials from elsewhere (auth.loopback_users).
        remote = request.remote or ""
        key = hashlib.sha256(f"{remote}\n{header}".encode("utf-8", "surrogateescape")).digest()
        now = time.monotonic()
        cached = self.logins.get(key)
        if cached is not None and cached[1] > now:
            self.logins.move_to_end(key)
            user = cached[0]
        else:
            username, password = _basic(header)
            result = await self.broker.authenticate(username, password, remote, "HTTP basic")
            if not hasattr(result, "tags"):
                raise ApiError(401, "not_authorised", "Login failed")
            user = result
            self.logins[key] = (user, now + LOGIN_CACHE_SECONDS)
            while len(self.logins) > LOGIN_CACHE_SIZE:
                self.logins.popitem(last=False)
        if not access.may_use_api(user):
            raise ApiError(401, "not_authorised", "Not management user")
        return user

    # -- the page -------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        text = resources.files(__package__).joinpath("page.html").read_text("utf-8")
        return web.Response(
            text=text,
            content_type="text/html",
            headers={
                "Cache-Control": "no-store",
                "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline' "
                "'self'; style-src 'unsafe-inline' 'self'; img-src 'self' data:",
            },
        )

    # -- overview, nodes, whoami ----------------------------------------------------------

    def _node(self) -> str:
        return shapes.node_name(self.broker.config.name)

    def _own(self) -> dict[str, Any]:
        broker = self.broker
        failover = broker.config.failover
        return {
            "name": broker.config.name,
            "uptime": time.time() - broker.started,
            "mem_used": broker.memory_in_use(),
            "mem_limit": broker.config.limits.memory_high_watermark,
            "mem_alarm": broker.memory_over,
            "disk_alarm": bool(broker.store_status().get("failing")),
            "listen": broker.config.public_address,
            "peer_name": failover.peer_name,
            "peer_listen": failover.peer_listen[0] if failover.peer_listen else failover.peer,
        }

    async def nodes(self, request: web.Request) -> web.StreamResponse:
        _need(access.is_monitor(request["user"]))
        return _json(self._nodes())

    def _nodes(self) -> list[dict[str, Any]]:
        return shapes.nodes_shape(
            self.broker.pair.status(), self.broker.replication_status(), self._own(), time.time()
        )

    async def node(self, request: web.Request) -> web.StreamResponse:
        _need(access.is_monitor(request["user"]))
        for node in self._nodes():
            if node["name"] == request.match_info["node"]:
                return _json(node)
        raise not_found()

    async def whoami(self, request: web.Request) -> web.StreamResponse:
        user = request["user"]
        return _json({"name": user.name, "tags": list(user.tags)})

    async def overview(self, request: web.Request) -> web.StreamResponse:
        user = request["user"]
        broker = self.broker
        now = time.time()
        vhosts = [v for v in broker.vhosts.values() if access.sees_vhost(user, v.name)]
        queues = [(v.name, q) for v in vhosts for q in v.visible_queues()]
        connections = self._visible_connections(user)
        totals = [0, 0, 0]
        rates = [0.0, 0.0, 0.0]
        for vhost, queue in queues:
            for index, rate in enumerate(shapes.queue_rates(self.rates, vhost, queue, now)):
                rates[index] += rate
            totals[0] += queue.published
            totals[1] += queue.delivered
            totals[2] += queue.acked
        ready = sum(q.message_count for _, q in queues)
        unacked = sum(q.unacked for _, q in queues)
        node = self._node()
        config = broker.config
        listeners = [
            {"node": node, "protocol": "amqp", "ip_address": host, "port": port}
            for host, port in config.addresses
        ]
        if config.tls is not None:
            listeners.append(
                {
                    "node": node,
                    "protocol": "amqp/ssl",
                    "ip_address": config.tls.host,
                    "port": config.tls.port,
                }
            )
        assert self.config is not None
        listeners.append(
            {
                "node": node,
                "protocol": "https" if self.config.tls else "http",
                "ip_address": self.config.host,
                "port": self.port,
            }
        )
        status = broker.pair.status()
        return _json(
            {
                "management_version": shapes.MANAGEMENT_VERSION,
                "rabbitmq_version": shapes.MANAGEMENT_VERSION,
                "product_name": "amqha",
                "product_version": __version__,
                "cluster_name": config.pair or config.name,
                "node": node,
                "rates_mode": "basic",
                "exchange_types": [
                    {"name": kind, "description": "", "enabled": True}
                    for kind in ("direct", "fanout", "topic", "headers")
                ],
                "message_stats": {
                    "publish": totals[0],
                    "publish_details": {"rate": round(rates[0], 1)},
                    "deliver_get": totals[1],
                    "deliver_get_details": {"rate": round(rates[1], 1)},
                    "ack": totals[2],
                    "ack_details": {"rate": round(rates[2], 1)},
                },
                "queue_totals": {
                    "messages": ready + unacked,
                    "messages_ready": ready,
                    "messages_unacknowledged": unacked,
                },
                "object_totals": {
                    "connections": len(connections),
                    "channels": sum(len(c.channels) for c in connections),
                    "exchanges": sum(sum(1 for _ in shapes.visible_exchanges(v)) for v in vhosts),
                    "queues": len(queues),
                    "consumers": sum(q.consumer_count for _, q in queues),
                },
                "listeners": listeners,
                "contexts": [
                    {
                        "node": node,
                        "description": "amqha management",
                        "path": "/",
                        "port": str(self.port),
                    }
                ],
                "amqha": {
                    "role": status.get("role"),
                    "state": status.get("state"),
                    "epoch": status.get("epoch", 0),
                    "serving": broker.pair.serving(),
                },
            }
        )

    # -- vhosts, users --------------------------------------------------------------------

    async def vhosts(self, request: web.Request) -> web.StreamResponse:
        user = request["user"]
        return _json(
            [
                shapes.vhost_shape(v)
                for name, v in sorted(self.broker.vhosts.items())
                if access.sees_vhost(user, name)
            ]
        )

    async def vhost(self, request: web.Request) -> web.StreamResponse:
        return _json(shapes.vhost_shape(self._vhost(request)))

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
        _need(access.is_admin(request["user"]))
        return _json(
            [
                {
                    "name": u.name,
                    "tags": list(u.tags),
                    "hashing_algorithm": definitions.hashing_algorithm(u),
                    "limits": {},
                }
                for u in self.broker.config.users
                if not access.is_internal_user(u)
            ]
        )

    async def permissions(self, request: web.Request) -> web.StreamResponse:
        """Each user's vhosts, with the full rights amqha gives on them."""
        _need(access.is_admin(request["user"]))
        return _json(definitions.export(self.broker.config.users, ())["permissions"])

    async def policies(self, request: web.Request) -> web.StreamResponse:
        """amqha has no policies (queue arguments only): always empty."""
        if "vhost" in request.match_info:
            self._vhost(request)
        return _json([])

    async def aliveness(self, request: web.Request) -> web.StreamResponse:
        """RabbitMQ's aliveness test: a message through a queue of the vhost, on a server
        that serves. The queue is the check's own, made for it and in no vhost's table: an
        application's queue named ``aliveness-test`` is never touched (RabbitMQ declares
        and reads that name; docs/operations.md)."""
        vhost = self._vhost(request)
        _need(access.may_change_queue(request["user"], vhost.name))
        if not self.broker.pair.serving():
            return _json({"status": "failed", "reason": "this server is not serving"}, 503)
        now = time.time()
        queue = new_queue(ALIVENESS_QUEUE, vhost=vhost.name)
        vhost.enqueue(aliveness_message(), (queue,), now)
        got = queue.get(now, no_ack=True)
        if got is None or got[0].body != ALIVENESS_BODY:
            return _json({"status": "failed", "reason": "the test message did not come back"}, 503)
        return _json({"status": "ok"})

    # -- queues ---------------------------------------------------------------------------

    async def queues(self, request: web.Request) -> web.StreamResponse:
        vhosts = self._vhosts(request)
        node, now = self._node(), time.time()
        found = [
            shapes.queue_shape(v.name, q, node, shapes.queue_rates(self.rates, v.name, q, now))
            for v in vhosts
            for q in v.visible_queues()
        ]
        if "vhost" not in request.match_info:
            self.rates.sweep()
        return _json(shapes.sorted_by_name(found))

    def _queue(self, request: web.Request) -> tuple[Any, Any]:
        vhost = self._vhost(request)
        queue = vhost.queues.get(request.match_info["name"])
        if queue is None or vhost.hidden_queue(queue.name) is not None:
            raise not_found()
        return vhost, queue

    async def queue(self, request: web.Request) -> web.StreamResponse:
        vhost, queue = self._queue(request)
        rates = shapes.queue_rates(self.rates, vhost.name, queue, time.time())
        shape = shapes.queue_shape(vhost.name, queue, self._node(), rates)
        shape["consumer_details"] = [
            c
            for c in self._consumers(request["user"])
            if c["queue"]["name"] == queue.name and c["queue"]["vhost"] == vhost.name
        ]
        return _json(shape)

    def _may_change(self, request: web.Request, vhost: Any, queue: str = "") -> None:
        _need(access.may_change_queue(request["user"], vhost.name, queue))
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
        return web.Response(status=204)

    # -- exchanges, bindings -------------------------------------------------------------

    async def exchanges(self, request: web.Request) -> web.StreamResponse:
        vhosts = self._vhosts(request)
        return _json(
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
        return _json(shapes.exchange_shape(vhost.name, exchange))

    async def bindings(self, request: web.Request) -> web.StreamResponse:
        vhosts = self._vhosts(request)
        return _json([b for v in vhosts for b in shapes.bindings_of(v)])

    # -- connections, channels, consumers ------------------------------------------------

    def _visible_connections(self, user: Any) -> list[Any]:
        """Open client connections ``user`` may see; the pair's own (peering) never."""
        return [
            c
            for c in self.broker.open_connections()
            if c.user is not None
            and not access.is_internal_user(c.user)
            and access.sees_connection(user, c.user.name)
        ]

    async def connections(self, request: web.Request) -> web.StreamResponse:
        node = self._node()
        found = [connection_shape(c, node) for c in self._visible_connections(request["user"])]
        return _json(sorted(found, key=lambda c: c["name"]))

    def _connection(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        for connection in self._visible_connections(request["user"]):
            if connection_name(connection) == name:
                return connection
        raise not_found()

    async def connection(self, request: web.Request) -> web.StreamResponse:
        return _json(connection_shape(self._connection(request), self._node()))

    async def close_connection(self, request: web.Request) -> web.StreamResponse:
        connection = self._connection(request)
        user = request["user"]
        _need(access.may_close_connection(user, connection.user.name))
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
        node = self._node()
        found = [
            channel_shape(c, channel, node)
            for c in self._visible_connections(request["user"])
            for channel in list(c.channels.values())
        ]
        return _json(sorted(found, key=lambda c: c["name"]))

    def _consumers(self, user: Any) -> list[dict[str, Any]]:
        found = []
        for connection in self._visible_connections(user):
            for channel in list(connection.channels.values()):
                for consumer in channel.consumers.values():
                    found.append(consumer_shape(connection, channel, consumer))
        return found

    async def consumers(self, request: web.Request) -> web.StreamResponse:
        found = self._consumers(request["user"])
        if "vhost" in request.match_info:
            vhost = self._vhost(request)
            found = [c for c in found if c["queue"]["vhost"] == vhost.name]
        return _json(found)

    # -- health checks ------------------------------------------------------------------

    async def alarms(self, request: web.Request) -> web.StreamResponse:
        broker = self.broker
        found = shapes.alarms(
            self._node(), broker.memory_over, bool(broker.store_status().get("failing"))
        )
        if found:
            return _json(
                {"status": "failed", "reason": "resource alarm(s) in effect", "alarms": found},
                503,
            )
        return _json({"status": "ok"})

    async def check_active(self, request: web.Request) -> web.StreamResponse:
        status = self.broker.pair.status()
        status["serving"] = self.broker.pair.serving()
        return _check(*shapes.is_active(status))

    async def check_active_in_sync(self, request: web.Request) -> web.StreamResponse:
        status = self.broker.pair.status()
        status["serving"] = self.broker.pair.serving()
        return _check(*shapes.active_in_sync(status, self.broker.replication_status()))

    # -- the event log -------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        _need(access.is_monitor(request["user"]))
        limit = _int_query(request, "limit", 100, 1, 1000)
        answer = read_events(self.broker.config.event_log_path, -1, limit)
        answer["server"] = self.broker.config.name
        return _json(answer)

    async def peer_events(self, request: web.Request) -> web.StreamResponse:
        """The peer's event log, asked of the peer's management listener
        (``management.peer``) with the caller's own credentials."""
        _need(access.is_monitor(request["user"]))
        assert self.config is not None
        peer = self.config.peer
        if peer is None:
            return _json({"available": False, "reason": "management.peer is not configured"})
        limit = _int_query(request, "limit", 100, 1, 1000)
        answer = await self._ask_peer(request, f"/api/amqha/events?limit={limit}")
        return _json(answer)

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
        _need(access.is_monitor(request["user"]))
        now = time.time()
        try:
            since = float(request.query.get("since", now - 3600))
        except ValueError:
            raise ApiError(400, "bad_request", "since must be a number (epoch seconds)") from None
        if not math.isfinite(since):
            raise ApiError(400, "bad_request", "since must be a finite number (epoch seconds)")
        since = max(now - HISTORY_SECONDS, min(now, since))
        records = await self._own_history(since)
        return _json({"server": self.broker.config.name, "since": since, "records": records})

    async def timeline(self, request: web.Request) -> web.StreamResponse:
        """Both servers' states over the last ``hours`` (1, 3, 12 or 24), the unprotected
        spans, outages, dual-active spells and incidents, and the pair's unprotected time
        since UTC midnight (docs/operations.md, "Web page")."""
        _need(access.is_monitor(request["user"]))
        hours = _int_query(request, "hours", timeline.DEFAULT_HOURS, 1, 24)
        if hours not in timeline.HOURS:
            raise ApiError(400, "bad_request", f"hours must be one of {timeline.HOURS}")
        now = time.time()
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
        return _json({"hours": hours, "server": name, "peer": peer, **found})

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

    # -- definitions ----------------------------------------------------------------------

    async def get_definitions(self, request: web.Request) -> web.StreamResponse:
        _need(access.is_admin(request["user"]))
        return _json(definitions.export(self.broker.config.users, self.broker.vhosts.values()))

    async def post_definitions(self, request: web.Request) -> web.StreamResponse:
        _need(access.is_admin(request["user"]))
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
                definitions.apply(plan, self.broker, time.time())
            except definitions.Refused as error:
                raise ApiError(error.status, "bad_request", str(error)) from None
        log.info(
            "definitions imported by %s (management): %s",
            escaped(request["user"].name),
            plan.summary(),
        )
        return web.Response(status=204)


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


ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_BODY = b"test_message"


def aliveness_message() -> Message:
    header = ContentHeader(body_size=len(ALIVENESS_BODY), properties=commands.Basic.Properties())
    return Message(address_of("", ALIVENESS_QUEUE), header.marshal(), ALIVENESS_BODY)


# -- connections, channels and consumers as RabbitMQ shows them ---------------------------


def _address(transport: Any, what: str) -> tuple[str, int]:
    where = transport.get_extra_info(what) if transport is not None else None
    if not where:
        return "", 0
    return str(where[0]), int(where[1])


def connection_name(connection: Any) -> str:
    """``peer host:port -> local host:port``, as RabbitMQ names a connection."""
    peer_host, peer_port = _address(connection.transport, "peername")
    host, port = _address(connection.transport, "sockname")
    return f"{peer_host}:{peer_port} -> {host}:{port}"


def connection_shape(connection: Any, node: str) -> dict[str, Any]:
    peer_host, peer_port = _address(connection.transport, "peername")
    host, port = _address(connection.transport, "sockname")
    properties = shapes._jsonable(dict(connection.client_properties))
    tls = connection.transport is not None and connection.transport.get_extra_info("sslcontext")
    return {
        "name": connection_name(connection),
        "node": node,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "user": connection.user.name,
        "vhost": connection.vhost.name,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "host": host,
        "port": port,
        "channels": len(connection.channels),
        "channel_max": connection.channel_max,
        "frame_max": connection.frame_max,
        "timeout": connection.heartbeat,
        "ssl": bool(tls),
        "state": "blocked" if connection.read_holds else "running",
        "client_properties": properties,
        "amqha": {"privileged": bool(connection.bypasses_gate)},
    }


def channel_shape(connection: Any, channel: Any, node: str) -> dict[str, Any]:
    name = connection_name(connection)
    return {
        "name": f"{name} ({channel.number})",
        "number": channel.number,
        "node": node,
        "user": connection.user.name,
        "vhost": connection.vhost.name,
        "connection_details": {
            "name": name,
            "peer_host": _address(connection.transport, "peername")[0],
            "peer_port": _address(connection.transport, "peername")[1],
        },
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.global_prefetch,
        "confirm": bool(channel.confirm),
        "transactional": channel.transaction is not None,
        "state": "running",
    }


def consumer_shape(connection: Any, channel: Any, consumer: Any) -> dict[str, Any]:
    name = connection_name(connection)
    peer_host, peer_port = _address(connection.transport, "peername")
    queue = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": connection.vhost.name},
        "channel_details": {
            "name": f"{name} ({channel.number})",
            "number": channel.number,
            "connection_name": name,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "user": connection.user.name,
        },
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "active": True,
        "activity_status": "up",
        "arguments": {},
    }


# -- helpers ------------------------------------------------------------------------------


def _basic(header: str) -> tuple[str, str]:
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise ApiError(401, "not_authorised", "Login failed")
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise ApiError(401, "not_authorised", "Login failed") from None
    username, sep, password = text.partition(":")
    if not sep:
        raise ApiError(401, "not_authorised", "Login failed")
    return username, password


def _need(allowed: bool) -> None:
    if not allowed:
        raise ApiError(401, "not_authorised", "Not authorised: the user's tags do not allow it")


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, headers={"Cache-Control": "no-store"})


def _check(ok: bool, reason: str) -> web.Response:
    if ok:
        return _json({"status": "ok", "reason": reason})
    return _json({"status": "failed", "reason": reason}, 503)


def _int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be an integer") from None
    return max(low, min(high, value))


def _plan(text: str, config: Any) -> definitions.Plan:
    """A definitions file's plan (on a worker thread): Refused if it is not JSON or not
    importable."""
    try:
        body = guard.loads(text)
    except ValueError as error:
        raise definitions.Refused(f"not JSON: {error}") from None
    return definitions.plan_import(body, config)
