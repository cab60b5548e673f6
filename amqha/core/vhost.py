"""A virtual host: its exchanges, queues and bindings, and the rules for changing them.

Owns: declare/delete/bind/unbind with AMQP's rules and reply codes (raised as pamqp
exceptions: soft ones close a channel, hard ones the connection; a queue's arguments
are checked in ``arguments``), routing a message through exchange-to-exchange bindings
to queues, giving each enqueued message its id, dead-lettering (the dead letter itself
is made in ``deadletter``), and the changes of durable wiring it emits on its ``ChangeLog`` (see
``changes``; the ``restore_*`` methods take them back without emitting, for ``apply``).

Hidden queues and forwards (docs/federation.md, "Forwarding"): a hidden queue is durable,
stored and replicated like any other, but no client reaches it by any route (declare,
bind, unbind, consume, get, purge, delete: 403; the default exchange and dead letters do
not reach it; listings leave it out). A forward puts every message routed through an
exchange on a hidden queue too, unless its ``x-amqha-path`` says it came from there.

Buffer queues (docs/federation.md, "Buffer queues"): a queue named ``federation: ...``
is reached by a client only as ``guard`` allows (its own link; an administrator to
repair it), by no route otherwise, and never through the default exchange.

Must not know: channels, sockets, the clock (``now`` is passed in, wall-clock seconds),
the store. An exclusive queue's owner is an opaque object (the connection) compared by
identity.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from pamqp import exceptions

from . import dedup, names
from .arguments import (
    REPLICATE,
    QueueArgumentError,
    check_queue_type,
    queue_type,
    replication_asked,
)
from .changes import (
    Bound,
    Change,
    ChangeLog,
    ExchangeDeclared,
    ExchangeDeleted,
    QueueDeclared,
    QueueDeleted,
    Unbound,
)
from .deadletter import dead_letter, is_cycle
from .forwards import Forward, add_forwards
from .kinds import new_queue
from .message import Message, MessageIds
from .policies import Policies
from .queue import Queue
from .reserved import (
    ALTERNATE_EXCHANGE,
    CONTROL_EXCHANGES,
    EXCHANGE_REFERENCES,
    HIDDEN,
    STANDARD_EXCHANGES,
    UNDELETABLE,
    DefaultExchange,
    hidden_refusal,
)
from .routing import EXCHANGE_CLASSES, ControlExchange, Exchange, alternate_of, arguments_size

# What a server-named queue's name carries when the vhost is given no global name.
DEFAULT_GLOBAL_NAME = "amqha"
# What ``VHost.enqueue`` answers for a message a queue refused (reject-publish overflow).
REFUSED = -1


def _inequivalent(what: str, name: str, arg: str) -> exceptions.AMQPPreconditionFailed:
    return exceptions.AMQPPreconditionFailed(
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for {what} '{name}' in vhost"
    )


class VHost:
    def __init__(
        self,
        name: str,
        wall_clock: Callable[[], float],
        log: ChangeLog | None = None,
        ids: MessageIds | None = None,
        global_name: str = DEFAULT_GLOBAL_NAME,
    ) -> None:
        self.name = name
        # This server's global name (its pair's, or its own): server-named queues carry it.
        self.global_name = global_name
        # x-death's "time" and dead letters' deadlines read it; injected so the model
        # stays clock-free.
        self.wall_clock = wall_clock
        # Where changes of durable state go (None: nothing is logged, as with no store).
        self.log = log
        self.ids = ids if ids is not None else MessageIds()
        # Durable queues are replicated to the PASSIVE unless asked otherwise; the names
        # of the durable queues that are not (the feed leaves their changes out).
        self.replicate_default = True
        self.unreplicated: set[str] = set()
        self.queues: dict[str, Queue] = {}
        # At most this many queues (0: no limit); a declare past it is refused with 406.
        self.max_queues = 0
        # The arguments of one declare or bind may count at most this (routing's
        # arguments_size; 0: no limit); more is refused with 406.
        self.max_arguments_size = 0
        # The names of the hidden queues (docs/federation.md): no client reaches them.
        self.hidden: set[str] = set()
        self.policies = Policies()  # and operator policies (``core.policies``)
        # Exchange name -> the forwards of the messages routed through it.
        self.forwards: dict[str, tuple[Forward, ...]] = {}
        self.exchanges: dict[str, Exchange] = {"": DefaultExchange(self.queues, self.hidden)}
        for exchange_name, kind in STANDARD_EXCHANGES:
            self.exchanges[exchange_name] = EXCHANGE_CLASSES[kind](exchange_name, durable=True)
        for exchange_name, (kind, tag) in CONTROL_EXCHANGES.items():
            self.exchanges[exchange_name] = ControlExchange(exchange_name, kind, tag)
        # Exchanges that have at least one exchange as a destination: routing through
        # them needs the recursive walk, all others take the one-hop fast path.
        self._has_exchange_destinations: set[str] = set()
        self.on_queue_deleted: Callable[[Queue], None] | None = None
        # Who may touch a federation buffer queue (its name starts ``names.BUFFER_PREFIX``):
        # ``guard(name, owner, reading)`` is why ``owner`` (a client's connection) may not,
        # or None; ``reading``: it would take messages (consume, get). The server's own
        # callers (owner None: the console, the API) are not asked. Unset: no client may
        # (docs/federation.md, "Buffer queues").
        self.guard: Callable[[str, object, bool], str | None] | None = None

    # -- the change stream ----------------------------------------------------------

    def _emit(self, change: Change) -> None:
        if self.log is not None:
            self.log.emit(change, True)

    @staticmethod
    def _logged_queue(queue: Queue) -> bool:
        """A queue whose contents and wiring survive: durable and not exclusive (an
        exclusive queue dies with its connection, so with any restart)."""
        return queue.durable and queue.exclusive_owner is None

    @staticmethod
    def _logged_exchange(exchange: Exchange) -> bool:
        return exchange.durable and not exchange.control and exchange.name != ""

    def _binding_change(
        self, kind: type, source: Exchange, destination: Exchange | Queue, key: str, args: dict
    ) -> None:
        if self.log is None or not self._logged_exchange(source):
            return
        if isinstance(destination, Exchange):
            if not self._logged_exchange(destination):
                return
        elif not self._logged_queue(destination):
            return
        self._emit(
            kind(
                self.name,
                source.name,
                destination.name,
                isinstance(destination, Exchange),
                key,
                dict(args),
            )
        )

    def set_log(self, log: ChangeLog | None) -> None:
        """Start (or stop) logging: every durable queue emits on ``log`` from now on."""
        self.log = log
        for queue in self.queues.values():
            queue.log = log if self._logged_queue(queue) else None

    # -- the control plane ---------------------------------------------------------

    def set_control_receiver(self, name: str, receiver: Any) -> None:
        """Where publishes to control exchange ``name`` go: ``receiver(message, user)``."""
        exchange = self.exchanges[name]
        assert isinstance(exchange, ControlExchange)
        exchange.receiver = receiver

    def _refuse_control_reference(self, name: Any, what: str) -> None:
        target = self.exchanges.get(name) if isinstance(name, str) else None
        if target is not None and target.control:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - {what} '{name}' is refused: it belongs to the server's "
                "control plane"
            )

    # -- exchanges -----------------------------------------------------------------

    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise exceptions.AMQPNotFound(
                f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"
            )
        return exchange

    def declare_exchange(
        self,
        name: str,
        kind: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise exceptions.AMQPNotFound(
                    f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"
                )
            return existing
        if name == "" or (name.startswith("amq.") and existing is None):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.'"
                if name
                else "ACCESS_REFUSED - operation not permitted on the default exchange"
            )
        self._check_arguments_size(arguments, f"exchange '{name}'")
        if kind not in EXCHANGE_CLASSES:
            # A channel error, as in RabbitMQ since 3.12: one bad declare does not close
            # every channel of the connection (docs/compat.md).
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - unknown exchange type '{kind}'"
            )
        for key in EXCHANGE_REFERENCES:
            self._refuse_control_reference((arguments or {}).get(key), key)
        if existing is not None:
            if existing.kind != kind:
                raise _inequivalent("exchange", name, "type")
            if existing.durable != durable:
                raise _inequivalent("exchange", name, "durable")
            if existing.auto_delete != auto_delete:
                raise _inequivalent("exchange", name, "auto_delete")
            if existing.internal != internal:
                raise _inequivalent("exchange", name, "internal")
            if existing.arguments.get(ALTERNATE_EXCHANGE) != (arguments or {}).get(
                ALTERNATE_EXCHANGE
            ):
                raise _inequivalent("exchange", name, ALTERNATE_EXCHANGE)
            return existing
        exchange = EXCHANGE_CLASSES[kind](name, durable, auto_delete, internal, arguments or {})
        self.exchanges[name] = exchange
        if durable:
            self._emit(
                ExchangeDeclared(
                    self.name, name, kind, auto_delete, internal, dict(exchange.arguments)
                )
            )
        return exchange

    def restore_exchange(
        self, name: str, kind: str, auto_delete: bool, internal: bool, arguments: dict[str, Any]
    ) -> None:
        """A durable exchange from the change stream (``apply``): no checks, nothing emitted."""
        if name not in self.exchanges:
            self.exchanges[name] = EXCHANGE_CLASSES[kind](
                name, True, auto_delete, internal, dict(arguments)
            )

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if name in UNDELETABLE or name.startswith("amq."):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - exchange '{name}' is reserved and cannot be deleted"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # deleting what is not there succeeds, as in RabbitMQ
        if if_unused and exchange.bindings:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - exchange '{name}' in use"
            )
        self.remove_exchange(exchange)

    def remove_exchange(self, exchange: Exchange) -> None:
        """Delete an exchange and every binding to it (no checks: they were made)."""
        name = exchange.name
        if self.exchanges.get(name) is not exchange:
            return
        del self.exchanges[name]
        if exchange.durable:
            self._emit(ExchangeDeleted(self.name, name))
        self._has_exchange_destinations.discard(name)
        for other in list(self.exchanges.values()):
            if other.unbind_destination(exchange):
                self._after_unbind(other)

    def _after_unbind(self, exchange: Exchange) -> None:
        if not exchange.exchange_bindings:
            self._has_exchange_destinations.discard(exchange.name)
        if exchange.auto_delete and not exchange.bindings and exchange.name in self.exchanges:
            self.remove_exchange(exchange)

    def _check_arguments_size(self, arguments: dict[str, Any] | None, what: str) -> None:
        limit = self.max_arguments_size
        if limit and arguments:
            size = arguments_size(arguments)
            if size > limit:
                raise exceptions.AMQPPreconditionFailed(
                    f"PRECONDITION_FAILED - the arguments of {what} count {size} bytes, "
                    f"more than limits.max_arguments_size ({limit})"
                )

    # -- queues --------------------------------------------------------------------

    def get_queue(self, name: str, owner: object | None = None, reading: bool = False) -> Queue:
        """A queue a client (or an administrator's console or API) names: never a
        hidden one, and a federation buffer queue only to its own link (``reading``: to
        take its messages)."""
        queue = self.queues.get(name)
        if queue is not None and name in self.hidden:
            raise hidden_refusal(name)
        self._check_guard(name, owner, reading)
        if queue is None:
            raise exceptions.AMQPNotFound(f"NOT_FOUND - no queue '{name}' in vhost '{self.name}'")
        self._check_owner(queue, owner)
        return queue

    def _check_guard(self, name: str, owner: object | None, reading: bool = False) -> None:
        if owner is None or not name.startswith(names.BUFFER_PREFIX):
            return
        why = (
            "only its own federation link may use it"
            if self.guard is None
            else self.guard(name, owner, reading)
        )
        if why is not None:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - queue '{name}' in vhost '{self.name}' is a federation "
                f"buffer queue: {why}"
            )

    @staticmethod
    def _check_owner(queue: Queue, owner: object | None) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            raise exceptions.AMQPResourceLocked(
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue "
                f"'{queue.name}' in vhost"
            )

    def declare_queue(
        self,
        name: str,
        owner: object,
        now: float,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue:
        if passive:
            queue = self.get_queue(name, owner)
            queue.last_used = now
            return queue
        if not name:
            name = names.generated_queue_name(self.global_name, secrets.token_urlsafe(16))
        elif name.startswith("amq."):
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.'"
            )
        elif name in self.hidden:
            raise hidden_refusal(name)
        self._check_guard(name, owner)
        arguments = arguments or {}
        if HIDDEN in arguments:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - queue '{name}': the argument '{HIDDEN}' is the server's own"
            )
        self._check_arguments_size(arguments, f"queue '{name}'")
        self._refuse_control_reference(
            arguments.get("x-dead-letter-exchange"), "dead-letter exchange"
        )
        check_queue_type(name, arguments)
        asked = replication_asked(name, arguments, durable, exclusive, auto_delete)
        existing = self.queues.get(name)
        if existing is not None:
            self._check_owner(existing, owner)
            if existing.durable != durable:
                raise _inequivalent("queue", name, "durable")
            if (existing.exclusive_owner is not None) != exclusive:
                raise _inequivalent("queue", name, "exclusive")
            if existing.auto_delete != auto_delete:
                raise _inequivalent("queue", name, "auto_delete")
            if queue_type(existing.arguments) != queue_type(arguments):
                # RabbitMQ's rule: an absent type equals 'classic' only; a quorum queue
                # redeclared without x-queue-type is inequivalent.
                raise _inequivalent("queue", name, "x-queue-type")
            for key in set(existing.arguments) | set(arguments):
                if key == "x-queue-type":
                    continue
                if key.startswith("x-") and existing.arguments.get(key) != arguments.get(key):
                    raise _inequivalent("queue", name, key)
            existing.last_used = now
            return existing
        return self._new_queue(name, owner, now, durable, exclusive, auto_delete, arguments, asked)

    def _new_queue(
        self,
        name: str,
        owner: object,
        now: float,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
        asked: bool | None,
    ) -> Queue:
        if self.max_queues and len(self.queues) >= self.max_queues:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - cannot declare queue '{name}': queue limit in vhost "
                f"'{self.name}' ({self.max_queues}) is reached"
            )
        try:
            queue = new_queue(
                name,
                durable,
                owner if exclusive else None,
                auto_delete,
                arguments,
                now,
                vhost=self.name,
            )
        except QueueArgumentError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error
        queue.on_dead_letter = self._dead_letter
        self.queues[name] = queue
        self.policies.refresh(queue)
        self._set_replicated(queue, asked)
        if self.log is not None and self._logged_queue(queue):
            queue.log = self.log
            self._emit(QueueDeclared(self.name, name, auto_delete, dict(arguments)))
        return queue

    def restore_queue(
        self, name: str, auto_delete: bool, arguments: dict[str, Any], now: float
    ) -> Queue:
        """A durable queue from the change stream (``apply``): no checks, nothing emitted."""
        queue = self.queues.get(name)
        if queue is None:
            queue = new_queue(name, True, None, auto_delete, dict(arguments), now, vhost=self.name)
            queue.on_dead_letter = self._dead_letter
            self.queues[name] = queue
            self.policies.refresh(queue)
            self._set_replicated(
                queue, arguments.get(REPLICATE) if queue_type(arguments) != "quorum" else True
            )
            if arguments.get(HIDDEN) is True:
                self.hidden.add(name)
        return queue

    # -- hidden queues and forwards --------------------------------------------------

    def declare_hidden_queue(self, name: str, now: float) -> Queue:
        """The hidden queue ``name``, made if missing: durable, stored and replicated
        (``x-amqha-replicate``), reached by no client. ValueError if a client's queue
        holds the name already."""
        queue = self.queues.get(name)
        if queue is not None:
            if name not in self.hidden:
                raise ValueError(
                    f"queue '{name}' in vhost '{self.name}' exists and is not hidden: "
                    "delete it so the server can make its own"
                )
            return queue
        arguments: dict[str, Any] = {HIDDEN: True, REPLICATE: True}
        queue = self._new_queue(name, None, now, True, False, False, arguments, True)
        self.hidden.add(name)
        return queue

    def hidden_queue(self, name: str) -> Queue | None:
        """The hidden queue ``name`` (for the server's own consumers), or None."""
        return self.queues.get(name) if name in self.hidden else None

    def visible_queues(self) -> list[Queue]:
        """Every queue a listing shows: all but the hidden ones."""
        hidden = self.hidden
        if not hidden:
            return list(self.queues.values())
        return [queue for name, queue in self.queues.items() if name not in hidden]

    def set_forward(
        self,
        exchange: str,
        queue_name: str,
        upstream_global: str,
        local_global: str,
        max_hops: int,
        now: float = 0.0,
    ) -> Queue:
        """From now on a message routed through ``exchange`` is also put on the hidden
        queue ``queue_name`` (made if missing), unless it would cross into
        ``upstream_global`` against the path rule (it came from there, or has made
        ``max_hops`` hops). Replaces a forward of the same exchange to the same queue.
        ValueError if a client's queue holds the name."""
        queue = self.declare_hidden_queue(queue_name, now)
        kept = tuple(f for f in self.forwards.get(exchange, ()) if f.queue is not queue)
        self.forwards[exchange] = (
            *kept,
            Forward(exchange, queue, upstream_global, local_global, max_hops),
        )
        return queue

    def remove_forward(self, exchange: str, queue_name: str) -> None:
        """Stop forwarding ``exchange`` to ``queue_name``; the hidden queue and what it
        holds stay (``remove_hidden_queue`` deletes it)."""
        kept = tuple(f for f in self.forwards.get(exchange, ()) if f.queue.name != queue_name)
        if kept:
            self.forwards[exchange] = kept
        else:
            self.forwards.pop(exchange, None)

    def remove_hidden_queue(self, name: str) -> int:
        """Delete hidden queue ``name`` and its forwards; the messages it held."""
        queue = self.hidden_queue(name)
        if queue is None:
            return 0
        for exchange in list(self.forwards):
            self.remove_forward(exchange, name)
        return self.remove_queue(queue)

    def _set_replicated(self, queue: Queue, asked: bool | None) -> None:
        queue.replicated = self._logged_queue(queue) and (
            self.replicate_default if asked is None else asked
        )
        if self._logged_queue(queue) and not queue.replicated:
            self.unreplicated.add(queue.name)

    def delete_queue(
        self,
        name: str,
        owner: object | None,
        if_unused: bool = False,
        if_empty: bool = False,
    ) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if name in self.hidden:
            raise hidden_refusal(name)
        self._check_guard(name, owner)
        self._check_owner(queue, owner)
        if if_unused and queue.consumers:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - queue '{name}' in use")
        if if_empty and queue.message_count:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - queue '{name}' not empty"
            )
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        """Delete a queue unconditionally (exclusive owner gone, auto-delete, x-expires)."""
        if self.queues.get(queue.name) is not queue:
            return 0
        del self.queues[queue.name]
        self.unreplicated.discard(queue.name)
        if queue.name in self.hidden:
            self.hidden.discard(queue.name)
            for source in list(self.forwards):
                self.remove_forward(source, queue.name)
        if queue.log is not None:
            self._emit(QueueDeleted(self.name, queue.name))
        count = queue.close()
        for exchange in list(self.exchanges.values()):
            if exchange.unbind_destination(queue):
                self._after_unbind(exchange)
        if self.on_queue_deleted is not None:
            self.on_queue_deleted(queue)
        return count

    # -- bindings ------------------------------------------------------------------

    def _bindable_source(self, name: str) -> Exchange:
        exchange = self._bindable_or_missing(name)
        if exchange is None:
            raise exceptions.AMQPNotFound(
                f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"
            )
        return exchange

    def _bindable_or_missing(self, name: str) -> Exchange | None:
        if name == "":
            raise exceptions.AMQPAccessRefused(
                "ACCESS_REFUSED - operation not permitted on the default exchange"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return None
        if exchange.control:
            raise exceptions.AMQPAccessRefused(
                f"ACCESS_REFUSED - exchange '{name}' belongs to the server's control plane: "
                "nothing can be bound to it or from it"
            )
        return exchange

    def bind_queue(
        self,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: dict[str, Any],
        owner: object,
    ) -> None:
        queue = self.get_queue(queue_name, owner)
        exchange = self._bindable_source(exchange_name)
        self._check_arguments_size(arguments, f"a binding of queue '{queue_name}'")
        try:
            added = exchange.bind(queue, routing_key, arguments)
        except ValueError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error
        if added:
            self._binding_change(Bound, exchange, queue, routing_key, arguments)

    def unbind_queue(
        self,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: dict[str, Any],
        owner: object,
    ) -> None:
        """Unbinding is idempotent, as in RabbitMQ: where the queue or the exchange is not
        there (an auto-delete one already gone, say) nothing is bound, and that succeeds."""
        exchange = self._bindable_or_missing(exchange_name)
        queue = self.queues.get(queue_name)
        if queue_name in self.hidden:
            raise hidden_refusal(queue_name)
        self._check_guard(queue_name, owner)
        if queue is not None:
            self._check_owner(queue, owner)
        if exchange is None or queue is None:
            return
        if exchange.unbind(queue, routing_key, arguments):
            self._binding_change(Unbound, exchange, queue, routing_key, arguments)
            self._after_unbind(exchange)

    def bind_exchange(
        self, destination_name: str, source_name: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        destination = self._bindable_source(destination_name)
        source = self._bindable_source(source_name)
        self._check_arguments_size(arguments, f"a binding of exchange '{destination_name}'")
        try:
            added = source.bind(destination, routing_key, arguments)
        except ValueError as error:
            raise exceptions.AMQPPreconditionFailed(f"PRECONDITION_FAILED - {error}") from error
        self._has_exchange_destinations.add(source.name)
        if added:
            self._binding_change(Bound, source, destination, routing_key, arguments)

    def unbind_exchange(
        self, destination_name: str, source_name: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        destination = self._bindable_or_missing(destination_name)
        source = self._bindable_or_missing(source_name)
        if destination is None or source is None:
            return  # idempotent, as unbind_queue
        if source.unbind(destination, routing_key, arguments):
            self._binding_change(Unbound, source, destination, routing_key, arguments)
            self._after_unbind(source)

    def restore_binding(
        self, source: str, destination: str, to_exchange: bool, key: str, arguments: dict
    ) -> None:
        """A binding from the change stream (``apply``): bound if both ends exist."""
        exchange = self.exchanges.get(source)
        target = (self.exchanges if to_exchange else self.queues).get(destination)
        if exchange is None or target is None:
            return
        exchange.bind(target, key, dict(arguments))
        if to_exchange:
            self._has_exchange_destinations.add(source)

    def restore_unbinding(
        self, source: str, destination: str, to_exchange: bool, key: str, arguments: dict
    ) -> None:
        exchange = self.exchanges.get(source)
        target = (self.exchanges if to_exchange else self.queues).get(destination)
        if (
            exchange is not None
            and target is not None
            and exchange.unbind(target, key, dict(arguments))
        ):
            self._after_unbind(exchange)

    # -- enqueue -------------------------------------------------------------------

    def enqueue(self, message: Message, queues: tuple[Queue, ...], now: float) -> int:
        """Give a routed message its id, put it on its queues and start delivery. What
        its confirm waits for, as a value: the LSN the store (and an in-sync PASSIVE)
        must hold first, 0 when nothing it changed needs the disk, ``REFUSED`` if any
        queue refused it (reject-publish overflow) (docs/architecture.md, "The walk of
        a confirmed publish")."""
        log = self.log
        sync_before = log.sync_lsn if log is not None else 0
        ids = self.ids
        message.msg_id = ids.next
        ids.next += 1
        expiration_ms = message.expiration_ms()
        expiration = None if expiration_ms is None else expiration_ms / 1000.0
        accepted = True
        copies = 0
        for queue in queues:
            memory = queue.dedup
            if memory is not None:
                copy, key = dedup.find(memory, message, now, queue)
                if copy:
                    copies += 1
                    continue
            limits = queue.limits
            if (
                limits.max_length is not None or limits.max_length_bytes is not None
            ) and queue.would_reject(message):
                accepted = False
                if limits.overflow == "reject-publish-dlx":
                    queue.refuse(message)
                continue
            queue.enqueue(message, now, expiration)
            if memory is not None and key is not None:
                dedup.remember(
                    memory, key, message, now, queue, queue.log, (self.name, "q", queue.name)
                )
            queue.published += 1
            if queue.consumers:
                queue.drain(now)
        if not accepted:
            return REFUSED
        if log is not None and (log.sync_lsn != sync_before or copies):
            # A copy dropped waits as long as what came before it: its first may be
            # still on its way to the disk or the PASSIVE.
            return log.sync_lsn
        return 0

    # -- routing -------------------------------------------------------------------

    def route(self, exchange: Exchange, routing_key: str, message: Message) -> tuple[Queue, ...]:
        """The queues a message reaches, each once, following exchange-to-exchange bindings
        and, from an exchange that routes it nowhere, that exchange's alternate exchange.
        A deduplicating exchange routes a copy nowhere (``unrouted_wait``)."""
        memory = exchange.dedup
        if memory is not None:
            log = self.log if self._logged_exchange(exchange) else None
            where = (self.name, "x", exchange.name)
            if dedup.dropped(memory, message, self.wall_clock(), log, where):
                return ()
        found = exchange.route(routing_key, message.headers)
        forwards = self.forwards
        if exchange.name not in self._has_exchange_destinations and (
            found or ALTERNATE_EXCHANGE not in exchange.arguments
        ):
            if forwards and exchange.name in forwards:
                found_with: dict[Queue, None] = dict.fromkeys(found)
                add_forwards(forwards, exchange.name, message, found_with)
                return tuple(found_with)
            return found
        queues: dict[Queue, None] = {}
        seen: set[int] = {id(exchange)}
        pending = list(found) or alternate_of(exchange, self.exchanges)
        if forwards:
            add_forwards(forwards, exchange.name, message, queues)
        while pending:
            destination = pending.pop()
            if isinstance(destination, Exchange):
                if id(destination) in seen:
                    continue
                seen.add(id(destination))
                reached = destination.route(routing_key, message.headers)
                pending.extend(reached or alternate_of(destination, self.exchanges))
                if forwards:
                    add_forwards(forwards, destination.name, message, queues)
            else:
                queues[destination] = None
        return tuple(queues)

    def unrouted_wait(self, exchange: Exchange) -> int:
        """What the confirm of a publish that reached no queue waits for: through a
        deduplicating exchange, what came before it (its first, or the key it left)."""
        log = self.log
        return log.sync_lsn if exchange.dedup is not None and log is not None else 0

    # -- dead letters --------------------------------------------------------------

    def _dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        limits = queue.limits
        exchange = self.exchanges.get(limits.dead_letter_exchange or "")
        if exchange is None or limits.dead_letter_exchange is None or exchange.control:
            return
        routing_key = limits.dead_letter_routing_key or message.routing_key
        made = dead_letter(message, queue.name, reason, exchange.name, routing_key, self.wall_clock)
        if made is None:
            return
        dead, deaths = made
        targets = tuple(
            target
            for target in self.route(exchange, routing_key, dead)
            if not is_cycle(target.name, deaths)
        )
        if targets:
            self.enqueue(dead, targets, self.wall_clock())
