"""The rule after a freeze, the controller's side: noticing a freeze and holding work.

Owns: what happens between the heartbeat thread seeing a gap in its ticks and the machine
taking PAUSED (``fsm``; docs/failover.md, "Freezes"): the pending report that stops every
confirm, the early PAUSED fed when a client's Connection.Open is read first, the hold of
every client connection while the machine fences this ACTIVE, its release, and the
``freeze_fence`` records. ``FailoverController`` inherits it.

Must not know: how the machine decides (``fsm``), frames and sockets (the broker holds and
releases connections).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from amqha.gate import not_active_text
from amqha.logtext import escaped

from . import fsm

if TYPE_CHECKING:
    from amqha.gate import Member

    from .heartbeat import Heartbeat

log = logging.getLogger("amqha.failover")


class FreezeRule:
    """Mixed into ``FailoverController``, whose machine, broker and records it uses."""

    machine: fsm.Machine
    broker: Member
    heartbeat: Heartbeat
    timeout: float
    last_seq: int

    def apply(self, outcome: fsm.Outcome) -> fsm.Decision | None:
        raise NotImplementedError

    def _write(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def init_freeze_rule(self) -> None:
        # A freeze seen by the heartbeat thread and not yet fed to the machine (PAUSED):
        # (gap, first sequence number sent after the thaw). Nothing is confirmed meanwhile.
        self._pause_pending: tuple[float, int] | None = None
        # The freeze an early PAUSED was fed for (a client's Open before the report).
        self._early_pause_tick = 0.0
        self._early_pause: tuple[float, int] | None = None
        self._freeze_held = False  # a freeze_fence record says this ACTIVE is held
        self._asked_to_vote = False  # its held clients were closed to vote (once a freeze)

    def freeze_report_pending(self) -> bool:
        return self._pause_pending is not None

    def _fence(self, gap: float) -> None:
        """On the heartbeat thread, the moment it sees the gap: attribute writes only. No
        confirm goes out from here until the machine has taken PAUSED (``_on_pause``)."""
        # Anything we send from now on was sent after waking; an answer that echoes it is news.
        self._pause_pending = (gap, self.last_seq + 1)

    def _on_pause(self, gap: float) -> None:
        log.warning("this process was frozen for %.2f s (no heartbeat tick)", gap)
        self._write("paused", gap=round(gap, 3))
        pending = self._pause_pending
        thaw_seq = pending[1] if pending is not None else self.last_seq + 1
        self.apply(fsm.step(self.machine, fsm.Event.PAUSED, self.loop.time(), thaw_seq=thaw_seq))
        if self._pause_pending is pending:
            self._pause_pending = None
        self.heartbeat.poke()

    def _freeze_not_yet_reported(self, now: float) -> None:
        """After a thaw this loop may read a client's Connection.Open before the machine
        has taken the freeze: the heartbeat thread has seen the gap and its report is
        still queued here, or it has not even ticked yet (a tick older than the timeout).
        Either way the machine takes PAUSED now, so no vote counts silence across the
        freeze; the thread's own report follows and restarts the clocks once more."""
        pending = self._pause_pending
        if pending is not None:
            if pending == self._early_pause:
                return
            self._early_pause = pending
            thaw_seq = pending[1]
        elif self._freeze_unreported():
            tick = self.heartbeat.last_tick
            if tick == self._early_pause_tick:
                return
            self._early_pause_tick = tick
            thaw_seq = self.last_seq + 1
        else:
            return
        self.apply(fsm.step(self.machine, fsm.Event.PAUSED, now, thaw_seq=thaw_seq))

    def _freeze_unreported(self) -> bool:
        """The heartbeat thread has not ticked for longer than the timeout: the process
        was frozen and this loop runs before the thread has reported it."""
        return time.monotonic() - self.heartbeat.last_tick > self.timeout

    @property
    def fenced(self) -> str | None:
        """Why this server holds its clients' work after a freeze, or None."""
        if self.machine.fenced or self._pause_pending is not None:
            return fsm.FROZEN
        return None

    def _hold(self, action: fsm.Fence) -> None:
        self.broker.hold_all()
        self._asked_to_vote = False
        if not self._freeze_held:  # one record per freeze, however often it is reported
            self._freeze_held = True
            log.warning("not serving after the freeze: %s", action.reason)
            self._write("freeze_fence", fenced=True, reason=action.reason)

    def _release(self, action: fsm.Unfence) -> None:
        self._freeze_held = False
        log.warning("serving again after the freeze: %s", escaped(action.reason))
        self._write("freeze_fence", fenced=False, reason=action.reason)
        self.broker.release_held()

    def _ask_held_clients_to_vote(self, now: float) -> None:
        """A fenced ACTIVE whose peer stayed silent for the grace after the thaw serves
        again only by a client's vote, and a client held on its connection never votes:
        its connections are closed once, so that it reconnects and its Open is the vote
        (what it had in flight was never confirmed; it sends it again)."""
        machine = self.machine
        if not machine.fenced or machine.peer_alive(now) or self._asked_to_vote:
            return
        self._asked_to_vote = True
        clients = self.broker.client_connections()
        text = not_active_text(None, FROZEN_SILENT_PEER)
        for connection in clients:
            connection.close_forced(text)
        log.warning(
            "the peer stayed silent after the freeze: closed %d held client connection(s) so "
            "that they reconnect and vote",
            len(clients),
        )


FROZEN_SILENT_PEER = (
    "this server was frozen and its peer is silent since: reconnect, and the connection "
    "votes it back"
)
