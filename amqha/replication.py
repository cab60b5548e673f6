"""Replication: the ACTIVE's change stream, pushed to the PASSIVE over the peering.

Owns: the ``Feed`` on the ACTIVE and the ``Follower`` on the PASSIVE.

- The feed has at most one subscriber: a ``peering`` login consuming the control queue
  ``amq.replication`` with proof of the pair's secret (``core.feedauth``). It sends a
  snapshot of the replicated state (from a ``Reset``), then every live change after it,
  in one ordered stream of deliveries through the subscriber's channel (an ``Outlet``):
  a change can never overtake the snapshot. Each delivery is a run of changes
  (``core.codec``) with its MAC. The subscriber's acks are the replication watermark
  ("the PASSIVE holds everything up to LSN n"), its prefetch the flow control. The rules
  (when confirms wait for the PASSIVE, when it is in sync, where the unprotected mark
  starts) are ``core.sync.Leader``'s; in sync is declared with a marker in the stream.
- The follower keeps a lean consuming link (``peering.ConsumerLink``) to the ACTIVE
  subscribed to the feed. Each run is handled in the socket's read, its MAC checked
  first; it is eligible to take over only from the ACTIVE's marker on
  (``core.sync.Eligibility``). Every run is decoded (so validated) before anything of
  it is stored or acked, then kept in the store as received (a pending run: one row),
  acked once that is written, and applied with ``core.apply`` (the same function as
  recovery) and written as rows after, in order, paced by the store's writer. A live
  run's row is written with an fsync; a snapshot's runs before its last without one
  (the last one's covers them), and none of a snapshot is applied before its end is
  on disk: what the ACTIVE waits for, while catching up and in sync, is the decode and
  one row per run; the rows and the state are off its way.

Must not know: the failover state machine (the pair tells the broker to lead or to
follow: see ``Broker.lead``/``Broker.follow``), the store's files. See
docs/durability.md, section 5.
"""

from __future__ import annotations

import collections
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands
from pamqp.header import ContentHeader

from failover import keys
from peering import ConsumerLink, Link, LinkClosed

from .core import codec, feedauth
from .core.apply import apply_run, state_changes
from .core.changes import (
    Batch,
    Bound,
    Change,
    DedupSeen,
    Enqueued,
    PendingRun,
    QueueDeclared,
    Reset,
    RunWritten,
    Settled,
    SnapshotEnd,
    SnapshotPart,
    Unbound,
)
from .core.reserved import FEED_QUEUE
from .core.sync import Eligibility, Leader, Phase, SentRun

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
    __slots__ = ("outlet", "prefetch", "key")

    def __init__(self, outlet: Outlet, key: bytes) -> None:
        self.outlet = outlet
        self.prefetch = outlet.prefetch or FOLLOWER_PREFETCH
        self.key = key  # the session key: every run's MAC (core/feedauth.py)


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
        self.leader = Leader()
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

    def subscribe(self, outlet: Outlet, key: bytes) -> None:
        """The PASSIVE, proven (the channel checked its proof), subscribes: at most one
        at a time (the channel refuses a second while one is live)."""
        assert self.subscriber is None
        log_ = self.broker.log
        self.subscriber = _Subscriber(outlet, key)
        self.leader.subscribe()
        # The state already holds every change up to the log's last LSN, taken or not.
        self._snapshot_lsn = log_.lsn if log_ is not None else 0
        self._snapshot = state_changes(self.broker.vhosts)
        self._carry = []
        self._pending.clear()
        self.backlog_bytes = 0
        self.sent_lsn = self._snapshot_lsn
        self.snapshots += 1
        self.snapshot_changes = 0
        log.info("replication: %s subscribed, sending a snapshot", outlet.peer)
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
        self._snapshot = None
        self._carry = []
        self._pending.clear()
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
        if self.subscriber is None:
            return
        last = first_lsn + len(changes) - 1
        if last <= self._snapshot_lsn:
            return
        if first_lsn <= self._snapshot_lsn:
            changes = changes[self._snapshot_lsn - first_lsn + 1 :]
            first_lsn = self._snapshot_lsn + 1
        size = _size(changes)
        self._pending.append((first_lsn, changes, size))
        self.backlog_bytes += size
        if self.backlog_bytes > MAX_BACKLOG_BYTES:
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
        body = codec.encode(first, changes)
        tag = outlet.next_tag()
        marker = headers.get(IN_SYNC) if headers else None
        headers = {SNAPSHOT_END: True} if end else dict(headers or {})
        headers[feedauth.MAC_HEADER] = feedauth.run_mac(subscriber.key, tag, end, marker, body)
        header = ContentHeader(0, len(body), commands.Basic.Properties(headers=headers)).marshal()
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
            sync_lsn = leader.sync_lsn
            # The marker: after every run it covers, so the PASSIVE reads it holding them.
            self._send(subscriber, 0, [], 0, False, None, {IN_SYNC: sync_lsn})
            self.on_sync(
                True,
                f"the passive holds the snapshot ({self.snapshot_changes} changes) and every "
                f"change confirmed without it (through LSN {sync_lsn})",
            )
        elif synced.moved:
            self.on_sync(True, "")
        self.push()

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
            "snapshots": self.snapshots,
            "refused_subscriptions": self.refusals,
        }


def _cut(changes: list[Change], budget: int = RUN_BYTES) -> int:
    """How many of ``changes`` make a run: at most RUN_CHANGES, and past ``budget``
    bytes only by its last change (at least one)."""
    size = 0
    for count, change in enumerate(changes[:RUN_CHANGES], 1):
        size += _size([change])
        if size >= budget:
            return count
    return min(len(changes), RUN_CHANGES)


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


class _Session:
    """One subscription's proof state: the session key, the next delivery tag."""

    __slots__ = ("key", "next_tag")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.next_tag: int | None = None  # the first run's tag starts the count


def max_run_bytes(max_message_size: int) -> int:
    """The largest run a follower reads: a run is cut after RUN_BYTES, so it holds at
    most that and one more change (a message, or a transaction's)."""
    return RUN_BYTES + 2 * max_message_size + (1 << 20)


class Follower:
    """The PASSIVE's side: subscribe to the ACTIVE's feed, apply, store, ack."""

    def __init__(
        self,
        broker: ReplicationHost,
        url: str,
        on_sync: Callable[[bool, str], None],
        connect_options: dict[str, Any],
        name: str,
        secret: bytes,
    ) -> None:
        self.broker = broker
        self.secret = secret
        self.on_sync = on_sync
        self.eligibility = Eligibility()
        self.state = "connecting"
        self.applied = 0
        self.runs = 0
        self.snapshot_started = 0.0
        self.last_snapshot_seconds: float | None = None
        # From a snapshot's end on disk to its last run applied (``_apply_next``).
        self.applying_since: float | None = None
        self.last_apply_seconds: float | None = None
        # Runs kept in the store as received and not applied yet, in order:
        # (seq, changes, now) for a live run (decoded on arrival, kept decoded), (seq,
        # bytes, now) for a snapshot's run (decoded again when applied: held as bytes,
        # it takes about 60% of the memory). Every run is decoded, so validated, before
        # anything of it is stored or acked.
        self._unapplied: collections.deque[tuple[int, list[Change] | bytes, float]] = (
            collections.deque()
        )
        # A snapshot is arriving (from its first run to its end on disk): nothing is
        # applied meanwhile, so the runs are stored and acked as fast as they come.
        self._receiving_snapshot = False
        self._writing = 0  # applied runs whose rows the store has not written yet
        self.pending_runs = 0  # runs kept as received, their changes not written yet
        self.refused_runs = 0  # runs that did not authenticate or validate
        # This server leads now (``detach``): nothing more from the feed is applied or acked.
        self.detached = False
        self.link = ConsumerLink(
            url,
            FEED_QUEUE,
            self._on_run,
            name=f"{name}->replication",
            prefetch=FOLLOWER_PREFETCH,
            on_up=self._subscribed,
            on_cancelled=self._cancelled,
            consume_arguments=self._consume_arguments,
            login_proof=self._login_proof,
            max_body=max_run_bytes(broker.config.limits.max_message_size),
            client_properties={"product": "amqha replication", "amqha_node": name},
            **connect_options,
        )

    @property
    def in_sync(self) -> bool:
        """Eligible to take over: the ACTIVE has said this server holds every change it
        ever confirmed, and nothing since has ended that (``core.sync.Eligibility``)."""
        return self.eligibility.in_sync

    async def start(self) -> None:
        await self.link.start()

    def detach(self) -> None:
        """This server leads now: from this instant no run is applied, no marker taken and
        nothing acked, even a run whose write completes later (its changes are in the
        state already, ``settle`` having run), and the link is closed. An ack sent after
        leading would let the old ACTIVE, still serving in a split, confirm a change on
        the word of a server that no longer follows it. ``stop`` ends the reconnecting."""
        self.detached = True
        current = self.link.link
        if current is not None:
            current.close("this server is ACTIVE now")

    async def stop(self) -> None:
        await self.link.stop()

    def settle(self) -> None:
        """Apply, in order, every run kept and not applied yet (before this server
        leads: what it leads with holds every run it received)."""
        unapplied = self._unapplied
        while unapplied:
            self._apply_next()

    def _apply_next(self) -> int:
        """Apply the oldest kept run: its changes to the state and to the store as rows,
        with the run's removal (a write without an fsync: the run was on disk first).
        Returns the LSN the store must pass for those rows."""
        seq, run, now = self._unapplied.popleft()
        changes = codec.decode(run)[1] if isinstance(run, bytes) else run
        self.pending_runs -= 1
        self.applied += len(changes)
        broker = self.broker
        lsn = broker.replicated([*changes, RunWritten(seq)])
        apply_run(broker, changes, now)
        if not self._unapplied and self.applying_since is not None:
            log.info(
                "replication: every kept run applied, %.3f s after the snapshot's end was on disk",
                time.monotonic() - self.applying_since,
            )
            self.last_apply_seconds = round(time.monotonic() - self.applying_since, 3)
            self.applying_since = None
        return lsn

    def _drain(self) -> None:
        """Apply kept runs in the background, in order: at most ``APPLY_AHEAD`` whose rows
        the store has not written yet (the store's writer sets the pace), and none while
        a snapshot arrives. Each step returns to the loop, so that runs still arriving
        are stored and acked between two steps."""
        if self.detached or self._receiving_snapshot:
            return
        while self._unapplied and self._writing < APPLY_AHEAD:
            self._writing += 1
            self.broker.when_safe(self._apply_next(), self._written)

    def _written(self, ok: bool) -> None:
        self._writing -= 1
        if not ok and not self.detached:
            # The run stays in the store's runs table, to be written at its next open,
            # after runs written since: a new snapshot must replace it first (its Reset
            # removes the runs kept before it). The state goes on in order meanwhile.
            current = self.link.link
            if current is not None:
                self._store_failed(current)
        self._drain()

    def _ended(self, reason: str) -> None:
        if self.eligibility.ended():
            self.on_sync(False, reason)

    def _subscribed(self) -> None:
        """A new subscription: the ACTIVE sends a new snapshot, so whatever this server
        held is not known to be complete until the ACTIVE says so again."""
        if self.detached:
            return
        self.state = "catching_up"
        if self.eligibility.subscribed():
            self.on_sync(False, "subscribed again to the ACTIVE's feed: catching up")

    def _login_proof(self, server_properties: dict[str, Any]) -> str:
        """The peering login answers the ACTIVE's nonce: its password is never sent
        (docs/security.md, "Logins")."""
        server_nonce = feedauth.parse_nonce(server_properties.get(feedauth.NONCE_PROPERTY))
        if server_nonce is None:
            raise LinkClosed("the server gave no nonce: not an amqha server that can feed us")
        return keys.peering_login_proof(self.secret, server_nonce, self.link.user)

    def _consume_arguments(self, link: Link, server_properties: dict[str, Any]) -> dict[str, Any]:
        """At Connection.Start: prove the pair's secret, bound to the server's nonce, and
        keep the session key that every run must carry a MAC with (core/feedauth.py)."""
        server_nonce = feedauth.parse_nonce(server_properties.get(feedauth.NONCE_PROPERTY))
        if server_nonce is None:
            raise LinkClosed("the server gave no nonce: not an amqha server that can feed us")
        client_nonce = secrets.token_bytes(feedauth.NONCE_BYTES)
        link.context = _Session(feedauth.session_key(self.secret, server_nonce, client_nonce))
        return {
            feedauth.NONCE_ARGUMENT: client_nonce.hex(),
            feedauth.PROOF_ARGUMENT: feedauth.subscribe_proof(
                self.secret, server_nonce, client_nonce
            ),
        }

    def _authentic(
        self, link: Link, tag: int, headers: dict[str, Any], marker: Any, end: bool, body: bytes
    ) -> bool:
        """Whether a run comes from the pair's ACTIVE, in order and unchanged. A run that
        does not is refused: never stored, applied or acked, and the link is closed."""
        session = link.context
        problem = None
        if not isinstance(session, _Session):
            problem = "a run on a link with no proof"
        elif session.next_tag is not None and tag != session.next_tag:
            problem = f"a run out of order (tag {tag}, expected {session.next_tag})"
        elif marker is not None and (
            not isinstance(marker, int) or isinstance(marker, bool) or not 0 <= marker < 1 << 63
        ):
            problem = "an in-sync marker without an LSN"
        elif not feedauth.run_mac_holds(
            session.key, tag, end, marker, body, headers.get(feedauth.MAC_HEADER)
        ):
            problem = "a run whose MAC does not hold: not from the pair's ACTIVE, or altered"
        if problem is None:
            session.next_tag = tag + 1
            return True
        self.refused_runs += 1
        log.error("replication: %s: refused, resubscribing", problem)
        self._ended(f"refused {problem}")
        link.close(problem)
        return False

    def _cancelled(self) -> None:
        """The ACTIVE ended the subscription while serving on: it confirms alone now."""
        if self.detached:
            return
        self._ended("the ACTIVE cancelled the replication subscription")

    def _declared(self, link: Link, tag: int, sync_lsn: int) -> None:
        """The ACTIVE's marker: every change it confirmed is in this server's store."""
        link.ack(tag)
        self.state = "in_sync"
        if self.eligibility.declared(sync_lsn):
            seconds = round(time.monotonic() - self.snapshot_started, 3)
            self.on_sync(
                True,
                f"in sync at LSN {sync_lsn}, {seconds} s after the snapshot started "
                f"(snapshot on disk in {self.last_snapshot_seconds} s, "
                f"{len(self._unapplied)} runs to apply)",
            )

    def _on_run(
        self, link: Link, tag: int, properties: commands.Basic.Properties, body: bytes
    ) -> None:
        """One run from the feed, in the socket's read (see the module docstring)."""
        if self.detached:
            return
        headers = properties.headers or {}
        marker = headers.get(IN_SYNC)
        end = bool(headers.get(SNAPSHOT_END))
        if not self._authentic(link, tag, headers, marker, end, body):
            return
        if marker is not None:
            self._declared(link, tag, marker)
            return
        try:
            first, changes = codec.decode(body)
        except ValueError as error:
            self.refused_runs += 1
            log.error("replication: a run that does not decode (%s): resubscribing", error)
            self._ended("a run from the ACTIVE that does not decode")
            link.close("a run that does not decode")
            return
        if changes and type(changes[0]) is Reset:  # a snapshot starts
            self._reset()
        self._keep(link, tag, body, changes, first == 0, end)

    def _keep(
        self, link: Link, tag: int, body: bytes, changes: list[Change], snapshot: bool, end: bool
    ) -> None:
        """A run, decoded (so valid): kept in the store as received (one row), acked once
        that is written, its changes applied and written as rows after (``_drain``).

        A live run's row is written with an fsync. A snapshot's run before its last is
        written without one: only the last one's ack counts (``core.sync.Leader``), its
        write has an fsync whatever it holds, which covers every write before it, and a
        crash before it leaves the data dir's ``incomplete`` mark (on disk before the
        snapshot's first run): the snapshot is taken again. A snapshot's runs are
        applied once its end is on disk, so that what the ACTIVE waits for (the end's
        ack, then the marker) is the decode and one row per run."""
        broker = self.broker
        seq = next(_RUN_SEQS)
        if snapshot:
            lsn = broker.replicated(
                [PendingRun(seq, body), SnapshotEnd() if end else SnapshotPart()]
            )
            self._unapplied.append((seq, body, broker.now()))
        else:
            lsn = broker.replicated([PendingRun(seq, body)])
            self._unapplied.append((seq, changes, broker.now()))
        self.pending_runs += 1
        self.runs += 1

        def kept(ok: bool) -> None:
            if self.detached:
                return
            if not ok:
                self._store_failed(link)
                return
            if end:
                # Not yet in sync: the ACTIVE confirmed changes alone meanwhile, and says
                # when this server holds them (its marker).
                self.state = "closing"
                self.last_snapshot_seconds = round(time.monotonic() - self.snapshot_started, 3)
                self._receiving_snapshot = False
                self.applying_since = time.monotonic()
                log.info(
                    "replication: snapshot on disk in %s s (%d runs to apply); waiting for "
                    "the ACTIVE's word",
                    self.last_snapshot_seconds,
                    len(self._unapplied),
                )
            link.ack(tag)
            self._drain()

        broker.when_safe(lsn, kept)

    def _store_failed(self, link: Link) -> None:
        # Not on this disk: never acked. The link is dropped so the ACTIVE stops waiting
        # for us (it confirms on its own store, and says so); we subscribe again, from a
        # new snapshot, once writes work.
        self.state = "store_failing"
        self._ended("this server's store could not write the changes")
        link.close("this server's store could not write the changes")

    def _reset(self) -> None:
        self.snapshot_started = time.monotonic()
        self.state = "catching_up"
        self._receiving_snapshot = True
        self._ended("a new snapshot from the ACTIVE")
        self.broker.before_reset()

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state if self.link.connected else "disconnected",
            "in_sync": self.in_sync,
            "sync_lsn": self.eligibility.sync_lsn,
            "applied_changes": self.applied,
            "runs": self.runs,
            "pending_runs": self.pending_runs,
            "unapplied_runs": len(self._unapplied),
            "refused_runs": self.refused_runs,
            "last_snapshot_seconds": self.last_snapshot_seconds,
            "last_apply_seconds": self.last_apply_seconds,
        }
