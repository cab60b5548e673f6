"""The failover controller: the asyncio shell around the pure state machine.

Owns: feeding the machine (signed, validated state messages from the peer, every client
Connection.Open through the broker's gate; the console's recover / promote / controller
commands are ``pair_commands``', the planned switchover ``switchover``'s), carrying out its actions in order (persist the epoch
before serving, and never serve if that fails; send the handover; close clients and
administrators with a redirect; log), the fence after a freeze (the machine decides it on
PAUSED; ``freeze_rule`` notices the freeze, holds the work and releases it), the
witness's verdict and fence (``witness_rule``), noticing the peer go quiet, and writing
the failover event log (docs/failover.md). It implements the broker's ``gate.Pair``.

The heartbeat (state out, every heartbeat) runs on a thread of its own (``heartbeat``);
everything else here runs on the broker's loop.

Must not know: frames and sockets (the broker and the peering own them), how the machine
decides (``fsm``), how a message is signed and checked (``peer_message``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import quote

from amqha import __version__, clock
from amqha.core import feedauth, protocol
from amqha.core.message import Message
from amqha.core.reserved import PEER_EXCHANGE, PEERING_PRODUCT
from amqha.gate import ACCEPT, Accept, ConsoleRefused, Member, Redirect, not_active_text
from amqha.logtext import escaped
from amqha.quarantine import is_incomplete
from config import ServerConfig
from config.tls import client_context
from peering import Peering

from . import fsm, keys, peer_message
from .drift import ConfigDrift
from .epoch import load_epoch, load_pair_offset, store_epoch, store_pair_offset
from .events import EventLog, RecordThrottle
from .freeze_rule import FreezeRule
from .heartbeat import Heartbeat
from .maintenance_rule import MaintenanceRule
from .pair_commands import PairCommands
from .peer_message import HANDOVER_TYPE, STATE_TYPE, MalformedPeerMessage
from .switchover import Switchover
from .witness_rule import WitnessRule

log = logging.getLogger("amqha.failover")

MALFORMED_LOG_INTERVAL = 1.0
# A refused state message is recorded in the event log once per kind of problem per minute:
# whoever floods amq.peer cannot fill the log's disk.
MALFORMED_RECORD_INTERVAL = 60.0
# A refused or redirected client is recorded once a second per kind (refuse, redirect): a
# guest looping on a PASSIVE's port wrote 19 MB in 15 s. Once a second keeps the report's
# timeline of redirects; the counters in status have every attempt.
CLIENT_RECORD_INTERVAL = 1.0
# After taking the service by a handover, the longest confirms wait for the server that
# handed it over to be in sync again (its snapshot of a large backlog takes seconds); sooner
# if it is lost. Then ``replication.when_alone`` applies.
REJOIN_WAIT = 10.0
# How long an ACTIVE whose disk failed waits for its PASSIVE to be in sync to hand over.
DISK_HANDOVER_WAIT = 10.0
# How far a PASSIVE's pair time may be from its ACTIVE's before it takes it again: more
# than a state message's flight and a heartbeat's jitter, far less than any TTL's grain.
PAIR_TIME_SLACK = 0.25
# The pair time is read from the latest of this many state messages: a message held up on
# a busy machine carries an older time than its arrival, and alone would set it back.
PAIR_TIME_SAMPLES = 8
# A step of the system clock this large is logged (it moves none of this server's times:
# amqha.clock, docs/durability.md, "When a clock steps").
CLOCK_STEP_NOTICE = 1.0


class FailoverController(FreezeRule, WitnessRule, PairCommands, Switchover, MaintenanceRule):
    def __init__(self, broker: Member, config: ServerConfig) -> None:
        assert config.failover.role is not None and config.failover.peer is not None
        self.broker = broker
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.role = fsm.Role(config.failover.role)
        self.timeout = config.failover.timeout
        self.machine = replace(
            fsm.Machine.start(
                config.name,
                self.role,
                load_epoch(config.data_dir),
                config.failover.timeout,
                self.loop.time(),
            ),
            takeover_unsynced=config.failover.takeover_unsynced,
            witnessed=bool(config.failover.witness),
            # A store killed while it took its peer's snapshot may hold part of it: not in
            # sync until its ACTIVE says so again (docs/durability.md, section 5).
            in_sync=not is_incomplete(config.data_dir),
            # After a freeze, the peer's link to us may take this long to come back: its
            # connect timeout and its longest backoff (docs/failover.md, "Freezes").
            reconnect=_connect_timeout(config) + config.failover.heartbeat,
        )
        self.events = EventLog(
            config.event_log_path, config.name, self.role.value, pair=config.pair
        )
        # The pair's time this server last followed (message deadlines are on it), until
        # it hears its ACTIVE's again (docs/durability.md, "When a clock steps").
        clock.follow(load_pair_offset(config.data_dir))
        self._disk_handover: asyncio.Task[None] | None = None  # held while it runs
        self.expected = peer_message.Expected(
            config.failover.secret,
            frozenset(config.failover.peer_listen),
            config.failover.peer_name,
        )
        self.boot = secrets.token_hex(8)
        self._seq = itertools.count(1)
        self.last_seq = 0
        self.running = True
        self.peer_heard = False
        self.peer_last_seen: float | None = None  # wall clock of the last peer state message
        # The ACTIVE's pair time less ours, from its latest state messages (PASSIVE only).
        self._pair_time_samples: collections.deque[float] = collections.deque(
            maxlen=PAIR_TIME_SAMPLES
        )
        self.peer_boot: str | None = None
        self.peer_seq = -1
        self.peer_protocol: int | None = None  # what the peer's release speaks, once heard
        # The epoch of the ACTIVE this PASSIVE was last in sync with (None: not in sync).
        self._synced_epoch: int | None = None
        # While a handover from the peer is applied: the epoch it led in (a resume point).
        self._handover_epoch: int | None = None
        self.malformed = 0
        self._malformed_records = RecordThrottle(MALFORMED_RECORD_INTERVAL)
        self._client_records = RecordThrottle(CLIENT_RECORD_INTERVAL)
        self._federation_records = RecordThrottle(CLIENT_RECORD_INTERVAL)
        self._last_malformed_log = 0.0
        self.clients = 0
        self.takeovers = 0
        # Client attempts sent elsewhere, and refused with no server to name (metrics).
        self.redirects = 0
        self.refusals = 0
        self.init_freeze_rule()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_due = 0.0
        self._clock_stepped = clock.stepped()
        user = config.user(config.failover.peer_user)
        assert user is not None  # the config loader checked it
        self.heartbeat = Heartbeat(
            self._make_peering,
            self._state_message,
            config.failover.heartbeat,
            config.failover.timeout,
            self.loop,
            self._on_link_up,
            self._on_pause,
            self._fence,
            PEER_EXCHANGE,
            self._on_peer_gone,
        )
        self._peer_url = (
            f"{'amqp' if config.failover.peer_tls is None else 'amqps'}://"
            f"{quote(user.name, safe='')}:{quote(user.password or '', safe='')}@"
            f"{config.failover.peer}/"
        )
        # The machine's actions, carried out in the order it returns them.
        self._actions: dict[type, Callable[[Any], None]] = {
            fsm.SendHandover: self._send_handover,
            fsm.RedirectClients: self._redirect_clients,
            fsm.LogDualActive: self._log_dual_active,
            fsm.LogMisconfigured: self._log_misconfigured,
            fsm.Fence: self._hold,
            fsm.Unfence: self._release,
        }
        # Replication follows the machine: the broker leads while ACTIVE and follows its
        # peer while PASSIVE (docs/durability.md, section 5).
        broker.attach(self)
        self._following = False
        self.init_witness_rule()
        self.init_pair_commands()
        self.init_switchover()
        self.init_maintenance()
        self.drift = ConfigDrift(config)

    def _make_peering(self, on_up: Callable[[], None]) -> Peering:
        # A restarted peer gives us one timeout of grace before a client vote can make it
        # ACTIVE: our state must reach it within that. So the link is retried every
        # heartbeat (no longer), and our state goes out the moment it is up.
        peer_tls = self.config.failover.peer_tls
        return Peering(
            self._peer_url,
            name=f"{self.config.name}->peer",
            backoff_initial=min(0.05, self.config.failover.heartbeat),
            backoff_max=self.config.failover.heartbeat,
            connect_timeout=_connect_timeout(self.config),
            heartbeat=self.config.failover.link_heartbeat,
            on_up=on_up,
            client_properties={"product": PEERING_PRODUCT, "amqha_node": self.config.name},
            ssl_context=None if peer_tls is None else client_context(peer_tls, self.config.source),
            server_hostname=None if peer_tls is None else peer_tls.server_name,
            login_proof=self._peering_login_proof,
            control=True,
        )

    def _peering_login_proof(self, server_properties: dict[str, Any]) -> str:
        """The peering login never sends its password: it proves the pair's secret on the
        peer's Connection.Start nonce (docs/security.md, "Logins"). A server with no
        nonce gets nothing (whatever listens there is not our peer)."""
        nonce = feedauth.parse_nonce(server_properties.get(feedauth.NONCE_PROPERTY))
        if nonce is None:
            # Whatever listens there is not our peer; a server that is not amqha at all is
            # reported as a link to one would be (on the broker's loop: this runs on the
            # heartbeat thread's).
            with contextlib.suppress(RuntimeError):  # the broker's loop is closing
                self.loop.call_soon_threadsafe(self._on_link_up, dict(server_properties))
            raise ConnectionError("the peer gave no login nonce: not logging in to it")
        return keys.peering_login_proof(
            self.config.failover.secret, nonce, self.config.failover.peer_user
        )

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._write("started", listen=self.config.public_address, peer=self.config.failover.peer)
        self._check_data_dir()
        self.broker.receive_control(PEER_EXCHANGE, self.on_peer_message)
        self.heartbeat.start()
        self._schedule_tick()

    def _check_data_dir(self) -> None:
        try:
            store_epoch(self.config.data_dir, self.machine.epoch)
        except OSError as error:
            log.error(
                "cannot write the epoch file in %s (%s): this server will not become ACTIVE "
                "until it can",
                self.config.data_dir,
                error,
            )

    async def stop(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        await self.loop.run_in_executor(None, self.heartbeat.stop)
        if self.witness_client is not None:
            self.witness_client.close()
        # The broker stops after us, closing the replication link as it goes: nothing it
        # reports from then on belongs in the event log, whose last record is `stopped`.
        self.broker.attach(None)
        self._write("stopped", listen=self.config.public_address, peer=self.config.failover.peer)
        self.events.close()

    # -- state out (the message is built on the heartbeat thread: immutable reads only) --

    def _state_message(self, kind: str | None = None) -> tuple[bytes, str, dict[str, Any]]:
        machine = self.machine
        seq = next(self._seq)
        self.last_seq = seq
        heard = [self.peer_boot, self.peer_seq] if self.peer_boot is not None else None
        return peer_message.encode(
            self.config.failover.secret,
            kind or STATE_TYPE,
            {
                "name": machine.name,
                "role": machine.role.value,
                "state": machine.state.value,
                "epoch": machine.epoch,
                "boot": self.boot,
                "seq": seq,
                "heard": heard,
                "ts": clock.now(),
                "pair_ts": clock.pair_now(),
                "listen": self.config.public_address,
                "clients": self.clients,
                "version": __version__,
                "in_sync": machine.in_sync,
                "config": self.drift.ours,
                "maintenance": self.maintenance.to_json(),
                "protocol": protocol.PROTOCOL,
            },
        )

    def _on_link_up(self, properties: dict[str, Any]) -> None:
        product = properties.get("product")
        if isinstance(product, bytes):
            product = product.decode(errors="replace")
        if product != "amqha" or not isinstance(properties.get("amqha"), dict):
            reason = (
                f"the server at {self.config.failover.peer} is not amqha "
                f"(it announces product {product!r}): it cannot be our peer"
            )
            if self.machine.misconfigured != reason:
                log.error("misconfigured pair: %s", escaped(reason))
                self._write(
                    "misconfigured", peer=self.config.failover.peer, peer_epoch=None, reason=reason
                )
                # Known from the link itself, not from a state message; a real amqha peer's
                # first state message clears it, as for any misconfiguration.
                self.machine = replace(self.machine, misconfigured=reason)
            return
        self.heartbeat.poke()

    def _schedule_tick(self) -> None:
        interval = self.config.failover.heartbeat
        self._tick_due = self.loop.time() + interval
        self._tick_handle = self.loop.call_at(self._tick_due, self._tick)

    def _tick(self) -> None:
        late = self.loop.time() - self._tick_due
        self._schedule_tick()
        self.clients = len(self.broker.client_connections())
        # A loop this far behind has not yet read what the peer sent meanwhile: judging the
        # peer now would call a busy link a dead one.
        if self.running and late < self.config.failover.heartbeat:
            self._notice_peer_lost(self.loop.time())
            now = self.loop.time()
            if self.machine.state is fsm.State.ACTIVE and not self.machine.peer_alive(now):
                # A silent peer whose feed has acked nothing for a timeout is lost to the
                # confirms too (docs/durability.md, section 5, "A silent PASSIVE"); a
                # PASSIVE that still speaks is only slow, and confirms wait for it.
                self.broker.passive_stalled(self.timeout)
        self._witness_tick()
        if self.running:
            self._ask_held_clients_to_vote(self.loop.time())
        self._notice_clock_step()

    def _notice_clock_step(self) -> None:
        """Log a step of the system clock: an operator reading the log by the system's
        time should know this server's times (deadlines, its event log) did not step."""
        stepped = clock.stepped()
        if abs(stepped - self._clock_stepped) >= CLOCK_STEP_NOTICE:
            log.warning(
                "the system clock stepped %+.1f s; this server's times keep to its monotonic"
                ' clock and are now %+.1f s from the system clock (docs/durability.md, "When'
                ' a clock steps")',
                stepped - self._clock_stepped,
                -stepped,
            )
            self._clock_stepped = stepped

    def _notice_peer_lost(self, now: float) -> None:
        """Record the loss once, when first noticed: at a tick, at a client vote or on
        evidence, whichever comes first, so the log shows the loss before any takeover it
        allows."""
        if not self.peer_heard or self.machine.peer_alive(now):
            return
        self.peer_heard = False
        self.broker.hold_until_rejoined(0)  # no rejoin to wait for now
        peer = self.machine.peer
        name = escaped(peer.name) if peer else None
        if self.machine.peer_gone:
            log.warning("peer %s lost: its link dropped and its port refuses connections", name)
        else:
            log.warning("peer %s silent for %.2f s: lost", name, self.machine.timeout)
        self._write(
            "peer_lost",
            peer=peer.name if peer else None,
            peer_state=peer.state.value if peer else None,
            last_seen=self.peer_last_seen,
            evidence="refused" if self.machine.peer_gone else "silence",
            maintenance=peer is not None and self._in_maintenance(peer.role),
        )

    def _on_peer_gone(self, pauses: int) -> None:
        """From the peering link: it dropped and the peer's port refuses connections, so no
        process serves there (docs/failover.md, "Evidence"). Evidence gathered before a
        freeze (``pauses``: the heartbeat's count of freezes then) says nothing of now."""
        if not self.running or pauses != self.heartbeat.pauses or self._freeze_unreported():
            return
        now = self.loop.time()
        self.apply(fsm.step(self.machine, fsm.Event.PEER_GONE, now))
        self._notice_peer_lost(now)

    # -- events in ----------------------------------------------------------------------

    def on_peer_message(self, message: Message, connection: Any) -> None:
        """A publish to amq.peer by a user tagged ``peering`` (the channel checked the tag)."""
        if not self.running:
            return
        properties = message.properties()
        kind = properties.message_type
        peer_epoch = self.machine.peer.epoch if self.machine.peer is not None else 0
        try:
            parsed = peer_message.parse(
                self.expected,
                kind,
                message.body,
                properties.headers,
                max(self.machine.epoch, peer_epoch),
            )
        except MalformedPeerMessage as error:
            self._malformed(error.kind, str(error), connection)
            return
        if parsed.boot == self.peer_boot and parsed.seq <= self.peer_seq:
            self._malformed("replay", f"replayed or reordered (seq {parsed.seq})", connection)
            return
        self.peer_boot, self.peer_seq = parsed.boot, parsed.seq
        self.peer_protocol = parsed.protocol
        now = self.loop.time()
        heard = parsed.heard
        # The last of our messages the peer heard, in this boot of ours: after a freeze, an
        # echo of one sent since the thaw is news (fsm: the rule after a freeze).
        echo = heard[1] if heard is not None and heard[0] == self.boot else 0
        peer = self._heard_maintenance(replace(parsed.peer, echo=echo), parsed.maintenance)
        if kind == HANDOVER_TYPE:
            self._on_handover(peer, now)
            return
        outcome = fsm.step(self.machine, fsm.PEER_EVENT[peer.state], now, peer)
        self.apply(outcome)
        self._new_term(peer)
        self._heard_after_switchover(peer)
        if outcome.machine.misconfigured is None and self.drift.heard(parsed.config):
            self._config_drift(peer.name)
        if outcome.machine.misconfigured is None and not self.peer_heard:
            self.peer_heard = True
            log.info("peer %s heard: %s epoch %d", escaped(peer.name), peer.state.value, peer.epoch)
            self._write("peer_up", peer=peer.name, peer_state=peer.state.value, last_seen=parsed.ts)
        if outcome.machine.misconfigured is None:
            self.peer_last_seen = parsed.ts if parsed.ts is not None else clock.now()
            self._follow_pair_time(peer, parsed.pair_ts)
        self._heard_echo(heard, self.boot)

    def _follow_pair_time(self, peer: fsm.PeerInfo, pair_ts: float | None) -> None:
        """A PASSIVE takes its ACTIVE's pair time (message deadlines are on it), within
        ``PAIR_TIME_SLACK`` (the message's flight and the heartbeat's jitter), and keeps it
        in its data dir for a restart (docs/durability.md, "When a clock steps")."""
        if (
            pair_ts is None
            or peer.state is not fsm.State.ACTIVE
            or self.machine.state is not fsm.State.PASSIVE
        ):
            self._pair_time_samples.clear()
            return
        samples = self._pair_time_samples
        samples.append(pair_ts - clock.now())
        offset = clock.offset_to_follow(samples, clock.pair_offset(), PAIR_TIME_SLACK)
        if offset is None:
            return
        clock.follow(offset)
        log.warning(
            "following %s's time: %+.3f s from this server's clock (message deadlines keep"
            " to the ACTIVE's)",
            escaped(peer.name),
            offset,
        )
        try:
            store_pair_offset(self.config.data_dir, offset)
        except OSError as error:
            log.warning("cannot keep the pair's time in the data dir: %s", error)

    def _config_drift(self, peer: str) -> None:
        """The settings that differ from the peer's changed: logged, by key only."""
        keys = self.drift.keys
        if keys:
            log.warning(
                "config drift: %d setting(s) differ from %s's: %s",
                len(keys),
                escaped(peer),
                escaped(", ".join(keys[:20])),
            )
        else:
            log.info("config drift: none left, the settings match %s's", escaped(peer))
        self._write("config_drift", peer=peer, keys=keys)

    def _on_handover(self, peer: fsm.PeerInfo, now: float) -> None:
        known = self.machine.peer
        if known is None or known.name != peer.name:
            self._malformed("handover", f"handover from {peer.name!r}, which is not our peer", None)
            return
        if (
            self.freeze_report_pending()
            or time.monotonic() - self.heartbeat.last_tick > self.timeout
        ):
            # Read in the moment after a freeze, before the machine has taken PAUSED: it
            # may be stale (fsm.STALE_HANDOVER); the peer serves on, or is voted back in.
            log.warning("handover from %s ignored: %s", escaped(peer.name), fsm.STALE_HANDOVER)
            return
        outcome = fsm.step(self.machine, fsm.Event.HANDOVER, now)
        self._handover_epoch = peer.epoch  # the term the peer led: where it may resume
        self.apply(outcome)
        self._handover_epoch = None
        if isinstance(outcome.decision, fsm.Refuse):
            log.warning(
                "handover from %s refused: %s",
                escaped(peer.name),
                escaped(outcome.decision.reason),
            )

    def _malformed(self, kind: str, reason: str, connection: Any) -> None:
        """Never acted on. Counted; logged at most once a second; recorded in the event log
        at most once a minute per kind of problem (a flood cannot fill it)."""
        self.malformed += 1
        sender = getattr(getattr(connection, "user", None), "name", None)
        where = getattr(connection, "peer", "?")
        now = self.loop.time()
        if now - self._last_malformed_log >= MALFORMED_LOG_INTERVAL:
            self._last_malformed_log = now
            log.warning(
                "dropped an amq.peer message from user '%s' at %s (%d so far): %s",
                escaped(sender),
                where,
                self.malformed,
                escaped(reason),
            )
        self._write_throttled(
            self._malformed_records,
            kind,
            now,
            "misconfigured",
            peer=sender,
            peer_epoch=None,
            reason=f"refused a state message from {where}: {reason}",
        )

    # -- the gate (gate.Pair) ------------------------------------------------------------

    def admit(self, client: str) -> Accept | Redirect:
        """Connection.Open from a client: the client vote, or a redirect."""
        now = self.loop.time()
        self._freeze_not_yet_reported(now)
        if self.running:
            self._notice_peer_lost(now)
            self._witness_verdict(now)
        decision = self.apply(fsm.step(self.machine, fsm.Event.CLIENT_REQUEST, now))
        if isinstance(decision, fsm.Accept):
            if self.serving():
                return ACCEPT
            reason = (
                self.fenced
                or self._lost_peer_and_witness(now)
                or "this server's heartbeat is late: it may have been frozen"
            )
            self.refusals += 1
            self._write_client("refuse", now, client=client, to=None, reason=reason)
            return Redirect(None, self.known_hosts(), reason)
        if isinstance(decision, fsm.Redirect):
            if decision.to:
                self.redirects += 1
            else:
                self.refusals += 1
            event = "redirect" if decision.to else "refuse"
            self._write_client(event, now, client=client, to=decision.to)
            return Redirect(decision.to, self.known_hosts())
        assert isinstance(decision, fsm.Refuse)
        self.refusals += 1
        self._write_client("refuse", now, client=client, to=None, reason=decision.reason)
        return Redirect(None, self.known_hosts(), decision.reason)

    def _write_client(self, event: str, now: float, **fields: Any) -> None:
        self._write_throttled(self._client_records, event, now, event, **fields)

    def serving(self) -> bool:
        # Checked on every confirm: a process that was frozen may run its sockets before its
        # heartbeat thread notices the gap, and must not confirm in that moment. The tick is
        # read first: the thread raises the fence before it moves the tick, so no order of
        # the two threads lets a confirm through between them.
        if time.monotonic() - self.heartbeat.last_tick > self.timeout:
            return False
        if self.freeze_report_pending():
            return False
        machine = self.machine
        if machine.state is not fsm.State.ACTIVE or machine.fenced:
            return False
        return self.witness_view is None or self._lost_peer_and_witness(self.loop.time()) is None

    def info(self) -> dict[str, Any]:
        machine = self.machine
        return {
            "name": machine.name,
            "role": machine.role.value,
            "state": machine.state.value,
            "epoch": machine.epoch,
            "known_hosts": self.known_hosts(),
        }

    # -- actions ------------------------------------------------------------------------

    def apply(self, outcome: fsm.Outcome) -> fsm.Decision | None:
        """Carry out an outcome; returns the decision, or a refusal if the epoch it needs
        could not be made durable (then nothing of the outcome takes effect)."""
        for action in outcome.actions:
            if isinstance(action, fsm.PersistEpoch):
                refusal = self._persist_epoch(action, outcome)
                if refusal is not None:
                    return refusal
        self.machine = outcome.machine
        for action in outcome.actions:
            if not isinstance(action, fsm.PersistEpoch):
                self._actions[type(action)](action)
        transition = outcome.transition
        if transition is not None:
            self._log_transition(transition)
        self._lead_or_follow()
        if transition is not None and transition.trigger is fsm.Event.HANDOVER:
            # The drained server that handed over rejoins at once, resuming where it left
            # off: nothing is confirmed on this one alone meanwhile (docs/failover.md,
            # "Planned switchover").
            self.broker.hold_until_rejoined(max(REJOIN_WAIT, self.timeout), self._handover_epoch)
        return outcome.decision

    # -- replication ----------------------------------------------------------------------

    def _lead_or_follow(self) -> None:
        state = self.machine.state
        if state is fsm.State.ACTIVE:
            self._following = False
            self.broker.lead(self.machine.epoch, 0 if self.role is fsm.Role.PRIMARY else 1)
        elif state is fsm.State.PASSIVE and not self._following:
            self._following = True
            peer_tls = self.config.failover.peer_tls
            options: dict[str, Any] = {"heartbeat": self.config.failover.link_heartbeat}
            if peer_tls is not None:
                options["ssl_context"] = client_context(peer_tls, self.config.source)
                options["server_hostname"] = peer_tls.server_name
            self.broker.follow(self._peer_url, options)
            self.machine = replace(self.machine, in_sync=self.broker.following_in_sync())

    def _new_term(self, peer: fsm.PeerInfo) -> None:
        """A PASSIVE in sync hears its peer ACTIVE in an epoch above the one it was in sync
        in: a new term (the ACTIVE restarted and leads again before this server subscribed
        to it, confirming alone meanwhile). What this server holds is the old term's: it
        is not in sync, so no client's vote makes it ACTIVE, until it has caught up again
        (docs/durability.md, section 5, "A new term")."""
        machine, synced = self.machine, self._synced_epoch
        if (
            machine.state is not fsm.State.PASSIVE
            or not machine.in_sync
            or peer.state is not fsm.State.ACTIVE
            or synced is None
            or peer.epoch <= synced
        ):
            return
        self.sync_changed(
            "passive",
            False,
            f"{peer.name} leads in epoch {peer.epoch}, this server was in sync in epoch "
            f"{synced}: it catches up again before it may take over",
        )
        self.broker.refollow()

    def sync_changed(self, side: str, in_sync: bool, reason: str) -> None:
        """The broker's replication changed: recorded; a PASSIVE's state feeds the rule."""
        if side == "passive":
            self.machine = replace(self.machine, in_sync=in_sync)
            # In sync with the ACTIVE of the highest epoch heard so far: its term.
            self._synced_epoch = self.machine.epoch if in_sync else None
        status = self.broker.replication_status()
        lag = (status.get("feed") or {}) if side == "active" else {}
        log.log(
            logging.INFO if in_sync else logging.WARNING,
            "replication (%s side): %s: %s",
            side,
            "in sync" if in_sync else "out of sync",
            reason,
        )
        self._write(
            "sync",
            side=side,
            sync="in_sync" if in_sync else "out_of_sync",
            reason=reason,
            lag_changes=lag.get("lag_changes"),
        )

    def store_damaged(self, found: dict[str, Any]) -> None:
        """At open, before the machine runs: not in sync (never voted in, a primary does
        not lead on seeing its backup), recorded."""
        self.machine = replace(self.machine, in_sync=False)
        self._write("store_damaged", path=found["path"], reason=found["reason"])

    def disk_failed(self, reason: str) -> None:
        """The store's disk failed (docs/durability.md, section 9): never in sync again in
        this process (no vote, no promote without --force, a primary does not lead on
        it), recorded; an ACTIVE hands the service to its PASSIVE if one is in sync, as
        a switchover does (what it confirmed is on that disk too)."""
        self.machine = replace(self.machine, in_sync=False)
        self._write("disk_failed", reason=reason)
        if self.machine.state is fsm.State.ACTIVE:
            self._disk_handover = self.loop.create_task(self._hand_over_failed_disk())

    async def _hand_over_failed_disk(self) -> None:
        try:
            result = await self._switchover(DISK_HANDOVER_WAIT, "amqha (the disk failed)")
            log.error("the disk failed: %s", result["result"])
        except ConsoleRefused as refused:
            log.error("the disk failed and the service stays here, confirming nothing: %s", refused)

    def quarantined(self, found: dict[str, Any]) -> None:
        self._write(
            "quarantine",
            messages=found["messages"],
            path=found["path"],
            queues=found["queues"],
        )

    def federation_event(self, fields: dict[str, Any]) -> None:
        """A `federation` record (a refused hello: a client can send those at will, so
        at most one a second of each kind; the next says how many were left out)."""
        unrecorded = self._federation_records.admit(str(fields.get("kind")), self.loop.time())
        if unrecorded is None:
            return
        if unrecorded:
            fields = {**fields, "unrecorded": unrecorded}
        self._write("federation", **fields)

    def _persist_epoch(self, action: fsm.PersistEpoch, outcome: fsm.Outcome) -> fsm.Refuse | None:
        try:
            store_epoch(self.config.data_dir, action.epoch)
        except OSError as error:
            reason = f"cannot persist epoch {action.epoch} in {self.config.data_dir}: {error}"
            log.error("%s", reason)
            if outcome.machine.state is fsm.State.ACTIVE and self.machine.state is not (
                fsm.State.ACTIVE
            ):
                # Serving in an epoch that a restart could forget risks two ACTIVE servers
                # in one epoch: the takeover does not happen.
                self._write("refuse", client=None, to=None, reason=reason)
                return fsm.Refuse(reason)
        return None

    def _log_transition(self, transition: fsm.Transition) -> None:
        if transition.to_state is fsm.State.ACTIVE:
            self.takeovers += 1
        # Start-up transitions are routine; a takeover or a step-down is what an operator
        # needs to see.
        notable = transition.trigger in (
            fsm.Event.CLIENT_REQUEST,
            fsm.Event.PROMOTE,
            fsm.Event.FORCE_PROMOTE,
        )
        level = (
            logging.WARNING
            if notable or transition.from_state is fsm.State.ACTIVE
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
        if transition.from_state is fsm.State.ACTIVE:
            self._freeze_held = False  # a fenced ACTIVE that yields is held no more
        # Tell the peer at once rather than at the next heartbeat: the pair settles faster.
        self.heartbeat.poke()

    def _send_handover(self, action: fsm.SendHandover) -> None:
        self.heartbeat.send(HANDOVER_TYPE)

    def _redirect_clients(self, action: fsm.RedirectClients) -> None:
        text = not_active_text(action.to)
        clients = self.broker.client_connections()
        for connection in clients:
            connection.close_forced(text)
        if clients:
            log.warning("closed %d client connection(s): %s", len(clients), text)
        # Administrators go too, but after the current turn: a console command that caused
        # this step-down gets its answer first. They can do nothing meanwhile: the server is
        # no longer serving.
        admins = self.broker.admin_connections()
        if admins:
            self.loop.call_soon(_close_all, admins, text)

    def _log_dual_active(self, action: fsm.LogDualActive) -> None:
        log.warning("dual active: %s", escaped(action.reason))
        self._log_peer_problem("dual_active", action)

    def _log_misconfigured(self, action: fsm.LogMisconfigured) -> None:
        log.error("misconfigured pair: %s", escaped(action.reason))
        self._log_peer_problem("misconfigured", action)

    def _log_peer_problem(
        self, event: str, action: fsm.LogDualActive | fsm.LogMisconfigured
    ) -> None:
        self._write(event, peer=action.peer, peer_epoch=action.peer_epoch, reason=action.reason)

    # -- descriptions -------------------------------------------------------------------

    def known_hosts(self) -> str:
        hosts = [self.config.public_address]
        peer = self.machine.peer
        hosts.append(peer.listen if peer is not None else self.config.failover.peer)
        return ",".join(dict.fromkeys(h for h in hosts if h))

    def status(self) -> dict[str, Any]:
        machine = self.machine
        now = self.loop.time()
        peer = machine.peer
        return {
            **self.info(),
            "listen": self.config.public_address,
            "controller": "running" if self.running else "stopped",
            "serving": self.serving(),
            "fenced": self.fenced,
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
            "peering": {
                "connected": self.heartbeat.connected,
                "target": self.config.failover.peer,
            },
            "misconfigured": machine.misconfigured,
            "config_drift": self.drift.keys,
            "maintenance": sorted(self.maintenance.roles),
            # While one server is upgraded after the other: the lower of the two is spoken.
            "protocol": {
                "this": protocol.PROTOCOL,
                "peer": self.peer_protocol,
                "spoken": protocol.spoken(self.peer_protocol or protocol.PROTOCOL),
            },
            "in_sync": machine.in_sync,
            # A PASSIVE that lost its peer: what the next client's connection would do.
            "takeover": fsm.vote_outlook(machine, now),
            "replication": self.broker.replication_status(),
            "malformed_peer_messages": self.malformed,
            "event_log_lost": self.events.lost,
            "takeovers": self.takeovers,
            "redirects": self.redirects,
            "refusals": self.refusals,
            "witness": self.witness_status(now),
        }

    def record(self, event: str, fields: dict[str, Any]) -> None:
        """An event of another part of this server (a federation link's) in its log."""
        self._write(event, **fields)

    def _write(self, event: str, **fields: Any) -> None:
        self.events.write(event, self.machine.state.value, self.machine.epoch, **fields)

    def _write_throttled(
        self, throttle: RecordThrottle, kind: str, now: float, event: str, **fields: Any
    ) -> None:
        unrecorded = throttle.admit(kind, now)
        if unrecorded is None:
            return
        if unrecorded:
            fields["unrecorded"] = unrecorded
        self._write(event, **fields)


def _connect_timeout(config: ServerConfig) -> float:
    """How long the peering waits for the peer's handshake before trying again."""
    return max(config.failover.timeout, 1.0)


def _close_all(connections: list[Any], text: str) -> None:
    for connection in connections:
        connection.close_forced(text)
