"""The witness, the controller's side: feeding its verdict to the machine, and its fence.

Owns: the witness client of a pair with ``failover.witness`` and the view of its answers,
the ping every tick (asking for a vote while not ACTIVE), the verdict on the peer fed to
the machine from fresh answers only (WITNESS_VOTE_HEARTBEATS old at most, the peer unheard
there for WITNESS_SILENT_TIMEOUTS), the rule that an ACTIVE that has lost its peer serves
on only with a majority of witnesses answering within a timeout, the peer's echo that
lifts that fence, its ``witness_fence`` records and its part of the status
(docs/failover.md, "The witness"). ``FailoverController`` inherits it.

Must not know: how the machine decides (``fsm``), the witness protocol (``witness``) and
its datagrams (``witness_net``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from config import ServerConfig

from . import fsm
from .witness import Answer, WitnessView
from .witness_net import WitnessClient

log = logging.getLogger("amqha.failover")

# A vote counts answers this many heartbeats old at most, and needs the peer unheard there
# for this many timeouts.
WITNESS_VOTE_HEARTBEATS = 2.5
WITNESS_SILENT_TIMEOUTS = 2.0


class WitnessRule:
    """Mixed into ``FailoverController``, whose machine, config and records it uses."""

    machine: fsm.Machine
    config: ServerConfig
    loop: asyncio.AbstractEventLoop
    timeout: float
    running: bool
    last_seq: int

    def apply(self, outcome: fsm.Outcome) -> fsm.Decision | None:
        raise NotImplementedError

    def _write(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def init_witness_rule(self) -> None:
        config = self.config
        self.witness_view: WitnessView | None = None
        self.witness_client: WitnessClient | None = None
        self.witness_fenced = False
        self._witness_fence_logged = False
        self._witness_fence_seq = 0
        self._peer_echoed_fence = False
        if config.failover.witness:
            self.witness_view = WitnessView(len(config.failover.witness))
            self.witness_client = WitnessClient(
                config.failover.witness,
                config.failover.secret,
                config.pair or "",
                config.name,
                self._on_witness_answer,
            )

    def _witness_tick(self) -> None:
        """At every tick of a running controller: ping, then the verdict and the fence."""
        if self.witness_client is not None and self.running:
            asking = self.machine.state is not fsm.State.ACTIVE
            self.witness_client.ping(
                self.machine.state.value,
                self.machine.epoch,
                WITNESS_SILENT_TIMEOUTS * self.timeout if asking else 0.0,
            )
            self._witness_verdict(self.loop.time())
            self._notice_witness_fence(self.loop.time())

    def _heard_echo(self, heard: tuple[str, int] | None, boot: str) -> None:
        """A peer message that echoes one of ours sent since the fence: the peer is heard
        again (``boot``: this process's)."""
        if (
            self.witness_fenced
            and heard is not None
            and heard[0] == boot
            and heard[1] >= self._witness_fence_seq
        ):
            self._peer_echoed_fence = True

    def _on_witness_answer(self, index: int, answer: Answer) -> None:
        assert self.witness_view is not None
        now = self.loop.time()
        self.witness_view.heard(index, now, answer, self.config.failover.peer_name)
        self._witness_verdict(now)

    def _witness_verdict(self, now: float) -> None:
        """Feed the machine the witnesses' verdict on the peer, from fresh answers only."""
        view = self.witness_view
        if view is None or not self.running:
            return
        agrees = view.peer_gone(
            now,
            WITNESS_VOTE_HEARTBEATS * self.config.failover.heartbeat,
            WITNESS_SILENT_TIMEOUTS * self.timeout,
        )
        event = fsm.Event.WITNESS_AGREES if agrees else fsm.Event.WITNESS_DISAGREES
        self.apply(fsm.step(self.machine, event, now))

    def _lost_peer_and_witness(self, now: float) -> str | None:
        """Why an ACTIVE with a witness must not serve now, or None. Once it has stopped,
        only a peer message that echoes one sent since counts as hearing the peer (one
        delayed in a healed link says nothing of now)."""
        view = self.witness_view
        machine = self.machine
        if view is None or machine.state is not fsm.State.ACTIVE:
            self.witness_fenced = False
            return None
        peer_heard = machine.peer_alive(now) and (
            not self.witness_fenced or self._peer_echoed_fence
        )
        reason = None
        if peer_heard:
            pass
        elif view.overtaken(now, self.timeout):
            reason = "the witness called this server silent to its peer, which may have taken over"
        elif view.peer_leads_above(machine.epoch, now, self.timeout):
            reason = "the witness heard the peer ACTIVE in a higher epoch: it took over"
        elif not view.reachable(now, self.timeout):
            reason = "lost both the peer and the witness: not serving alone"
        if reason is not None and not self.witness_fenced:
            self.witness_fenced = True
            self._witness_fence_seq = self.last_seq + 1
            self._peer_echoed_fence = False
        elif reason is None:
            self.witness_fenced = False
        return reason

    def _notice_witness_fence(self, now: float) -> None:
        reason = self._lost_peer_and_witness(now)
        fenced = reason is not None
        if fenced == self._witness_fence_logged:
            return
        self._witness_fence_logged = fenced
        if fenced:
            log.warning("not serving: %s", reason)
        else:
            log.warning("serving again: the peer or the witness answers")
        self._write("witness_fence", fenced=fenced, reason=reason)

    def witness_status(self, now: float) -> dict[str, Any] | None:
        """The witness's part of the controller's status (None without a witness)."""
        if self.witness_client is None or self.witness_view is None:
            return None
        return {
            "addresses": [f"{h}:{p}" for h, p in self.config.failover.witness],
            "answers": list(self.witness_client.answers),
            "reachable": self.witness_view.reachable(now, self.timeout),
            "agrees_peer_gone": self.machine.witness_agrees,
            "fenced": self.witness_fenced,
            # Per witness: why it is not heard (None: it answers), docs/failover.md.
            "witnesses": self.witness_client.status(),
        }
