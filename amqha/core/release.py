"""Big drops freed a slice at a time (docs/limits.md, "Big drops").

Owns: the containers of messages a queue has let go of all at once (a purge, a delete, a
PASSIVE applying either) and frees a slice of them per call. Freeing a million messages
takes about 0.2 s of the interpreter: in one callback that is a loop stalled past a
pair's failover timeout on a busy machine. A container of up to ``AT_ONCE`` items is
freed at once, as any other; a bigger one is handed here, and ``some`` frees ``SLICE``
items a call. The server calls ``some`` once a turn of its loop while any remain
(``set_waker``); with no waker (tools, tests without a server) a container is freed at
once.

Must not know: the loop, queues' insides (a container is a deque, a list or a dict).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

AT_ONCE = 20_000  # items: a container up to this size is freed at once
SLICE = 20_000  # items freed by one call of ``some`` (4 ms alone, 16 ms in a busy server)

_held: deque[Any] = deque()
_wake: Callable[[], None] | None = None


def set_waker(wake: Callable[[], None] | None) -> None:
    """``wake()`` is called when the first container is handed over after none was held:
    it must have ``some`` called, and again while it returns True. None (a server that
    stops): what is still held is freed now."""
    global _wake
    _wake = wake
    if wake is None:
        while _held:
            _held.popleft().clear()


def later(container: Any) -> None:
    """Free ``container``'s items (a deque, a list or a dict the caller no longer uses):
    a slice a call of ``some`` if it is big and a waker is set, else now."""
    if _wake is None or len(container) <= AT_ONCE:
        container.clear()
        return
    first = not _held
    _held.append(container)
    if first:
        _wake()


def some(count: int = SLICE) -> bool:
    """Free up to ``count`` items of the held containers; whether any remain."""
    while count > 0 and _held:
        container = _held[0]
        if isinstance(container, deque):
            drop: Callable[[], Any] = container.popleft
        elif isinstance(container, dict):
            drop = container.popitem
        else:
            drop = container.pop
        for _ in range(min(count, len(container))):
            drop()
            count -= 1
        if not container:
            _held.popleft()
    return bool(_held)


def pending() -> int:
    """Items still held (status, tests)."""
    return sum(len(container) for container in _held)
