"""A fake ACTIVE for the replication link's tests: an AMQP server on a port that lets a
real PASSIVE subscribe to ``amq.replication`` and sends it whatever the test scripts.

With the pair's secret it can also sign its runs (a fuzzer needs runs that authenticate,
to reach the decoding behind the MAC); without it, it is the attacker of the audit.
Records every method the PASSIVE sends and the delivery tags it acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ContentHeader

from amqha.core import feedauth

# (properties, announced body size, body) of one delivery.
Delivery = tuple[commands.Basic.Properties, int, bytes]
# Given the session key (None without the secret), the deliveries of one subscription.
Script = Callable[[bytes | None], list[Delivery]]
# Given the session key, a tag the PASSIVE acked and the next free tag, what to send next
# on that subscription (as the real ACTIVE sends its marker once the snapshot is acked).
FollowUp = Callable[[bytes | None, int, int], list[Delivery]]


def signed(key: bytes, tag: int, headers: dict[str, Any], body: bytes) -> Delivery:
    """A delivery whose MAC holds for ``tag``, as the real ACTIVE sends it."""
    marker = headers.get("amqha-in-sync")
    end = bool(headers.get("amqha-snapshot-end"))
    mac = feedauth.run_mac(key, tag, end, marker if isinstance(marker, int) else None, body)
    return commands.Basic.Properties(headers={**headers, feedauth.MAC_HEADER: mac}), len(body), body


class FakeActive:
    def __init__(
        self,
        port: int,
        script: Script,
        secret: bytes | None = None,
        follow_up: FollowUp | None = None,
    ) -> None:
        self.port = port
        self.script = script
        self.follow_up = follow_up
        self.secret = secret
        self.received: list[str] = []
        self.logins: list[str] = []  # each Connection.StartOk's response, as sent
        # (subscription, delivery tag) -> the body sent, and the ones the PASSIVE acked.
        self.sent: dict[tuple[int, int], bytes] = {}
        self.acked: list[tuple[int, int]] = []
        self.connections = 0
        self.subscriptions = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeActive:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        nonce = secrets.token_bytes(feedauth.NONCE_BYTES)
        # This connection's subscription: its number, once it consumes; its session key;
        # the next delivery tag.
        subscription: list[Any] = [0, None, 1]
        buffer = b""
        try:
            await asyncio.wait_for(reader.readexactly(8), 10)  # the protocol header
            writer.write(
                frame.marshal(
                    commands.Connection.Start(
                        server_properties={
                            "product": "amqha",
                            feedauth.NONCE_PROPERTY: nonce.hex(),
                        },
                        mechanisms="PLAIN",
                        locales="en_US",
                    ),
                    0,
                )
            )
            while True:
                data = await asyncio.wait_for(reader.read(65536), 10)
                if not data:
                    return
                buffer += data
                while buffer:
                    try:
                        used, channel, method = frame.unmarshal(buffer)
                    except UnmarshalingException:
                        break
                    buffer = buffer[used:]
                    self.received.append(type(method).__name__)
                    self._answer(method, channel, nonce, writer, subscription)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            return
        finally:
            writer.close()

    def _answer(
        self,
        method: Any,
        channel: int,
        nonce: bytes,
        writer: asyncio.StreamWriter,
        subscription: list[Any],
    ) -> None:
        def send(reply: Any, number: int = 0) -> None:
            writer.write(frame.marshal(reply, number))

        def deliver(deliveries: list[Delivery]) -> None:
            for properties, size, body in deliveries:
                tag = subscription[2]
                subscription[2] = tag + 1
                self.sent[(subscription[0], tag)] = body
                send(
                    commands.Basic.Deliver("amq.ctag-fake", tag, False, "", "amq.replication"),
                    channel,
                )
                writer.write(frame.marshal(ContentHeader(0, size, properties), channel))
                if body:
                    writer.write(frame.marshal(ContentBody(body), channel))

        if isinstance(method, commands.Connection.StartOk):
            response = method.response
            self.logins.append(response.decode() if isinstance(response, bytes) else response)
            send(commands.Connection.Tune(channel_max=2, frame_max=131072, heartbeat=0))
        elif isinstance(method, commands.Connection.Open):
            send(commands.Connection.OpenOk())
        elif isinstance(method, commands.Channel.Open):
            send(commands.Channel.OpenOk(), channel)
        elif isinstance(method, commands.Basic.Qos):
            send(commands.Basic.QosOk(), channel)
        elif isinstance(method, commands.Basic.Consume):
            self.subscriptions += 1
            subscription[0] = self.subscriptions
            key = None
            client_nonce = feedauth.parse_nonce(
                (method.arguments or {}).get(feedauth.NONCE_ARGUMENT)
            )
            if self.secret is not None and client_nonce is not None:
                key = feedauth.session_key(self.secret, nonce, client_nonce)
            subscription[1] = key
            send(commands.Basic.ConsumeOk("amq.ctag-fake"), channel)
            deliver(self.script(key))
        elif isinstance(method, commands.Basic.Ack):
            self.acked.append((subscription[0], method.delivery_tag))
            if self.follow_up is not None:
                deliver(self.follow_up(subscription[1], method.delivery_tag, subscription[2]))
        elif isinstance(method, commands.Connection.Close):
            send(commands.Connection.CloseOk())
