"""Message deduplication: which published messages an exchange or a queue drops as copies.

Owns: the arguments that ask for it (the interface of RabbitMQ's community plugin
rabbitmq-message-deduplication, and amqha's ``x-deduplication-by: message-id``) and their
checks, a message's key, and the two memories a key is looked up in:

- ``SeenCache``: the keys seen recently, at most ``x-cache-size`` of them (the oldest goes
  first), each for ``x-cache-ttl`` ms (or the message's own ``x-cache-ttl`` header) or
  until evicted. An ``x-message-deduplication`` exchange has one; so has a queue declared
  with ``x-deduplication-by: message-id`` (its keys outlive the messages).
- ``InQueue``: the keys of the messages a queue declared with ``x-message-deduplication:
  true`` still holds (ready or delivered and not settled). It is rebuilt from the queue's
  messages wherever they are put back (a restart, a PASSIVE following its ACTIVE), so
  it needs no change of its own in the stream.

A key a cache takes is a change of state (``changes.DedupSeen``): it goes to the store and
the PASSIVE with the message, so a copy sent again after a failover meets the same cache
on the new ACTIVE (docs/compat.md, "Message deduplication"; docs/durability.md).

Must not know: the vhost, the store, the loop, the clock (``now`` is passed in).
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from typing import Any, ClassVar

from pamqp import exceptions

from ..wire import headers_of
from .changes import ChangeLog, DedupSeen

EXCHANGE_TYPE = "x-message-deduplication"
QUEUE_FLAG = "x-message-deduplication"
BY = "x-deduplication-by"
CACHE_SIZE = "x-cache-size"
CACHE_TTL = "x-cache-ttl"
PERSISTENCE = "x-cache-persistence"
HEADER = "x-deduplication-header"
TTL_HEADER = "x-cache-ttl"
_HEADER_BYTES = HEADER.encode()
_TTL_BYTES = TTL_HEADER.encode()
BY_HEADER, BY_MESSAGE_ID = "header", "message-id"
PERSISTENCE_MODES = ("memory", "disk")
EXCHANGE_ARGUMENTS = (CACHE_SIZE, CACHE_TTL, PERSISTENCE)
QUEUE_ARGUMENTS = (QUEUE_FLAG, BY, CACHE_SIZE, CACHE_TTL, PERSISTENCE)
# What one remembered key costs beyond its bytes: the dict slot, the key and value
# objects (counted against the memory watermark as ``DedupBytes.held``).
ENTRY_OVERHEAD = 160
# The longest key kept as it is: a longer one is kept as its SHA-256.
MAX_KEY = 1024

EXCHANGE, QUEUE = "x", "q"  # what owns a cache, in a ``DedupSeen``


class DedupBytes:
    """Bytes held by every deduplication memory of this process."""

    held: ClassVar[int] = 0


def _held(key: bytes, sign: int) -> int:
    """What remembering (``sign`` 1) or forgetting (-1) ``key`` changes in the count."""
    cost = sign * (len(key) + ENTRY_OVERHEAD)
    DedupBytes.held += cost
    return cost


class DedupArgumentError(exceptions.AMQPPreconditionFailed):
    pass


def _refused(owner: str, key: str, value: Any, need: str) -> DedupArgumentError:
    return DedupArgumentError(
        f"PRECONDITION_FAILED - invalid arg '{key}' for {owner}: {value!r} ({need})"
    )


def _number(arguments: dict[str, Any], key: str, owner: str, minimum: int) -> int | None:
    """An integer argument; the plugin takes a numeric string too (``"10"``)."""
    if key not in arguments:
        return None
    value = arguments[key]
    if isinstance(value, (bytes, str)):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        value = int(text) if text.strip().isdigit() else value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _refused(owner, key, arguments[key], f"need an integer >= {minimum}")
    return value


def _text(arguments: dict[str, Any], key: str, owner: str, allowed: tuple[str, ...]) -> str | None:
    if key not in arguments:
        return None
    value = arguments[key]
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if value not in allowed:
        raise _refused(owner, key, arguments[key], "one of " + ", ".join(allowed))
    return str(value)


class Settings:
    """What a declare's arguments ask: the key (``by``), the cache (``size``, ``ttl`` in
    seconds or None), and whether its keys go to the store (``persistent``)."""

    __slots__ = ("by", "size", "ttl", "persistent")

    def __init__(self, by: str, size: int | None, ttl: float | None, persistent: bool) -> None:
        self.by, self.size, self.ttl, self.persistent = by, size, ttl, persistent


def exchange_settings(name: str, arguments: dict[str, Any]) -> Settings:
    """The cache of an ``x-message-deduplication`` exchange; a wrong argument is a 406
    naming it (``x-cache-size`` is required, as in the plugin)."""
    owner = f"exchange '{name}'"
    size = _number(arguments, CACHE_SIZE, owner, 1)
    if size is None:
        raise DedupArgumentError(
            f"PRECONDITION_FAILED - exchange '{name}' of type '{EXCHANGE_TYPE}' needs "
            f"the argument '{CACHE_SIZE}' (an integer >= 1)"
        )
    ttl = _number(arguments, CACHE_TTL, owner, 1)
    persistence = _text(arguments, PERSISTENCE, owner, PERSISTENCE_MODES) or "memory"
    return Settings(BY_HEADER, size, None if ttl is None else ttl / 1000.0, persistence == "disk")


def queue_settings(name: str, arguments: dict[str, Any], durable: bool) -> Settings | None:
    """What a queue's arguments ask (None: no deduplication). ``x-message-deduplication:
    true`` alone: the plugin's, by header while the first copy is in the queue.
    ``x-deduplication-by: message-id``: by the message_id property, with a cache of
    ``x-cache-size`` keys (required) for ``x-cache-ttl`` ms; kept on disk for a durable
    queue (or asked with ``x-cache-persistence: disk``)."""
    owner = f"queue '{name}'"
    flag = arguments.get(QUEUE_FLAG)
    if flag is not None and not isinstance(flag, bool):
        raise _refused(owner, QUEUE_FLAG, flag, "need true or false")
    by = _text(arguments, BY, owner, (BY_HEADER, BY_MESSAGE_ID))
    if flag is False and by is not None:
        raise _refused(owner, BY, by, f"contradicts '{QUEUE_FLAG}: false'")
    if by != BY_MESSAGE_ID:
        for key in (CACHE_SIZE, CACHE_TTL, PERSISTENCE):
            if key in arguments:
                raise _refused(owner, key, arguments[key], f"a cache needs '{BY}: {BY_MESSAGE_ID}'")
        return Settings(BY_HEADER, None, None, False) if flag or by else None
    size = _number(arguments, CACHE_SIZE, owner, 1)
    if size is None:
        raise DedupArgumentError(
            f"PRECONDITION_FAILED - queue '{name}': '{BY}: {BY_MESSAGE_ID}' needs the "
            f"argument '{CACHE_SIZE}' (an integer >= 1)"
        )
    ttl = _number(arguments, CACHE_TTL, owner, 1)
    persistence = _text(arguments, PERSISTENCE, owner, PERSISTENCE_MODES)
    persistent = persistence == "disk" or (durable and persistence is None)
    return Settings(BY_MESSAGE_ID, size, None if ttl is None else ttl / 1000.0, persistent)


def _key_of(value: Any) -> bytes:
    """A header value as a key: its type and its value, so 42 and "42" differ."""
    if value is None:
        return b"n"
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return b"s" + value
    if isinstance(value, bool):
        return b"b1" if value else b"b0"
    if isinstance(value, int):
        return b"i" + str(value).encode()
    if isinstance(value, float):
        return b"f" + repr(value).encode()
    return b"r" + repr(value).encode("utf-8", "surrogateescape")


def message_key(message: Any, by: str) -> bytes | None:
    """The key of ``message`` (None: it has none and is not checked)."""
    if by == BY_MESSAGE_ID:
        value = message.properties().message_id
        if value is None:
            return None
        key = _key_of(value)
    else:
        header = message.header
        if _HEADER_BYTES not in header:  # the common case of a message without it: no decode
            return None
        headers = headers_of(header) if message.decoded is None else message.headers()
        if HEADER not in headers:
            return None
        key = _key_of(headers[HEADER])
    if len(key) > MAX_KEY:
        return b"h" + hashlib.sha256(key).digest()
    return key


def message_ttl(message: Any, default: float | None) -> float | None:
    """The cache TTL for this message in seconds: its ``x-cache-ttl`` header (ms) when it
    is a non-negative integer, else the cache's."""
    if _TTL_BYTES not in message.header:
        return default
    headers = message.headers()
    value = headers.get(TTL_HEADER) if headers else None
    if isinstance(value, (bytes, str)):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        value = int(text) if text.isdigit() else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value / 1000.0
    return default


class Counters:
    """What the metrics read of one memory."""

    __slots__ = ("hits", "evictions")

    def __init__(self) -> None:
        self.hits = 0
        self.evictions = 0


class SeenCache:
    """The keys seen recently: at most ``size``, the oldest taken evicted first, each until
    its expiry (wall-clock seconds, None: until evicted). ``seq`` numbers every key taken;
    as a key is evicted only by newer ones (an expired key stays until then, or until it
    is taken again), the keys held are always among the last ``size`` taken: the store
    keeps an owner's keys by that rule."""

    __slots__ = ("settings", "entries", "seq", "counters", "bytes")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.entries: OrderedDict[bytes, tuple[float | None, int]] = OrderedDict()
        self.seq = 0
        self.counters = Counters()
        self.bytes = 0

    def __del__(self) -> None:
        DedupBytes.held -= self.bytes

    def __len__(self) -> int:
        return len(self.entries)

    def seen(self, key: bytes, now: float) -> bool:
        """Whether ``key`` was seen and has not expired (a hit is counted)."""
        entry = self.entries.get(key)
        if entry is None or (entry[0] is not None and entry[0] <= now):
            return False
        self.counters.hits += 1
        return True

    def take(self, key: bytes, expires: float | None, seq: int | None = None) -> None:
        """Remember ``key`` until ``expires``, as the newest, evicting the oldest past the
        size. ``seq``: the number it was given where it was first taken (the ACTIVE, the
        store); else the next."""
        entries = self.entries
        if key in entries:
            del entries[key]
        else:
            self.bytes += _held(key, 1)
        self.seq = seq if seq is not None and seq > self.seq else self.seq + 1
        entries[key] = (expires, self.seq)
        size = self.settings.size or 0
        while len(entries) > size:
            oldest, _ = entries.popitem(last=False)
            self.bytes += _held(oldest, -1)
            self.counters.evictions += 1


class InQueue:
    """The keys of the messages a queue still holds, by message id. ``queue.holds(msg_id)``
    is the queue's own answer; an entry whose message has left is found stale on a hit
    and dropped, and all stale entries go once they outnumber the queue's messages."""

    __slots__ = ("settings", "ids", "counters", "bytes")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ids: dict[bytes, int] = {}
        self.counters = Counters()
        self.bytes = 0

    def __del__(self) -> None:
        DedupBytes.held -= self.bytes

    def __len__(self) -> int:
        return len(self.ids)

    def seen(self, key: bytes, queue: Any) -> bool:
        msg_id = self.ids.get(key)
        if msg_id is None:
            return False
        if queue.holds(msg_id):
            self.counters.hits += 1
            return True
        self._forget(key)
        return False

    def take(self, key: bytes, msg_id: int, queue: Any) -> None:
        ids = self.ids
        if key not in ids:
            self.bytes += _held(key, 1)
        ids[key] = msg_id
        if len(ids) > 2 * (queue.message_count + queue.unacked) + 1024:
            for stale in [k for k, i in ids.items() if not queue.holds(i)]:
                self._forget(stale)

    def _forget(self, key: bytes) -> None:
        del self.ids[key]
        self.bytes += _held(key, -1)


def in_id_order(messages: Any, msg_id: int) -> bool:
    """Whether a sequence of messages in id order holds ``msg_id``."""
    at = bisect.bisect_left(messages, msg_id, key=msg_id_of)
    return at < len(messages) and messages[at].msg_id == msg_id


def msg_id_of(message: Any) -> int:
    return message.msg_id


def find(memory: InQueue | SeenCache, message: Any, now: float, queue: Any) -> tuple[bool, Any]:
    """Whether ``message`` is a copy of one ``memory`` holds, and its key (None: it has
    none, nothing to remember)."""
    key = message_key(message, memory.settings.by)
    if key is None:
        return False, None
    if type(memory) is InQueue:
        return memory.seen(key, queue), key
    return memory.seen(key, now), key  # type: ignore[arg-type]


def remember(
    memory: InQueue | SeenCache,
    key: bytes,
    message: Any,
    now: float,
    queue: Any,
    log: ChangeLog | None,
    where: tuple[str, str, str],
) -> None:
    """``memory`` takes the key of ``message``, which went on: a queue's index by its id;
    a cache until its TTL, told to ``log`` (``where``: vhost, owner kind, owner) so the
    store and the PASSIVE take it too, before the message's confirm."""
    if type(memory) is InQueue:
        memory.take(key, message.msg_id, queue)
        return
    cache: Any = memory
    settings = cache.settings
    ttl = message_ttl(message, settings.ttl)
    expires = None if ttl is None else now + ttl
    cache.take(key, expires)
    if log is not None:
        vhost, kind, owner = where
        log.emit(
            DedupSeen(
                vhost, kind, owner, key, expires, cache.seq, settings.size, settings.persistent
            ),
            message.is_persistent(),
        )


def restored(queue: Any, message: Any) -> None:
    """A message put back on a queue (a store, the PASSIVE): its key is in the queue again.
    A cache's keys come back as ``DedupSeen`` changes instead."""
    memory = queue.dedup
    if type(memory) is InQueue:
        key = message_key(message, memory.settings.by)
        if key is not None:
            memory.take(key, message.msg_id, queue)


def dropped(
    memory: SeenCache, message: Any, now: float, log: ChangeLog | None, where: tuple
) -> bool:
    """An exchange's check: whether ``message`` is a copy (routed nowhere); if not, its
    key is remembered."""
    copy, key = find(memory, message, now, None)
    if not copy and key is not None:
        remember(memory, key, message, now, None, log, where)
    return copy
