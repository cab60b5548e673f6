"""The failover controller: the asyncio shell around the pure state machine.

Owns: feeding the machine (peer state messages from the local amq.peer, every
client Connection.Open through the broker's gate, console recover/handover),
carrying out its actions in order (persist the epoch before serving, send the
handover, close clients with a redirect, log), publishing this server's state to
the peer's amq.peer every heartbeat over the peering, noticing the peer go quiet,
and writing the failover event log (DESIGN.md §5).

Must not know: frames and sockets (the broker and the peering own them), how the
machine decides (``fsm``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from amqha import __version__
from amqha.connection import ACCEPT, Accept, Connection, not_active_text
from amqha.connection import Redirect as GateRedirect
from amqha.core.message import Message
from amqha.core.vhost import PEER_EXCHANGE
from config import ServerConfig
from peering import Peering

from . import fsm
from .epoch import load_epoch, store_epoch
from .events import EventLog

log = logging.getLogger("amqha.failover")

STATE_TYPE = "amqha.peer.state"
HANDOVER_TYPE = "amqha.peer.handover"
_REQUIRED = {"name": str, "role": str, "state": str, "epoch": int, "listen": str}


class MalformedPeerMessage(ValueError):
    """An amq.peer message that is not a valid state message: logged and dropped."""


def parse_state_message(body: bytes) -> tuple[fsm.PeerInfo, dict[str, Any]]:
    """Decode a state message into the machine's PeerInfo; unknown fields are ignored."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedPeerMessage(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise MalformedPeerMessage("not a JSON object")
    for key, kind in _REQUIRED.items():
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise MalformedPeerMessage(f"field {key!r} missing or not {kind.__name__}")
    try:
        role, state = fsm.Role(data["role"]), fsm.State(data["state"])
    except ValueError as error:
        raise MalformedPeerMessage(str(error)) from None
    if data["epoch"] < 0:
        raise MalformedPeerMessage("negative epoch")
    return fsm.PeerInfo(data["name"], role, state, data["epoch"], data["listen"]), data


class FailoverController:
    def __init__(self, broker: Any, config: ServerConfig) -> None:
        assert config.failover.role is not None and config.failover.peer is not None
        self.broker = broker
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.role = fsm.Role(config.failover.role)
        self.machine = fsm.Machine.start(
            config.name,
            self.role,
            load_epoch(config.data_dir),
            config.failover.timeout,
            self.loop.time(),
        )
        self.events = EventLog(config.event_log_path, config.name, self.role.value)
        user = config.user(config.failover.peer_user)
        assert user is not None  # the config loader checked it
        # A restarted peer gives us one timeout of grace before a client vote can make it
        # ACTIVE: our state must reach it within that. So the link is retried every
        # heartbeat (no longer), and our state goes out the moment it is up, not a tick later.
        self.peering = Peering(
            f"amqp://{quote(user.name, safe='')}:{quote(user.password, safe='')}@"
            f"{config.failover.peer}/",
            name=f"{config.name}->peer",
            backoff_initial=min(0.05, config.failover.heartbeat),
            backoff_max=config.failover.heartbeat,
            connect_timeout=max(config.failover.timeout, 1.0),
            on_up=self._on_link_up,
            client_properties={"product": "amqha peering", "amqha_node": config.name},
        )
        self.seq = 0
        self.running = True
        self.peer_heard = False
        self.peer_last_seen: float | None = None  # wall clock of the last peer state message
        self.malformed = 0
        self._last_malformed_log = 0.0
        self._tick_handle: asyncio.TimerHandle | None = None
        broker.gate = self.gate
        broker.pair_info = self.pair_info
        broker.failover = self
        # The machine's actions, carried out in the order it returns them.
        self._actions: dict[type, Callable[[Any], None]] = {
            fsm.PersistEpoch: self._persist_epoch,
            fsm.SendHandover: self._send_handover,
            fsm.RedirectClients: self._redirect_clients,
            fsm.LogDualActive: self._log_dual_active,
            fsm.LogMisconfigured: self._log_misconfigured,
        }

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._write("started", listen=self.config.public_address, peer=self.config.failover.peer)
        self.broker.subscribe_internal(PEER_EXCHANGE, self.on_peer_message)
        await self.peering.start()
        self._tick()

    async def stop(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        await self.peering.stop()
        self._write("stopped", listen=self.config.public_address, peer=self.config.failover.peer)
        self.events.close()

    def set_running(self, running: bool) -> str:
        """Console ``controller stop|start``: a stopped controller neither sends nor hears state."""
        if running == self.running:
            return f"controller already {'running' if running else 'stopped'}"
        self.running = running
        if running:
            self._tick()
        elif self._tick_handle is not None:
            self._tick_handle.cancel()
        return f"controller {'started' if running else 'stopped'}"

    # -- state out ----------------------------------------------------------------------

    def state_message(self) -> bytes:
        self.seq += 1
        machine = self.machine
        return json.dumps(
            {
                "name": machine.name,
                "role": machine.role.value,
                "state": machine.state.value,
                "epoch": machine.epoch,
                "seq": self.seq,
                "ts": time.time(),
                "listen": self.config.public_address,
                "clients": len(self.broker.client_connections()),
                "version": __version__,
            },
            separators=(",", ":"),
        ).encode()

    def _on_link_up(self) -> None:
        properties = self.peering.server_properties
        product = properties.get("product")
        if isinstance(product, bytes):
            product = product.decode(errors="replace")
        if product != "amqha" or not isinstance(properties.get("amqha"), dict):
            reason = (
                f"the server at {self.config.failover.peer} is not amqha "
                f"(it announces product {product!r}): it cannot be our peer"
            )
            if self.machine.misconfigured != reason:
                log.error("misconfigured pair: %s", reason)
                self._write(
                    "misconfigured", peer=self.config.failover.peer, peer_epoch=None, reason=reason
                )
                # Known from the link itself, not from a state message; a real amqha peer's
                # first state message clears it, as for any misconfiguration.
                self.machine = replace(self.machine, misconfigured=reason)
            return
        self._publish_state()

    def _publish_state(self) -> None:
        if self.running:
            self.peering.publish(PEER_EXCHANGE, self.state_message(), message_type=STATE_TYPE)

    def _tick(self) -> None:
        if not self.running:
            return
        self._publish_state()
        self._notice_peer_lost(self.loop.time())
        self._tick_handle = self.loop.call_later(self.config.failover.heartbeat, self._tick)

    def _notice_peer_lost(self, now: float) -> None:
        """Record the loss once, when first noticed: at a heartbeat tick or at a client vote,
        whichever comes first, so the log shows the loss before any takeover it allows."""
        if not self.peer_heard or self.machine.peer_alive(now):
            return
        self.peer_heard = False
        peer = self.machine.peer
        log.warning("peer %s silent for %.2f s: lost", peer and peer.name, self.machine.timeout)
        self._write(
            "peer_lost",
            peer=peer.name if peer else None,
            peer_state=peer.state.value if peer else None,
            last_seen=self.peer_last_seen,
        )

    # -- events in ----------------------------------------------------------------------

    def on_peer_message(self, message: Message) -> None:
        if not self.running:
            return
        properties = message.properties()
        kind = properties.message_type
        try:
            peer, data = parse_state_message(message.body)
        except MalformedPeerMessage as error:
            self._malformed(str(error))
            return
        now = self.loop.time()
        if kind == HANDOVER_TYPE:
            self._on_handover(peer, now)
            return
        if kind not in (STATE_TYPE, None):
            self._malformed(f"unknown message type {kind!r}")
            return
        outcome = fsm.step(self.machine, fsm.PEER_EVENT[peer.state], now, peer)
        self.apply(outcome)
        if outcome.machine.misconfigured is None and not self.peer_heard:
            self.peer_heard = True
            log.info("peer %s heard: %s epoch %d", peer.name, peer.state.value, peer.epoch)
            self._write(
                "peer_up", peer=peer.name, peer_state=peer.state.value, last_seen=data.get("ts")
            )
        if outcome.machine.misconfigured is None:
            self.peer_last_seen = (
                data.get("ts") if isinstance(data.get("ts"), float) else time.time()
            )

    def _on_handover(self, peer: fsm.PeerInfo, now: float) -> None:
        known = self.machine.peer
        if known is None or known.name != peer.name:
            self._malformed(f"handover from {peer.name!r}, which is not our peer")
            return
        outcome = fsm.step(self.machine, fsm.Event.HANDOVER, now)
        self.apply(outcome)
        if isinstance(outcome.decision, fsm.Refuse):
            log.warning("handover from %s refused: %s", peer.name, outcome.decision.reason)

    def _malformed(self, reason: str) -> None:
        self.malformed += 1
        now = self.loop.time()
        if now - self._last_malformed_log >= 1.0:
            self._last_malformed_log = now
            log.warning(
                "dropped a malformed amq.peer message (%d so far): %s", self.malformed, reason
            )

    def gate(self, connection: Connection) -> Accept | GateRedirect:
        """Connection.Open from a client: the client vote, or a redirect."""
        now = self.loop.time()
        if self.running:
            self._notice_peer_lost(now)
        outcome = fsm.step(self.machine, fsm.Event.CLIENT_REQUEST, now)
        self.apply(outcome)
        decision = outcome.decision
        if isinstance(decision, fsm.Accept):
            return ACCEPT
        if isinstance(decision, fsm.Redirect):
            self._write(
                "redirect" if decision.to else "refuse", client=connection.peer, to=decision.to
            )
            return GateRedirect(decision.to, self.known_hosts())
        assert isinstance(decision, fsm.Refuse)
        self._write("refuse", client=connection.peer, to=None, reason=decision.reason)
        return GateRedirect(None, self.known_hosts(), decision.reason)

    def recover(self, user: str) -> tuple[bool, str]:
        """Console ``recover``: the failback, run on the ACTIVE backup."""
        outcome = fsm.step(self.machine, fsm.Event.MANUAL_RECOVER, self.loop.time())
        self.apply(outcome)
        decision = outcome.decision
        ok = isinstance(decision, fsm.Accept)
        result = "handed over to the primary" if ok else getattr(decision, "reason", "refused")
        self._write("console", user=user, command="recover", result=result)
        return ok, result

    # -- actions ------------------------------------------------------------------------

    def apply(self, outcome: fsm.Outcome) -> None:
        self.machine = outcome.machine
        for action in outcome.actions:
            self._actions[type(action)](action)
        transition = outcome.transition
        if transition is not None:
            # Start-up transitions are routine; a takeover or a step-down is what an operator
            # needs to see.
            takeover = transition.trigger is fsm.Event.CLIENT_REQUEST
            level = (
                logging.WARNING
                if takeover or transition.from_state is fsm.State.ACTIVE
                else logging.INFO
            )
            log.log(
                level,
                "%s -> %s on %s (epoch %d): %s",
                transition.from_state.value,
                transition.to_state.value,
                transition.trigger.value,
                self.machine.epoch,
                transition.reason,
            )
            self._write(
                "transition",
                **{"from": transition.from_state.value},
                to=transition.to_state.value,
                trigger=transition.trigger.value,
                reason=transition.reason,
            )
            # Tell the peer at once rather than at the next heartbeat: the pair settles faster.
            self._publish_state()

    def _persist_epoch(self, action: fsm.PersistEpoch) -> None:
        store_epoch(self.config.data_dir, action.epoch)

    def _send_handover(self, action: fsm.SendHandover) -> None:
        self.peering.publish(PEER_EXCHANGE, self.state_message(), message_type=HANDOVER_TYPE)

    def _redirect_clients(self, action: fsm.RedirectClients) -> None:
        self._close_clients(action.to)

    def _log_dual_active(self, action: fsm.LogDualActive) -> None:
        log.warning("dual active: %s", action.reason)
        self._log_peer_problem("dual_active", action)

    def _log_misconfigured(self, action: fsm.LogMisconfigured) -> None:
        log.error("misconfigured pair: %s", action.reason)
        self._log_peer_problem("misconfigured", action)

    def _log_peer_problem(
        self, event: str, action: fsm.LogDualActive | fsm.LogMisconfigured
    ) -> None:
        self._write(event, peer=action.peer, peer_epoch=action.peer_epoch, reason=action.reason)

    def _close_clients(self, to: str | None) -> None:
        text = not_active_text(to)
        clients = self.broker.client_connections()
        for connection in clients:
            connection.close_forced(text)
        if clients:
            log.warning("closed %d client connection(s): %s", len(clients), text)

    # -- descriptions -------------------------------------------------------------------

    def known_hosts(self) -> str:
        hosts = [self.config.public_address]
        peer = self.machine.peer
        hosts.append(peer.listen if peer is not None else self.config.failover.peer)
        return ",".join(dict.fromkeys(h for h in hosts if h))

    def pair_info(self) -> dict[str, Any]:
        machine = self.machine
        return {
            "name": machine.name,
            "role": machine.role.value,
            "state": machine.state.value,
            "epoch": machine.epoch,
            "known_hosts": self.known_hosts(),
        }

    def status(self) -> dict[str, Any]:
        machine = self.machine
        now = self.loop.time()
        peer = machine.peer
        return {
            **self.pair_info(),
            "listen": self.config.public_address,
            "controller": "running" if self.running else "stopped",
            "peer": None
            if peer is None
            else {
                "name": peer.name,
                "role": peer.role.value,
                "state": peer.state.value,
                "epoch": peer.epoch,
                "listen": peer.listen,
                "alive": machine.peer_alive(now),
                "last_seen": self.peer_last_seen,
            },
            "peering": {"connected": self.peering.connected, "target": self.config.failover.peer},
            "misconfigured": machine.misconfigured,
            "malformed_peer_messages": self.malformed,
        }

    def _write(self, event: str, **fields: Any) -> None:
        self.events.write(event, self.machine.state.value, self.machine.epoch, **fields)
