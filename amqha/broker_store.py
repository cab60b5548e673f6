"""The broker's side of its store: open and recover, hand over each turn's changes, and
release confirms as the store (and the PASSIVE) hold them (docs/durability.md).

Owns: opening the store and replaying what it holds into the vhosts, the hand-over of
the change log once per turn of the loop, the store's progress as a sink of the confirm
watermark (``StoreSink``), the publishes refused when a write fails (and publishers
held until a retry writes), and closing the store. What the store's progress releases is the confirm pipeline's
(``confirm_pipeline.py``), to which this side reports.

Must not know: SQLite (``store.py``), frames. A part of ``server.Broker``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .core.apply import apply_run, reset
from .core.changes import ChangeLog
from .quarantine import mark_incomplete
from .store_file import StoreDamaged, StoreError, set_aside

if TYPE_CHECKING:
    from .store import Store, StoreFailure

log = logging.getLogger("amqha.server")

# After a store write fails (a full disk), publishers stay blocked this long before the
# next write is tried.
STORE_RETRY = 1.0
# Recovery applies the stored changes this many at a time (core.apply.apply_run).
RECOVER_RUN = 4096


class StoreSink:
    """The store as a sink of the confirm watermark: it keeps its own progress, what its
    writer reported written (``written``)."""

    __slots__ = ("store", "written")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.written = 0  # the store has everything up to this LSN on disk

    def submit(self, first_lsn: int, changes: Sequence[Any]) -> None:
        self.store.submit(first_lsn, changes)

    def reported(self, last_lsn: int) -> None:
        """The writer wrote (or failed: it is not written again) up to ``last_lsn``."""
        if last_lsn > self.written:
            self.written = last_lsn

    def holds(self) -> int | None:
        return self.written


class StoreSide:
    """The store's hand-over and the confirms it releases: part of ``Broker``."""

    def open_store(self) -> None:
        """Open the store, rebuild the durable state from it, then log every change to it.

        A store that cannot be read raises ``StoreError`` (one line naming the file)."""
        if not self.config.store.enabled:
            return
        from .store import Store

        started = time.monotonic()
        path = self.config.store_path

        def recovered() -> Store:
            store = Store.open(path, self.config.store.max_bytes)
            try:
                now = self.now()
                changes = store.recover()
                while run := list(itertools.islice(changes, RECOVER_RUN)):
                    apply_run(self, run, now)
            except BaseException:
                store.abandon()
                raise
            return store

        try:
            store = recovered()
        except StoreDamaged as damage:
            self._set_aside(path, damage)
            store = recovered()
        self.ids.seen(store.max_msg_id())
        counts = store.counts()
        seconds = time.monotonic() - started
        pending = store.pending_runs_written
        self.recovered = dict(counts, seconds=round(seconds, 3), path=path, pending_runs=pending)
        if counts.get("queues") or counts.get("messages") or pending:
            # Runs a PASSIVE acked and had not written as rows yet: written at open.
            kept = f" ({pending} runs from the ACTIVE written first)" if pending else ""
            print(
                f"amqha {self.config.name}: recovered {counts.get('queues', 0)} durable "
                f"queues and {counts.get('messages', 0)} persistent messages from {path} "
                f"in {seconds:.2f} s{kept}",
                file=sys.stderr,
                flush=True,
            )
        self.log = ChangeLog(self._changes_pending)
        for vhost in self.vhosts.values():
            vhost.set_log(self.log)
            for queue in vhost.queues.values():
                self.watch_queue(queue)
        store.start(self._store_notified)
        self.store = store
        # The feed first: the PASSIVE's store is the longer way to the watermark.
        self.store_sink = StoreSink(store)
        self.sinks = [self.feed, self.store_sink]
        self.confirms.attach(self.sinks)

    def _set_aside(self, path: str, damage: StoreDamaged) -> None:
        """A damaged store (docs/durability.md, section 4, "A damaged store"): a server of
        a pair moves it aside and starts empty, not in sync, so that it takes its state
        from its ACTIVE and never leads on what it read; a server alone refuses to start."""
        if self.config.failover.role is None or not self.config.replication.enabled:
            raise StoreError(
                f"{damage}: with no peer to take its state from, this server does not start"
                " on it; move the file aside to start empty, or restore it from a backup"
            ) from None
        aside = set_aside(path, time.time())
        mark_incomplete(self.config.data_dir)
        for vhost in self.vhosts.values():
            reset(vhost)  # what was read before the damage showed
        log.error(
            "%s; set aside as %s: this server starts with an empty store, not in sync, and"
            " takes its state from its peer",
            damage,
            aside,
        )
        self.store_damaged = {"path": aside, "reason": str(damage)}
        if self.pair_events is not None:
            self.pair_events.store_damaged(self.store_damaged)

    def _changes_pending(self) -> None:
        """The first change of this turn: they all go to the store when the turn ends."""
        self.loop.call_soon(self._take_changes)

    def _take_changes(self) -> None:
        if self.log is None or self.store is None:
            return
        first, changes = self.log.take()
        if changes:
            for sink in self.sinks:
                sink.submit(first, changes)

    def _store_notified(self, last_lsn: int, failed: StoreFailure | None) -> None:
        """Called on the store's writer thread: hand the news to the loop."""
        # A closed loop: the server is gone and nothing waits any more.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._stored, last_lsn, failed)

    def _stored(self, last_lsn: int, failed: StoreFailure | None) -> None:
        self.store_sink.reported(last_lsn)
        if failed is not None:
            self.confirms.refuse(failed.first_lsn, failed.last_lsn)
            self.store_failures += 1
            if failed.broken:
                if self.disk_failed is None:
                    self._disk_failed(failed.error)
            else:
                if not self.store_failing:
                    log.warning(
                        "the store could not write (%s): publishes not stored are nacked and "
                        "publishers blocked; consumers are still served",
                        failed.error,
                    )
                    self.store_failing = True
                    self.update_blocked()
                if self.store_retry is None:
                    self.store_retry = self.loop.call_later(STORE_RETRY, self._retry_store)
        self.confirms.advance()

    def _disk_failed(self, error: str) -> None:
        """The store's disk failed (docs/durability.md, section 9): publishers blocked and
        every persistent publish nacked until a restart, consumers still served; the pair
        is told (an ACTIVE hands over to an in-sync PASSIVE; a PASSIVE stops following)."""
        self.disk_failed = error
        self.store_failing = True
        log.error(
            "the store's disk failed (%s): this server stores and confirms nothing more until"
            " it is restarted; publishers are blocked, consumers still served",
            error,
        )
        self.update_blocked()
        follower, self.follower = self.follower, None
        if follower is not None:  # nothing it receives can be kept: no more acks
            follower.detach("this server's disk failed")
            self.loop.create_task(follower.stop())
        if self.pair_events is not None:
            self.pair_events.disk_failed(error)

    def _retry_store(self) -> None:
        """Let publishers try again: a write that fails again blocks them again."""
        self.store_retry = None
        if self.store_failing and self.disk_failed is None:
            self.store_failing = False
            log.warning("retrying the store: publishers unblocked")
            self.update_blocked()

    def when_safe(self, lsn: int, done: Callable[[bool], None]) -> None:
        self.confirms.when_safe(lsn, done)

    def store_status(self) -> dict[str, Any]:
        if self.store is None:
            return {"enabled": False}
        return {
            "enabled": True,
            "path": self.config.store_path,
            "failing": self.store_failing,
            "disk_failed": self.disk_failed,
            "failures": self.store_failures,
            "lsn": self.log.lsn if self.log is not None else 0,
            "safe_lsn": self.store_sink.written,
            "recovered": self.recovered,
        }

    def close_store(self) -> None:
        """Write what the store has not been given yet, then close it."""
        if self.store_retry is not None:
            self.store_retry.cancel()
            self.store_retry = None
        store, self.store = self.store, None
        if store is None:
            return
        self.confirms.attach([])  # nothing is written any more: nothing waits for it
        if self.log is not None:
            first, changes = self.log.take()
            if changes:
                store.submit(first, changes)
        store.close()
