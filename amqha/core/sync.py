"""The replication protocol's rules: when a PASSIVE is in sync, what the confirms wait for.

Owns, for one subscription of a PASSIVE to its ACTIVE's feed:

- on the ACTIVE (``Leader``): the runs sent and not acked, the replicated LSN (the
  PASSIVE holds every change up to it), the phase of the subscription, the LSN at which
  the PASSIVE counts as in sync, the confirm watermark, and where the unprotected mark
  goes when protection is lost;
- on the PASSIVE (``Eligibility``): whether it may take over.

The rule (docs/durability.md, section 5, "In sync"): a PASSIVE may take over only if it
holds every change its ACTIVE has ever confirmed. While the PASSIVE catches up, the
ACTIVE confirms on its own store alone. When the PASSIVE acks the snapshot's end, the
ACTIVE stops confirming without it (``Phase.CLOSING``) and records the sync LSN: the
last change it may have confirmed alone. Once the PASSIVE has acked through the sync
LSN, every confirmed change is on both disks: the ACTIVE declares it in sync and tells
it so (a marker in the stream, after every run it covers). Only the marker makes a
PASSIVE eligible; a new subscription, a cancel by the ACTIVE or a failed store makes it
ineligible at once. Losing the link to a dead ACTIVE keeps it eligible: that is what
eligibility is for.

Pure: no asyncio, sockets, clocks, disks or logging. The feed and the follower
(``amqha/replication.py``) are the shells that send, store and log.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol


class Sink(Protocol):
    """Where the change stream goes, each turn: the store and the replication feed
    (``Broker.sinks``). A confirm goes out once every sink that holds changes for it has
    the publish's LSN."""

    def submit(self, first_lsn: int, changes: Sequence[Any]) -> None:
        """This turn's changes, the first with LSN ``first_lsn``."""
        ...

    def holds(self) -> int | None:
        """Every change up to this LSN is held; None: confirms do not wait for this
        sink now (a feed with no PASSIVE past its snapshot)."""
        ...


def watermark(held: Iterable[int | None]) -> int:
    """The confirm watermark: the lowest LSN the sinks that count hold."""
    return min((lsn for lsn in held if lsn is not None), default=0)


class Phase(enum.Enum):
    NONE = "none"  # no subscriber: confirms go on the ACTIVE's store alone
    SNAPSHOT = "snapshot"  # the snapshot is being sent or acked: still alone
    CLOSING = "closing"  # snapshot acked: confirms wait for the PASSIVE; not in sync yet
    IN_SYNC = "in_sync"  # the PASSIVE holds every change ever confirmed


class SentRun(NamedTuple):
    last_lsn: int  # the run covers every change up to this LSN
    snapshot_end: bool
    first_msg_id: int | None  # the first message id it carries, if any
    sent_at: float
    size: int


class Synced(NamedTuple):
    """What an ack did: the watermark may have moved; ``declared`` if the PASSIVE just
    became in sync (the shell sends the marker and records it)."""

    moved: bool
    declared: bool


class Leader:
    """The ACTIVE's side of the protocol for one subscription at a time."""

    __slots__ = ("phase", "replicated_lsn", "sync_lsn", "unacked", "hold_alone")

    def __init__(self, hold_alone: bool = False) -> None:
        # ``replication.when_alone: hold``: with no in-sync PASSIVE, no confirm goes out.
        self.hold_alone = hold_alone
        self.phase = Phase.NONE
        self.replicated_lsn = 0
        self.sync_lsn: int | None = None
        self.unacked: collections.OrderedDict[int, SentRun] = collections.OrderedDict()

    @property
    def in_sync(self) -> bool:
        return self.phase is Phase.IN_SYNC

    @property
    def gating(self) -> bool:
        """Whether confirms wait for the PASSIVE."""
        return self.phase is Phase.CLOSING or self.phase is Phase.IN_SYNC

    def holds(self) -> int | None:
        """As a sink: the PASSIVE's LSN while confirms wait for it; with no PASSIVE in
        sync, None (the ACTIVE confirms alone), or 0 when it holds them (the watermark
        never moves back: what was confirmed stays confirmed, nothing more goes out)."""
        if self.gating:
            return self.replicated_lsn
        return 0 if self.hold_alone else None

    def watermark(self, store_lsn: int) -> int:
        """Confirms may go out up to this LSN: the store's, and while gating the
        PASSIVE's too."""
        return watermark((store_lsn, self.holds()))

    def subscribe(self) -> None:
        """A new subscriber: it starts from a snapshot, so nothing it held counts."""
        self.phase = Phase.SNAPSHOT
        self.replicated_lsn = 0
        self.sync_lsn = None
        self.unacked.clear()

    def resume(self, held_lsn: int, confirmed_lsn: int) -> bool:
        """A new subscriber that already holds every change up to ``held_lsn`` (the
        server that handed the service over, resuming where it left off: docs/durability.md,
        section 5, "Resuming after a handover"): no snapshot, so confirms wait for it
        from now on, and what went out alone is everything up to ``confirmed_lsn``. True
        if it is in sync at once (nothing was confirmed past what it holds): the shell
        sends the marker."""
        self.unacked.clear()
        self.replicated_lsn = held_lsn
        self.sync_lsn = confirmed_lsn
        if held_lsn >= confirmed_lsn:
            self.phase = Phase.IN_SYNC
            return True
        self.phase = Phase.CLOSING
        return False

    def sent(self, tag: int, run: SentRun) -> None:
        self.unacked[tag] = run

    def acked(self, tag: int, multiple: bool, confirmed_lsn: int) -> Synced:
        """The subscriber's ack of ``tag`` (and every tag before it with ``multiple``).
        ``confirmed_lsn``: the highest LSN whose confirms the ACTIVE has released."""
        unacked = self.unacked
        if multiple:
            done = [each for each in unacked if each <= tag]
        else:
            done = [tag] if tag in unacked else []
        moved = False
        snapshot_acked = False
        for each in done:
            run = unacked.pop(each)
            if run.last_lsn > self.replicated_lsn:
                self.replicated_lsn = run.last_lsn
                moved = True
            snapshot_acked = snapshot_acked or run.snapshot_end
        if snapshot_acked and self.phase is Phase.SNAPSHOT:
            # From here on no confirm goes out without the PASSIVE; what went out alone
            # is everything up to what was confirmed so far.
            self.phase = Phase.CLOSING
            self.sync_lsn = confirmed_lsn
        declared = False
        if (
            self.phase is Phase.CLOSING
            and self.sync_lsn is not None
            and self.replicated_lsn >= self.sync_lsn
        ):
            self.phase = Phase.IN_SYNC
            declared = True
        return Synced(moved and self.gating, declared)

    def drop(self) -> bool:
        """The subscriber is gone; True if it was in sync (protection is lost now)."""
        was = self.phase is Phase.IN_SYNC
        self.phase = Phase.NONE
        self.sync_lsn = None
        self.unacked.clear()
        return was

    def stalled(self, now: float, limit: float) -> float | None:
        """While confirms wait for the PASSIVE: how long its oldest unacked run has
        waited, if ``limit`` or more (a PASSIVE frozen, or its link stuck); else None."""
        if not self.gating or not self.unacked:
            return None
        waited = now - next(iter(self.unacked.values())).sent_at
        return waited if waited >= limit else None

    def unprotected_from(self, backlog_first_id: int | None, next_id: int) -> int:
        """The first message id the PASSIVE may not hold, for the unprotected mark when
        protection is lost: the oldest run sent and not acked that carries one, else the
        oldest one not sent yet, else the next id to be given out. Call before ``drop``."""
        for run in self.unacked.values():
            if run.first_msg_id is not None:
                return run.first_msg_id
        return backlog_first_id if backlog_first_id is not None else next_id


class Eligibility:
    """The PASSIVE's side: may it take over? Only once its ACTIVE has said it is in sync,
    and not since anything that ends what that covered."""

    __slots__ = ("in_sync", "sync_lsn")

    def __init__(self) -> None:
        self.in_sync = False
        self.sync_lsn: int | None = None

    def subscribed(self) -> bool:
        """A new subscription starts from a new snapshot. True if eligibility was lost."""
        return self._lose()

    def declared(self, sync_lsn: int) -> bool:
        """The ACTIVE's marker: every change up to ``sync_lsn``, and every change it
        confirmed, is in this server's store. True if this made it eligible."""
        self.sync_lsn = sync_lsn
        was = self.in_sync
        self.in_sync = True
        return not was

    def ended(self) -> bool:
        """The ACTIVE cancelled the subscription (it confirms alone from now on), a run
        did not decode or validate, or this server's store failed: True if lost."""
        return self._lose()

    def _lose(self) -> bool:
        was = self.in_sync
        self.in_sync = False
        self.sync_lsn = None
        return was
