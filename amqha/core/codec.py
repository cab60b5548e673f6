"""The change stream on the wire: a run of changes as bytes, and back.

Owns: the byte layout the ACTIVE uses to push its changes to the PASSIVE (one AMQP
message carries a run of consecutive changes and the LSN of the first). Every field is
length-prefixed or fixed-size; names are AMQP short strings; arguments are AMQP field
tables. Decoding checks every length and raises ``ValueError`` on anything that does not
parse to the end, or that this server could not apply (an exchange of an unknown type,
a control exchange): a malformed run is refused whole. See docs/durability.md.

Must not know: sockets, the store, the loop.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final, cast

from librt.strings import BytesWriter, write_i64_be

from ..wire import decode_field_table, field_table, i64_at, put_u32, u32_at
from .changes import (
    Batch,
    Bound,
    Change,
    DedupSeen,
    Delivered,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    PermissionDeleted,
    PermissionSet,
    PolicyDeleted,
    PolicySet,
    QueueDeclared,
    QueueDeleted,
    Redelivered,
    Reset,
    Settled,
    Unbound,
    UserDeleted,
    UserSet,
    VhostDeleted,
    VhostSet,
)
from .policies import check as check_policy
from .reserved import CONTROL_EXCHANGES
from .routing import EXCHANGE_TYPES

VERSION = 1
_HEAD = struct.Struct(">BQI")
_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_ENQUEUED_TAIL = struct.Struct(">dB")

_KIND = {
    Enqueued: 1,
    Delivered: 2,
    Settled: 3,
    ExchangeDeclared: 4,
    ExchangeDeleted: 5,
    QueueDeclared: 6,
    QueueDeleted: 7,
    Bound: 8,
    Unbound: 9,
    Batch: 10,
    Reset: 11,
    Redelivered: 12,
    DedupSeen: 13,
    UserSet: 14,
    UserDeleted: 15,
    VhostSet: 16,
    VhostDeleted: 17,
    PermissionSet: 18,
    PermissionDeleted: 19,
    PolicySet: 20,
    PolicyDeleted: 21,
}
# The access changes whose fields are names alone, in order.
_NAMES_ONLY = (UserDeleted, VhostSet, VhostDeleted, PermissionSet, PermissionDeleted)


def _name(text: str) -> bytes:
    data = text.encode()
    if len(data) > 255:
        raise ValueError(f"name longer than 255 bytes: {text[:40]!r}...")
    return _U8.pack(len(data)) + data


def _encode_head(change: Any) -> list[bytes]:
    """A Delivered's or a Settled's kind byte and names: what changes of one queue share."""
    head = [_U8.pack(_KIND[type(change)]), _name(change.vhost), _name(change.queue)]
    if type(change) is Settled:
        head.append(_name(change.reason))
    return head


def _blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _encode(change: Change, out: list[bytes]) -> None:
    kind = type(change)
    out.append(_U8.pack(_KIND[kind]))
    if kind is Enqueued:
        c: Any = change
        deadline = math.nan if c.deadline is None else c.deadline
        out += (
            _name(c.vhost),
            _name(c.queue),
            _I64.pack(c.msg_id),
            _blob(c.address),
            _blob(c.header),
            _blob(c.body),
            _F64.pack(deadline),
            _U8.pack(c.persistent),
        )
    elif kind is Delivered:
        c = change
        out += (_name(c.vhost), _name(c.queue), _I64.pack(c.msg_id))
    elif kind is Redelivered:
        c = change
        out += (_name(c.vhost), _name(c.queue), _I64.pack(c.msg_id), _U32.pack(c.deliveries))
    elif kind is Settled:
        c = change
        ids = c.msg_ids
        out += (
            _name(c.vhost),
            _name(c.queue),
            _name(c.reason),
            _U32.pack(len(ids)),
            struct.pack(f">{len(ids)}q", *ids),
        )
    elif kind is ExchangeDeclared:
        c = change
        out += (
            _name(c.vhost),
            _name(c.name),
            _name(c.kind),
            _U8.pack(c.auto_delete),
            _U8.pack(c.internal),
            field_table(c.arguments),
        )
    elif kind is QueueDeclared:
        c = change
        out += (_name(c.vhost), _name(c.name), _U8.pack(c.auto_delete), field_table(c.arguments))
    elif kind in (ExchangeDeleted, QueueDeleted):
        c = change
        out += (_name(c.vhost), _name(c.name))
    elif kind in (Bound, Unbound):
        c = change
        out += (
            _name(c.vhost),
            _name(c.source),
            _name(c.destination),
            _U8.pack(c.to_exchange),
            _name(c.routing_key),
            field_table(c.arguments),
        )
    elif kind is DedupSeen:
        c = change
        expires = math.nan if c.expires is None else c.expires
        out += (
            _name(c.vhost),
            _name(c.kind),
            _name(c.owner),
            _blob(c.key),
            _F64.pack(expires),
            _I64.pack(c.seq),
            _U32.pack(c.keep),
            _U8.pack(c.persistent),
        )
    elif kind is UserSet:
        c = change
        out += (_name(c.name), _blob(c.password_hash.encode()), _U8.pack(len(c.tags)))
        out += [_name(tag) for tag in c.tags]
    elif kind is PolicySet:
        c = change
        out += (_name(c.vhost), _name(c.name), _blob(c.pattern.encode()), _name(c.apply_to))
        out += (_I64.pack(c.priority), field_table(c.definition), _U8.pack(c.operator))
    elif kind is PolicyDeleted:
        c = change
        out += (_name(c.vhost), _name(c.name), _U8.pack(c.operator))
    elif kind in _NAMES_ONLY:
        out += [_name(field) for field in change]  # type: ignore[arg-type]
    elif kind is Batch:
        c = change
        out.append(_U32.pack(len(c.changes)))
        for inner in c.changes:
            _encode(inner, out)
    elif kind is Reset:
        pass
    else:
        raise ValueError(f"not a change: {change!r}")


_ENQUEUED_KIND = bytes([_KIND[Enqueued]])


def encode(first_lsn: int, changes: list[Change]) -> bytes:
    """A run of consecutive changes, the first with LSN ``first_lsn``. Written into one
    ``BytesWriter`` (docs/performance.md, "Writing frames"): its integer writes and
    copies are C calls, where each ``Struct.pack`` was a call with its arguments
    parsed and each piece an item of a list to join."""
    out = BytesWriter()
    out.write(_HEAD.pack(VERSION, first_lsn, len(changes)))
    prefixes: dict[tuple[str, str], bytes] = {}  # kind + vhost + queue, once per queue
    # What the message before had: its names and prefix, its address and header with the
    # header's size between them (most messages of a run share them), no deadline.
    vhost = queue = None
    prefix = middle = b""
    address: bytes | None = None  # None: no message yet (b"" is an address)
    header: bytes | None = None
    no_deadline = (_ENQUEUED_TAIL.pack(math.nan, False), _ENQUEUED_TAIL.pack(math.nan, True))
    # A delivery's or an ack's kind and names, once per (kind, vhost, queue[, reason]).
    settles: dict[tuple[Any, ...], bytes] = {}
    for change in changes:
        kind = type(change)
        if kind is not Enqueued:
            if kind is Delivered or kind is Settled:
                # The next hottest kinds (a consumer's every delivery and ack), the same
                # bytes as _encode writes: their names encoded once per run.
                d: Any = change
                key = (kind, d.vhost, d.queue) if kind is Delivered else (kind, *d[:2], d[3])
                head = settles.get(key)
                if head is None:
                    head = settles[key] = b"".join(_encode_head(d))
                out.write(head)
                if kind is Delivered:
                    write_i64_be(out, d[2])
                else:
                    ids: tuple[int, ...] = d[2]
                    put_u32(out, len(ids))
                    for msg_id in ids:
                        write_i64_be(out, msg_id)
                continue
            parts: list[bytes] = []
            _encode(change, parts)
            for part in parts:
                out.write(part)
            continue
        # The hot kind, the same bytes as _encode writes, with fewer calls. Unpacked as
        # the tuple it is: the compiled code reads its items in place, where attribute
        # reads look each field up by name.
        c_vhost, c_queue, msg_id, this_address, this_header, body, deadline, persistent = cast(
            Enqueued, change
        )
        if c_queue is not queue or c_vhost is not vhost:
            vhost, queue = key = c_vhost, c_queue
            known = prefixes.get(key)
            if known is None:
                known = prefixes[key] = _ENQUEUED_KIND + _name(c_vhost) + _name(c_queue)
            prefix = known
        if this_address != address or this_header != header:
            address, header = this_address, this_header
            middle = this_address + _U32.pack(len(this_header)) + this_header
        out.write(prefix)
        write_i64_be(out, msg_id)
        put_u32(out, len(this_address))
        out.write(middle)
        put_u32(out, len(body))
        out.write(body)
        out.write(
            no_deadline[persistent]
            if deadline is None
            else _ENQUEUED_TAIL.pack(deadline, persistent)
        )
    return out.getvalue()


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        at = self.at
        end = at + size
        if size < 0 or end > len(self.data):
            raise ValueError("truncated change run")
        self.at = end
        return self.data[at:end]

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return int(_U32.unpack(self.take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def name(self) -> str:
        return self.take(self.u8()).decode()

    def blob(self) -> bytes:
        return self.take(self.u32())

    def flag(self) -> bool:
        value = self.u8()
        if value > 1:
            raise ValueError(f"bad flag {value}")
        return bool(value)

    def table(self) -> dict[str, Any]:
        size = self.u32()
        return decode_field_table(_U32.pack(size) + self.take(size))


def _decode(reader: _Reader, depth: int) -> Change:
    kind = reader.u8()
    if kind == 1:  # inside a Batch
        one: list[Change] = []
        reader.at, _ = _decode_messages(reader.data, reader.at - 1, one, {}, 1)
        return one[0]
    if kind == 2:
        return Delivered(reader.name(), reader.name(), reader.i64())
    if kind == 3:
        vhost, queue, reason = reader.name(), reader.name(), reader.name()
        count = reader.u32()
        ids = struct.unpack(f">{count}q", reader.take(8 * count))
        return Settled(vhost, queue, ids, reason)
    if kind == 4:
        declared = ExchangeDeclared(
            reader.name(),
            reader.name(),
            reader.name(),
            reader.flag(),
            reader.flag(),
            reader.table(),
        )
        # A value this server cannot apply is refused with the run, never stored: an
        # unknown type would stop every restart.
        if declared.kind not in EXCHANGE_TYPES:
            raise ValueError(f"exchange {declared.name!r} of unknown type {declared.kind!r}")
        if declared.name in CONTROL_EXCHANGES or not declared.name:
            raise ValueError(f"exchange {declared.name!r} cannot be declared")
        return declared
    if kind == 5:
        return ExchangeDeleted(reader.name(), reader.name())
    if kind == 6:
        return QueueDeclared(reader.name(), reader.name(), reader.flag(), reader.table())
    if kind == 7:
        return QueueDeleted(reader.name(), reader.name())
    if kind in (8, 9):
        fields = (
            reader.name(),
            reader.name(),
            reader.name(),
            reader.flag(),
            reader.name(),
            reader.table(),
        )
        return Bound(*fields) if kind == 8 else Unbound(*fields)
    if kind == 10:
        if depth > 0:
            raise ValueError("a batch inside a batch")
        return Batch(tuple(_decode(reader, depth + 1) for _ in range(reader.u32())))
    if kind == 11:
        return Reset()
    if kind == 12:
        return Redelivered(reader.name(), reader.name(), reader.i64(), reader.u32())
    if kind == 13:
        vhost, owner_kind, owner = reader.name(), reader.name(), reader.name()
        key = reader.blob()
        (expires,) = _F64.unpack(reader.take(8))
        seq, keep, persistent = reader.i64(), reader.u32(), reader.flag()
        if owner_kind not in ("x", "q"):
            raise ValueError(f"a deduplication key of an unknown owner kind {owner_kind!r}")
        return DedupSeen(
            vhost,
            owner_kind,
            owner,
            key,
            None if math.isnan(expires) else expires,
            seq,
            keep,
            persistent,
        )
    if kind == 14:
        name, password_hash = reader.name(), reader.blob().decode()
        tags = tuple(reader.name() for _ in range(reader.u8()))
        if "peering" in tags:  # the pair's own login is never made at run time
            raise ValueError(f"user {name!r} with the tag 'peering' cannot be made")
        return UserSet(name, password_hash, tags)
    if kind == 15:
        return UserDeleted(reader.name())
    if kind in (16, 17):
        return (VhostSet if kind == 16 else VhostDeleted)(reader.name())
    if kind in (18, 19):
        return (PermissionSet if kind == 18 else PermissionDeleted)(reader.name(), reader.name())
    if kind == 20:
        policy = PolicySet(
            reader.name(),
            reader.name(),
            reader.blob().decode(),
            reader.name(),
            reader.i64(),
            reader.table(),
            reader.flag(),
        )
        # A value this server cannot apply is refused with the run (core.policies).
        check_policy(policy)
        return policy
    if kind == 21:
        return PolicyDeleted(reader.name(), reader.name(), reader.flag())
    raise ValueError(f"unknown change kind {kind}")


def _decode_messages(
    data: bytes, at: int, out: list[Change], queues: dict[bytes, tuple[str, str]], limit: int
) -> tuple[int, int]:
    """Read up to ``limit`` consecutive Enqueued changes from ``at`` (a kind byte) into
    ``out``; (the offset after them, how many).

    The hot kind, read in one loop with local offsets. ``queues`` keeps the names of each
    queue's prefix (kind, vhost, queue) already seen in this run: decoded once. A message
    whose prefix, address or header has the same bytes as the one before it shares that
    one's object (the messages of a run mostly go to one queue, from one publisher, with
    the same properties). Compared as slices: ``bytes.startswith`` at an offset parses its
    arguments at each call, which cost more than the slice (100 messages: 70 against 40
    µs), and integers are read in place (``wire.u32_at``, ``wire.i64_at``), not through
    ``struct``."""
    tail = _ENQUEUED_TAIL.unpack_from
    new, enqueued = _new, Enqueued  # module names, each read once
    prefix = address = header = b""
    vhost = queue = ""
    done = 0
    while done < limit and data[at] == 1:
        end = at + 2 + data[at + 1]
        end += 1 + data[end]
        if end - at != len(prefix) or data[at:end] != prefix:
            prefix = data[at:end]
            names = queues.get(prefix)
            if names is None:
                vhost_end = at + 2 + data[at + 1]
                names = queues[prefix] = (
                    data[at + 2 : vhost_end].decode(),
                    data[vhost_end + 1 : end].decode(),
                )
            vhost, queue = names
        msg_id = i64_at(data, end)
        size = u32_at(data, end + 8)
        end += 12
        at = end + size
        if size != len(address) or data[end:at] != address:
            address = data[end:at]  # cut short by the run's end: the reads below fail
        size = u32_at(data, at)
        at += 4
        if size != len(header) or data[at : at + size] != header:
            header = data[at : at + size]
        at += size
        size = u32_at(data, at)
        at += 4
        body = data[at : at + size]
        at += size
        if data[at : at + 8] == _NO_DEADLINE:  # the usual case: no float to make
            deadline, persistent = math.nan, data[at + 8]
        else:
            deadline, persistent = tail(data, at)
        at += 9
        if len(body) != size or persistent > 1:
            raise ValueError("truncated or bad Enqueued")
        out.append(
            new(
                enqueued,
                (
                    vhost,
                    queue,
                    msg_id,
                    address,
                    header,
                    body,
                    None if deadline != deadline else deadline,  # NaN: no deadline
                    persistent == 1,
                ),
            )
        )
        done += 1
    return at, done


_new: Final = tuple.__new__  # the fields in order, without NamedTuple's keyword handling
# What ``encode`` writes for a message without a deadline.
_NO_DEADLINE: Final = struct.pack(">d", math.nan)


def _head(data: bytes) -> tuple[int, int]:
    if len(data) < _HEAD.size:
        raise ValueError("truncated change run")
    version, first, count = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"change run version {version}, this server reads {VERSION}")
    return first, count


def _head_names(head: bytes) -> tuple[str, ...]:
    """The names in a Delivered's or a Settled's head (kind byte, then length-prefixed)."""
    names = []
    at = 1
    while at < len(head):
        end = at + 1 + head[at]
        names.append(head[at + 1 : end].decode())
        at = end
    return tuple(names)


def decode(data: bytes) -> tuple[int, list[Change]]:
    """(LSN of the first change, the changes); ValueError if ``data`` is not a whole run."""
    first, count = _head(data)
    reader = _Reader(data)
    at = _HEAD.size
    changes: list[Change] = []
    queues: dict[bytes, tuple[str, str]] = {}
    remaining = count
    heads: dict[bytes, tuple[str, ...]] = {}  # a Delivered's or a Settled's, by its bytes
    append = changes.append
    try:
        while remaining:
            kind = data[at]
            if kind == 1:
                at, done = _decode_messages(data, at, changes, queues, remaining)
                remaining -= done
            elif kind == 2 or kind == 3:
                # A delivery or an ack: the names decoded once per run (_encode_head).
                end = at + 2 + data[at + 1]
                end += 1 + data[end]
                if kind == 3:
                    end += 1 + data[end]
                head = data[at:end]
                names = heads.get(head)
                if names is None:
                    names = heads[head] = _head_names(head)
                if kind == 2:
                    (msg_id,) = _I64.unpack_from(data, end)
                    at = end + 8
                    append(_new(Delivered, (*names, msg_id)))
                else:
                    (count,) = _U32.unpack_from(data, end)
                    end += 4
                    ids = (
                        _I64.unpack_from(data, end)  # one ack: a 1-tuple as it is
                        if count == 1
                        else struct.unpack_from(f">{count}q", data, end)
                    )
                    at = end + 8 * count
                    append(_new(Settled, (names[0], names[1], ids, names[2])))
                remaining -= 1
            else:
                reader.at = at
                changes.append(_decode(reader, 0))
                at = reader.at
                remaining -= 1
    except (IndexError, struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"malformed change run: {error}") from None
    if at != len(data):
        raise ValueError("bytes left after the change run")
    return first, changes
