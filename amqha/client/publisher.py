"""``Publisher``: publishing with confirms through failovers, at least once (docs/client.md).

Owns: the messages held from ``send`` until their confirm, sent again in order on the
next ACTIVE after a failover (each with a message id, and with ``deduplicate`` the
deduplication header the server drops a copy by), ``max_pending`` and what a full
publisher does, a message the server refuses (nacked, or its channel closed over it) and
the errors a publisher raises.

Must not know: consumers; how the next server is found (``link.py``, ``connection.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aio_pika
import aiormq
from yarl import URL

from amqha.client_watch import DEFAULT_SILENT_AFTER

from .failover_log import describe
from .link import Link

log = logging.getLogger("amqha.client")

# The header a queue declared with x-message-deduplication (or an exchange of type
# x-message-deduplication) drops a second copy by (docs/client.md, "Exactly once").
DEDUPLICATION_HEADER = "x-deduplication-header"


class PublisherFull(RuntimeError):
    """The publisher holds ``max_pending`` unconfirmed messages and was told to raise."""


class PublisherClosed(RuntimeError):
    """The publisher was closed before this message was confirmed."""


class PublishRefused(aio_pika.exceptions.DeliveryError):
    """The server refused the message (Basic.Nack or Basic.Reject): it was not sent again."""


class PublishFailed(RuntimeError):
    """The server closed the channel over this message alone (a missing exchange, a
    refused permission): it was not sent again. The server's error is the cause."""


@dataclass
class _Held:
    """One message the publisher keeps until its confirm."""

    seq: int
    exchange: str
    routing_key: str
    body: bytes
    properties: aiormq.spec.Basic.Properties
    confirmed: asyncio.Future[None]
    generation: int = 0  # the connection it was last sent on (0: not sent yet)
    sends: int = 0
    error: BaseException | None = None  # why its last send got no confirm


def _as_message(
    message: aio_pika.abc.AbstractMessage | bytes, persistent: bool
) -> aio_pika.abc.AbstractMessage:
    if isinstance(message, bytes | bytearray | memoryview):
        mode = (
            aio_pika.DeliveryMode.PERSISTENT if persistent else aio_pika.DeliveryMode.NOT_PERSISTENT
        )
        return aio_pika.Message(bytes(message), delivery_mode=mode)
    return message


class Publisher(Link):
    """Publishes with confirms through failovers; at least once (docs/client.md).

    Each message is held from ``send`` until the server confirms it; the ones held when
    the server is lost are sent again, in order, on the next ACTIVE. A message without a
    message id gets one (a uuid4), kept across sends: a consumer can tell a duplicate by
    it (``Deduplicator``). At most ``max_pending`` messages are held; when that many
    wait for their confirm, ``send`` waits for one (``when_full="block"``) or raises
    ``PublisherFull`` (``"raise"``). A message the server nacks is not sent again: its
    future fails with ``PublishRefused``. A server that owes confirms and sends nothing
    for ``silent_after`` s is left for the next listed one (docs/client.md).

    With ``deduplicate=True`` every message also carries the header
    ``x-deduplication-header`` set to its message id (the same on every send of it; one
    the application set itself is kept, as are its other headers, on a copy of its
    dict): a queue declared with ``x-message-deduplication`` then drops the copy sent
    again after a failover and still confirms it, so the queue gets it once
    (docs/client.md, "Exactly once"). The publisher declares nothing for it.

        async with Publisher(urls, max_pending=1000) as publisher:
            await publisher.publish(b"body", routing_key="orders")  # returns once confirmed
            confirmed = await publisher.send(b"next", routing_key="orders")  # held; not waited
            await publisher.flush()
    """

    publisher_confirms = True

    def __init__(
        self,
        urls: Sequence[str | URL] | str,
        *,
        max_pending: int = 1000,
        when_full: Literal["block", "raise"] = "block",
        persistent: bool = True,
        deduplicate: bool = False,
        setup: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]] | None = None,
        name: str = "publisher",
        attempt_timeout: float = 5.0,
        warn_after: float = 10.0,
        silent_after: float = DEFAULT_SILENT_AFTER,
        **connect_kwargs: Any,
    ) -> None:
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(
                f"max_pending must be a whole number of at least 1, not {max_pending!r}"
            )
        if when_full not in ("block", "raise"):
            raise ValueError(f'when_full must be "block" or "raise", not {when_full!r}')
        super().__init__(
            urls, name, setup, attempt_timeout, warn_after, connect_kwargs, silent_after
        )
        self.max_pending = max_pending
        self.when_full = when_full
        self.persistent = persistent
        self.deduplicate = deduplicate
        self.resent = 0  # sends of a message already sent on a lost connection
        self.refused = 0
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._outbox: asyncio.Queue[_Held] = asyncio.Queue()
        self._slots = asyncio.Semaphore(max_pending)
        self._empty = asyncio.Event()
        self._empty.set()
        self._seq = 0
        self._generation = 0
        self._confirming: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Messages held: sent or to be sent, not confirmed yet."""
        return len(self._held)

    async def send(
        self,
        message: aio_pika.abc.AbstractMessage | bytes,
        routing_key: str,
        exchange: str = "",
    ) -> asyncio.Future[None]:
        """Hold the message and send it; the future resolves at its confirm.

        Returns once the message is held (after waiting for room with ``"block"``)."""
        if self.closing:
            raise PublisherClosed(f"{self.failover.name} is closed")
        if self.when_full == "raise" and self._slots.locked():
            raise PublisherFull(
                f"{self.failover.name}: {self.max_pending} messages await their confirm "
                f"(max_pending={self.max_pending}); wait for confirms (flush) or publish slower"
            )
        await self._slots.acquire()
        if self.closing:
            self._slots.release()
            raise PublisherClosed(f"{self.failover.name} is closed")
        outgoing = _as_message(message, self.persistent)
        if outgoing.message_id is None:
            outgoing.message_id = uuid.uuid4().hex  # type: ignore[misc]  # shown to the application
        properties = outgoing.properties  # held: every send of it carries the same
        if self.deduplicate:
            # A copy: the application's dict (aio-pika's Message shares it) stays as it was.
            headers = dict(properties.headers or {})
            headers.setdefault(DEDUPLICATION_HEADER, outgoing.message_id)
            properties.headers = headers
        self._seq += 1
        held = _Held(
            self._seq,
            exchange,
            routing_key,
            outgoing.body,
            properties,
            asyncio.get_running_loop().create_future(),
        )
        self._held[held.seq] = held
        self._empty.clear()
        self._outbox.put_nowait(held)
        return held.confirmed

    async def publish(
        self,
        message: aio_pika.abc.AbstractMessage | bytes,
        routing_key: str,
        exchange: str = "",
    ) -> None:
        """Send and wait for the confirm, however many failovers it takes."""
        await asyncio.shield(await self.send(message, routing_key, exchange))

    async def flush(self, timeout: float | None = None) -> None:
        """Until every message held is confirmed (or refused)."""
        await asyncio.wait_for(self._empty.wait(), timeout)

    async def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` s for the held messages' confirms, then close; those
        still held fail with PublisherClosed (and are logged)."""
        if self.task is not None and not self.closing:
            with contextlib.suppress(TimeoutError):
                await self.flush(timeout)
        await self._stop()
        for task in list(self._confirming):
            task.cancel()
        await asyncio.gather(*self._confirming, return_exceptions=True)
        if self._held:
            log.warning(
                "%s closed with %d messages unconfirmed", self.failover.name, len(self._held)
            )
        for held in list(self._held.values()):
            self._settle(held, PublisherClosed(f"{self.failover.name} closed before the confirm"))

    async def _serve(self) -> None:
        assert self.underlay is not None
        self._generation += 1
        generation, channel = self._generation, self.underlay
        # What was held when the last server was lost goes first, in order; one at a
        # time after the server closed a channel over one of them, to find which.
        sender = asyncio.ensure_future(self._resend_then_send(channel, generation))
        try:
            await self._until_lost()
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    async def _resend_then_send(self, channel: aiormq.abc.AbstractChannel, generation: int) -> None:
        if self.channel_refused:
            for held in list(self._held.values()):
                if held.seq not in self._held:
                    continue
                await asyncio.wait([self._send(held, channel, generation)])
                if held.seq in self._held and isinstance(
                    held.error, aiormq.exceptions.ChannelClosed
                ):
                    self.refused += 1
                    failed = PublishFailed(f"the server refused it: {describe(held.error)}")
                    failed.__cause__ = held.error
                    self._settle(held, failed)
                    return  # the channel is closed: the next one goes on from here
                if generation != self._generation or held.seq in self._held:
                    return  # lost meanwhile
            self.channel_refused = False
        else:
            for held in list(self._held.values()):
                self._send(held, channel, generation)
        await self._send_new(channel, generation)

    async def _send_new(self, channel: aiormq.abc.AbstractChannel, generation: int) -> None:
        while True:
            held = await self._outbox.get()
            if held.seq in self._held and held.generation != generation:
                self._send(held, channel, generation)

    def _send(
        self, held: _Held, channel: aiormq.abc.AbstractChannel, generation: int
    ) -> asyncio.Task[None]:
        if held.sends:
            self.resent += 1
        held.generation = generation
        held.sends += 1
        task = asyncio.ensure_future(self._confirm(held, channel, generation))
        self._confirming.add(task)
        task.add_done_callback(self._confirming.discard)
        return task

    async def _confirm(
        self, held: _Held, channel: aiormq.abc.AbstractChannel, generation: int
    ) -> None:
        try:
            await channel.basic_publish(
                held.body,
                exchange=held.exchange,
                routing_key=held.routing_key,
                properties=held.properties,
            )
        except aiormq.exceptions.DeliveryError as error:
            self.refused += 1
            self._settle(held, PublishRefused(error.message, error.frame))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # No confirm from this connection: held, and sent again on the next one.
            held.error = error
            if generation == self._generation:
                self.lost()
        else:
            self._settle(held, None)

    def _settle(self, held: _Held, error: BaseException | None) -> None:
        if self._held.pop(held.seq, None) is None:
            return
        self._slots.release()
        if not self._held:
            self._empty.set()
        if held.confirmed.done():
            return
        if error is None:
            held.confirmed.set_result(None)
        else:
            held.confirmed.set_exception(error)
            held.confirmed.exception()  # an application that did not wait is told by the log
