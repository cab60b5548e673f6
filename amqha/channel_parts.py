"""What a channel's parts (publishing, transactions) read and call of the channel they are
mixed into, declared once.

Owns: declarations only. ``channel.Channel`` is made of its own methods and two parts,
``channel_publish.Publishing`` and ``channel_tx.Transactions``; each part reads the
channel's state and calls methods another part or the channel defines. Declared here,
each part is type-checked on its own, and compiled (a mypyc trait: docs/performance.md,
"The compiled modules"); the channel's ``__init__`` sets the attributes, and the methods
below are overridden by the part or the channel that owns them.

Must not know: anything a part does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

from .core.message import Message
from .core.queue import Queue

if TYPE_CHECKING:
    from pamqp.base import Frame as Method

    from . import wire
    from .core.confirms import Confirms, Waiting
    from .core.vhost import VHost
    from .host import ChannelHost, ChannelOwner


@trait
class Counted:
    """A consumer as the channel's book of unacked deliveries sees it
    (``channel.ChannelConsumer``). A trait: compiled, the count is read and written in
    place, where a Protocol's attribute was looked up by name."""

    unacked: int  # its deliveries not acked yet


class Unacked:
    """An unacknowledged delivery: its tag, its consumer (None for a Basic.Get), its queue
    and its message. A class rather than a tuple: compiled, a tuple typed by its fields
    is unpacked into C values where it is read and packed again where it is stored, a
    new tuple each time (docs/performance.md, "Calls the compiler can bind")."""

    __slots__ = ("tag", "consumer", "queue", "message")

    def __init__(self, tag: int, consumer: Counted | None, queue: Queue, message: Message) -> None:
        self.tag = tag
        self.consumer = consumer
        self.queue = queue
        self.message = message


# A transaction is data: the actions it will take on commit, in order (channel_tx.py).
TxAction = tuple[Any, ...]


@trait
class ChannelParts:
    """The channel as its parts see it."""

    connection: ChannelOwner
    broker: ChannelHost
    vhost: VHost
    number: int
    confirm: bool  # Confirm.Select
    confirms: Confirms
    # The confirm pipeline's book: publishes waiting for the watermark go there.
    waiting: Waiting
    transaction: list[TxAction] | None  # Tx.Select: the open transaction's actions

    def reply(self, method: Method) -> None:  # the channel's
        raise NotImplementedError

    def next_tag(self) -> int:  # the channel's
        raise NotImplementedError

    def _route(self, exchange: Any, publish: wire.Publish, message: Message) -> None:
        raise NotImplementedError  # Publishing's

    def _hold_in_transaction(self, size: int) -> None:
        raise NotImplementedError  # Transactions'

    def _settle(self, entries: list[Unacked]) -> None:
        raise NotImplementedError  # the channel's

    def _return_to_queues(self, entries: list[Unacked], requeue: bool) -> None:
        raise NotImplementedError  # the channel's
