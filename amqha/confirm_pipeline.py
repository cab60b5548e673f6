"""The confirm pipeline: from what the sinks hold to what each connection may send.

Owns: the sinks whose progress makes the watermark (the replication feed and the store:
``core.sync.Sink``), the watermark itself (``safe_lsn``), the book of what waits for it
(``core.confirms.Waiting``: channels' confirm trackers and transactions' commits) and the
other waiters (``when_safe``: a federation link's intake, the follower's applied runs).
When a sink reports progress, ``advance`` takes the watermark, asks the book what it
releases and hands each released value to the connection that writes it; a range the
store could not write is ``refuse``, handed out the same way. docs/architecture.md,
"The walk of a confirmed publish"; the watermark's rule is docs/durability.md's.

Must not know: channels, frames, SQLite. The broker holds one (``Broker.confirms``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from .core.confirms import Commit, Released, Waiting
from .core.sync import Sink, watermark


class ConfirmPipeline:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # Where each turn's changes go and whose progress releases confirms; none (and
        # everything safe at once) until the store is open.
        self.sinks: list[Sink] = []
        self.safe_lsn = 0  # confirms may go out for everything up to this LSN
        self.waiting = Waiting()
        self.waiters: collections.deque[tuple[int, Callable[[bool], None]]] = collections.deque()

    def attach(self, sinks: list[Sink]) -> None:
        """The store is open: ``sinks`` make the watermark from now on (the feed first:
        the PASSIVE's store is the longer way to it)."""
        self.sinks = sinks

    def advance(self) -> None:
        """A sink reported progress: release what the new watermark makes safe."""
        safe = watermark([sink.holds() for sink in self.sinks])
        if safe <= self.safe_lsn:
            return
        self.safe_lsn = safe
        _hand_out(self.waiting.advance(safe), True)
        waiters = self.waiters
        while waiters and waiters[0][0] <= safe:
            _, done = waiters.popleft()
            done(True)

    def refuse(self, first: int, last: int) -> None:
        """The store could not write LSNs ``first``-``last``: what waits on them is
        refused now, whatever the watermark. Held back until the watermark passed the
        range (a PASSIVE behind it), such a publish was acked later, on the PASSIVE's
        copy alone, and lost if this server then led from its own store."""
        _hand_out(self.waiting.refuse(first, last), False)
        waiters = self.waiters
        if any(first <= lsn <= last for lsn, _ in waiters):
            refused = [done for lsn, done in waiters if first <= lsn <= last]
            self.waiters = collections.deque(
                (lsn, done) for lsn, done in waiters if not first <= lsn <= last
            )
            for done in refused:
                done(False)

    def expect_commit(self, commit: Commit) -> None:
        """A transaction's commit waits for its LSN: its connection answers once it is
        safe (``commit_done``), or at once if it already is."""
        if commit.lsn <= self.safe_lsn or not self.sinks:
            self.loop.call_soon(commit.owner.commit_done, commit, True)
        else:
            self.waiting.expect_commit(commit)

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None:
        """Call ``done(ok)`` once the store (and an in-sync PASSIVE) has up to ``lsn``."""
        if lsn <= self.safe_lsn or not self.sinks:
            self.loop.call_soon(done, True)
        else:
            self.waiters.append((lsn, done))


def _hand_out(released: Released, ok: bool) -> None:
    """Each released tracker and commit to the connection that writes it."""
    due, commits = released
    for confirms in due:
        confirms.owner.confirms_due(confirms)
    for commit in commits:
        commit.owner.commit_done(commit, ok)
