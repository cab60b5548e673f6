"""The upstream side of federation: what this server answers on ``amq.federation``.

Owns: the requests other places' links send here (``hello``, ``bindings``), the
registry of the global names linked here (one claim per name, proven by a key only the
place holds: a second place claiming a name is refused and learns nothing of the holder,
docs/federation.md "Duplicate names", docs/security.md "Federation names"), who may touch
a buffer queue (only a connection linked for the queue's downstream name), the refusals'
event records, and the buffer queues left without a consumer (orphans). ``amq.federation``
is a control exchange: only users tagged ``federation`` may publish there (the channel
refuses others with 403); the service checks the tag again, and answers only to the
asking connection's own reply address (direct reply-to) or exclusive queue.

Must not know: sockets, frames, the failover state machine (the broker's
``federation_event`` hands the event records a pair keeps to its controller).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import clock as steady
from ..core import names
from ..core.message import Message
from ..core.reserved import FEDERATION_EXCHANGE
from ..logtext import escaped
from ..wire import address_of, json_answer

if TYPE_CHECKING:
    from ..host import FederationHost

FEDERATION_TAG = "federation"
# A buffer queue with no consumer for this long is reported as an orphan (logged once).
ORPHAN_AFTER = 300.0
# How often the buffer queues are looked at for orphans.
ORPHAN_CHECK = 10.0
# At most one log line of each kind of refusal this often (the event log has its own throttle).
LOG_INTERVAL = 1.0
# A name stays claimed this long after its last link closed (a link reconnecting, or the
# pair's other server taking over, finds it still its own), and at most this many names
# are claimed with no link (the oldest such claim goes first).
CLAIM_HOLD = 3600.0
MAX_IDLE_CLAIMS = 10_000
# Links one connection may hold (a link's connection holds one; more is a flood).
MAX_LINKS_PER_CONNECTION = 16

log = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request this service cannot read: answered ``{"ok": false, "error": ...}``."""


@dataclass
class Link:
    """One connection that said hello."""

    name: str  # the global name it claims
    token: str  # the hash of its claim key (names.claim_token): same place, same token
    server: str  # the server it runs on
    exchange: str
    vhost: str
    connection: Any
    since: float

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.token[:16],  # a fingerprint of the claim: proves nothing
            "server": self.server,
            "exchange": self.exchange,
            "vhost": self.vhost,
            "address": getattr(self.connection, "peer", ""),
            "user": self.connection.user.name,
            "since": self.since,
        }


class Registry:
    """The links connected here, by global name: one claim per name (pure; the caller
    passes the time)."""

    def __init__(self, own_name: str) -> None:
        self.own_name = own_name
        self.links: dict[str, list[Link]] = {}
        # name -> (token, when its last link closed; None while linked)
        self.claims: dict[str, tuple[str, float | None]] = {}

    def hello(self, link: Link, now: float = 0.0) -> tuple[str | None, str | None, list[Link]]:
        """(refusal kind, refusal text, links to close). A name claimed by another place
        (another token: it does not hold the key) is refused, and the refusal says nothing
        of the holder; the links there are untouched. With the same name and token, the
        link is accepted; the older connections it replaces are returned: those of the
        pair's other server (after its failover, the old ACTIVE's links are stale) and an
        older connection of the same link (same server, exchange and vhost)."""
        if link.name == self.own_name:
            return (
                "self_link",
                f"link to itself: '{link.name}' is this server's own global name",
                [],
            )
        present = self.links.get(link.name, [])
        claim = self.claims.get(link.name)
        if claim is not None and claim[1] is not None and now - claim[1] >= CLAIM_HOLD:
            claim = None  # held long enough with no link: free again
        if claim is not None and claim[0] != link.token:
            return (
                "duplicate_name",
                f"duplicate name: '{link.name}' is claimed here by another place (a link "
                "proves its name with its place's key: is this place's global name unique?)",
                [],
            )
        mine = [
            known
            for known in (k for links in self.links.values() for k in links)
            if known.connection is link.connection
        ]
        again = any(
            (known.name, known.exchange, known.vhost) == (link.name, link.exchange, link.vhost)
            for known in mine
        )
        if not again and len(mine) >= MAX_LINKS_PER_CONNECTION:
            return (
                "too_many_links",
                f"too many links on one connection: at most {MAX_LINKS_PER_CONNECTION}",
                [],
            )
        self.claims.pop(link.name, None)
        self.claims[link.name] = (link.token, None)
        replaced = [
            known
            for known in present
            if known.connection is not link.connection
            and (
                known.server != link.server
                or (known.exchange, known.vhost) == (link.exchange, link.vhost)
            )
        ]
        kept = [
            known
            for known in present
            if known not in replaced
            and not (
                known.connection is link.connection
                and (known.exchange, known.vhost) == (link.exchange, link.vhost)
            )
        ]
        self.links[link.name] = [*kept, link]
        return None, None, replaced

    def forget(self, connection: Any, now: float = 0.0) -> list[Link]:
        """The connection closed: its links go; a name left with no link stays claimed
        for ``CLAIM_HOLD``."""
        gone = []
        for name in list(self.links):
            kept = [link for link in self.links[name] if link.connection is not connection]
            gone += [link for link in self.links[name] if link.connection is connection]
            if kept:
                self.links[name] = kept
            else:
                del self.links[name]
                claim = self.claims.get(name)
                if claim is not None:
                    self.claims[name] = (claim[0], now)
        idle = [name for name, (_, since) in self.claims.items() if since is not None]
        for name in idle[: max(0, len(idle) - MAX_IDLE_CLAIMS)]:
            del self.claims[name]
        return gone

    def proven(self, link: Link) -> bool:
        """``link``'s name is linked here now, for its exchange and vhost, by the holder of
        the same key."""
        claim = self.claims.get(link.name)
        return (
            claim is not None
            and claim[0] == link.token
            and any(
                (known.exchange, known.vhost, known.token)
                == (link.exchange, link.vhost, link.token)
                for known in self.links.get(link.name, ())
            )
        )

    def linked_for(self, connection: Any, name: str, exchange: str, vhost: str) -> bool:
        """``connection`` said a hello, proven, for ``name``'s link of ``exchange`` in
        ``vhost``: the buffer queue of that link is its own."""
        return any(
            link.connection is connection and (link.exchange, link.vhost) == (exchange, vhost)
            for link in self.links.get(name, ())
        )

    def describe(self) -> list[dict[str, Any]]:
        return [link.describe() for name in sorted(self.links) for link in self.links[name]]


class OrphanWatch:
    """Buffer queues that have had no consumer for ``after`` seconds (pure: the caller
    passes the queues and the time)."""

    def __init__(self, after: float = ORPHAN_AFTER) -> None:
        self.after = after
        self.idle_since: dict[tuple[str, str], float] = {}
        self.orphans: set[tuple[str, str]] = set()

    def sweep(self, queues: list[tuple[str, Any]], now: float) -> list[tuple[str, str]]:
        """``queues``: (vhost, queue) for every buffer queue. Returns the ones that became
        orphans at this sweep (to be logged once)."""
        present = set()
        newly = []
        for vhost, queue in queues:
            key = (vhost, queue.name)
            present.add(key)
            if queue.consumer_count:
                self.idle_since.pop(key, None)
                self.orphans.discard(key)
                continue
            since = self.idle_since.setdefault(key, now)
            if now - since >= self.after and key not in self.orphans:
                self.orphans.add(key)
                newly.append(key)
        for key in set(self.idle_since) - present:
            del self.idle_since[key]
        self.orphans &= present
        return newly

    def is_orphan(self, vhost: str, queue: str) -> bool:
        return (vhost, queue) in self.orphans


class UpstreamService:
    """Answers ``amq.federation`` requests inside the server (docs/federation.md)."""

    def __init__(self, broker: FederationHost, clock: Callable[[], float] = steady.now) -> None:
        self.broker = broker
        self.clock = clock
        self.registry = Registry(broker.config.global_name)
        self.orphans = OrphanWatch()
        self.refused: dict[str, int] = {}
        self._logged: dict[str, float] = {}
        self._timer: Any = None
        self.handlers: dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]] = {
            "hello": self.on_hello,
            "bindings": self.on_bindings,
        }

    def start(self) -> None:
        self.broker.receive_control(FEDERATION_EXCHANGE, self.on_request, None)
        self.broker.when_closed(self._connection_closed)
        self._timer = self.broker.loop.call_later(ORPHAN_CHECK, self._check_orphans)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- requests -------------------------------------------------------------------------

    def on_request(self, message: Message, connection: Any) -> None:
        properties = message.properties()
        try:
            if FEDERATION_TAG not in connection.user.tags:
                # The channel lets only such users publish here; this holds even if a
                # request ever came another way.
                raise BadRequest(
                    f"ACCESS_REFUSED - federation requests need a user tagged "
                    f"'{FEDERATION_TAG}'; '{connection.user.name}' is not"
                )
            request = json.loads(message.body)
            if not isinstance(request, dict):
                raise BadRequest("a request is a JSON object")
            handler = self.handlers.get(request.get("op"))  # type: ignore[arg-type]
            if handler is None:
                raise BadRequest(f"unknown op {request.get('op')!r} (known: hello, bindings)")
            answer = handler(request, connection)
        except BadRequest as error:
            answer = {"ok": False, "error": str(error)}
        except (ValueError, TypeError, RecursionError) as error:
            answer = {"ok": False, "error": f"bad request: {error}"}
        self._reply(connection, properties.reply_to, properties.correlation_id, answer)

    def _reply(
        self, connection: Any, reply_to: str | None, correlation_id: str | None, answer: dict
    ) -> None:
        """To the asking connection's own direct reply-to address or exclusive queue, never
        anywhere else."""
        if not reply_to:
            return
        header, body = json_answer(correlation_id, answer)
        consumer = self.broker.reply_consumer(reply_to)
        if consumer is not None and consumer.channel.connection is connection:
            consumer.deliver(None, Message(address_of("", reply_to), header, body), False)
            return
        queue = connection.exclusive_queues.get(reply_to)
        if queue is not None:
            message = Message(address_of("", queue.name), header, body)
            self.broker.enqueue(message, (queue,), connection.vhost.name)

    def on_hello(self, request: dict[str, Any], connection: Any) -> dict[str, Any]:
        fields = {key: _text(request, key) for key in ("name", "server", "exchange")}
        fields["vhost"] = _text(request, "vhost", "/")
        for key, problem in (
            ("name", names.global_name_problem(fields["name"])),
            ("server", names.name_problem(fields["server"])),
        ):
            if problem is not None:
                raise BadRequest(f"bad hello: {key}: {problem}")
        if "key" not in request:
            raise BadRequest(
                "bad hello: no 'key' (the proof of the place's name, docs/security.md "
                '"Federation names"): is the downstream of an earlier version?'
            )
        key = _text(request, "key")
        if len(key) < 32:
            raise BadRequest("bad hello: 'key' is too short to prove anything")
        token = names.claim_token(key)
        link = Link(connection=connection, since=self.clock(), token=token, **fields)
        if request.get("outbound") is True:
            # A link's second connection (what it publishes: probes, forwarded messages):
            # trusted with the link's headers once it proves the key of a link that is up,
            # and never counted as a link of its own (it replaces nothing).
            if not self.registry.proven(link):
                self._refused("outbound", "outbound hello: no link of this name is up here", link)
                return {"ok": False, "error": "outbound hello: no link of this name is up here"}
            connection.federation_linked = True
            return {"ok": True, "name": self.registry.own_name}
        known = self.registry.linked_for(connection, link.name, link.exchange, link.vhost)
        kind, text, replaced = self.registry.hello(link, time.monotonic())
        if kind is not None:
            assert text is not None
            self._refused(kind, text, link)
            return {"ok": False, "error": text}
        connection.federation_linked = True
        for old in replaced:
            self.registry.forget(old.connection, time.monotonic())
            log.info(
                "federation: %s replaces the link from %s (%s): closing the older connection",
                escaped(f"'{link.name}' from {link.server}"),
                escaped(old.server),
                escaped(getattr(old.connection, "peer", "")),
            )
            old.connection.close_forced(
                f"CONNECTION_FORCED - replaced by a newer link of '{link.name}' "
                f"(server {link.server})"
            )
        if known:
            return {"ok": True, "name": self.registry.own_name}  # said again: nothing new
        log.info(
            "federation: %s linked for exchange %s",
            escaped(f"'{link.name}' (server {link.server}, id {link.token[:16]})"),
            escaped(f"'{link.exchange}' in vhost '{link.vhost}'"),
        )
        return {"ok": True, "name": self.registry.own_name}

    def buffer_refusal(self, queue: str, connection: Any) -> str | None:
        """Why ``connection`` may not touch buffer queue ``queue`` (declare, consume, get,
        purge, delete, bind, unbind), or None: only a connection whose hello, proven by its
        place's key, claimed the queue's downstream name for its exchange and vhost."""
        parsed = names.parse_buffer_queue(queue)
        if parsed is None:
            return "not a link's buffer queue name; no client may use it"
        exchange, _, downstream = parsed
        vhost = getattr(getattr(connection, "vhost", None), "name", None)
        if vhost is not None and self.registry.linked_for(connection, downstream, exchange, vhost):
            return None
        return (
            f"only the link of '{downstream}' for exchange '{exchange}' may use it (a "
            f"connection that said its proven hello on {FEDERATION_EXCHANGE})"
        )

    def _refused(self, kind: str, text: str, link: Link) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        now = time.monotonic()
        if now - self._logged.get(kind, -LOG_INTERVAL) >= LOG_INTERVAL:
            self._logged[kind] = now
            log.warning(
                "federation: hello refused from %s (user %s): %s",
                escaped(getattr(link.connection, "peer", "")),
                escaped(link.connection.user.name),
                escaped(text),
            )
        self.broker.federation_event(
            {
                "kind": kind,
                "name": link.name,
                "id": link.token[:16],
                "server": link.server,
                "exchange": link.exchange,
                "vhost": link.vhost,
                "address": getattr(link.connection, "peer", ""),
                "user": link.connection.user.name,
                "reason": text,
            }
        )

    def on_bindings(self, request: dict[str, Any], connection: Any) -> dict[str, Any]:
        vhost_name = _text(request, "vhost", "/")
        queue_name = _text(request, "queue")
        if not queue_name.startswith(names.BUFFER_PREFIX):
            raise BadRequest(
                f"queue '{queue_name}' is not a federation buffer queue (its name starts "
                f"'{names.BUFFER_PREFIX}')"
            )
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost_name not in connection.user.vhosts or vhost is None:
            raise BadRequest(
                f"ACCESS_REFUSED - user '{connection.user.name}' may not read vhost '{vhost_name}'"
            )
        refusal = self.buffer_refusal(queue_name, connection)
        if refusal is not None:
            raise BadRequest(f"ACCESS_REFUSED - queue '{queue_name}': {refusal}")
        queue = vhost.queues.get(queue_name)
        if queue is None or vhost.hidden_queue(queue_name) is not None:
            raise BadRequest(f"NOT_FOUND - no queue '{queue_name}' in vhost '{vhost_name}'")
        found = [
            {
                "exchange": exchange.name,
                "routing_key": binding.routing_key,
                "arguments": _jsonable(binding.arguments),
            }
            for exchange in vhost.exchanges.values()
            for binding in exchange.by_destination.get(queue, {}).values()
        ]
        return {"ok": True, "bindings": found}

    # -- connections and orphans ---------------------------------------------------------

    def _connection_closed(self, connection: Any) -> None:
        for link in self.registry.forget(connection, time.monotonic()):
            log.info(
                "federation: link of %s closed", escaped(f"'{link.name}' (server {link.server})")
            )

    def _check_orphans(self) -> None:
        self._timer = self.broker.loop.call_later(ORPHAN_CHECK, self._check_orphans)
        self.sweep_orphans(self.clock())

    def sweep_orphans(self, now: float) -> list[tuple[str, str]]:
        """Look at the buffer queues once (only while serving: a PASSIVE's have no
        consumers by design); log each new orphan once."""
        if not self.broker.pair.serving():
            return []
        buffers = [
            (vhost.name, queue)
            for vhost in self.broker.vhosts.values()
            for queue in vhost.visible_queues()
            if queue.name.startswith(names.BUFFER_PREFIX)
        ]
        newly = self.orphans.sweep(buffers, now)
        for vhost, queue in newly:
            log.warning(
                "federation: buffer queue %s has had no consumer for %d s: an orphan (its "
                "link is gone; delete it if that place is not coming back)",
                escaped(f"'{queue}' in vhost '{vhost}'"),
                self.orphans.after,
            )
        return newly

    def status(self) -> dict[str, Any]:
        """The console's ``federation`` section: the names linked here, refusals, orphans."""
        return {
            "name": self.registry.own_name,
            "linked": self.registry.describe(),
            "refused": dict(self.refused),
            "orphans": [
                {"vhost": vhost, "queue": queue} for vhost, queue in sorted(self.orphans.orphans)
            ],
        }


def _text(request: dict[str, Any], key: str, default: str | None = None) -> str:
    value = request.get(key, default)
    if not isinstance(value, str) or not value or len(value) > 255:
        raise BadRequest(f"'{key}' must be a non-empty string of at most 255 characters")
    return value


def _jsonable(value: Any) -> Any:
    """A binding's arguments as JSON can carry them (bytes as text)."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
