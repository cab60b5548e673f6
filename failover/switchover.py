"""The planned switchover, the controller's side (docs/failover.md, "Planned switchover").

Owns: ``amqha console switchover`` on the ACTIVE, in order: the machine must accept it
(its in-sync PASSIVE heard; with ``wait``, asked again until it does or the time is up);
the broker stops reading its clients (it never refuses them: what they sent stays in their
sockets, and goes to the new ACTIVE when they follow the redirect); once the broker says
it is drained (every publish it read confirmed and written, every change it logged, a
delivery or an ack too, on its PASSIVE's disk), the machine steps to PASSIVE in the same
turn of the loop, sends the signed handover and redirects the clients. If the drain does not end
within ``DRAIN_TIMEOUT`` (the PASSIVE lost, the machine refusing now), clients are read
again and the switchover fails with the reason; a PASSIVE that drops out of sync as it
drains is waited for again while ``wait`` lasts. Each step is a ``switchover`` record
(``requested``, ``handed_over``, ``completed`` when the peer is heard ACTIVE, ``failed``).
``FailoverController`` inherits it.

Must not know: how the machine decides (``fsm``), what drained means inside the broker
(``Member.undrained``), the console's words.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from amqha.gate import ConsoleRefused, Member

from . import fsm

log = logging.getLogger("amqha.failover")

# The longest a drain may take before the switchover gives up and serves on.
DRAIN_TIMEOUT = 10.0
# How often the drain and a waited-for PASSIVE are looked at.
DRAIN_POLL = 0.005
WAIT_POLL = 0.1


class Switchover:
    """Mixed into ``FailoverController``, whose machine, broker and records it uses."""

    machine: fsm.Machine
    loop: asyncio.AbstractEventLoop
    broker: Member

    def apply(self, outcome: fsm.Outcome) -> fsm.Decision | None:
        raise NotImplementedError

    def _write(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def init_switchover(self) -> None:
        # The peer a switchover handed the service to, and when, until it is heard ACTIVE.
        self.switched_to: tuple[str, float] | None = None

    def _command_switchover(self, args: dict[str, Any], user: str) -> Any:
        wait = args.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
            raise ConsoleRefused(f"switchover: wait must be a number of seconds >= 0, not {wait!r}")
        refusal = self._switchover_refusal()
        if refusal is not None and not wait:
            self._write("switchover", phase="failed", user=user, reason=refusal)
            raise ConsoleRefused(f"switchover refused: {refusal}")
        return self._switchover(float(wait), user)

    def _switchover_refusal(self) -> str | None:
        decision = fsm.step(self.machine, fsm.Event.SWITCHOVER, self.loop.time()).decision
        if not isinstance(decision, fsm.Accept):
            return getattr(decision, "reason", "refused")
        if not self.broker.passive_in_sync():
            # Its state messages may still say in sync for a heartbeat or two after its
            # replication link dropped: the feed knows first.
            return (
                f"the {fsm.peer_role(self.machine)} is not in sync: its replication link is"
                " down or catching up"
            )
        return None

    async def _switchover(self, wait: float, user: str) -> dict[str, Any]:
        started = time.monotonic()
        deadline = self.loop.time() + wait
        requested = False
        while True:
            refusal = self._switchover_refusal()
            while refusal is not None:
                if self.loop.time() >= deadline:
                    self._write("switchover", phase="failed", user=user, reason=refusal)
                    raise ConsoleRefused(f"switchover refused after waiting {wait:g} s: {refusal}")
                await asyncio.sleep(WAIT_POLL)
                refusal = self._switchover_refusal()
            peer = self.machine.peer
            assert peer is not None  # the machine accepted: it heard its PASSIVE
            if not requested:
                self._write("switchover", phase="requested", user=user, to=peer.name)
                requested = True
            self.broker.hold_clients(True)
            drain_deadline = self.loop.time() + DRAIN_TIMEOUT
            why = self.broker.undrained()
            while why is not None and self.loop.time() < drain_deadline:
                if not self.broker.passive_in_sync():
                    break  # the PASSIVE went away: no drain can end now
                await asyncio.sleep(DRAIN_POLL)
                why = self.broker.undrained()
            if why is None:
                # Drained in this turn of the loop: nothing can be read or confirmed
                # between the last look and the step (the broker reads no client meanwhile).
                decision = self.apply(
                    fsm.step(self.machine, fsm.Event.SWITCHOVER, self.loop.time())
                )
                if isinstance(decision, fsm.Accept):
                    drained = round(time.monotonic() - started, 3)
                    self.switched_to = (peer.name, time.monotonic())
                    self._write(
                        "switchover",
                        phase="handed_over",
                        user=user,
                        to=peer.name,
                        drained_s=drained,
                    )
                    return {
                        "result": f"handed the service to {peer.name} (drained in {drained:g} s)",
                        "state": self.machine.state.value,
                        "to": peer.name,
                        "drained_s": drained,
                    }
                why = getattr(decision, "reason", "refused")
            self.broker.hold_clients(False)
            refusal = self._switchover_refusal()
            if refusal is not None and self.loop.time() < deadline:
                # With time left to wait, the PASSIVE that left as it drained (its link
                # dropped, or it catches up again in a new term) is waited for again, from
                # the top; so is one the machine refused at the step: after a cut, the feed
                # has it in sync a moment before its state messages (over its peer link,
                # up again a little later) say so.
                log.info("switchover: the PASSIVE left the drain (%s); waiting for it", refusal)
                continue
            self._write("switchover", phase="failed", user=user, reason=why)
            raise ConsoleRefused(f"switchover failed, this server serves on: {why}")

    def _heard_after_switchover(self, peer: fsm.PeerInfo) -> None:
        """A state message from the peer: the one we handed over to, now ACTIVE, completes it."""
        switched = self.switched_to
        if switched is None or peer.name != switched[0]:
            return
        if peer.state is fsm.State.ACTIVE:
            self.switched_to = None
            took = round(time.monotonic() - switched[1], 3)
            self._write("switchover", phase="completed", to=peer.name, took_s=took)
