"""Publisher confirms of one channel, released in publish order by a watermark.

Owns: the publish sequence numbers of a channel in confirm mode, which of them wait for
the store ("safe up to LSN n", reported by the store as it writes), which were refused
(nacks), and the order confirms go out in: acks as ``multiple`` acks up to the first
publish that is not yet safe, a nack only once every publish before it is confirmed.
A nack of a later publish never acks an earlier one that is not yet safe, and a
``multiple`` ack never covers a nacked one. See docs/durability.md.

Must not know: frames, channels, the store.
"""

from __future__ import annotations

import bisect
from collections import deque

# One confirm to send: (ack? , sequence number, multiple?).
Confirm = tuple[bool, int, bool]


class Confirms:
    __slots__ = ("seq", "confirmed", "unsafe", "nacks")

    def __init__(self) -> None:
        self.seq = 0  # the last publish's sequence number
        self.confirmed = 0  # every publish up to this one has been confirmed
        # (sequence number, LSN the store must pass) of publishes not yet safe, in order.
        self.unsafe: deque[tuple[int, int]] = deque()
        # Refused publishes, to nack once every publish before them is confirmed.
        self.nacks: list[int] = []

    def publish(self) -> int:
        self.seq += 1
        return self.seq

    def refuse(self, seq: int) -> None:
        bisect.insort(self.nacks, seq)

    def wait_for(self, seq: int, lsn: int) -> None:
        """Publish ``seq`` is confirmed once the store has written up to ``lsn``."""
        self.unsafe.append((seq, lsn))

    def progress(self, safe_lsn: int) -> bool:
        """Everything up to ``safe_lsn`` is safe. True if some publish became confirmable."""
        unsafe = self.unsafe
        moved = False
        while unsafe and unsafe[0][1] <= safe_lsn:
            unsafe.popleft()
            moved = True
        return moved

    def refuse_range(self, first: int, last: int) -> bool:
        """The store could not write LSNs ``first``-``last``: the publishes that wait on
        them are nacked, at once, whatever the watermark (they will never be safe). True
        if some were."""
        unsafe = self.unsafe
        refused = [seq for seq, lsn in unsafe if first <= lsn <= last]
        if not refused:
            return False
        self.unsafe = deque((seq, lsn) for seq, lsn in unsafe if not first <= lsn <= last)
        for seq in refused:
            bisect.insort(self.nacks, seq)
        return True

    def due(self) -> list[Confirm]:
        """The confirms that may go out now, in order; they count as sent."""
        if not self.nacks and not self.unsafe:
            # The common case (transient messages, or every write done): one ack.
            upto = self.seq
            if upto <= self.confirmed:
                return []
            multiple = upto - self.confirmed > 1
            self.confirmed = upto
            return [(True, upto, multiple)]
        upto = self.unsafe[0][0] - 1 if self.unsafe else self.seq
        out: list[Confirm] = []
        nacks = self.nacks
        while nacks and nacks[0] <= upto:
            seq = nacks.pop(0)
            if seq - 1 > self.confirmed:
                out.append((True, seq - 1, seq - 1 - self.confirmed > 1))
            out.append((False, seq, False))
            self.confirmed = seq
        if upto > self.confirmed:
            out.append((True, upto, upto - self.confirmed > 1))
            self.confirmed = upto
        return out

    def drop_unsafe(self) -> None:
        """The channel closes: publishes from the first one not yet safe on stay
        unconfirmed (the publisher sees the channel close instead)."""
        if self.unsafe:
            self.seq = self.unsafe[0][0] - 1
            self.nacks = [seq for seq in self.nacks if seq <= self.seq]
            self.unsafe.clear()
