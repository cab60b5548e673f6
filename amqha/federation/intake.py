"""What a federation link takes down: each delivery routed here, and the acks it releases.

Owns: one upstream delivery of a link's session taken in the order it came (nothing here
awaits): a probe counted (the link's own) or dropped (another's), a message refused by
its path (``model.message_crossing``: a loop, past max_hops) or for want of the local
exchange dropped and counted, else routed into the local exchange in process with the
path header added and the upstream's user_id cleared; and the acks that follow: with
``delivery: confirm`` once the local server holds the message safe (``when_safe``), else
once routed, in order, up to the first delivery not yet done (docs/federation.md, "The
link"). ``Link`` inherits it and sends the acks.

Must not know: connections and channels (``link`` owns them), when this server leads,
the config file.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any

from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from ..core import names
from ..core.message import HELD, Message
from ..core.vhost import REFUSED
from ..wire import address_of, with_headers
from . import model

if TYPE_CHECKING:
    from config.schema import FederatedExchange

    from ..host import FederationHost

log = logging.getLogger("amqha.federation")


class Intake:
    """Mixed into ``Link``, whose session, counters and in-flight deliveries it uses."""

    broker: FederationHost
    spec: FederatedExchange
    confirm: bool
    upstream_name: str
    local_name: str
    probes: model.Probes
    counters: model.Counters
    _session: int
    # [delivery tag, done here] in the order they came; acks go up to the first not done.
    _inflight: collections.deque[list[Any]]
    _ack_upto: int
    _broken: str | None

    @property
    def probe_key(self) -> str:
        raise NotImplementedError

    def _poke(self) -> None:
        raise NotImplementedError

    async def _delivered(self, delivered: DeliveredMessage, session: int) -> None:
        """One upstream delivery: a probe counted, a message routed here (or dropped,
        counted); with ``delivery: confirm`` acked once the local server holds it safe.
        Nothing here awaits: deliveries are taken in the order they came."""
        if session != self._session or not self.broker.leading:
            return  # a server that no longer leads takes nothing down: the link is stopping
        deliver = delivered.delivery
        assert isinstance(deliver, spec.Basic.Deliver)
        tag = deliver.delivery_tag
        entry = [tag, False]
        self._inflight.append(entry)
        try:
            self._take(delivered, deliver, entry, session)
        except Exception as error:  # a header this server cannot take: counted, not routed
            log.warning("federation %s: delivery dropped: %s", self.spec.exchange, error)
            self.counters.drop("invalid")
            self._settle(entry, session)

    def _take(
        self, delivered: DeliveredMessage, deliver: Any, entry: list[Any], session: int
    ) -> None:
        properties = delivered.header.properties
        headers: dict[str, Any] = dict(properties.headers or {})
        now = self.broker.now()
        probe = headers.get(model.PROBE_HEADER)
        if probe is not None:
            if probe == self.probe_key:
                self.probes.came_back(now)
            else:
                self.counters.drop("foreign_probe")
            self._settle(entry, session)
            return
        path, refused = model.message_crossing(
            headers, self.upstream_name, self.local_name, self.spec.max_hops
        )
        if refused is not None:
            self.counters.drop(refused)
            self._settle(entry, session)
            return
        vhost = self.broker.vhosts.get(self.spec.vhost)
        exchange = None if vhost is None else vhost.exchanges.get(self.spec.exchange)
        if vhost is None or exchange is None:
            self.counters.drop("no_exchange")
            self._settle(entry, session)
            return
        headers[names.PATH_HEADER] = path
        properties.headers = None
        # Who published upstream is the upstream's word, not ours to vouch for: cleared,
        # as RabbitMQ's federation does by default (docs/federation.md, "The link").
        properties.user_id = None
        body = delivered.body
        header = with_headers(
            ContentHeader(body_size=len(body), properties=properties).marshal(), headers
        )
        routing_key = deliver.routing_key or ""
        message = Message(address_of(self.spec.exchange, routing_key), header, body)
        self.counters.taken(now, bool(deliver.redelivered))
        queues = vhost.route(exchange, routing_key, message)
        wait = vhost.enqueue(message, queues, now) if queues else 0
        message.decoded = None
        broker = self.broker
        if not broker.blocked and HELD.count > broker.memory.message_budget:
            broker.memory.check()  # as a publish does: acks stop at once past the watermark
        if wait == REFUSED:
            self.counters.drop("rejected")
        elif self.confirm and wait:
            self.broker.when_safe(wait, lambda ok: self._safe(entry, session, ok))
        else:
            self._settle(entry, session)

    def _safe(self, entry: list[Any], session: int, ok: bool) -> None:
        if session != self._session:
            return
        if not ok:
            # Not acked: the link restarts and the upstream delivers it again.
            self._broken = "the local store could not write a message"
            self._poke()
            return
        self._settle(entry, session)

    def _settle(self, entry: list[Any], session: int) -> None:
        """One delivery done here: the upstream may be acked up to the first not done."""
        if session != self._session:
            return
        entry[1] = True
        inflight = self._inflight
        upto = 0
        while inflight and inflight[0][1]:
            upto = inflight.popleft()[0]
        if upto:
            self._ack_upto = upto
            self._poke()
