"""Publisher confirms of one channel, released in publish order by a watermark.

Owns: the publish sequence numbers of a channel in confirm mode, which of them wait for
the store ("safe up to LSN n", reported by the store as it writes), which were refused
(nacks), and the order confirms go out in: acks as ``multiple`` acks up to the first
publish that is not yet safe, a nack only once every publish before it is confirmed.
A nack of a later publish never acks an earlier one that is not yet safe, and a
``multiple`` ack never covers a nacked one. See docs/durability.md.

``Waiting`` is the confirm pipeline's book (docs/architecture.md, "The walk of a confirmed
publish"): the trackers with publishes not yet safe and the transactions' commits. Given
a new watermark (``advance``) or a range the store could not write (``refuse``), it
answers what is released, as values; the caller hands each to its owner (a connection),
which writes it. Nothing here calls anyone.

Must not know: frames, channels, connections, the store.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

# One confirm to send: (ack? , sequence number, multiple?).
Confirm = tuple[bool, int, bool]


class Confirms:
    """One channel's confirms. ``channel`` and ``owner`` say where they go: the channel's
    number and whoever writes them (its connection); this module never calls the owner."""

    __slots__ = ("seq", "confirmed", "unsafe", "nacks", "channel", "owner")

    def __init__(self, channel: int = 0, owner: Any = None) -> None:
        self.channel = channel
        self.owner = owner
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


class Commit:
    """A transaction's commit waiting for the store: Commit-Ok on ``channel`` once
    ``lsn`` is safe. ``token`` is the channel the commit came from (its number may be
    reused by then); ``owner`` writes the answer."""

    __slots__ = ("lsn", "channel", "owner", "token")

    def __init__(self, lsn: int, channel: int, owner: Any, token: object) -> None:
        self.lsn = lsn
        self.channel = channel
        self.owner = owner
        self.token = token


# What a new fact releases: trackers whose confirms are due, and commits, with whether
# they succeeded (a refused range fails them).
Released = tuple[list[Confirms], list[Commit]]


class Waiting:
    """What waits for the watermark. ``expect`` and ``expect_commit`` put it here;
    ``advance`` and ``refuse`` answer what a fact releases (see the module docstring)."""

    __slots__ = ("trackers", "commits", "safe_lsn")

    def __init__(self) -> None:
        # Trackers with publishes not yet safe (a dict: insertion order, quick removal).
        self.trackers: dict[Confirms, None] = {}
        self.commits: deque[Commit] = deque()  # in LSN order: each commit ends a batch
        self.safe_lsn = 0  # as of the last ``advance``

    def expect(self, confirms: Confirms, seq: int, lsn: int) -> bool:
        """Publish ``seq`` of ``confirms`` is confirmed once ``lsn`` is safe. False when it
        is safe already (a copy a deduplicating queue dropped, whose first is): nothing
        waits, and the caller hands the confirm out as for a transient message."""
        if lsn <= self.safe_lsn:
            return False
        if not confirms.unsafe:
            self.trackers[confirms] = None
        confirms.unsafe.append((seq, lsn))
        return True

    def expect_commit(self, commit: Commit) -> None:
        self.commits.append(commit)

    def forget(self, confirms: Confirms) -> None:
        """The channel closes: its publishes not yet safe stay unconfirmed."""
        confirms.drop_unsafe()
        self.trackers.pop(confirms, None)

    def advance(self, safe_lsn: int) -> Released:
        """Everything up to ``safe_lsn`` is safe: the trackers with confirms now due, and
        the commits now done."""
        self.safe_lsn = safe_lsn
        due = []
        trackers = self.trackers
        for confirms in list(trackers):
            if confirms.progress(safe_lsn):
                due.append(confirms)
                if not confirms.unsafe:
                    del trackers[confirms]
        done = []
        commits = self.commits
        while commits and commits[0].lsn <= safe_lsn:
            done.append(commits.popleft())
        return due, done

    def refuse(self, first: int, last: int) -> Released:
        """The store could not write LSNs ``first``-``last``: the trackers with publishes
        waiting on them (now nacks due), and the commits that fail."""
        due = []
        trackers = self.trackers
        for confirms in list(trackers):
            if confirms.refuse_range(first, last):
                due.append(confirms)
                if not confirms.unsafe:
                    del trackers[confirms]
        failed = [commit for commit in self.commits if first <= commit.lsn <= last]
        if failed:
            self.commits = deque(c for c in self.commits if not first <= c.lsn <= last)
        return due, failed
