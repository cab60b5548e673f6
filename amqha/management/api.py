"""The management listener: RabbitMQ's HTTP API and the pair's web page, on aiohttp.

Owns: the ``management.listen`` listener (an aiohttp.web application on the broker's
loop, TLS with the amqps listener's certificate when ``management.tls``), HTTP basic
auth against the broker's users (the same logins as AMQP, the same refusal delay), the
route table of docs/operations.md ("Management API"), the overview, nodes and whoami
routes and the page at ``/``; the other routes are ``objects``' (the broker's objects and
the changes to them) and ``history``'s (the event logs and the pair's timeline).

Bounds: aiohttp parses requests with the limits of HANDLER_OPTIONS; a body is at most
MAX_BODY (a definitions file); the sockets are ``sockets``' (at most MAX_CONNECTIONS, a
share per address, a socket that has not logged in closed after its answer, so none can
keep an operator out); a change must pass ``guard`` (same origin, a JSON body); a
successful login is remembered for LOGIN_CACHE_SECONDS (at most LOGIN_CACHE_SIZE of them)
so the page's polling does not cost an scrypt check every two seconds; a refused one costs
its sender ``auth.failed_login_delay``.

Must not know: how the model routes or stores (``core``), how failover decides (it reads
the broker's ``gate.Pair``); what a user may see is ``access``, the JSON is ``shapes``,
the answers and refusals are ``replies``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from config.tls import server_context

from .. import __version__, clock
from . import access, guard, shapes
from .history import PairHistory
from .objects import ObjectRoutes
from .policies import PolicyRoutes
from .replies import ApiError, basic_credentials, json_reply, need, not_found
from .sockets import REQUEST_TIMEOUT, ManagedSocket, SocketTable
from .users import AccessRoutes
from .writes import WriteRoutes

if TYPE_CHECKING:
    from ..host import ManagementSource

log = logging.getLogger("amqha.management")

MAX_BODY = 16 * 1024 * 1024
LOGIN_CACHE_SECONDS = 60.0
LOGIN_CACHE_SIZE = 1024
SHUTDOWN_TIMEOUT = 0.5
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


class ManagementEndpoint:
    """The listener; started with the broker when ``management.listen`` is set."""

    def __init__(self, broker: ManagementSource) -> None:
        self.broker = broker
        self.config = broker.config.management
        self.runner: web.AppRunner | None = None
        self.objects = ObjectRoutes(broker)
        self.writes = WriteRoutes(self.objects)
        self.users = AccessRoutes(self.objects)
        self.policies = PolicyRoutes(self.objects)
        self.history = PairHistory(broker)
        # sha256(authorization header) -> (user, expiry on the loop's clock)
        self.logins: OrderedDict[bytes, tuple[Any, float, int]] = OrderedDict()
        self.listener: asyncio.base_events.Server | None = None
        self.sockets = SocketTable()

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
        await self.history.close()
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
        put = app.router.add_put
        objects, history, writes = self.objects, self.history, self.writes
        users = self.users
        get("/", self.page)
        get("/api/overview", self.overview)
        get("/api/whoami", self.whoami)
        get("/api/nodes", self.nodes)
        get("/api/nodes/{node}", self.node)
        get("/api/vhosts", objects.vhosts)
        get("/api/vhosts/{vhost}", objects.vhost)
        get("/api/users", objects.users)
        get("/api/users/{name}", users.user)
        put("/api/users/{name}", users.put_user)
        delete("/api/users/{name}", users.delete_user)
        put("/api/vhosts/{vhost}", users.put_vhost)
        delete("/api/vhosts/{vhost}", users.delete_vhost)
        get("/api/permissions", objects.permissions)
        get("/api/permissions/{vhost}/{user}", users.permission)
        put("/api/permissions/{vhost}/{user}", users.put_permission)
        delete("/api/permissions/{vhost}/{user}", users.delete_permission)
        for kind in ("policies", "operator-policies"):
            get(f"/api/{kind}", self.policies.listing)
            get(f"/api/{kind}/{{vhost}}", self.policies.listing)
            get(f"/api/{kind}/{{vhost}}/{{name}}", self.policies.one)
            put(f"/api/{kind}/{{vhost}}/{{name}}", self.policies.put)
            delete(f"/api/{kind}/{{vhost}}/{{name}}", self.policies.delete)
        get("/api/aliveness-test/{vhost}", objects.aliveness)
        get("/api/queues", objects.queues)
        get("/api/queues/{vhost}", objects.queues)
        get("/api/queues/{vhost}/{name}", objects.queue)
        put("/api/queues/{vhost}/{name}", writes.put_queue)
        delete("/api/queues/{vhost}/{name}", objects.delete_queue)
        delete("/api/queues/{vhost}/{name}/contents", objects.purge_queue)
        get("/api/exchanges", objects.exchanges)
        get("/api/exchanges/{vhost}", objects.exchanges)
        get("/api/exchanges/{vhost}/{name}", objects.exchange)
        put("/api/exchanges/{vhost}/{name}", writes.put_exchange)
        delete("/api/exchanges/{vhost}/{name}", writes.delete_exchange)
        get("/api/bindings", objects.bindings)
        get("/api/bindings/{vhost}", objects.bindings)
        between = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
        get(between, writes.bindings_between)
        post(between, writes.post_binding)
        delete(between + "/{props}", writes.delete_binding)
        get("/api/connections", objects.connections)
        get("/api/connections/{name}", objects.connection)
        delete("/api/connections/{name}", objects.close_connection)
        get("/api/channels", objects.channels)
        get("/api/consumers", objects.consumers)
        get("/api/consumers/{vhost}", objects.consumers)
        get("/api/health/checks/alarms", objects.alarms)
        get("/api/health/checks/local-alarms", objects.alarms)
        get("/api/health/checks/amqha-active", objects.check_active)
        get("/api/health/checks/amqha-active-in-sync", objects.check_active_in_sync)
        get("/api/health/checks/amqha-config-match", objects.check_config_match)
        get("/api/definitions", objects.get_definitions)
        post("/api/definitions", objects.post_definitions)
        get("/api/amqha/events", history.events)
        get("/api/amqha/peer-events", history.peer_events)
        get("/api/amqha/history", history.history)
        get("/api/amqha/timeline", history.timeline)
        post("/api/amqha/switchover", objects.post_switchover)
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
            socket.request_in("Authorization" in request.headers)
        response = await self._answer(request, handler)
        if socket is not None:
            socket.answered(response, "user" in request)
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
        # A login remembered before a user, a vhost or a permission changed at run time is
        # checked again (a deleted user is out at its next request).
        if cached is not None and cached[1] > now and cached[2] == self.broker.access.version:
            self.logins.move_to_end(key)
            user = cached[0]
        else:
            username, password = basic_credentials(header)
            result = await self.broker.authenticate(username, password, remote, "HTTP basic")
            if not hasattr(result, "tags"):
                raise ApiError(401, "not_authorised", "Login failed")
            user = result
            self.logins[key] = (user, now + LOGIN_CACHE_SECONDS, self.broker.access.version)
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

    def _own(self) -> dict[str, Any]:
        broker = self.broker
        failover = broker.config.failover
        return {
            "name": broker.config.name,
            "uptime": clock.now() - broker.started,
            "mem_used": broker.memory.in_use(),
            "mem_limit": broker.config.limits.memory_high_watermark,
            "mem_alarm": broker.memory.over,
            "disk_alarm": bool(broker.store_status().get("failing")),
            "listen": broker.config.public_address,
            "peer_name": failover.peer_name,
            "peer_listen": failover.peer_listen[0] if failover.peer_listen else failover.peer,
        }

    async def nodes(self, request: web.Request) -> web.StreamResponse:
        need(access.is_monitor(request["user"]))
        return json_reply(self._nodes())

    def _nodes(self) -> list[dict[str, Any]]:
        return shapes.nodes_shape(
            self.broker.pair.status(), self.broker.replication_status(), self._own(), clock.now()
        )

    async def node(self, request: web.Request) -> web.StreamResponse:
        need(access.is_monitor(request["user"]))
        for node in self._nodes():
            if node["name"] == request.match_info["node"]:
                return json_reply(node)
        raise not_found()

    async def whoami(self, request: web.Request) -> web.StreamResponse:
        user = request["user"]
        return json_reply({"name": user.name, "tags": list(user.tags)})

    async def overview(self, request: web.Request) -> web.StreamResponse:
        user = request["user"]
        broker = self.broker
        now = clock.now()
        vhosts = [v for v in broker.vhosts.values() if access.sees_vhost(user, v.name)]
        queues = [(v.name, q) for v in vhosts for q in v.visible_queues()]
        connections = self.objects.visible_connections(user)
        totals = [0, 0, 0]
        rates = [0.0, 0.0, 0.0]
        for vhost, queue in queues:
            for index, rate in enumerate(shapes.queue_rates(self.objects.rates, vhost, queue, now)):
                rates[index] += rate
            totals[0] += queue.published
            totals[1] += queue.delivered
            totals[2] += queue.acked
        ready = sum(q.message_count for _, q in queues)
        unacked = sum(q.unacked for _, q in queues)
        node = self.objects.node()
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
        return json_reply(
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
