"""The memory alarm's flow control: which connections it holds, and which it tells.

Owns the rule of docs/limits.md, "What the alarm holds". While the broker blocks
publishers (the memory count past ``limits.memory_high_watermark``, or a store that
cannot write), a connection is held (its socket no longer read) when it publishes a
message, that is to an exchange that is not a control exchange, or at once when the
alarm finds it in the middle of one; Connection.Blocked goes (if the client announced
the capability) to every connection that has published messages, and Unblocked to each
of them when the alarm clears. Requests to the control plane (the console,
``amq.federation``, ``amq.peer``) never hold a connection; the pair's own links
(peering logins) are neither held nor told; a connection that only consumes is read on,
since its acks free memory.

Must not know: how memory is counted or when the alarm begins (``server``), routing,
what a channel does with a publish.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from . import wire
from .read_holds import READ_HELD_MEMORY


def hold(connection: Any, reason: str) -> None:
    """The connection publishes a message while the alarm is on (``reason``): told, and
    not read any more until the alarm clears. Never a pair's own link."""
    if not connection.pair_link:
        tell(connection, reason)
        connection.hold_reading(READ_HELD_MEMORY, True)


def alarm(connection: Any, reason: str | None) -> None:
    """The alarm began (``reason``) or ended (None). A connection that has published
    messages is told; one in the middle of a publish is held at once (the others at
    their next publish, ``hold``); every one is read again when it ends. One that never
    published a message is not told: aio-pika and the clients on aiormq open no channel
    while told blocked, and a consumer, the console or a federation link must go on."""
    if connection.pair_link:
        return
    if reason is None:
        tell(connection, None)
        connection.hold_reading(READ_HELD_MEMORY, False)
        return
    if connection.publishes_messages:
        tell(connection, reason)
    if connection.published and any(
        channel.publishing() for channel in connection.channels.values()
    ):
        hold(connection, reason)


def tell(connection: Any, reason: str | None) -> None:
    """Connection.Blocked with ``reason``, or Unblocked (None) after a Blocked, to a
    client that announced the capability."""
    blocked = reason is not None
    if blocked == connection.told_blocked:
        return
    connection.told_blocked = blocked
    if connection.capability("connection.blocked"):
        method = (
            commands.Connection.Blocked(reason)
            if reason is not None
            else commands.Connection.Unblocked()
        )
        connection.send(wire.method_frame(0, method))
