"""One federation link: a client of the upstream that brings one exchange's traffic down.

Owns: connecting to the upstream (its URLs in turn, a PASSIVE's ``NOT_ACTIVE`` redirect
followed, heartbeats on), the hello and the binding reconcile on ``amq.federation``, the
buffer queue, pipelined binds, consuming with a prefetch, acking upstream what
``intake`` has taken down (routed into the local exchange in process; ``delivery:
confirm`` once the local server holds it safe, ``drop`` once routed; no acks while the
local alarm is on), the outbound connection that carries what the link publishes upstream
(probes, forwarded messages), and the link's status (docs/federation.md, "The link" and
"Flow control").

What a link decides (its bindings, its state, its retry delay, when it is stalled) is
``model``'s; this module does it.

Must not know: when this server leads (``agent.Federation`` starts and stops links), the
config file.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import random
import ssl
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from yarl import URL

from peering.agent import raise_if_cancelled

from ..core import names
from ..core.reserved import FEDERATION_EXCHANGE
from ..gate import redirect_target
from . import model
from .forward import Forwarder
from .intake import Intake

if TYPE_CHECKING:
    from config.schema import FederatedExchange

    from ..host import FederationHost

log = logging.getLogger("amqha.federation")

REPLY_TO = "amq.rabbitmq.reply-to"
# Heartbeats asked of the upstream: a dead upstream is noticed within about twice this.
HEARTBEAT = 5
CONNECT_TIMEOUT = 5.0
# An answer from amq.federation, or an AMQP method's reply, longer than this fails the link.
ANSWER_TIMEOUT = 10.0
# A run-time removal waits this long for the upstream to delete the buffer queue.
DELETE_TIMEOUT = 3.0
BACKOFF_INITIAL = 0.1
BACKOFF_MAX = 5.0
# How often a running link looks for local binding changes (a counter compare) and due work.
TICK = 0.05
# After normalising the local bindings (which took T), changes wait 9 T before the next.
WATCH_COST_FACTOR = 9


def _release(sleeper: asyncio.Future[None]) -> None:
    if not sleeper.done():
        sleeper.set_result(None)


def _released(sleeper: asyncio.Future[None], _: Any) -> None:
    _release(sleeper)


def _probe_done(task: asyncio.Future[Any]) -> None:
    """A probe that failed went with its connection: the link's loop notices that."""
    if not task.cancelled():
        task.exception()


class LinkFailure(Exception):
    """Why a link cannot run: its ``failed(reason)``."""


def _reason(error: BaseException) -> str:
    """An error as a link's reason: the broker's reply text where there is one."""
    text = str(error) or type(error).__name__
    if isinstance(error, asyncio.TimeoutError):
        return "timed out"
    if isinstance(error, ConnectionError) and not str(error):
        return type(error).__name__
    for token in ("ACCESS_REFUSED", "NOT_FOUND", "NOT_ACTIVE", "PRECONDITION_FAILED"):
        at = text.find(token)
        if at >= 0:
            return text[at:].rstrip("')\"").split("', ")[0][:300]
    return text[:300]


def _with_vhost(url: str, vhost: str) -> URL:
    """The upstream URL for the exchange's vhost, with heartbeats asked for."""
    base = URL(url)
    path = "/" if vhost == "/" else "/" + quote(vhost, safe="")
    return base.with_path(path, encoded=True).with_query({"heartbeat": str(HEARTBEAT)})


def _with_address(url: URL, address: str) -> URL:
    host, _, port = address.rpartition(":")
    return url.with_host(host.strip("[]")).with_port(int(port))


class Link(Intake):
    """One federated exchange's link to its upstream (docs/federation.md, "The link")."""

    def __init__(
        self,
        broker: FederationHost,
        spec_: FederatedExchange,
        urls: tuple[str, ...],
        local_name: str,
        federation_id: str,
        reconcile: float,
        probe: float,
        prefetch: int,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        rng: random.Random | None = None,
        tls: ssl.SSLContext | None = None,
        source: str = "config",
    ) -> None:
        self.broker = broker
        self.source = source  # "config" (the config file) or "console" (added at run time)
        self.spec = spec_
        self.raw_urls = tuple(urls)  # as configured (the delete of a removed link uses them)
        self.urls = [_with_vhost(url, spec_.vhost) for url in urls]
        self.local_name = local_name
        self.federation_id = federation_id
        self.reconcile_every = reconcile
        self.probe_every = probe
        self.prefetch = prefetch
        self.on_event = on_event
        self.rng = rng or random.Random()
        self.tls = tls  # for amqps URLs: whom to trust (failover.peer_tls's CA)
        self.confirm = spec_.delivery == "confirm"
        # Until a hello names it, the upstream is called by its key in federation.upstreams.
        self.upstream_name = spec_.upstream
        self.state = model.LinkState()
        self.probes = model.Probes(probe)
        self.counters = model.Counters()
        self.server: str | None = None
        self.last_server: str | None = None
        self.last_error: str | None = None
        self.buffer_depth: int | None = None
        self.control = False  # the upstream answers on amq.federation
        self.desired = model.Desired()
        self.confirmed: dict[Any, model.UpstreamBinding] = {}  # bound upstream, as known
        self._task: asyncio.Task[None] | None = None
        self._connection: aiormq.abc.AbstractConnection | None = None
        # What the link publishes upstream (probes, forwarded messages) goes on a
        # connection of its own: the upstream's alarm holds a connection that publishes,
        # never the one that takes messages down and acks them (docs/federation.md,
        # "Flow control").
        self._outbound: aiormq.abc.AbstractConnection | None = None
        self._probing: asyncio.Future[Any] | None = None
        self._target: URL | None = None  # the URL the link's connection took
        self._session = 0
        self._watched: tuple[int, int] | None = None  # (id, version) of the exchange seen
        self._next_watch = 0.0  # perf_counter time before which changes wait (a storm)
        self._inflight: collections.deque[list[Any]] = collections.deque()
        self._ack_upto = 0
        self._acked = 0
        self._broken: str | None = None
        self._poked = False  # there is work for the running loop (see _serve)
        self._sleeper: asyncio.Future[None] | None = None
        self._answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._down_since: float | None = None
        # forward: true: the drain of the hidden queue of what is published here
        # (docs/federation.md, "The link", step 8), made when the link first runs.
        self.forwarder: Forwarder | None = None

    # -- status --------------------------------------------------------------------------

    @property
    def buffer_queue(self) -> str:
        return names.buffer_queue_name(self.spec.exchange, self.upstream_name, self.local_name)

    @property
    def probe_key(self) -> str:
        return model.probe_key(self.local_name, self.spec.exchange)

    def status(self) -> dict[str, Any]:
        now = self.broker.now()
        counters = self.counters
        return {
            "exchange": self.spec.exchange,
            "vhost": self.spec.vhost,
            "upstream": self.spec.upstream,
            "upstream_name": self.upstream_name,
            "source": self.source,
            "delivery": self.spec.delivery,
            "state": model.shown_state(self.state, self.probes, now),
            "reason": self.state.reason,
            "since": self.state.since,
            "attempts": self.state.attempts,
            "server": self.server,
            "last_error": self.last_error,
            "buffer_queue": self.buffer_queue,
            "bindings": {"desired": len(self.desired.bindings), "confirmed": len(self.confirmed)},
            "bindings_refused": dict(self.desired.refused),
            "repairs": counters.repairs,
            "buffer_depth": self.buffer_depth,
            "in": counters.received,
            "out": self.forwarder.forwarded if self.forwarder is not None else 0,
            "forward": self.forwarder.status() if self.forwarder is not None else None,
            "dropped": dict(counters.dropped),
            "duplicates": counters.duplicates,
            "probes": {"sent": self.probes.sent, "back": self.probes.back},
            "last_message": counters.last_message,
            "control": self.control,
        }

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self.state.connecting(self.broker.now())
            name = f"federation {self.spec.exchange} <- {self.spec.upstream}"
            self._task = asyncio.get_running_loop().create_task(self._run(), name=name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._close()
        if self.forwarder is not None:
            self.forwarder.detach()
        if self.state.state == model.RUNNING:
            self._event("link_down", reason="stopped")
        self.state.connecting(self.broker.now())

    async def delete_upstream_queue(self, queue: str, timeout: float = DELETE_TIMEOUT) -> None:
        """Delete the buffer queue ``queue`` upstream on a short connection of the link's
        own (URLs, login, vhost), for a link removed at run time; the link is stopped.
        An error (LinkFailure, or the upstream's) if it could not be done within
        ``timeout``; a queue already gone is done."""
        try:
            async with asyncio.timeout(timeout):
                connection = await self._connect(timeout)
                try:
                    await self._hello(connection)  # only the link's own may delete it
                    channel = await connection.channel()
                    await channel.queue_delete(queue)
                finally:
                    with contextlib.suppress(Exception):
                        await connection.close()
        except TimeoutError:
            raise LinkFailure(f"no answer from the upstream within {timeout:g} s") from None
        finally:
            self.server = None

    async def _close(self) -> None:
        exchange = self._local_exchange()
        if exchange is not None:
            exchange.watchers.discard(self._poke)
        connection, self._connection = self._connection, None
        outbound, self._outbound = self._outbound, None
        self._session += 1  # what the old connection left in flight is forgotten
        self._inflight.clear()
        if self.forwarder is not None:
            self.forwarder.down()
        for each in (outbound, connection):
            if each is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(each.close(), ANSWER_TIMEOUT)

    def _poke(self) -> None:
        """Work for the running link: it wakes now rather than at its next tick."""
        self._poked = True
        sleeper = self._sleeper
        if sleeper is not None and not sleeper.done():
            sleeper.set_result(None)

    def _event(self, kind: str, **fields: Any) -> None:
        record = {
            "kind": kind,
            "exchange": self.spec.exchange,
            "vhost": self.spec.vhost,
            "upstream": self.spec.upstream,
            **fields,
        }
        log.info("federation %s: %s", kind, record)
        if self.on_event is not None:
            self.on_event("federation", record)

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                await self._session_run()
                reason = "the upstream closed the connection"
            except asyncio.CancelledError:
                raise
            except LinkFailure as failure:
                reason = str(failure)
            except Exception as error:  # a connection lost mid-way, any AMQP error
                reason = _reason(error)
            was_running = self.state.state == model.RUNNING
            await self._close()
            now = self.broker.now()
            self.last_error = reason
            self.server = None  # the last one used is named in link_down and in the log
            if was_running:
                self._event("link_down", reason=reason, server=self.last_server)
            self.state.failed(reason, now)
            if self.state.attempts == 1 or not was_running and self.state.attempts % 50 == 0:
                self._event("link_failed", reason=reason, attempts=self.state.attempts)
            raise_if_cancelled()
            await asyncio.sleep(
                model.backoff(self.state.attempts, BACKOFF_INITIAL, BACKOFF_MAX, self.rng)
            )

    # -- connecting ----------------------------------------------------------------------

    async def _connect(self, timeout: float = CONNECT_TIMEOUT) -> aiormq.abc.AbstractConnection:
        """The first upstream server that takes the link, a PASSIVE's redirect followed."""
        last = "no upstream URL"
        for url in self.urls:
            target: URL | None = url
            for _ in range(2):  # the listed address, then where it sends the link
                if target is None:
                    break
                raise_if_cancelled()
                try:
                    connection = await asyncio.wait_for(
                        aiormq.connect(target, **self._connect_options(target)), timeout
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    last = _reason(error)
                    redirect = redirect_target(error, [])
                    target = None if redirect is None else _with_address(url, redirect)
                    continue
                self.server = self.last_server = f"{target.host}:{target.port}"
                self._target = target
                return connection
        raise LinkFailure(last)

    def _connect_options(self, target: URL) -> dict[str, Any]:
        options: dict[str, Any] = {
            "client_properties": {
                "connection_name": f"federation {self.spec.exchange} "
                f"{self.local_name} <- {self.spec.upstream}"
            }
        }
        if self.tls is not None and target.scheme == "amqps":
            options["context"] = self.tls
        return options

    async def _session_run(self) -> None:
        self._broken = None
        exchange = self._local_exchange()
        if exchange is None:
            raise LinkFailure(f"exchange not found here (vhost {self.spec.vhost!r})")
        self._set_forward()  # before connecting: what is published meanwhile is kept
        connection = self._connection = await self._connect()
        session = self._session
        await self._hello(connection)
        self._set_forward()  # the hello may have given the upstream's real name
        channel = await connection.channel(publisher_confirms=False)
        try:
            await asyncio.wait_for(
                channel.exchange_declare(self.spec.exchange, passive=True), ANSWER_TIMEOUT
            )
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise LinkFailure("exchange not found upstream") from None
        declared = await asyncio.wait_for(
            channel.queue_declare(
                self.buffer_queue,
                durable=self.confirm,
                exclusive=not self.confirm,
                auto_delete=not self.confirm,
            ),
            ANSWER_TIMEOUT,
        )
        self.buffer_depth = declared.message_count
        self._watch_bindings(force=True)
        await self._reconcile(channel, connection)
        # Both kinds of link ack, and never more than ``prefetch`` are unacked: the
        # downstream's credit (docs/federation.md, "Flow control").
        await channel.basic_qos(prefetch_count=self.prefetch)
        self._ack_upto = self._acked = 0
        await channel.basic_consume(
            self.buffer_queue, functools.partial(self._delivered, session=session)
        )
        outbound = await self._open_outbound()
        now = self.broker.now()
        self.state.running(now)
        self.probes.up(now)
        self.last_error = None
        if self.forwarder is not None:
            await self._forward_through(outbound)
        self._event("link_up", server=self.server, upstream_name=self.upstream_name)
        await self._serve(connection, channel, await outbound.channel(publisher_confirms=False))

    async def _open_outbound(self) -> aiormq.abc.AbstractConnection:
        """The connection for what the link publishes upstream, to the server the link
        took (a pair's ACTIVE)."""
        url = self._target
        assert url is not None
        try:
            outbound = await asyncio.wait_for(
                aiormq.connect(url, **self._connect_options(url)), CONNECT_TIMEOUT
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:
            raise LinkFailure(f"outbound connection: {_reason(error)}") from None
        self._outbound = outbound
        # Probes and forwarded messages carry the headers the upstream trusts only from a
        # proven link connection: this one proves it belongs to our link (it joins the
        # link, it does not replace it).
        await self._hello(outbound, outbound=True)
        return outbound

    def _set_forward(self) -> None:
        """With ``forward: true``, what is published to the local exchange is also kept on
        the link's hidden queue (named by the upstream's config key, so it is the same
        before and after a hello names the upstream), to be drained upstream."""
        if not self.spec.forward:
            return
        vhost = self.broker.vhosts[self.spec.vhost]
        queue = vhost.set_forward(
            self.spec.exchange,
            names.forward_queue_name(self.spec.exchange, self.spec.upstream),
            self.upstream_name,
            self.local_name,
            self.spec.max_hops,
            self.broker.now(),
        )
        if self.forwarder is None or self.forwarder.queue is not queue:
            if self.forwarder is not None:
                self.forwarder.detach()
            self.forwarder = Forwarder(queue, self.spec.exchange, self.local_name, self.broker.now)

    async def _forward_through(self, connection: aiormq.abc.AbstractConnection) -> None:
        """Drain the hidden queue upstream on a channel of its own, with publisher confirms:
        a message is acked here only once the upstream confirmed it."""
        channel = await connection.channel(publisher_confirms=True)

        async def publish(
            exchange: str, routing_key: str, body: bytes, properties: spec.Basic.Properties
        ) -> bool:
            confirmation = await channel.basic_publish(
                body, exchange=exchange, routing_key=routing_key, properties=properties
            )
            return isinstance(confirmation, spec.Basic.Ack)

        assert self.forwarder is not None
        self.forwarder.up(publish)

    def _local_exchange(self) -> Any:
        vhost = self.broker.vhosts.get(self.spec.vhost)
        return None if vhost is None else vhost.exchanges.get(self.spec.exchange)

    # -- amq.federation --------------------------------------------------------------------

    async def _ask(
        self, connection: aiormq.abc.AbstractConnection, request: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The upstream's answer on amq.federation, or None if it has no such exchange
        (a server without the control exchange: the link then works from what it bound)."""
        channel = await connection.channel()
        try:
            while not self._answers.empty():
                self._answers.get_nowait()
            await channel.basic_consume(REPLY_TO, self._answer, no_ack=True)
            await asyncio.wait_for(
                channel.basic_publish(
                    json.dumps(request).encode(),
                    exchange=FEDERATION_EXCHANGE,
                    routing_key=str(request["op"]),
                    properties=spec.Basic.Properties(
                        reply_to=REPLY_TO,
                        correlation_id=uuid.uuid4().hex,
                        content_type="application/json",
                    ),
                ),
                ANSWER_TIMEOUT,
            )
            return await asyncio.wait_for(self._answers.get(), ANSWER_TIMEOUT)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        except TimeoutError:
            raise LinkFailure(f"no answer to {request['op']} on {FEDERATION_EXCHANGE}") from None
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), ANSWER_TIMEOUT)

    async def _answer(self, message: DeliveredMessage) -> None:
        try:
            answer = json.loads(message.body)
        except ValueError:
            answer = {"ok": False, "error": "an answer that is not JSON"}
        self._answers.put_nowait(answer if isinstance(answer, dict) else {"ok": False})

    async def _hello(
        self, connection: aiormq.abc.AbstractConnection, outbound: bool = False
    ) -> None:
        """Say who we are on ``connection``; ``outbound``: the link's second connection,
        which joins the link its first connection said a hello for."""
        # The proof of our name is bound to the upstream, by the global name it gave at
        # Connection.Start (docs/security.md, "Federation names").
        told = (connection.server_properties or {}).get("amqha-name")
        upstream = told.decode() if isinstance(told, bytes) else str(told or self.upstream_name)
        request: dict[str, Any] = {
            "op": "hello",
            "name": self.local_name,
            "key": names.claim_key(self.federation_id, upstream),
            "server": self.broker.config.name,
            "exchange": self.spec.exchange,
            "vhost": self.spec.vhost,
        }
        if outbound:
            request["outbound"] = True
        answer = await self._ask(connection, request)
        if outbound:
            if answer is not None and not answer.get("ok"):
                raise LinkFailure(str(answer.get("error") or "outbound hello refused"))
            return
        self.control = answer is not None
        if answer is None:
            return
        if not answer.get("ok"):
            raise LinkFailure(str(answer.get("error") or "hello refused"))
        name = answer.get("name")
        if not isinstance(name, str) or names.global_name_problem(name) is not None:
            raise LinkFailure(f"the upstream answered hello with a bad name {name!r}")
        self.upstream_name = str(name)

    # -- bindings ------------------------------------------------------------------------

    def _watch_bindings(self, force: bool = False) -> bool:
        """Recompute the desired upstream bindings if the local exchange's bindings changed
        (or it was replaced); True if they did."""
        exchange = self._local_exchange()
        if exchange is not None and self._poke not in exchange.watchers:
            exchange.watchers.add(self._poke)  # a change wakes the link at once
        seen = None if exchange is None else (id(exchange), exchange.version)
        if seen == self._watched and not force:
            return False
        started = time.perf_counter()
        if not force and started < self._next_watch:
            return False  # a storm of changes: looked at again soon, at a bounded cost
        self._watched = seen
        local = (
            []
            if exchange is None or not self.spec.bindings
            else [(b.routing_key, b.arguments) for b in exchange.bindings.values()]
        )
        self.desired = model.desired(local, self.local_name, self.upstream_name, self.spec.max_hops)
        # Normalising is O(bindings): while they keep changing, the link spends at most
        # about a tenth of the server's time on it.
        self._next_watch = time.perf_counter() + WATCH_COST_FACTOR * (time.perf_counter() - started)
        return True

    def _wanted(self) -> dict[Any, model.UpstreamBinding]:
        """The desired bindings and the probe's own."""
        probe = model.UpstreamBinding(
            self.probe_key, {"x-match": "all", model.PROBE_HEADER: self.probe_key}
        )
        return {**self.desired.bindings, probe.key: probe}

    async def _apply(
        self,
        channel: aiormq.abc.AbstractChannel,
        to_bind: list[model.UpstreamBinding],
        to_unbind: list[model.UpstreamBinding],
    ) -> None:
        """Binds pipelined (no wait for each Bind-Ok), then unbinds; a passive declare
        after them answers once the upstream has done them all."""
        queue, exchange = self.buffer_queue, self.spec.exchange
        for binding in to_bind:
            await channel.queue_bind(
                queue,
                exchange,
                binding.routing_key,
                nowait=True,
                arguments=dict(binding.arguments),
            )
        if to_unbind:
            await asyncio.wait_for(
                asyncio.gather(
                    *(
                        channel.queue_unbind(
                            queue, exchange, binding.routing_key, dict(binding.arguments)
                        )
                        for binding in to_unbind
                    )
                ),
                ANSWER_TIMEOUT,
            )
        declared = await asyncio.wait_for(
            channel.queue_declare(queue, passive=True), ANSWER_TIMEOUT
        )
        self.buffer_depth = declared.message_count
        for binding in to_bind:
            self.confirmed[binding.key] = binding
        for binding in to_unbind:
            self.confirmed.pop(binding.key, None)

    async def _reconcile(
        self, channel: aiormq.abc.AbstractChannel, connection: aiormq.abc.AbstractConnection
    ) -> None:
        """Make the buffer queue's upstream bindings the wanted ones, from what the upstream
        says it has; without amq.federation, from what this link bound (each bound again:
        binding is idempotent)."""
        wanted = self._wanted()
        answer = None
        if self.control:
            answer = await self._ask(
                connection, {"op": "bindings", "vhost": self.spec.vhost, "queue": self.buffer_queue}
            )
            if answer is not None and not answer.get("ok"):
                raise LinkFailure(str(answer.get("error") or "bindings refused"))
        if answer is None:
            to_bind = list(wanted.values())
            to_unbind = [
                b for key, b in sorted(self.confirmed.items(), key=repr) if key not in wanted
            ]
            await self._apply(channel, to_bind, to_unbind)
            return
        actual = [
            model.UpstreamBinding(str(item.get("routing_key", "")), item.get("arguments") or {})
            for item in answer.get("bindings") or []
            if isinstance(item, dict) and item.get("exchange") == self.spec.exchange
        ]
        self.confirmed = {binding.key: binding for binding in actual}
        to_bind, to_unbind = model.repairs(wanted, actual)
        probe = self.probe_key  # the link's own probe binding made again is no repair
        self.counters.repairs += sum(b.routing_key != probe for b in (*to_bind, *to_unbind))
        await self._apply(channel, to_bind, to_unbind)

    async def _sync_bindings(self, channel: aiormq.abc.AbstractChannel) -> None:
        """Local bindings changed: bind and unbind the difference from what is bound."""
        to_bind, to_unbind = model.repairs(self._wanted(), self.confirmed.values())
        if to_bind or to_unbind:
            await self._apply(channel, to_bind, to_unbind)

    # -- running ---------------------------------------------------------------------------

    async def _serve(
        self,
        connection: aiormq.abc.AbstractConnection,
        channel: aiormq.abc.AbstractChannel,
        outbound: aiormq.abc.AbstractChannel,
    ) -> None:
        """Until the connection goes: acks, binding changes, probes, reconciles."""
        loop = asyncio.get_running_loop()
        next_probe = loop.time()
        next_reconcile = loop.time() + self.reconcile_every
        closing = connection.closing
        while not closing.done():
            if not self._poked:
                # Until poked (a binding changed here, acks are due, the link broke), the
                # connection closes, or a tick passes: a bare future, woken directly.
                sleeper = self._sleeper = loop.create_future()
                timer = loop.call_later(TICK, _release, sleeper)
                on_close = functools.partial(_released, sleeper)
                closing.add_done_callback(on_close)
                try:
                    await sleeper
                finally:
                    timer.cancel()
                    closing.remove_done_callback(on_close)
                    self._sleeper = None
            self._poked = False
            if self._broken is not None:
                raise LinkFailure(self._broken)
            if closing.done():
                break
            if outbound.is_closed:
                raise LinkFailure("the outbound connection closed")
            # While this server blocks publishers (memory), what came down stays unacked:
            # the upstream stops at the prefetch and keeps the rest (both kinds of link:
            # docs/federation.md, "Flow control").
            if self._ack_upto > self._acked and not self.broker.blocked:
                upto = self._ack_upto
                await channel.basic_ack(upto, multiple=True)
                self._acked = upto
            if self._watch_bindings():
                await self._sync_bindings(channel)
            now = loop.time()
            if now >= next_probe:
                next_probe = now + self.probe_every
                self._probe(outbound)
            if now >= next_reconcile:
                next_reconcile = now + self.reconcile_every
                await self._reconcile(channel, connection)
        error = closing.exception() if closing.done() and not closing.cancelled() else None
        if error is not None:
            raise LinkFailure(_reason(error))

    def _probe(self, channel: aiormq.abc.AbstractChannel) -> None:
        """A probe, sent beside the loop: while the upstream's alarm holds the outbound
        connection it waits there (and the link shows stalled), and acks still flow."""
        if self._probing is not None and not self._probing.done():
            return
        self._probing = asyncio.ensure_future(
            channel.basic_publish(
                b"",
                exchange=self.spec.exchange,
                routing_key=self.probe_key,
                properties=spec.Basic.Properties(headers={model.PROBE_HEADER: self.probe_key}),
            )
        )
        self._probing.add_done_callback(_probe_done)
        self.probes.sent_one()
