"""Replication, the PASSIVE's side: the ``Follower`` (docs/durability.md, section 5).

Owns: the lean consuming link (``peering.ConsumerLink``) to the ACTIVE, subscribed to its
feed (``replication.Feed``) with proof of the pair's secret. Each run is handled in the
socket's read, its MAC checked first; it is eligible to take over only from the ACTIVE's
marker on (``core.sync.Eligibility``). Every run is decoded (so validated) before anything
of it is stored or acked, then kept in the store as received (a pending run: one row),
acked once that is written, and applied with ``core.apply`` (the same function as
recovery) and written as rows after, in order, paced by the store's writer. A live run's
row is written with an fsync; a snapshot's runs before its last without one (the last
one's covers them). What the ACTIVE waits for is the decode and one row per run, and,
only once more than a bound is kept and not applied, the apply: so a takeover, which
applies what is left before it serves, is quick at any moment, right after a catch-up
of millions of messages too.

Must not know: the failover state machine (the pair tells the broker to follow), the
store's files, the feed's side of the protocol (``replication``).
"""

from __future__ import annotations

import collections
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from failover import keys
from peering import ConsumerLink, Link, LinkClosed

from .core import codec, feedauth, protocol
from .core.apply import apply_run
from .core.changes import (
    Change,
    PendingRun,
    Reset,
    RunWritten,
    SnapshotEnd,
    SnapshotPart,
    Unsynced,
)
from .core.reserved import FEED_QUEUE
from .core.sync import Eligibility
from .store_write import needs_sync

if TYPE_CHECKING:
    from .host import ReplicationHost

from .replication import (
    _RUN_SEQS,
    APPLY_AHEAD,
    BEHIND,
    FOLLOWER_PREFETCH,
    IN_SYNC,
    RUN_BYTES,
    SNAPSHOT_END,
    UNAPPLIED_BYTES,
    UNAPPLIED_CHANGES,
)

log = logging.getLogger("amqha.replication")


def acks_may_go(unapplied_changes: int, unapplied_bytes: int, behind: bool) -> bool:
    """Whether the follower may ack what it kept: while what is kept and not applied is
    within the bound, or whatever it is while the ACTIVE says its backlog for this
    follower nears the limit at which it would drop it (``BEHIND``)."""
    return behind or (unapplied_changes <= UNAPPLIED_CHANGES and unapplied_bytes <= UNAPPLIED_BYTES)


def keep_entries(
    seq: int, body: bytes, changes: list[Change], snapshot: bool, end: bool
) -> list[Any]:
    """What the store writes to keep a run as received: the run, and what says whether
    its write needs an fsync. A snapshot's run before its last needs none (its last one's
    covers it); a live run needs one if its changes would (``store_write.needs_sync``: a
    persistent message, wiring), not if it holds only what a confirm never waits for
    (a consumer's settles and delivery marks, transient messages), as the ACTIVE writes
    those (docs/durability.md, section 5)."""
    if snapshot:
        return [PendingRun(seq, body), SnapshotEnd() if end else SnapshotPart()]
    if needs_sync(changes):
        return [PendingRun(seq, body)]
    return [PendingRun(seq, body), Unsynced()]


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
        resume: tuple[int, int] | None = None,
    ) -> None:
        self.broker = broker
        # (the epoch this server led in, its last LSN): it handed the service over and
        # asks to resume from there (docs/durability.md, section 5, "Resuming after a
        # handover"), until the first run of a subscription says whether it does.
        self.resume = resume
        self.resumed = False
        # The ACTIVE's LSN of the last change this server received in a live run (0: none
        # since the last snapshot): where the ACTIVE stood, should it hand over.
        self.source_lsn = 0
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
        # Runs kept in the store as received and not applied yet, in order: (seq,
        # changes, now, bytes of the run). Every run is decoded, so validated, before
        # anything of it is stored or acked; what they hold in all is bounded
        # (``_release``), so that a takeover applies little before it serves.
        self._unapplied: collections.deque[tuple[int, list[Change], float, int]] = (
            collections.deque()
        )
        self._unapplied_changes = 0
        self._unapplied_bytes = 0
        # Acks of runs kept (and markers), in order, held while too much is unapplied.
        self._acks: collections.deque[tuple[Link, int]] = collections.deque()
        # The ACTIVE's last run said its backlog for us nears its limit (``BEHIND``).
        self._behind = False
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

    def detach(self, reason: str = "this server is ACTIVE now") -> None:
        """This server leads now: from this instant no run is applied, no marker taken and
        nothing acked, even a run whose write completes later (its changes are in the
        state already, ``settle`` having run), and the link is closed. An ack sent after
        leading would let the old ACTIVE, still serving in a split, confirm a change on
        the word of a server that no longer follows it. ``stop`` ends the reconnecting."""
        self.detached = True
        self._acks.clear()
        current = self.link.link
        if current is not None:
            current.close(reason)

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
        seq, changes, now, size = self._unapplied.popleft()
        self._unapplied_changes -= len(changes)
        self._unapplied_bytes -= size
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
        the store has not written yet (the store's writer sets the pace). Each step
        returns to the loop, so that runs still arriving are stored and acked between
        two steps."""
        if self.detached:
            return
        while self._unapplied and self._writing < APPLY_AHEAD:
            self._writing += 1
            self.broker.when_safe(self._apply_next(), self._written)
        self._release()

    def _ack(self, link: Link, tag: int) -> None:
        self._acks.append((link, tag))
        self._release()

    def _release(self) -> None:
        """Send the acks held, in order, while what is kept and not applied is within
        ``UNAPPLIED_CHANGES`` and ``UNAPPLIED_BYTES``. Beyond, the ACTIVE waits for the
        apply (its prefetch runs out): a PASSIVE in sync never holds more than that and
        the prefetch to apply, so its takeover is quick whatever the backlog it caught
        up on; unless the ACTIVE says it is near dropping us (``acks_may_go``)
        (docs/durability.md, section 5, "Acks and flow")."""
        acks = self._acks
        while acks and acks_may_go(self._unapplied_changes, self._unapplied_bytes, self._behind):
            link, tag = acks.popleft()
            link.ack(tag)

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
        key = feedauth.session_key(self.secret, server_nonce, client_nonce)
        link.context = _Session(key)
        arguments = {
            protocol.ARGUMENT: protocol.PROTOCOL,
            feedauth.NONCE_ARGUMENT: client_nonce.hex(),
            feedauth.PROOF_ARGUMENT: feedauth.subscribe_proof(
                self.secret, server_nonce, client_nonce
            ),
        }
        if self.resume is not None:
            arguments[feedauth.RESUME_ARGUMENT] = feedauth.resume_argument(key, *self.resume)
        return arguments

    def _first_run(self, snapshot: bool) -> None:
        """The first run of a subscription that asked to resume: a snapshot's (the ACTIVE
        could not resume it) or not (it did: no snapshot)."""
        self.resume = None
        if not snapshot:
            self.resumed = True
            self.snapshot_started = time.monotonic()
            log.info("replication: resumed where this server handed the service over: no snapshot")

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
        self._ack(link, tag)
        self.state = "in_sync"
        if self.eligibility.declared(sync_lsn):
            seconds = round(time.monotonic() - self.snapshot_started, 3)
            if self.resumed:
                how = (
                    f"resumed where this server handed the service over, {seconds} s after"
                    " it subscribed (no snapshot)"
                )
            else:
                how = (
                    f"{seconds} s after the snapshot started (snapshot on disk in "
                    f"{self.last_snapshot_seconds} s, {len(self._unapplied)} runs to apply: "
                    f"{self._unapplied_changes} changes, {self._unapplied_bytes} bytes)"
                )
            self.on_sync(True, f"in sync at LSN {sync_lsn}, {how}")

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
        self._behind = bool(headers.get(BEHIND))
        if marker is not None:
            if self.resume is not None:
                self._first_run(False)
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
        if self.resume is not None:
            self._first_run(first == 0)
        if changes and type(changes[0]) is Reset:  # a snapshot starts
            self._reset()
        elif first and changes:
            self.source_lsn = first + len(changes) - 1  # live runs tile the ACTIVE's LSNs
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
        snapshot's first run): the snapshot is taken again. The ack waits for the
        apply only beyond the bound (``_release``)."""
        broker = self.broker
        seq = next(_RUN_SEQS)
        lsn = broker.replicated(keep_entries(seq, body, changes, snapshot, end))
        self._unapplied.append((seq, changes, broker.now(), len(body)))
        self._unapplied_changes += len(changes)
        self._unapplied_bytes += len(body)
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
                self.applying_since = time.monotonic()
                log.info(
                    "replication: snapshot on disk in %s s (%d runs to apply); waiting for "
                    "the ACTIVE's word",
                    self.last_snapshot_seconds,
                    len(self._unapplied),
                )
            self._ack(link, tag)  # before the apply: within the bound, at once
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
        self.source_lsn = 0
        self.resumed = False
        self.snapshot_started = time.monotonic()
        self.state = "catching_up"
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
            "unapplied_changes": self._unapplied_changes,
            "held_acks": len(self._acks),
            "refused_runs": self.refused_runs,
            "last_snapshot_seconds": self.last_snapshot_seconds,
            "last_apply_seconds": self.last_apply_seconds,
            "resumed": self.resumed,
        }
