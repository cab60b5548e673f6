"""AMQP 0-9-1 framing and codec: bytes in, frames out, and frames back to bytes.

Owns: splitting a byte stream into frames (with the frame_max cap checked on the
7-byte header, before the payload is read), decoding method frames through pamqp's
index table, and hand-written encoders for the hot frames (Basic.Publish in;
Basic.Deliver, Basic.GetOk, Basic.Return and content frames out) that are
byte-identical to pamqp's output (tests/unit/test_wire.py holds them to that).

Must not know: sockets, channels, queues, the clock. Errors are raised as pamqp's
AMQP exception classes so the connection can map them to reply codes.
"""

from __future__ import annotations

import calendar
import datetime
import decimal
import json
import struct
import time
from typing import Any, Final, cast

from librt.strings import (
    BytesWriter,
    read_i32_be,
    read_i64_be,
    write_i16_be,
    write_i32_be,
    write_i64_be,
)
from pamqp import commands, constants, decode, exceptions
from pamqp import encode as pamqp_encode
from pamqp.base import Frame as Method
from pamqp.header import ContentHeader

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD: Final = constants.FRAME_METHOD
FRAME_HEADER: Final = constants.FRAME_HEADER
FRAME_BODY: Final = constants.FRAME_BODY
FRAME_HEARTBEAT: Final = constants.FRAME_HEARTBEAT
FRAME_END: Final = constants.FRAME_END
# 7 header bytes plus the end byte: what a frame costs beyond its payload.
FRAME_OVERHEAD: Final = 8

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_method_index: Final = struct.Struct(">I")
_short: Final = struct.Struct(">H")
_long_long: Final = struct.Struct(">Q")
_deliver_tail: Final = struct.Struct(">QB")
_content_head: Final = struct.Struct(">HHQ")

PUBLISH_INDEX: Final = commands.Basic.Publish.index
PUBLISH_PREFIX: Final = _method_index.pack(PUBLISH_INDEX)
_DELIVER_PREFIX: Final = _method_index.pack(commands.Basic.Deliver.index)
_GET_OK_PREFIX: Final = _method_index.pack(commands.Basic.GetOk.index)
_RETURN_PREFIX: Final = _method_index.pack(commands.Basic.Return.index)
_ACK_PREFIX: Final = _method_index.pack(commands.Basic.Ack.index)
_NACK_PREFIX: Final = _method_index.pack(commands.Basic.Nack.index)
_DECLARE_OK_PREFIX: Final = _method_index.pack(commands.Queue.DeclareOk.index)
_counts: Final = struct.Struct(">II")

# Connection.Redirect exists in AMQP 0-8/0-9 (class 10, method 42) but not in 0-9-1,
# so pamqp has no class for it: it is encoded here by hand.
REDIRECT_CLASS_METHOD: Final = (10, 42)
_REDIRECT_PREFIX: Final = _method_index.pack(10 << 16 | 42)

_KNOWN_CLASSES: Final = {index >> 16 for index in commands.INDEX_MAPPING}


class RawFrame:
    """One frame as read off the wire: its type, channel and undecoded payload."""

    __slots__ = ("kind", "channel", "payload")

    def __init__(self, kind: int, channel: int, payload: bytes) -> None:
        self.kind = kind
        self.channel = channel
        self.payload = payload


def split_frames(buffer: bytes | bytearray, frame_max: int) -> tuple[list[RawFrame], int]:
    """Cut whole frames off the front of ``buffer``.

    Returns the frames and how many bytes they took; a partial frame at the end is
    left for the next call. A frame larger than ``frame_max`` is refused on its
    header alone (501) so a hostile size never makes us wait for or hold its payload;
    a bad end byte is a 501 as well.
    """
    frames: list[RawFrame] = []
    append = frames.append
    position = 0
    available = len(buffer)
    largest_payload = frame_max - FRAME_OVERHEAD
    # One copy now (at most a partial frame plus a read) rather than two per frame.
    data = buffer if type(buffer) is bytes else bytes(buffer)
    while available - position >= 7:
        # The head read in place, where ``unpack_from`` parses its arguments and builds
        # a tuple for every frame.
        kind = data[position]
        channel = data[position + 1] << 8 | data[position + 2]
        size = u32_at(data, position + 3)
        if size > largest_payload:
            raise exceptions.AMQPFrameError(
                f"FRAME_ERROR - frame size {size + FRAME_OVERHEAD} exceeds frame_max {frame_max}"
            )
        start = position + 7
        end = start + size
        if end >= available:
            break
        if data[end] != 0xCE:  # FRAME_END, as a literal: this loop runs once per frame
            raise exceptions.AMQPFrameError(f"FRAME_ERROR - bad frame end byte 0x{data[end]:02x}")
        append(RawFrame(kind, channel, data[start:end]))
        position = end + 1
    return frames, position


# A method frame's field tables (Queue.Declare's arguments, a headers binding's, a
# client's properties) hold a handful of entries. Past this many, counting those of
# nested tables and arrays, the frame is refused before the rest is decoded: a 128 KiB
# frame of one-byte void entries would otherwise cost the loop 131,000 of them.
MAX_METHOD_TABLE_ENTRIES: Final = 4096


def decode_method(payload: bytes) -> Method:
    """Decode a method frame's payload into pamqp's class for it.

    An unknown class is 540 (NOT_IMPLEMENTED), an unknown method of a known class
    is 503 (COMMAND_INVALID), arguments that do not decode, or whose field tables hold
    more than MAX_METHOD_TABLE_ENTRIES entries, are 502 (SYNTAX_ERROR).
    """
    if len(payload) < 4:
        raise exceptions.AMQPSyntaxError("SYNTAX_ERROR - method frame shorter than its index")
    (index,) = _method_index.unpack_from(payload)
    method_class = commands.INDEX_MAPPING.get(index)
    if method_class is None:
        class_id, method_id = index >> 16, index & 0xFFFF
        if class_id not in _KNOWN_CLASSES:
            raise exceptions.AMQPNotImplemented(f"NOT_IMPLEMENTED - unknown class {class_id}")
        raise exceptions.AMQPCommandInvalid(
            f"COMMAND_INVALID - unknown method {method_id} of class {class_id}"
        )
    method = method_class()
    try:
        _decode_arguments(method, payload)
    except Exception as error:  # struct.error, ValueError, IndexError, OverflowError...
        raise exceptions.AMQPSyntaxError(
            f"SYNTAX_ERROR - cannot decode {method.name}: {error}"
        ) from error
    return method


# Each method class's arguments in wire order with their pamqp type names.
_ARGUMENT_TYPES: Final[dict[type[Method], tuple[tuple[str, str], ...]]] = {
    method_class: tuple((name, method_class.amqp_type(name)) for name in method_class.__slots__)
    for method_class in cast(dict[int, type[Method]], commands.INDEX_MAPPING).values()
}


def _argument_types(method_class: type[Method]) -> tuple[tuple[str, str], ...]:
    """A class registered with pamqp after this module was imported (a client's
    Connection.Redirect) gets its entry on first use."""
    types = _ARGUMENT_TYPES.get(method_class)
    if types is None:
        types = _ARGUMENT_TYPES[method_class] = tuple(
            (name, method_class.amqp_type(name)) for name in method_class.__slots__
        )
    return types


def _decode_arguments(method: Method, payload: bytes) -> None:
    """What pamqp's ``Frame.unmarshal`` does, with field tables decoded by ``_table``.

    pamqp slices off the rest of a table for every value it decodes (twice), so a frame
    of many small entries cost time quadratic in its size: 2.5 s of CPU for one
    128 KiB Queue.Declare. The other types are few per method and left to pamqp.
    Consecutive bits share an octet, eight at most, as in pamqp.
    """
    entries = _Entries(MAX_METHOD_TABLE_ENTRIES)
    at = 4
    bits_at = -1  # the octet the current run of bits is read from
    bit = 0
    value: Any
    for name, kind in _argument_types(type(method)):
        if kind == "bit":
            if bits_at < 0 or bit == 8:
                bits_at, bit = at, 0
                at += 1
            value = bool(payload[bits_at] >> bit & 1)
            bit += 1
        else:
            bits_at = -1
            if kind == "table":
                at, value = _table(payload, at, 0, entries)
            else:
                consumed, value = decode.by_type(payload[at:], kind)
                at += consumed
        setattr(method, name, value)


def method_index_bytes(method: type[Method]) -> bytes:
    """The 4 bytes a method frame of this class starts with."""
    return _method_index.pack(method.index)


def method_index(payload: bytes) -> int:
    """The class and method ids of a method frame's payload of 4 bytes or more."""
    return u32_at(payload, 0)


def u32_at(data: bytes, at: int) -> int:
    """The big-endian unsigned 32-bit integer at ``at`` (IndexError past the end), read
    in place by librt (a C call, compiled), where ``Struct.unpack_from`` parses its
    arguments and builds a tuple (a fifth of a publish's instructions went to the four
    it made). librt reads signed integers: the mask makes it unsigned."""
    value: int = read_i32_be(data, at)
    return value & 0xFFFFFFFF


def i64_at(data: bytes, at: int) -> int:
    """The big-endian signed 64-bit integer at ``at`` (IndexError past the end)."""
    value: int = read_i64_be(data, at)
    return value


def u64_at(data: bytes, at: int) -> int:
    """The big-endian unsigned 64-bit integer at ``at`` (IndexError past the end)."""
    value: int = read_i64_be(data, at)
    return value if value >= 0 else value + 0x10000000000000000


def method_ids(frame: RawFrame) -> tuple[int, int]:
    """A method frame's class and method ids, (0, 0) for any other frame."""
    if frame.kind == FRAME_METHOD and len(frame.payload) >= 4:
        index = method_index(frame.payload)
        return index >> 16, index & 0xFFFF
    return 0, 0


_CLOSING_METHODS: Final = (
    method_index_bytes(commands.Connection.Close),
    method_index_bytes(commands.Connection.CloseOk),
)


def is_connection_close(frame: RawFrame) -> bool:
    """Connection.Close or Close-Ok: what a closing connection still reads."""
    return (
        frame.channel == 0 and frame.kind == FRAME_METHOD and frame.payload[:4] in _CLOSING_METHODS
    )


class Publish:
    """Basic.Publish decoded by the fast path.

    ``address`` is the exchange and routing key exactly as they stood on the wire
    (two shortstrs): Basic.Deliver, GetOk and Return carry the same two fields in
    the same encoding, so they are copied, never re-encoded.
    """

    __slots__ = ("exchange", "routing_key", "mandatory", "immediate", "address")

    def __init__(
        self, exchange: str, routing_key: str, mandatory: bool, immediate: bool, address: bytes
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.address = address


def decode_publish(payload: bytes) -> Publish:
    """Basic.Publish without pamqp: index(4) ticket(2) exchange rk bits."""
    try:
        exchange_length = payload[6]
        key_at = 7 + exchange_length
        key_length = payload[key_at]
        bits_at = key_at + 1 + key_length
        bits = payload[bits_at]
        exchange = payload[7:key_at].decode()
        routing_key = payload[key_at + 1 : bits_at].decode()
    except (IndexError, UnicodeDecodeError) as error:
        raise exceptions.AMQPSyntaxError(
            f"SYNTAX_ERROR - cannot decode Basic.Publish: {error}"
        ) from error
    if bits_at + 1 != len(payload):
        raise exceptions.AMQPSyntaxError("SYNTAX_ERROR - Basic.Publish has trailing bytes")
    return Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2), payload[6:bits_at])


def shortstr(value: str) -> bytes:
    data = value.encode()
    if len(data) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(data),)) + data


def reply_text(text: str) -> str:
    """``text`` cut to fit a shortstr (255 bytes of UTF-8), never inside a character."""
    return text.encode()[:255].decode(errors="ignore")


def address_of(exchange: str, routing_key: str) -> bytes:
    """The (exchange, routing key) pair in wire form, as Publish.address holds it."""
    return shortstr(exchange) + shortstr(routing_key)


def content_body_size(header_payload: bytes) -> int:
    """The body size a content header announces (class, weight, size, ...)."""
    if len(header_payload) < 14:
        raise exceptions.AMQPFrameError("FRAME_ERROR - content header too short")
    class_id = header_payload[0] << 8 | header_payload[1]
    body_size = u64_at(header_payload, 4)
    if class_id != commands.Basic.frame_id:
        raise exceptions.AMQPFrameError(f"FRAME_ERROR - content header for class {class_id}")
    return body_size


# Basic's properties in flag order (bit 15 down to bit 2) with their pamqp type names.
_PROPERTY_TYPES: Final = tuple(
    (flag, commands.Basic.Properties.amqp_type(name))
    for name, flag in commands.Basic.Properties.flags.items()
)
# A timestamp or a second flag word: rare enough to leave to pamqp.
_PAMQP_CHECKS_FLAGS: Final = commands.Basic.Properties.flags["timestamp"] | 0x0003
_EMPTY_TABLE: Final = b"\x00\x00\x00\x00"


def check_properties(header_payload: bytes) -> commands.Basic.Properties | None:
    """Refuse (502) a content header whose properties pamqp could not decode.

    The header is forwarded verbatim and decoded only later (dead-lettering, headers
    routing), far from the publisher: it must be known to decode when it arrives.
    Shortstrs, octets and empty tables are walked here and None is returned; anything
    else is decoded, and the decoded properties are returned so that routing the same
    message does not decode them again.
    """
    if len(header_payload) < 14:
        raise exceptions.AMQPSyntaxError("SYNTAX_ERROR - content header too short")
    flags = header_payload[12] << 8 | header_payload[13]
    if flags & _PAMQP_CHECKS_FLAGS:
        return decode_properties(header_payload)
    at, size, remaining = 14, len(header_payload), flags
    try:
        for flag, kind in _PROPERTY_TYPES:
            if not remaining & flag:
                if not remaining:
                    break
                continue
            remaining ^= flag
            if kind == "shortstr":
                end = at + 1 + header_payload[at]
                if end > size:
                    raise IndexError("shortstr runs past the header")
                header_payload[at + 1 : end].decode()
                at = end
            elif kind == "octet":
                if at >= size:
                    raise IndexError("octet missing")
                at += 1
            elif header_payload[at : at + 4] == _EMPTY_TABLE:
                at += 4
            else:
                return decode_properties(header_payload)
    except (IndexError, UnicodeDecodeError) as error:
        raise exceptions.AMQPSyntaxError(
            f"SYNTAX_ERROR - cannot decode message properties: {error}"
        ) from error
    return None


# Deeper nesting than this is refused: no client sends it, and each level costs a
# recursion in every decoder that will read the table after us.
MAX_TABLE_DEPTH: Final = 32
_PROPERTY_NAMES: Final = tuple(
    (name, commands.Basic.Properties.flags[name], commands.Basic.Properties.amqp_type(name))
    for name in commands.Basic.Properties.__slots__
)


def without_headers(header_payload: bytes, keys: frozenset[str]) -> bytes:
    """The content header with none of the headers named ``keys`` (the same bytes if it
    has none of them); the other properties as they were."""
    properties = decode_properties(header_payload)
    headers = properties.headers
    if not headers or not keys.intersection(headers):
        return header_payload
    properties.headers = {k: v for k, v in headers.items() if k not in keys} or None
    (body_size,) = struct.unpack_from(">Q", header_payload, 4)
    return ContentHeader(body_size=body_size, properties=properties).marshal()


def decode_properties(header_payload: bytes) -> commands.Basic.Properties:
    """A content header's properties, as pamqp decodes them, in time linear in their size.

    pamqp copies the rest of a field table for every field it decodes, so a table of
    many small fields costs time quadratic in its size (tens of milliseconds for
    100 KB): tables are decoded here instead, the other property types by pamqp.
    Anything that does not decode, or a table nested deeper than MAX_TABLE_DEPTH, is
    a 502.
    """
    try:
        return _decode_properties(header_payload)
    except Exception as error:  # struct.error, ValueError, OverflowError, OSError...
        raise exceptions.AMQPSyntaxError(
            f"SYNTAX_ERROR - cannot decode message properties: {error}"
        ) from error


def _decode_properties(payload: bytes) -> commands.Basic.Properties:
    at = 12
    flags = -1
    while True:
        if len(payload) - at < 2:
            raise ValueError("content header flags are truncated")
        (word,) = _short.unpack_from(payload, at)
        at += 2
        if flags < 0:
            flags = word
        if not word & 1:
            break
    properties = commands.Basic.Properties()
    value: Any
    for name, flag, kind in _PROPERTY_NAMES:
        if not flags & flag:
            continue
        if kind == "table":
            at, value = _table(payload, at, 0, _Entries(_UNCOUNTED))
        else:
            consumed, value = decode.by_type(payload[at:], kind)
            at += consumed
        setattr(properties, name, value)
    return properties


class _Entries:
    """How many more table and array entries a decode may take; any past them is refused."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


# Content headers are bounded by limits.max_header_size before they are decoded, and a
# stored table was counted when its method arrived: neither has a count of its own.
_UNCOUNTED: Final = 2**62


_u32: Final = struct.Struct(">I")
_FIXED_VALUES: Final[dict[int, tuple[int, Any]]] = {
    ord(tag): (size, unpack)
    for tag, size, unpack in (
        ("t", 1, lambda data, at: bool(data[at])),
        ("b", 1, struct.Struct(">b").unpack_from),
        ("B", 1, struct.Struct(">B").unpack_from),
        ("s", 2, struct.Struct(">h").unpack_from),
        ("u", 2, struct.Struct(">H").unpack_from),
        ("I", 4, struct.Struct(">l").unpack_from),
        ("i", 4, struct.Struct(">L").unpack_from),
        ("l", 8, struct.Struct(">q").unpack_from),
        ("L", 8, struct.Struct(">q").unpack_from),
        ("f", 4, struct.Struct(">f").unpack_from),
        ("d", 8, struct.Struct(">d").unpack_from),
    )
}


def _table(data: bytes, at: int, depth: int, entries: _Entries) -> tuple[int, dict[str, Any]]:
    """A field table at ``at``: (the offset after it, its fields)."""
    if depth >= MAX_TABLE_DEPTH:
        raise ValueError(f"field tables nested deeper than {MAX_TABLE_DEPTH}")
    (length,) = _u32.unpack_from(data, at)
    at += 4
    end = at + length
    if end > len(data):
        raise ValueError("field table length exceeds available data")
    table: dict[str, Any] = {}
    while at < end:
        entries.left -= 1
        if entries.left < 0:
            raise ValueError(f"field tables hold more than {MAX_METHOD_TABLE_ENTRIES} entries")
        key_end = at + 1 + data[at]
        if key_end > end:
            raise ValueError("field table key length exceeds data")
        key = data[at + 1 : key_end].decode()
        at, table[key] = _value(data, key_end, end, depth, entries)
    return end, table


def _array(data: bytes, at: int, depth: int, entries: _Entries) -> tuple[int, list[Any]]:
    if depth >= MAX_TABLE_DEPTH:
        raise ValueError(f"field arrays nested deeper than {MAX_TABLE_DEPTH}")
    (length,) = _u32.unpack_from(data, at)
    at += 4
    end = at + length
    if end > len(data):
        raise ValueError("field array length exceeds available data")
    values: list[Any] = []
    append = values.append
    while at < end:
        entries.left -= 1
        if entries.left < 0:
            raise ValueError(f"field tables hold more than {MAX_METHOD_TABLE_ENTRIES} entries")
        at, value = _value(data, at, end, depth, entries)
        append(value)
    return end, values


def _value(data: bytes, at: int, end: int, depth: int, entries: _Entries) -> tuple[int, Any]:
    """One tagged value inside a table or array that ends at ``end``."""
    if at >= end:
        raise ValueError("field value missing")
    tag = data[at]
    at += 1
    value: Any
    fixed = _FIXED_VALUES.get(tag)
    if fixed is not None:
        size, unpack = fixed
        if at + size > end:
            raise ValueError("field value runs past its table")
        value = unpack(data, at)
        return at + size, value if tag == 116 else value[0]  # 116: "t", already a bool
    if tag == 83 or tag == 120:  # "S" long string, "x" byte array
        (length,) = _u32.unpack_from(data, at)
        start = at + 4
        stop = start + length
        if stop > end:
            raise ValueError("long string runs past its table")
        raw = data[start:stop]
        if tag == 120:
            return stop, bytearray(raw)
        try:
            return stop, raw.decode()
        except UnicodeDecodeError:
            return stop, raw
    table: dict[str, Any] | list[Any]
    if tag == 70:  # "F"
        stop, table = _table(data, at, depth + 1, entries)
    elif tag == 65:  # "A"
        stop, table = _array(data, at, depth + 1, entries)
    elif tag == 86 or tag == 0:  # "V" void, and a zero tag pamqp also reads as void
        return at, None
    elif tag == 68 or tag == 84:  # "D" decimal, "T" timestamp: rare, left to pamqp
        size = 5 if tag == 68 else 8
        if at + size > end:
            raise ValueError("field value runs past its table")
        _, value = decode.TABLE_MAPPING[bytes((tag,))](data[at : at + size])
        return at + size, value
    else:
        raise ValueError(f"unknown field type {bytes((tag,))!r}")
    if stop > end:
        raise ValueError("nested field table runs past its table")
    return stop, table


def put_u16(out: BytesWriter, n: int) -> None:
    """``n`` (0 to 65535) as two bytes, big-endian: librt writes signed integers, so the
    upper half goes as its two's complement (the same bytes). Out of range, a
    ValueError, as ``Struct.pack`` refused it."""
    if not 0 <= n <= 0xFFFF:
        raise ValueError(f"{n} is out of range for an unsigned 16-bit integer")
    write_i16_be(out, n - 0x10000 if n > 0x7FFF else n)


def put_u32(out: BytesWriter, n: int) -> None:
    if not 0 <= n <= 0xFFFFFFFF:
        raise ValueError(f"{n} is out of range for an unsigned 32-bit integer")
    write_i32_be(out, n - 0x100000000 if n > 0x7FFFFFFF else n)


def put_u64(out: BytesWriter, n: int) -> None:
    if n < 0:
        raise ValueError(f"{n} is out of range for an unsigned 64-bit integer")
    if n > 0x3FFFFFFFFFFFFFFF:  # past what a compiled int holds unboxed: rare
        if n > 0xFFFFFFFFFFFFFFFF:
            raise ValueError(f"{n} is out of range for an unsigned 64-bit integer")
        n = n - 0x10000000000000000 if n > 0x7FFFFFFFFFFFFFFF else n
    write_i64_be(out, n)


def put_head(out: BytesWriter, kind: int, channel: int, size: int) -> None:
    """A frame's first seven bytes: its type, channel and payload size."""
    out.append(kind)
    put_u16(out, channel)
    put_u32(out, size)


def frame_head(kind: int, channel: int, size: int) -> bytes:
    """``put_head`` as bytes: compiled, C calls where ``Struct.pack`` was a method looked
    up by name, its arguments parsed (docs/performance.md, "Writing frames")."""
    out = BytesWriter()
    put_head(out, kind, channel, size)
    return out.getvalue()


def method_frame(channel: int, method: Method) -> bytes:
    payload = _method_index.pack(method.index) + method.marshal()
    return frame_head(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def declare_ok_frame(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    """Queue.DeclareOk by hand: pamqp refuses to encode a name outside the spec's domain
    regex, yet clients may declare any UTF-8 name (RabbitMQ takes them all)."""
    payload = _DECLARE_OK_PREFIX + shortstr(queue) + _counts.pack(message_count, consumer_count)
    return frame_head(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def redirect_frame(host: str, known_hosts: str) -> bytes:
    payload = _REDIRECT_PREFIX + shortstr(host) + shortstr(known_hosts)
    return frame_head(FRAME_METHOD, 0, len(payload)) + payload + b"\xce"


def content_frames(channel: int, header_payload: bytes, body: bytes, frame_max: int) -> bytes:
    """Content header plus body frames, the body cut to fit frame_max."""
    head = frame_head(FRAME_HEADER, channel, len(header_payload)) + header_payload + b"\xce"
    size = len(body)
    if size == 0:
        return head
    chunk = frame_max - FRAME_OVERHEAD
    if size <= chunk:
        return b"".join((head, frame_head(FRAME_BODY, channel, size), body, b"\xce"))
    parts = [head]
    for start in range(0, size, chunk):
        piece = body[start : start + chunk]
        parts += (frame_head(FRAME_BODY, channel, len(piece)), piece, b"\xce")
    return b"".join(parts)


def deliver_frames(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    address: bytes,
    header_payload: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """Basic.Deliver + content header + body. ``consumer_tag`` is already a shortstr."""
    size = len(body)
    if 0 < size <= frame_max - FRAME_OVERHEAD:
        # The usual delivery, a body in one frame: all before the body written into one
        # buffer, the body copied once after it (docs/performance.md, "Writing frames").
        # 13 = method index, delivery tag, redelivered.
        out = BytesWriter()
        put_head(out, FRAME_METHOD, channel, 13 + len(consumer_tag) + len(address))
        out.write(_DELIVER_PREFIX)
        out.write(consumer_tag)
        put_u64(out, delivery_tag)
        out.append(1 if redelivered else 0)
        out.write(address)
        out.append(FRAME_END)
        put_head(out, FRAME_HEADER, channel, len(header_payload))
        out.write(header_payload)
        out.append(FRAME_END)
        put_head(out, FRAME_BODY, channel, size)
        return b"%b%b\xce" % (out.getvalue(), body)
    payload = b"".join(
        (
            _DELIVER_PREFIX,
            consumer_tag,
            _deliver_tail.pack(delivery_tag, redelivered),
            address,
        )
    )
    return _method_with_content(channel, payload, header_payload, body, frame_max)


def _method_with_content(
    channel: int, payload: bytes, header_payload: bytes, body: bytes, frame_max: int
) -> bytes:
    """A method frame carrying ``payload``, then its content header and body frames."""
    return (
        frame_head(FRAME_METHOD, channel, len(payload))
        + payload
        + b"\xce"
        + content_frames(channel, header_payload, body, frame_max)
    )


def get_ok_frames(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    address: bytes,
    message_count: int,
    header_payload: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    payload = b"".join(
        (
            _GET_OK_PREFIX,
            _deliver_tail.pack(delivery_tag, redelivered),
            address,
            struct.pack(">I", message_count),
        )
    )
    return _method_with_content(channel, payload, header_payload, body, frame_max)


def return_frames(
    channel: int,
    reply_code: int,
    reply_text: str,
    address: bytes,
    header_payload: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    payload = b"".join((_RETURN_PREFIX, _short.pack(reply_code), shortstr(reply_text), address))
    return _method_with_content(channel, payload, header_payload, body, frame_max)


def headers_header(body_size: int, headers: dict[str, Any]) -> bytes:
    """A content header payload whose only property is ``headers`` (what pamqp's
    ``ContentHeader(0, body_size, Basic.Properties(headers=...)).marshal()`` gives)."""
    return (
        _content_head.pack(commands.Basic.frame_id, 0, body_size)
        + _short.pack(_HEADERS_FLAG)
        + field_table(headers)
    )


def deliver_tag(payload: bytes) -> int:
    """A Basic.Deliver payload's delivery tag (after its index and consumer tag); a
    FRAME_ERROR if the payload is too short to hold one."""
    at = 5 + payload[4] if len(payload) > 4 else len(payload)
    if len(payload) < at + 9:
        raise exceptions.AMQPFrameError("FRAME_ERROR - Basic.Deliver too short")
    tag: int = _deliver_tail.unpack_from(payload, at)[0]
    return tag


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    out = BytesWriter()
    put_head(out, FRAME_METHOD, channel, 13)
    out.write(_ACK_PREFIX)
    put_u64(out, delivery_tag)
    out.append(1 if multiple else 0)
    out.append(FRAME_END)
    return out.getvalue()


def nack_frame(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    payload = _NACK_PREFIX + _deliver_tail.pack(delivery_tag, multiple | requeue << 1)
    return frame_head(FRAME_METHOD, channel, 13) + payload + b"\xce"


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """Basic.Ack from a client: (delivery_tag, multiple)."""
    if len(payload) != 13:
        raise exceptions.AMQPSyntaxError("SYNTAX_ERROR - Basic.Ack has the wrong length")
    return u64_at(payload, 4), bool(payload[12] & 1)


ACK_INDEX: Final = commands.Basic.Ack.index


# -- field tables ---------------------------------------------------------------------
#
# pamqp encodes every float as a single-precision 'f', so a double a publisher sent in a
# header would come back rounded (or not encodable at all) when a message's headers are
# rewritten. This encoder keeps each value's width: floats are doubles, a longstr that is
# not UTF-8 stays a longstr, a byte array stays a byte array, a timestamp a timestamp.

_long: Final = struct.Struct(">I")
_signed_long: Final = struct.Struct(">i")
_signed_long_long: Final = struct.Struct(">q")
_double: Final = struct.Struct(">d")


def field_table(table: dict[str, Any]) -> bytes:
    """A field table (with its length prefix) as RabbitMQ writes one."""
    data = b"".join(shortstr(key) + _field_value(value) for key, value in table.items())
    return _long.pack(len(data)) + data


def decode_field_table(data: bytes) -> dict[str, Any]:
    """The fields of a table written by ``field_table``; ValueError if it does not decode."""
    end, table = _table(data, 0, 0, _Entries(_UNCOUNTED))
    if end != len(data):
        raise ValueError("bytes left after the field table")
    return table


def _field_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + _signed_long.pack(value)
        return b"l" + _signed_long_long.pack(value)
    if isinstance(value, float):
        return b"d" + _double.pack(value)
    if isinstance(value, str):
        encoded = value.encode()
        return b"S" + _long.pack(len(encoded)) + encoded
    if isinstance(value, bytes):
        return b"S" + _long.pack(len(value)) + value
    if isinstance(value, bytearray):
        return b"x" + _long.pack(len(value)) + bytes(value)
    if isinstance(value, datetime.datetime):
        return b"T" + _long_long.pack(int(value.timestamp()))
    if isinstance(value, time.struct_time):
        return b"T" + _long_long.pack(calendar.timegm(value))
    if isinstance(value, decimal.Decimal):
        return b"D" + pamqp_encode.decimal(value)
    if isinstance(value, dict):
        return b"F" + field_table(value)
    if isinstance(value, list | tuple):
        data = b"".join(_field_value(item) for item in value)
        return b"A" + _long.pack(len(data)) + data
    if value is None:
        return b"V"
    raise TypeError(f"no AMQP field type for {type(value).__name__} ({value!r})")


_HEADERS_FLAG: Final = commands.Basic.Properties.flags["headers"]
_SHORTSTR_FLAGS_BEFORE_HEADERS: Final = (
    commands.Basic.Properties.flags["content_type"],
    commands.Basic.Properties.flags["content_encoding"],
)


def with_headers(header_payload: bytes, headers: dict[str, Any]) -> bytes:
    """A content header payload that has no headers property, given ``headers``."""
    (flags,) = _short.unpack_from(header_payload, 12)
    if flags & _HEADERS_FLAG:
        raise ValueError("the content header has a headers property already")
    if not headers:
        return header_payload
    at = 14
    for flag in _SHORTSTR_FLAGS_BEFORE_HEADERS:
        if flags & flag:
            at += 1 + header_payload[at]
    return (
        header_payload[:12]
        + _short.pack(flags | _HEADERS_FLAG)
        + header_payload[14:at]
        + field_table(headers)
        + header_payload[at:]
    )


def headers_of(header_payload: bytes) -> dict[str, Any]:
    """A content header's headers property alone ({} without one), read without decoding
    the other properties (what deduplication asks of every message); a 502 as
    ``decode_properties`` when it does not decode."""
    (flags,) = _short.unpack_from(header_payload, 12)
    if not flags & _HEADERS_FLAG:
        return {}
    try:
        at = 14
        for flag in _SHORTSTR_FLAGS_BEFORE_HEADERS:
            if flags & flag:
                at += 1 + header_payload[at]
        _, table = _table(header_payload, at, 0, _Entries(_UNCOUNTED))
    except Exception as error:  # struct.error, IndexError, ValueError...
        raise exceptions.AMQPSyntaxError(
            f"SYNTAX_ERROR - cannot decode message properties: {error}"
        ) from error
    return table


def json_answer(correlation_id: str | None, answer: dict[str, Any]) -> tuple[bytes, bytes]:
    """The content header and body of a control plane's JSON answer (the console's, the
    federation upstream's), to be delivered to the asker's reply address."""
    body = json.dumps(answer, default=str).encode()
    header = ContentHeader(
        body_size=len(body),
        properties=commands.Basic.Properties(
            content_type="application/json", correlation_id=correlation_id
        ),
    ).marshal()
    return header, body
