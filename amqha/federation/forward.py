"""Forwarding: drain a link's hidden local queue to the upstream exchange, with confirms.

Owns: the in-process consumer of the hidden queue ``names.forward_queue_name`` (it
implements ``core.queue.Consumer``), the window of messages in flight upstream, the path
header each forwarded message carries (``x-amqha-path`` with this server's global name
added), the local ack once the upstream confirmed a message, and the requeue of what was
in flight when the link drops (docs/federation.md, "The link", step 6).

Must not know: how the link connects (it is handed a publish function while the link is
up, and ``None`` when it is down), the config, sockets.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pamqp import commands

from ..core import names
from ..core.message import Message
from ..core.queue import Consumer, Queue

log = logging.getLogger("amqha.federation")

# publish(exchange, routing_key, body, properties) -> True once the upstream confirmed,
# False if it refused (nack or return); raises when the link dropped.
REFUSED_PAUSE = 1.0  # seconds before a message the upstream refused is tried again

Publish = Callable[[str, str, bytes, commands.Basic.Properties], Awaitable[bool]]


class Forwarder(Consumer):
    """The consumer of one hidden forward queue."""

    def __init__(
        self,
        queue: Queue,
        exchange: str,
        local_name: str,
        now: Callable[[], float],
        window: int = 1000,
    ) -> None:
        super().__init__(f"federation-forward:{queue.name}", exclusive=True, no_ack=False)
        self.queue = queue
        self.exchange = exchange
        self.local_name = local_name
        self.now = now
        self.window = window
        self.publish: Publish | None = None
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.forwarded = 0
        self.refused = 0
        self.attached = False
        self.resume_at = 0.0

    # -- core.queue.Consumer --------------------------------------------------------------

    def ready(self) -> bool:
        return (
            self.publish is not None
            and len(self.in_flight) < self.window
            and self.now() >= self.resume_at
        )

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        publish = self.publish
        msg_id = message.msg_id
        if publish is None:  # the link dropped between ready() and here
            queue.requeue([msg_id])
            return
        self.in_flight[msg_id] = asyncio.get_running_loop().create_task(
            self._send(publish, message)
        )

    def cancelled(self) -> None:
        """The queue went away (it is removed with the federation)."""
        self.attached = False
        self.down()

    # -- the link's side ---------------------------------------------------------------

    def attach(self) -> None:
        if not self.attached:
            self.queue.add_consumer(self, self.now())
            self.attached = True

    def detach(self) -> None:
        if self.attached:
            self.queue.remove_consumer(self, self.now())
            self.attached = False
        self.down()

    def up(self, publish: Publish) -> None:
        """The link is running: forward through ``publish``."""
        self.publish = publish
        self.attach()
        self.queue.wake(self)
        self.queue.drain(self.now())

    def down(self) -> None:
        """The link dropped: what was in flight goes back to the queue, in place."""
        self.publish = None
        in_flight, self.in_flight = self.in_flight, {}
        for task in in_flight.values():
            task.cancel()
        if in_flight and self.queue.outstanding:
            self.queue.requeue([i for i in in_flight if i in self.queue.outstanding])

    async def _send(self, publish: Publish, message: Message) -> None:
        msg_id = message.msg_id
        properties = copy.copy(message.properties())
        headers: dict[str, Any] = dict(properties.headers or {})
        headers[names.PATH_HEADER] = names.extended(names.path_of(headers), self.local_name)
        properties.headers = headers
        # user_id was checked against the publisher's login here; upstream the link's own
        # login would be checked against it, so the claim stays behind.
        properties.user_id = None
        try:
            confirmed = await publish(self.exchange, message.routing_key, message.body, properties)
        except asyncio.CancelledError:
            return  # down() requeues it
        except Exception as error:  # the link dropped: the link's own loop reconnects
            log.debug("forward of %s failed: %s", msg_id, error)
            if self.in_flight.pop(msg_id, None) is not None and msg_id in self.queue.outstanding:
                self.queue.requeue([msg_id])
            return
        if self.in_flight.pop(msg_id, None) is None:
            return
        if confirmed:
            self.forwarded += 1
            self.queue.ack_one(msg_id)
        else:
            # Refused upstream (the exchange is gone, or a nack): kept, and tried again
            # after a pause rather than at once.
            self.refused += 1
            self.queue.requeue([msg_id])
            self.resume_at = self.now() + REFUSED_PAUSE
            asyncio.get_running_loop().call_later(REFUSED_PAUSE, self._resume)
            return
        self._resume()

    def _resume(self) -> None:
        if self.attached and self.ready():
            self.queue.wake(self)
            self.queue.drain(self.now())

    def status(self) -> dict[str, Any]:
        return {
            "queue": self.queue.name,
            "depth": self.queue.message_count,
            "in_flight": len(self.in_flight),
            "forwarded": self.forwarded,
            "refused": self.refused,
        }
