"""The broker's leadership: leading (the replication feed) or following (the follower).

Owns: what a server does when the failover controller makes it ACTIVE (its block of message
ids for the term, the feed that replicates to the PASSIVE, the unprotected mark while no
PASSIVE is in sync) or PASSIVE (the follower that takes the ACTIVE's changes, the reset
before a snapshot), and the replication status the console and metrics show
(docs/durability.md).

Must not know: the failover state machine (it is told to lead or follow), sockets. A part
of ``server.Broker``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from .follower import Follower
from .quarantine import (
    clear_incomplete,
    clear_unprotected_mark,
    mark_incomplete,
    quarantine,
    read_unprotected_mark,
    write_unprotected_mark,
)
from .read_holds import READ_HELD_SWITCHOVER

log = logging.getLogger("amqha.server")

# Message ids of one ACTIVE term: a block of 2**40 per (epoch, role).
ID_BLOCK_BITS = 40
# How often a client that a switchover's drain does not read hears a heartbeat from this
# server. A client awaiting confirms leaves a server it hears nothing from for its
# silent_after (amqha.client: 1.2 s by default) as a frozen one, and sends again what it
# had not seen confirmed: copies of messages this server stored and was about to
# confirm. The drain (waiting on the PASSIVE's disk) may take that long on a busy
# machine; a frozen server sends no heartbeat, so a real freeze is still seen
# (docs/failover.md, "Planned switchover").
DRAIN_HEARTBEAT = 0.2
# The longest a clean stop of an ACTIVE waits for its drain, and how often it looks.
STOP_DRAIN = 5.0
STOP_DRAIN_POLL = 0.005


class Leadership:
    """Lead and follow: part of ``Broker``."""

    def lead(self, epoch: int, role_bit: int) -> None:
        """This server is ACTIVE: its changes are logged (and fed to a PASSIVE), its
        timers run, and new message ids come from its own block for this epoch (two
        ACTIVE servers of a split never give the same id)."""
        self.ids.seen(((epoch * 2 + role_bit) << ID_BLOCK_BITS) - 1)
        self._led_epoch = epoch
        if self.leading:
            return
        self.leading = True
        if self.federation is not None:
            self.federation.set_leading(True)
        clear_incomplete(self.config.data_dir)  # what it leads with is the service now
        follower, self.follower = self.follower, None
        self._took_over = None
        if follower is not None:
            follower.settle()  # every run received is in the state this server leads with
            follower.detach()  # and nothing that arrives or completes later is acked
            self.loop.create_task(follower.stop())
            if follower.source_lsn and self.log is not None:
                self._took_over = (follower.source_lsn, self.log.lsn)
        for vhost in self.vhosts.values():
            vhost.set_log(self.log)
            for queue in vhost.queues.values():
                self.watch_queue(queue)
        self.feed.set_leading(True)
        if not self.feed.in_sync:
            self._mark_unprotected(True)
            if self.pair_events is not None and self.config.replication.enabled:
                self.pair_events.sync_changed("active", False, "ACTIVE with no in-sync passive")

    def follow(self, url: str, connect_options: dict[str, Any]) -> None:
        """This server is PASSIVE: it takes its state from the ACTIVE at ``url``. An
        ACTIVE that steps down drained (its in-sync PASSIVE holds every change it logged:
        a handover) offers to resume where it left off rather than take a snapshot."""
        if not self.leading and self.follower is not None:
            return
        resume = self._resume_point()
        self.leading = False
        self.switching = False
        if self.federation is not None:
            self.federation.set_leading(False)
        self.feed.drop("this server is no longer ACTIVE")
        self.feed.set_leading(False)
        for vhost in self.vhosts.values():
            vhost.set_log(None)
        if not self.config.replication.enabled or self.store is None:
            return
        if self.disk_failed is not None:
            log.error("not following the ACTIVE: this server's disk failed (%s)", self.disk_failed)
            return
        self._follow_with = (url, connect_options)
        if resume is not None:
            # Not in sync until the ACTIVE says so, even across a restart.
            mark_incomplete(self.config.data_dir)
        self.follower = Follower(
            self,
            url,
            self._follower_sync,
            connect_options,
            self.config.name,
            self.config.failover.secret,
            resume,
        )
        self.loop.create_task(self.follower.start())

    def _resume_point(self) -> tuple[int, int] | None:
        """Where this server may resume following from (the epoch it led in, its last
        LSN), if it is an ACTIVE stepping down drained; else None (a snapshot). A queue
        left out of replication rules it out: a snapshot's reset is what takes its
        messages to a quarantine (docs/durability.md, section 5, "Resuming after a
        handover")."""
        log_ = self.log
        if not self.leading or log_ is None:
            return None
        if not self.feed.in_sync:
            why = "no PASSIVE was in sync"
        elif self.feed.replicated_lsn != log_.lsn:
            why = f"the PASSIVE held LSN {self.feed.replicated_lsn} of {log_.lsn}"
        elif any(vhost.unreplicated for vhost in self.vhosts.values()):
            why = "a queue is left out of replication"
        else:
            return self._led_epoch, log_.lsn
        log.info("stepping down: it takes a snapshot to follow (%s)", why)
        return None

    def refollow(self) -> None:
        """This PASSIVE's ACTIVE leads in a new term (restarted and leading again before we
        subscribed to it): what this server held in sync was the term before's. Subscribe
        again, from a snapshot (docs/durability.md, section 5, "A new term")."""
        follower = self.follower
        if self.leading or follower is None:
            return
        follower.settle()
        follower.detach()
        self.loop.create_task(follower.stop())
        self.follower = None
        self.follow(*self._follow_with)

    def hold_clients(self, hold: bool) -> None:
        """A planned switchover (failover/switchover.py): no client connection is read
        while it drains, so nothing changes but what was read before; what clients sent
        meanwhile waits in their sockets for the new ACTIVE."""
        self.switching = hold
        for connection in self.client_connections():
            connection.hold_reading(READ_HELD_SWITCHOVER, hold)
        if self.drain_heartbeats is not None:
            self.drain_heartbeats.cancel()
            self.drain_heartbeats = None
        if hold:
            self.drain_heartbeats = self.loop.call_later(DRAIN_HEARTBEAT, self._drain_heartbeat)
        if not hold and self.leading:
            # The switchover failed and this server serves on: what a channel closed
            # meanwhile gave back (not sent on while switching: channel.py) goes out now.
            now = self.now()
            for vhost in self.vhosts.values():
                for queue in vhost.queues.values():
                    queue.drain(now)

    def _drain_heartbeat(self) -> None:
        """While a switchover drains: every client not read hears this server is alive."""
        self.drain_heartbeats = None
        if not self.switching:
            return
        for connection in self.client_connections():
            connection.heartbeat_now()
        self.drain_heartbeats = self.loop.call_later(DRAIN_HEARTBEAT, self._drain_heartbeat)

    async def drain_before_stop(self) -> None:
        """A clean stop of an ACTIVE whose PASSIVE is in sync drains first, as a
        switchover does: its clients are not read from now on, and it waits (at most
        ``STOP_DRAIN`` s) until every publish it read is confirmed to its client and every
        change it logged is on the PASSIVE's disk. No run is then in flight as the
        replication link closes, so nothing is marked as possibly on this server alone
        (its restart would quarantine it), and no client is left to send again what was
        stored (docs/failover.md, "A clean stop")."""
        if not self.leading or self.config.failover.role is None or not self.feed.in_sync:
            return
        self.hold_clients(True)
        deadline = self.loop.time() + STOP_DRAIN
        why = self.undrained()
        while why is not None and self.feed.in_sync and self.loop.time() < deadline:
            await asyncio.sleep(STOP_DRAIN_POLL)
            why = self.undrained()
        if why is not None:
            log.warning("stopping undrained: %s", why)

    def passive_in_sync(self) -> bool:
        return self.feed.in_sync

    def hold_until_rejoined(self, seconds: float, handed_over_in: int | None = None) -> None:
        took_over = self._took_over
        if handed_over_in is not None and took_over is not None and self.leading:
            source_lsn, base_lsn = took_over
            self.feed.keep_for_resume((handed_over_in, source_lsn), base_lsn)
        self.feed.hold_until_in_sync(seconds)

    def undrained(self) -> str | None:
        if not self.feed.in_sync:
            return "no PASSIVE in sync"
        waiting = self.confirms.waiting
        if waiting.trackers or waiting.commits:
            return "confirms wait for the store or the PASSIVE"
        for connection in self.client_connections():
            if connection.due_confirms or connection.backlog is not None:
                return "confirms not yet written to a client"
        log_ = self.log
        if log_ is not None and self.feed.replicated_lsn < log_.lsn:
            # Deliveries and acks too: the new ACTIVE must know what was delivered here
            # (redelivered) and what was settled (gone).
            return f"the PASSIVE holds LSN {self.feed.replicated_lsn} of {log_.lsn}"
        return None

    def passive_stalled(self, limit: float) -> None:
        if self.leading:
            self.feed.drop_if_stalled(limit)

    def following_in_sync(self) -> bool:
        follower = self.follower
        return follower.in_sync if follower is not None else True

    def replicated(self, changes: list[Any]) -> int:
        """Changes received from the ACTIVE (a kept run, or a kept run's changes): to the
        store, like ours. Returns the LSN the store must pass for them."""
        log_ = self.log
        assert log_ is not None
        log_.extend(changes, True)
        self._take_changes()  # now, not when the turn ends: the writer starts at once
        return log_.lsn

    def before_reset(self) -> None:
        """A snapshot from the ACTIVE is about to replace the durable state: messages the
        ACTIVE never had (accepted while this server had no in-sync PASSIVE, as a split
        brain's losing side, or on a queue left out of replication) are kept in a
        quarantine file first, and reported."""
        mark = read_unprotected_mark(self.config.data_dir)
        found = quarantine(self.vhosts, mark, self.config.data_dir, self.config.name)
        mark_incomplete(self.config.data_dir)
        if mark is not None:
            clear_unprotected_mark(self.config.data_dir)
        if found is not None:
            self.quarantined.append(found)
            log.warning(
                "quarantined %d messages the ACTIVE never had into %s",
                found["messages"],
                found["path"],
            )
            if self.pair_events is not None:
                self.pair_events.quarantined(found)

    def _mark_unprotected(self, unprotected: bool, first_id: int | None = None) -> None:
        if not self.leading or self.store is None or not self.config.replication.enabled:
            return
        if unprotected:
            if read_unprotected_mark(self.config.data_dir) is None:
                mark = self.ids.next if first_id is None else first_id
                write_unprotected_mark(self.config.data_dir, mark)
        else:
            clear_unprotected_mark(self.config.data_dir)

    def replication_status(self) -> dict[str, Any]:
        if not self.config.replication.enabled:
            return {"enabled": False}
        status: dict[str, Any] = {"enabled": True, "leading": self.leading}
        if self.leading:
            status["feed"] = self.feed.status()
        if self.follower is not None:
            status["follower"] = self.follower.status()
        # A file replayed whole is renamed (``amqha quarantine replay``): no longer held.
        held = [found for found in self.quarantined if os.path.exists(found["path"])]
        if held:
            status["quarantined"] = held
        if self.store_damaged is not None:
            status["store_damaged"] = self.store_damaged
        return status

    def _feed_sync(self, in_sync: bool, reason: str) -> None:
        """The feed's subscriber became (or stopped being) an in-sync PASSIVE, or acked."""
        if reason:
            if in_sync:
                self._mark_unprotected(False)
            if self.pair_events is not None:
                self.pair_events.sync_changed("active", in_sync, reason)
        self.confirms.advance()

    def _feed_unprotected(self, first_id: int) -> None:
        """The in-sync PASSIVE is gone: messages from ``first_id`` on may be on this
        server alone (those it was sent and had not acked included)."""
        self._mark_unprotected(True, first_id)

    def _follower_sync(self, in_sync: bool, reason: str) -> None:
        if in_sync:
            clear_incomplete(self.config.data_dir)
        if self.pair_events is not None:
            self.pair_events.sync_changed("passive", in_sync, reason)
