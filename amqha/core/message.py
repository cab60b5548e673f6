"""A published message as the broker holds it.

Owns: the wire-form pieces of a message (address, content header payload, body) and
lazy access to its properties. The content header is kept exactly as the publisher
sent it and forwarded verbatim on delivery; it is decoded only when routing or
dead-lettering needs a property.

Also owns the count of the memory messages hold (``HELD.count``): every message
adds its bytes and a fixed per-message overhead when it is made and takes them back
when the last reference to it goes, wherever it was held (queues, unacknowledged
deliveries, transactions). The memory watermark reads it.

And the server-wide counter that gives each message its id (``MessageIds``).

Must not know: queues, channels, connections.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from pamqp import commands, exceptions
from pamqp.header import ContentHeader

from ..wire import decode_properties, with_headers

_FLAG_CONTENT_TYPE = 1 << 15
_FLAG_CONTENT_ENCODING = 1 << 14
_FLAG_HEADERS = 1 << 13
_FLAG_DELIVERY_MODE = 1 << 12
_FLAG_PRIORITY = 1 << 11
_FLAG_REPLY_TO = 1 << 9
_FLAG_EXPIRATION = 1 << 8
_FLAG_CONTINUED = 1
_table_size = struct.Struct(">I")
_body_size = struct.Struct(">Q")

# What a queued message costs beyond its header and body bytes: the Message object,
# three bytes objects' headers, the queue's slot and the allocator's rounding. Measured
# with bench/memory_attacks.py (1M one-byte messages).
MESSAGE_OVERHEAD = 224


def _unshortstr_pair(address: bytes) -> tuple[str, str]:
    exchange_end = 1 + address[0]
    return address[1:exchange_end].decode(), address[exchange_end + 1 :].decode()


class HeldBytes:
    """The bytes held by all live messages of this process (see the module docstring).
    An object's attribute, which compiled code reads and writes in place: a class
    attribute was looked up and set by name, and each set emptied the type's method
    cache (docs/performance.md, "Calls the compiler can bind")."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


HELD: Final = HeldBytes()


class Message:
    """One message. Shared by every queue it was routed to; never mutated after routing."""

    __slots__ = ("address", "header", "body", "decoded", "cost", "msg_id")

    def __init__(
        self,
        address: bytes,
        header: bytes,
        body: bytes,
        decoded: commands.Basic.Properties | None = None,
        msg_id: int = 0,
    ) -> None:
        self.address = address
        # Stable identity, given when the message is first enqueued (see core.vhost).
        self.msg_id = msg_id
        self.header = header
        self.body = body
        # The properties already decoded while the message is routed; the publisher
        # drops them once routed, so a queued message holds only its wire bytes.
        self.decoded = decoded
        cost = len(address) + len(header) + len(body) + MESSAGE_OVERHEAD
        self.cost = cost
        HELD.count += cost

    def __del__(self) -> None:
        HELD.count -= self.cost

    @property
    def exchange(self) -> str:
        return _unshortstr_pair(self.address)[0]

    @property
    def routing_key(self) -> str:
        return _unshortstr_pair(self.address)[1]

    def _flags(self) -> int:
        header = self.header  # read in place: ``unpack_from`` builds a tuple (wire.py)
        return header[12] << 8 | header[13]

    def properties(self) -> commands.Basic.Properties:
        decoded = self.decoded
        if decoded is None:
            decoded = decode_properties(self.header)
        return decoded

    def headers(self) -> dict[str, Any]:
        if not self._flags() & _FLAG_HEADERS:
            return {}
        return self.properties().headers or {}

    def expiration_ms(self) -> int | None:
        """The per-message TTL, or None. A value that is not a non-negative integer is a 406."""
        if not self._flags() & _FLAG_EXPIRATION:
            return None
        raw = self.properties().expiration
        try:
            value = int(raw) if raw is not None else -1
        except ValueError:
            value = -1
        if value < 0:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - invalid expiration '{raw}'"
            )
        return value

    def expiration_text(self) -> str | None:
        """The expiration property as sent, or None."""
        if not self._flags() & _FLAG_EXPIRATION:
            return None
        return self.properties().expiration

    def reply_to(self) -> str | None:
        """The reply_to property, or None (read only when the flag is set)."""
        if not self._flags() & _FLAG_REPLY_TO:
            return None
        return self.properties().reply_to

    def with_reply_to(self, reply_to: str) -> Message:
        """A copy whose reply_to names ``reply_to`` (direct reply-to fills in its address)."""
        properties = decode_properties(self.header)  # a fresh copy: it is changed below
        headers = properties.headers or {}
        properties.headers = None
        properties.reply_to = reply_to
        # The body may not have arrived yet: the size is the one the header announces.
        content = ContentHeader(
            body_size=_body_size.unpack_from(self.header, 4)[0], properties=properties
        )
        return Message(self.address, with_headers(content.marshal(), headers), self.body)

    def priority(self) -> int:
        """The priority property (0 when absent), read from the header bytes: the
        properties before it are skipped by their sizes, nothing is decoded."""
        header = self.header
        flags = header[12] << 8 | header[13]
        if not flags & _FLAG_PRIORITY:
            return 0
        if flags & _FLAG_CONTINUED:
            return self.properties().priority or 0
        at = 14
        if flags & _FLAG_CONTENT_TYPE:
            at += 1 + header[at]
        if flags & _FLAG_CONTENT_ENCODING:
            at += 1 + header[at]
        if flags & _FLAG_HEADERS:
            at += 4 + _table_size.unpack_from(header, at)[0]
        if flags & _FLAG_DELIVERY_MODE:
            at += 1
        return header[at]

    def is_persistent(self) -> bool:
        """delivery_mode == 2, read from the header bytes: the properties before it (two
        short strings and the headers table) are skipped, not decoded."""
        header = self.header
        flags = (header[12] << 8) | header[13]
        if not flags & _FLAG_DELIVERY_MODE:
            return False
        at = 14
        try:
            if flags & _FLAG_CONTENT_TYPE:
                at += 1 + header[at]
            if flags & _FLAG_CONTENT_ENCODING:
                at += 1 + header[at]
            if flags & _FLAG_HEADERS:
                at += 4 + int.from_bytes(header[at : at + 4], "big")
            return header[at] == 2
        except IndexError:  # checked on arrival; kept safe for any header
            return self.properties().delivery_mode == 2

    def rewritten(
        self, address: bytes, headers: dict[str, Any], drop_expiration: bool = False
    ) -> Message:
        """A copy with a new address and headers (dead-lettering uses this)."""
        properties = decode_properties(self.header)  # a fresh copy: it is changed below
        properties.headers = None
        if drop_expiration:
            properties.expiration = None
        content = ContentHeader(body_size=len(self.body), properties=properties)
        return Message(address, with_headers(content.marshal(), headers), self.body)

    @property
    def size(self) -> int:
        return len(self.body)


class MessageIds:
    """The server-wide message id counter, shared by every vhost: ids are never reused
    (a restart resumes above the highest one recovered)."""

    __slots__ = ("next",)

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def seen(self, msg_id: int) -> None:
        if msg_id >= self.next:
            self.next = msg_id + 1
