"""Replication: the ACTIVE's change stream, pushed to the PASSIVE over the peering.

Owns: the ``Feed`` on the ACTIVE (the ``Follower`` on the PASSIVE is ``follower``'s).

- The feed has at most one subscriber: a ``peering`` login consuming the control queue
  ``amq.replication`` with proof of the pair's secret (``core.feedauth``). It sends a
  snapshot of the replicated state (from a ``Reset``), then every live change after it,
  in one ordered stream of deliveries through the subscriber's channel (an ``Outlet``):
  a change can never overtake the snapshot. Each delivery is a run of changes
  (``core.codec``) with its MAC. The subscriber's acks are the replication watermark
  ("the PASSIVE holds everything up to LSN n"), its prefetch the flow control. The rules
  (when confirms wait for the PASSIVE, when it is in sync, where the unprotected mark
  starts) are ``core.sync.Leader``'s; in sync is declared with a marker in the stream.
- The follower (``follower.Follower``) subscribes, stores, applies and acks.
- After a handover, the server that handed the service over may resume where it left
  off instead of taking a snapshot: from the takeover on, this server keeps its changes
  for it (``keep_for_resume``), and a subscription that names the point of the handover
  (``core.feedauth``) is sent them, with no snapshot (docs/durability.md, section 5,
  "Resuming after a handover").

Must not know: the failover state machine (the pair tells the broker to lead or to
follow: see ``Broker.lead``/``Broker.follow``), the store's files. See
docs/durability.md, section 5.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import clock, wire
from .core import codec, feedauth, protocol
from .core.apply import state_changes
from .core.changes import (
    ACCESS_CHANGES,
    POLICY_CHANGES,
    Batch,
    Bound,
    Change,
    DedupSeen,
    Enqueued,
    QueueDeclared,
    Settled,
    Unbound,
)
from .core.sync import Leader, Phase, SentRun

if TYPE_CHECKING:
    from .host import ReplicationHost

log = logging.getLogger("amqha.replication")

# A delivery carries at most this many changes, or about this many bytes.
RUN_CHANGES = 2000
RUN_BYTES = 512 * 1024
# Deliveries the follower lets the feed have in flight.
FOLLOWER_PREFETCH = 16
# Kept runs the follower applies ahead of the store writing their rows.
APPLY_AHEAD = 2
# The most a follower holds kept and not applied before it stops acking (changes, bytes
# of runs): what a takeover must apply before it serves, at any moment. Beyond it the
# ACTIVE's feed waits for the follower's apply, as it waits for its disk
# (docs/durability.md, section 5, "Acks and flow").
UNAPPLIED_CHANGES = 20_000
UNAPPLIED_BYTES = 8 * 1024 * 1024
# A kept run's number in the store's runs table: never used twice by one process (the
# table is this process's alone, and opening the store empties it), so that a run left
# by an earlier follower never comes after a later one.
_RUN_SEQS = itertools.count(1)
# A subscriber this far behind (bytes of changes waiting for it) is dropped: it
# subscribes again and catches up from a new snapshot instead of holding memory.
MAX_BACKLOG_BYTES = 256 * 1024 * 1024
# The headers of a run: "snapshot_end" marks the snapshot's last run; "in_sync" is the
# ACTIVE's marker (an empty run): the PASSIVE holds every change it ever confirmed, up
# to the LSN it carries (docs/durability.md, section 5, "In sync").
SNAPSHOT_END = "amqha-snapshot-end"
IN_SYNC = "amqha-in-sync"
# On a run sent while more than half of MAX_BACKLOG_BYTES waits for the subscriber: the
# follower then acks what it has kept without waiting for its apply (UNAPPLIED_CHANGES),
# so that a long catch-up under a busy publisher ends rather than starts again from a
# new snapshot. A pacing hint, outside the run's MAC: a forged one makes a takeover
# right after a catch-up slower, never loses a change (docs/durability.md, section 5).
BEHIND = "amqha-behind"


def _size(changes: Sequence[Change]) -> int:
    """About how many bytes ``changes`` hold (for the backlog limit, the lag and where
    a run is cut): a transaction's messages count too."""
    return 64 * len(changes) + sum(
        [
            len(c.body) + len(c.header)  # type: ignore[union-attr]
            if type(c) is Enqueued
            else (_size(c.changes) if type(c) is Batch else 0)  # type: ignore[union-attr]
            for c in changes
        ]
    )


def _first_msg_id(changes: Sequence[Change]) -> int | None:
    """The first message id a run carries (ids grow with LSNs), or None."""
    for change in changes:
        kind = type(change)
        if kind is Enqueued:
            return change.msg_id  # type: ignore[union-attr]
        if kind is Batch:
            found = _first_msg_id(change.changes)  # type: ignore[union-attr]
            if found is not None:
                return found
    return None


class Outlet(Protocol):
    """The subscriber's way out: its channel (``channel_feed.FeedOutlet``), seen through this
    interface only. Delivery tags come from the channel, whose other deliveries share
    them."""

    peer: str  # the subscriber's address, for logs and status
    prefetch: int  # the runs it lets the feed have in flight (0: no limit set)

    def next_tag(self) -> int: ...

    def deliver(self, tag: int, header: bytes, body: bytes) -> None:
        """Send one run now (the PASSIVE's store is on the confirm's way)."""

    def cancel(self) -> None:
        """Tell the subscriber its subscription is over (Basic.Cancel), if its channel is
        still open."""

    def detach(self) -> None:
        """The feed is done with this outlet: acks on it no longer reach the feed."""


class _Subscriber:
    __slots__ = ("outlet", "prefetch", "key", "protocol")

    def __init__(self, outlet: Outlet, key: bytes, protocol: int) -> None:
        self.outlet = outlet
        self.prefetch = outlet.prefetch or FOLLOWER_PREFETCH
        self.key = key  # the session key: every run's MAC (core/feedauth.py)
        self.protocol = protocol  # what it is spoken (core/protocol.py)


class Feed:
    """The ACTIVE's side: one subscriber at a time (see the module docstring). The
    protocol's rules are ``core.sync.Leader``'s; this shell takes the snapshot, encodes
    and sends the runs, and tells the broker what changed."""

    def __init__(
        self,
        broker: ReplicationHost,
        on_sync: Callable[[bool, str], None],
        on_unprotected: Callable[[int], None],
    ) -> None:
        self.broker = broker
        # (in_sync, reason): the broker re-checks its confirms; a reason: a change of
        # protection to record.
        self.on_sync = on_sync
        # Protection was lost: the first message id the PASSIVE may not hold.
        self.on_unprotected = on_unprotected
        config = broker.config
        self.hold_alone = (
            config.replication.when_alone == "hold" and config.failover.role is not None
        )
        self.leader = Leader()
        # When confirms began to wait for want of an in-sync PASSIVE (hold_alone), or None.
        self.held_since: float | None = None
        # After a handover: the end of the wait for the old ACTIVE (hold_until_in_sync).
        self._rejoin_timer: asyncio.TimerHandle | None = None
        self.subscriber: _Subscriber | None = None
        self.sent_lsn = 0
        self._snapshot: Iterator[Change] | None = None
        # Changes taken from the snapshot past the end of the run that took them.
        self._carry: list[Change] = []
        self._snapshot_lsn = 0
        # Live changes not sent yet: (first LSN, changes, their size).
        self._pending: collections.deque[tuple[int, list[Change], int]] = collections.deque()
        self.backlog_bytes = 0
        self.snapshots = 0
        self.snapshot_changes = 0
        self.refusals = 0  # subscriptions refused for want of proof of the secret
        # After a takeover by handover: the point the server that handed over may resume
        # from ((its epoch, its last LSN), as this server received them), kept until the
        # first subscription; the changes since are kept in ``_pending`` meanwhile.
        self._resume_point: tuple[int, int] | None = None
        self.resumes = 0
        self._submitted_lsn = 0  # the last LSN the broker handed this sink

    @property
    def in_sync(self) -> bool:
        return self.leader.in_sync

    @property
    def replicated_lsn(self) -> int:
        return self.leader.replicated_lsn

    def holds(self) -> int | None:
        """As a sink (``core.sync.Sink``): what the PASSIVE holds, while it counts."""
        return self.leader.holds()

    # -- subscribing --------------------------------------------------------------------

    @property
    def live_subscriber(self) -> bool:
        return self.subscriber is not None

    def refused(self, peer: str, user: str) -> None:
        """A subscription without proof of the pair's secret (the channel refuses it)."""
        self.refusals += 1
        log.warning(
            "replication: subscription from %s (user %r) refused: no proof of the pair's secret",
            peer,
            user,
        )

    def keep_for_resume(self, point: tuple[int, int], base_lsn: int) -> None:
        """This server just took the service by a handover, holding the state of the
        server that handed it over at ``point`` (the epoch it led in, the last LSN of its
        that this server received), which is this server's state at its own LSN
        ``base_lsn``. Until the first subscription, every change after ``base_lsn`` is kept,
        so that server may resume from there rather than take a snapshot."""
        if self.subscriber is not None or self._submitted_lsn > base_lsn:
            return  # a change after the takeover went by unkept: a snapshot it is
        self._resume_point = point
        self._snapshot_lsn = base_lsn
        self._pending.clear()
        self.backlog_bytes = 0

    def forget_resume(self, reason: str) -> None:
        if self._resume_point is not None:
            self._resume_point = None
            if self.subscriber is None:
                self._pending.clear()
                self.backlog_bytes = 0
            log.info("replication: no resume after the handover: %s", reason)

    def subscribe(
        self,
        outlet: Outlet,
        key: bytes,
        speaks: int = protocol.PROTOCOL,
        resume: tuple[int, int] | None = None,
    ) -> None:
        """The PASSIVE, proven (the channel checked its proof), subscribes: at most one
        at a time (the channel refuses a second while one is live). ``speaks``: the
        protocol it is spoken (core/protocol.py); ``resume``: the point it asks to resume
        from, proven too."""
        assert self.subscriber is None
        log_ = self.broker.log
        self.subscriber = _Subscriber(outlet, key, speaks)
        point, self._resume_point = self._resume_point, None
        if resume is not None and resume == point:
            self._resume(outlet.peer)
            return
        if resume is not None:
            log.info(
                "replication: %s asked to resume from epoch %d, LSN %d; %s: sending a snapshot",
                outlet.peer,
                resume[0],
                resume[1],
                "this server holds no such point"
                if point is None
                else f"the point of the handover is epoch {point[0]}, LSN {point[1]}",
            )
        self.leader.subscribe()
        # The state already holds every change up to the log's last LSN, taken or not.
        self._snapshot_lsn = log_.lsn if log_ is not None else 0
        self._snapshot = state_changes(self.broker.vhosts, access=self.broker.access)
        self._carry = []
        self._pending.clear()
        self.backlog_bytes = 0
        self.sent_lsn = self._snapshot_lsn
        self.snapshots += 1
        self.snapshot_changes = 0
        log.info("replication: %s subscribed, sending a snapshot", outlet.peer)
        self.push()

    def _resume(self, peer: str) -> None:
        """The server that handed the service over resumes where it left off: it holds
        this server's state at the takeover, so it is sent the changes kept since, then
        the live ones; confirms wait for it from now on."""
        subscriber = self.subscriber
        assert subscriber is not None
        self._snapshot = None
        self._carry = []
        self.sent_lsn = self._snapshot_lsn
        self.resumes += 1
        self.snapshot_changes = 0
        log.info(
            "replication: %s resumed after LSN %d, where it handed the service over: no "
            "snapshot (%d kept changes to send)",
            peer,
            self._snapshot_lsn,
            sum(len(changes) for _, changes, _ in self._pending),
        )
        if self.leader.resume(self._snapshot_lsn, self.broker.safe_lsn):
            self._declare(
                subscriber,
                f"the passive resumed where it handed the service over (LSN "
                f"{self._snapshot_lsn}), holding every change confirmed",
            )
        self.push()

    def drop(self, reason: str, cancel: bool = True) -> None:
        """Forget the subscriber (its channel closed, it fell too far behind, this server
        steps down). With ``cancel``, its channel still open, the PASSIVE is told (a
        server-side Basic.Cancel): it stops counting as in sync at once."""
        subscriber, self.subscriber = self.subscriber, None
        leader = self.leader
        mark = None
        if leader.in_sync:
            mark = leader.unprotected_from(self._backlog_first_id(), self.broker.ids.next)
        was_in_sync = leader.drop()
        if was_in_sync and self.hold_alone:
            self.held_since = clock.now()  # no confirm goes out from now on
        self._snapshot = None
        self._carry = []
        self._pending.clear()  # kept changes too: no resume can be served without them
        self._resume_point = None
        self.backlog_bytes = 0
        if subscriber is None:
            return
        subscriber.outlet.detach()
        if cancel:
            subscriber.outlet.cancel()
        if was_in_sync:
            assert mark is not None
            self.on_unprotected(mark)
            self.on_sync(False, reason)
        log.warning("replication: subscriber dropped: %s", reason)

    def drop_if_stalled(self, limit: float) -> None:
        """Drop an in-sync (or closing) subscriber that has acked nothing for ``limit``
        seconds: confirms stop waiting for a PASSIVE that is frozen or cut off, as they do
        when its link closes, instead of for as long as the link's heartbeat takes to
        call it dead (docs/durability.md, section 5, "A silent PASSIVE")."""
        waited = self.leader.stalled(time.monotonic(), limit)
        if waited is not None:
            self.drop(
                f"the passive acked nothing for {waited:.2f} s (frozen, or its link is "
                "stuck): confirms no longer wait for it"
            )

    def unsubscribed(self, outlet: Outlet) -> None:
        if self.subscriber is not None and self.subscriber.outlet is outlet:
            self.drop("the passive's replication link closed", cancel=False)

    def _backlog_first_id(self) -> int | None:
        for _, changes, _ in self._pending:
            found = _first_msg_id(changes)
            if found is not None:
                return found
        return None

    # -- the stream ---------------------------------------------------------------------

    def submit(self, first_lsn: int, changes: Sequence[Change]) -> None:
        """As a sink: changes the broker just took from its log (every turn of the
        loop), sent as live runs to the subscriber, if any."""
        last = first_lsn + len(changes) - 1
        self._submitted_lsn = last
        if self.subscriber is None and self._resume_point is None:
            return
        if last <= self._snapshot_lsn:
            return
        if first_lsn <= self._snapshot_lsn:
            changes = changes[self._snapshot_lsn - first_lsn + 1 :]
            first_lsn = self._snapshot_lsn + 1
        size = _size(changes)
        self._pending.append((first_lsn, changes, size))
        self.backlog_bytes += size
        if self.backlog_bytes > MAX_BACKLOG_BYTES:
            if self.subscriber is None:
                self.forget_resume(f"more than {MAX_BACKLOG_BYTES} bytes of changes since")
            else:
                self.drop(f"the passive fell behind by more than {MAX_BACKLOG_BYTES} bytes")
            return
        self.push()

    def push(self) -> None:
        subscriber = self.subscriber
        while subscriber is not None and len(self.leader.unacked) < subscriber.prefetch:
            if self._snapshot is not None:
                changes, end = self._snapshot_run()
                self._send(subscriber, 0, changes, self._snapshot_lsn, end, None)
            elif self._pending:
                first, changes, last = self._live_run()
                self._send(subscriber, first, changes, last, False, _first_msg_id(changes))
            else:
                return
            subscriber = self.subscriber

    def _snapshot_run(self) -> tuple[list[Change], bool]:
        """The snapshot's next run, taken a few changes at a time until it is full; True
        with its last run."""
        assert self._snapshot is not None
        changes: list[Change] = []
        size = 0
        while len(changes) < RUN_CHANGES and size < RUN_BYTES:
            want = min(64, RUN_CHANGES - len(changes))
            if self._carry:
                chunk, self._carry = self._carry[:want], self._carry[want:]
            else:
                chunk = list(itertools.islice(self._snapshot, want))
            if not chunk:
                self._snapshot = None
                self.snapshot_changes += len(changes)
                return changes, True
            chunk_size = _size(chunk)
            if size + chunk_size > RUN_BYTES and len(chunk) > 1:
                # A run passes RUN_BYTES by its last change only, as live runs do: a chunk
                # of large messages would make a run larger than the follower reads.
                cut = _cut(chunk, RUN_BYTES - size)
                self._carry = chunk[cut:] + self._carry
                chunk = chunk[:cut]
                chunk_size = _size(chunk)
            changes += chunk
            size += chunk_size
        self.snapshot_changes += len(changes)
        return changes, False

    def _live_run(self) -> tuple[int, list[Change], int]:
        first, changes, size = self._pending[0]
        if len(changes) > RUN_CHANGES or (size > RUN_BYTES and len(changes) > 1):
            cut = _cut(changes)
            head, tail = changes[:cut], changes[cut:]
            head_size = _size(head)
            # The rest starts right after the head: a run cut by bytes holds fewer than
            # RUN_CHANGES, and a rest numbered from RUN_CHANGES on would, once acked, carry
            # the PASSIVE's LSN past changes it was never sent (their confirms went out).
            self._pending[0] = (first + cut, tail, size - head_size)
            changes, size = head, head_size
        else:
            self._pending.popleft()
        self.backlog_bytes -= size
        last = first + len(changes) - 1
        unreplicated = self._unreplicated()
        if unreplicated:
            changes = [c for c in changes if not _leaves_out(c, unreplicated)]
        return first, changes, last

    def _unreplicated(self) -> set[tuple[str, str]]:
        return {
            (vhost.name, name)
            for vhost in self.broker.vhosts.values()
            for name in vhost.unreplicated
        }

    def _send(
        self,
        subscriber: _Subscriber,
        first: int,
        changes: list[Change],
        last: int,
        end: bool,
        first_msg_id: int | None,
        headers: dict[str, Any] | None = None,
    ) -> None:
        outlet = subscriber.outlet
        if subscriber.protocol < protocol.DEDUP_CHANGES:
            # A PASSIVE of the previous release cannot read them: it keeps no
            # deduplication cache and no run-time users (docs/operations.md, "Upgrading").
            changes = [c for c in changes if type(c) not in _NOT_FOR_PROTOCOL_1]
        body = codec.encode(first, changes)
        tag = outlet.next_tag()
        marker = headers.get(IN_SYNC) if headers else None
        headers = {SNAPSHOT_END: True} if end else dict(headers or {})
        if self.backlog_bytes > MAX_BACKLOG_BYTES // 2:
            headers[BEHIND] = True
        headers[feedauth.MAC_HEADER] = feedauth.run_mac(subscriber.key, tag, end, marker, body)
        header = wire.headers_header(len(body), headers)
        self.leader.sent(tag, SentRun(last, end, first_msg_id, time.monotonic(), len(body)))
        self.sent_lsn = max(self.sent_lsn, last)
        outlet.deliver(tag, header, body)

    def acked(self, outlet: Outlet, tag: int, multiple: bool) -> None:
        """The subscriber's Basic.Ack: it holds what those deliveries carried."""
        subscriber = self.subscriber
        if subscriber is None or subscriber.outlet is not outlet:
            return
        leader = self.leader
        before = leader.phase
        synced = leader.acked(tag, multiple, self.broker.safe_lsn)
        if before is Phase.SNAPSHOT and leader.phase is not Phase.SNAPSHOT:
            log.info(
                "replication: snapshot of %d changes acked; confirms wait for the passive, "
                "in sync once it has acked through LSN %s",
                self.snapshot_changes,
                leader.sync_lsn,
            )
        if synced.declared:
            self._declare(
                subscriber,
                f"the passive holds the snapshot ({self.snapshot_changes} changes) and every "
                f"change confirmed without it (through LSN {leader.sync_lsn})",
            )
        elif synced.moved:
            self.on_sync(True, "")
        self.push()

    def _declare(self, subscriber: _Subscriber, reason: str) -> None:
        """The PASSIVE is in sync: the marker goes after every run it covers, so the
        PASSIVE reads it holding them. This server says so first (``on_sync`` clears its
        unprotected mark): once the marker is out the PASSIVE may take over at once, and
        a mark left behind by a kill in between would set aside, at this server's
        restart, messages its peer holds (docs/durability.md, section 5)."""
        self.held_since = None
        self._end_rejoin_wait()
        self.on_sync(True, reason)
        self._send(subscriber, 0, [], 0, False, None, {IN_SYNC: self.leader.sync_lsn})

    def status(self) -> dict[str, Any]:
        subscriber = self.subscriber
        leader = self.leader
        log_ = self.broker.log
        lsn = log_.lsn if log_ is not None else 0
        oldest = next(iter(leader.unacked.values()), None) if subscriber else None
        return {
            "subscriber": None if subscriber is None else subscriber.outlet.peer,
            "state": "in_sync"
            if leader.in_sync
            else ("catching_up" if subscriber is not None else "none"),
            "phase": leader.phase.value,
            "sync_lsn": leader.sync_lsn,
            "lag_changes": max(0, lsn - leader.replicated_lsn) if subscriber else None,
            "lag_bytes": (
                self.backlog_bytes + sum(run.size for run in leader.unacked.values())
                if subscriber
                else None
            ),
            "lag_seconds": round(time.monotonic() - oldest.sent_at, 3) if oldest else 0.0,
            "replicated_lsn": leader.replicated_lsn,
            "when_alone": "hold" if self.hold_alone else "confirm",
            **self._held(),
            "snapshots": self.snapshots,
            "resumes": self.resumes,
            "refused_subscriptions": self.refusals,
        }

    def set_leading(self, leading: bool) -> None:
        """This server leads (or no longer does): with ``when_alone: hold`` its confirms
        wait for an in-sync PASSIVE from now on (a PASSIVE's own writes never wait)."""
        self._end_rejoin_wait()
        self.forget_resume("this server " + ("leads again" if leading else "no longer leads"))
        self.leader.hold_alone = self.hold_alone and leading
        self.held_since = clock.now() if self.leader.hold_alone and not self.in_sync else None

    def hold_until_in_sync(self, seconds: float) -> None:
        """This ACTIVE took the service by a handover (a planned switchover, a recover):
        the server that handed it over, drained, rejoins as PASSIVE at once, and until it
        is in sync again no confirm goes out on this server alone, whatever
        ``when_alone`` says (docs/failover.md, "Planned switchover"). After ``seconds``
        without it, or at once with ``seconds`` 0 (it is lost), ``when_alone`` applies
        again."""
        if seconds <= 0:
            self.forget_resume("the server that handed the service over is lost")
            if self._rejoin_timer is not None:
                self._rejoin_timer.cancel()
                self._rejoin_late()
            return
        if self.in_sync or self.leader.hold_alone:
            return
        self.leader.hold_alone = True
        self.held_since = clock.now()
        self._rejoin_timer = asyncio.get_running_loop().call_later(seconds, self._rejoin_late)

    def _rejoin_late(self) -> None:
        self._rejoin_timer = None
        if self.leader.hold_alone and not self.hold_alone and not self.in_sync:
            log.warning(
                "replication: the server that handed the service over is not in sync yet:"
                " confirming alone (replication.when_alone: confirm)"
            )
            self.leader.hold_alone = False
            self.held_since = None
            self.on_sync(False, "")  # the confirms held meanwhile go out

    def _end_rejoin_wait(self) -> None:
        """In sync (or no longer leading): the wait after a handover is over."""
        if self._rejoin_timer is not None:
            self._rejoin_timer.cancel()
            self._rejoin_timer = None
            self.leader.hold_alone = self.hold_alone

    def _held(self) -> dict[str, Any]:
        """``when_alone: hold`` with no PASSIVE in sync: the publishes whose confirms wait,
        and since when (wall clock) none has gone out."""
        if not self.leader.hold_alone or self.leader.gating or self.held_since is None:
            return {"held_confirms": 0, "held_since": None}
        waiting = self.broker.confirms.waiting
        held = sum(len(tracker.unsafe) for tracker in waiting.trackers)
        return {"held_confirms": held, "held_since": round(self.held_since, 3)}


def _cut(changes: list[Change], budget: int = RUN_BYTES) -> int:
    """How many of ``changes`` make a run: at most RUN_CHANGES, and past ``budget``
    bytes only by its last change (at least one)."""
    size = 0
    for count, change in enumerate(changes[:RUN_CHANGES], 1):
        size += _size([change])
        if size >= budget:
            return count
    return min(len(changes), RUN_CHANGES)


# The kinds a PASSIVE of protocol 1 cannot read.
_NOT_FOR_PROTOCOL_1 = (DedupSeen, *ACCESS_CHANGES, *POLICY_CHANGES)


def _leaves_out(change: Change, unreplicated: set[tuple[str, str]]) -> bool:
    """Whether a change concerns only a queue that is not replicated."""
    kind = type(change)
    if kind is Enqueued or kind is Settled:
        return (change.vhost, change.queue) in unreplicated  # type: ignore[union-attr]
    if kind is QueueDeclared:
        return (change.vhost, change.name) in unreplicated  # type: ignore[union-attr]
    if kind is DedupSeen:
        return change.kind == "q" and (change.vhost, change.owner) in unreplicated  # type: ignore[union-attr]
    if kind is Bound or kind is Unbound:
        return (not change.to_exchange) and (  # type: ignore[union-attr]
            change.vhost,  # type: ignore[union-attr]
            change.destination,  # type: ignore[union-attr]
        ) in unreplicated
    return False
