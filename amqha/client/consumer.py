"""``Consumer`` and ``Deduplicator``: consuming through failovers (docs/client.md).

Owns: a consumer's callback, acked when it returns and requeued when it raises; never
acking on the new ACTIVE a delivery that came from the lost server; the message ids of
recent messages, to drop the duplicates an at-least-once publisher can make.

Must not know: publishers; how the next server is found (``link.py``, ``connection.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aio_pika
import aiormq
from yarl import URL

from amqha.client_watch import DEFAULT_SILENT_AFTER

from .link import Link

log = logging.getLogger("amqha.client")


class Deduplicator:
    """The message ids of the last ``capacity`` messages handled, to drop duplicates.

    ``Publisher`` is at least once: a message whose confirm was lost with its server is
    sent again, with the same message id, and can reach the consumer twice (the second
    time possibly with ``redelivered`` false). Check ``seen`` before handling a message
    and ``add`` its id once handled; ids older than the last ``capacity`` are forgotten,
    so a duplicate arriving after that many others is not caught (docs/client.md).
    """

    def __init__(self, capacity: int = 100_000) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a whole number of at least 1, not {capacity!r}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, message_id: str) -> None:
        self._ids[message_id] = None
        self._ids.move_to_end(message_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def seen(self, message_id: str | None) -> bool:
        """Whether this id was handled already; records it if not. A message without an
        id is never a duplicate."""
        if message_id is None:
            return False
        if message_id in self._ids:
            self._ids.move_to_end(message_id)
            return True
        self.add(message_id)
        return False


class Consumer(Link):
    """Consumes ``queue`` through failovers (docs/client.md).

    ``callback`` gets each message (an aio-pika IncomingMessage); when it returns the
    message is acked, when it raises the message is requeued (and the error logged).
    After a failover the consumer resumes on the new ACTIVE by itself. A delivery that
    came from the lost server is never acked on the new one (its delivery tag means
    nothing there): that message comes again from the new server, and with a
    ``dedupe`` the handled ones are acked without calling ``callback`` twice.
    ``setup`` runs on every new channel before consuming (declare the queue there).
    A server silent past its heartbeat and ``silent_after`` is left (docs/client.md).
    """

    def __init__(
        self,
        urls: Sequence[str | URL] | str,
        queue: str,
        callback: Callable[[aio_pika.abc.AbstractIncomingMessage], Awaitable[Any]],
        *,
        prefetch: int = 50,
        dedupe: Deduplicator | None = None,
        setup: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]] | None = None,
        name: str | None = None,
        attempt_timeout: float = 5.0,
        warn_after: float = 10.0,
        silent_after: float = DEFAULT_SILENT_AFTER,
        **connect_kwargs: Any,
    ) -> None:
        super().__init__(
            urls,
            name or f"consumer of {queue}",
            setup,
            attempt_timeout,
            warn_after,
            connect_kwargs,
            silent_after,
        )
        self.queue = queue
        self.callback = callback
        self.prefetch = prefetch
        self.dedupe = dedupe
        self.handled = 0
        self.duplicates = 0  # deliveries dropped by dedupe
        self.stale = 0  # acks not sent: their delivery came from a server since lost
        self._handling: set[asyncio.Task[None]] = set()
        self._consuming: tuple[aio_pika.abc.AbstractQueue, str] | None = None

    async def close(self, timeout: float = 10.0) -> None:
        """Stop consuming; callbacks still running get up to ``timeout`` s to finish
        (their messages are acked if the channel is still open), then are cancelled."""
        self.closing = True
        if self._consuming is not None:
            queue, tag = self._consuming
            with contextlib.suppress(Exception):
                await asyncio.wait_for(queue.cancel(tag), 2.0)
        if self._handling:
            await asyncio.wait(list(self._handling), timeout=timeout)
        for task in list(self._handling):
            task.cancel()
        await asyncio.gather(*self._handling, return_exceptions=True)
        await self._stop()

    async def _on_channel(self, channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.set_qos(prefetch_count=self.prefetch)
        queue = await channel.get_queue(self.queue, ensure=False)
        self._consuming = (queue, await queue.consume(self._deliver))

    async def _deliver(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        # aiormq cancels the consumer's tasks when their channel closes: the callback runs
        # in a task of its own, to its end (its ack is then dropped as stale).
        task = asyncio.ensure_future(self._handle(message))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)
        await asyncio.shield(task)

    async def _handle(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        message_id = message.message_id
        if self.dedupe is not None and message_id is not None and message_id in self.dedupe:
            self.duplicates += 1
            await self._settle(message, ack=True)
            return
        try:
            await self.callback(message)
        except Exception:
            log.exception(
                "%s: the callback failed on message %s; it is requeued",
                self.failover.name,
                message_id,
            )
            await self._settle(message, ack=False)
            return
        self.handled += 1
        if self.dedupe is not None and message_id is not None:
            self.dedupe.add(message_id)
        await self._settle(message, ack=True)

    async def _settle(self, message: aio_pika.abc.AbstractIncomingMessage, ack: bool) -> None:
        """Ack (or requeue) on the channel the message came by, if that is the one in use."""
        if message.processed:  # the callback settled it itself
            return
        try:
            channel = message.channel
        except aiormq.exceptions.ChannelInvalidStateError:
            channel = None
        if channel is None or channel is not self.underlay:
            self.stale += 1
            log.debug(
                "%s: not settling message %s: it came from a server since lost",
                self.failover.name,
                message.message_id,
            )
            return
        try:
            if ack:
                await message.ack()
            else:
                await message.nack(requeue=True)
        except (aiormq.exceptions.AMQPError, ConnectionError):
            self.stale += 1  # lost while sending: the new ACTIVE delivers it again
