"""The active/passive failover state machine of one server in a primary/backup pair.

Owns: the single transition table that maps every (state, event) pair of docs/failover.md
to a handler (the roles, states, events and the values a step takes and returns are in
``values`` and re-exported here), the client vote, epochs, dual-active resolution,
misconfiguration detection, the manual failback and the planned switchover. `step()` is the only entry point: it takes
a `Machine` value, an event and the current monotonic time, and returns an `Outcome` value
carrying the new machine, the transition (if any), the answer to whoever asked (a client, the
console, the peer's handover) and the actions the host must carry out.

Must not know: sockets, asyncio, clocks, logging, files, AMQP or the shape of the amq.peer
message. Time is passed in; persistence, sending and logging are returned as action values
for the failover controller to perform, in order, before it acts on the decision.

Decisions where the pair's outline (docs/failover.md) is silent:

- Start-up grace. A freshly started server counts its peer as alive for one timeout
  (`peer_expiry = now + timeout`), so a primary restarting while the backup serves hears the
  backup before any client vote can make it ACTIVE ("wait a timeout first"). Without it the
  first client to reach a restarted primary would make it ACTIVE at once and, epochs being
  equal, take the service back from the backup: an automatic failback.
- PASSIVE backup + PEER_PRIMARY stays PASSIVE. The table's PRIMARY + PEER_PASSIVE row already
  makes the restarted primary ACTIVE when it sees us PASSIVE; if the backup also went ACTIVE on
  PEER_PRIMARY, two state messages crossing on the wire would give a dual active on a healthy
  link. The primary leading is the pair's normal shape and never leaves it without a server.
  (A PASSIVE primary + PEER_BACKUP still goes ACTIVE: the backup only stays in that case.)
- A restarted primary leads on PEER_PASSIVE only once the backup has heard it. The PASSIVE
  message must echo one of this run's own state messages (`PeerInfo.echo` > 0): one sent
  before the backup heard us comes from a backup whose clock of our silence still runs
  from our last run, which a client's vote may make ACTIVE before our first message
  reaches it (a dual active in which the backup, the lower epoch, yields what it
  confirmed meanwhile). A backup that has heard us has renewed our expiry and takes no
  vote while it hears us. Until then we stay PRIMARY, or follow the backup if it is
  voted in. PEER_BACKUP needs no echo: a BACKUP takes no client vote, and leads only
  on hearing us, by the same start rules on the same two epochs. The mirror holds for a
  restarted backup that led last: it leads on a PRIMARY message only once that message
  echoes one of its own run. After a double failure the primary, restarted first, may be
  voted in on our silence before our first message reaches it. (A primary not in sync or
  in maintenance takes no vote, unless `takeover_unsynced` lets the former: the backup
  leads on its first message.)
- Epoch adoption (Raft's term rule). On every correctly configured peer message the machine
  takes `epoch = max(own, peer's)`, after the table has run, and persists it when it grows. So
  a server that restarts never serves in an epoch below one it has seen, as §3 requires, even
  one it only heard of. Dual active compares the raw epochs before adoption. An ACTIVE that
  stays ACTIVE and hears a higher epoch (the peer led meanwhile: it took over while we were
  frozen or cut off, then restarted) takes the first epoch of its own above it instead: it
  never serves in an epoch its peer served in.
- Disjoint epochs. The primary leads only in odd epochs, the backup only in even ones
  (`next_epoch`). Adoption alone cannot keep them apart: with both servers down, a
  restarted primary may lead by client vote before it hears its peer, and with consecutive
  epochs it could take the very epoch the backup last served in (one above the last it
  heard of). With disjoint epochs two servers never confirm in one epoch, whatever they
  missed of each other. A pair that fails over back and forth still counts 1, 2, 3, ...
- Misconfiguration. A message from a peer with our name, our role, or a start state that
  contradicts its role is reported (`LogMisconfigured`, once per distinct reason), never
  paired: it refreshes neither `peer` nor `peer_expiry` and changes no state or epoch. While
  the last peer message was misconfigured, nothing takes this server to ACTIVE: the client
  vote, HANDOVER and MANUAL_RECOVER are refused with the reason. Only a correctly configured
  peer's state message clears it (or a restart). A misconfigured peer going quiet does not:
  it may only be cut off, and two servers of one role could never resolve a dual active.
  A server that is already ACTIVE keeps serving; a stray second primary or backup refuses
  its own clients, since it sees the same misconfiguration.
- Dual active is logged on both sides (`LogDualActive`): the loser also closes its clients
  with a redirect to the winner.
- Manual promotion (`amqha console promote [--force]`). A server that is not ACTIVE and
  whose peer is gone (a restarted backup whose primary is down refuses every client, with no
  other way out) becomes ACTIVE in a new epoch on an administrator's word. While the peer is
  heard ACTIVE, PROMOTE is refused: FORCE_PROMOTE takes the service anyway, in an epoch above
  the peer's, so the peer yields by the dual-active rule. A misconfigured pair is refused
  either way: promotion does not fix a configuration.
- The takeover rule (replication). A PASSIVE that is not in sync with its ACTIVE (it is
  still catching up, or it never was) does not take over by client vote, and PROMOTE
  refuses it too: it would serve without messages the ACTIVE confirmed. The refusal says
  why. `failover.takeover_unsynced` (the controller sets `takeover_unsynced`) lets the
  client vote through; FORCE_PROMOTE always may, and its reason says it was not in sync.
  The same rule decides who leads when the ACTIVE is gone and the other one restarts: a
  PASSIVE primary not in sync stays PASSIVE when its backup comes back (the backup's own
  store has what was confirmed) and the backup, told so by the primary's state message,
  takes ACTIVE; of two PASSIVE servers, the one in sync leads.
- Evidence of death (PEER_GONE). A peer whose link has just dropped and whose port now
  refuses connections has no process serving there: the kernel answers for it. That counts
  the peer lost at once instead of after a timeout; the client vote and the takeover rule
  then decide as for a silent peer. A silent peer (host down, link cut, process frozen)
  gives no such evidence and still needs the timeout. Hearing the peer clears it.
- The witness (failover.witness). With one, the client vote also needs the witness's
  agreement (a majority of witnesses has not heard the peer for twice the timeout): a
  peer silent here but heard there is cut off from us, not dead. Evidence of death needs
  no witness: the peer's own host has answered. The controller feeds the verdict in
  (WITNESS_AGREES / WITNESS_DISAGREES) from fresh answers only, and fences an ACTIVE that
  has lost both its peer and its witnesses (failover/witness.py).
- The rule after a freeze (PAUSED, docs/failover.md "Freezes"). A server that finds itself
  frozen past its timeout trusts no silence measured across the freeze: its peer counts as
  alive for a timeout plus the time the peer's link to us needs to come back after our
  thaw (`reconnect`: its connect timeout and its longest backoff), and evidence and a
  witness's verdict from before the freeze are dropped. An ACTIVE is fenced (`thawed`:
  `Fence`, no client read, no confirm) until (a) a peer state message echoes one we sent
  after the thaw (`PeerInfo.echo` >= `thaw_seq`): then the table has run on it and we
  serve if still ACTIVE; (b) PEER_GONE; or (c) a client's vote passes the rules a PASSIVE
  with a silent peer follows (silence counted from the thaw, the witness agreeing where
  there is one, not misconfigured): it serves on in its epoch. With a witness, (b) is a
  lost peer like any other: the vote decides, with the witness. Hearing its peer in an
  epoch above its own, in any state and in any message, it has been overtaken: it yields
  (the peer led after it). A timeout passing alone never lifts the fence.
- Maintenance (`amqha console maintenance on|off SERVER`). A server in maintenance never
  becomes ACTIVE but by FORCE_PROMOTE: the client vote, PROMOTE and a handover are refused
  with the reason, and where the table would have it lead (a primary starting, both
  PASSIVE) it stays. Its peer, told so by its state messages, leads where the primary
  would have (if in sync), and a switchover or a recover towards it is refused.
- Client answers. A server that is not ACTIVE redirects a client to the peer when the peer
  is alive and ACTIVE; otherwise it refuses with the misconfiguration reason if there is one,
  and otherwise redirects to nobody ("no active server, retry later").
"""

from __future__ import annotations

from dataclasses import replace

from .fsm_steps import (
    NO_ACTIVE_KNOWN,
    Handler,
    adopt_epoch,
    after_freeze,
    become_active,
    go_passive,
    misconfiguration,
    move,
    next_epoch,
    not_serving,
    overtaken,
    peer_led_last,
    refuse,
    report_misconfiguration,
    stay,
    unfence_if_not_active,
)
from .values import (
    PEER_EVENT,
    Accept,
    Action,
    Decision,
    Event,
    Fence,
    LogDualActive,
    LogMisconfigured,
    Machine,
    Outcome,
    PeerInfo,
    PersistEpoch,
    Redirect,
    RedirectClients,
    Refuse,
    Role,
    SendHandover,
    State,
    Transition,
    Unfence,
)

__all__ = [
    "Role",
    "State",
    "Event",
    "PEER_EVENT",
    "PeerInfo",
    "Machine",
    "Transition",
    "Accept",
    "Redirect",
    "Refuse",
    "Decision",
    "PersistEpoch",
    "SendHandover",
    "RedirectClients",
    "LogDualActive",
    "LogMisconfigured",
    "Fence",
    "Unfence",
    "Action",
    "Outcome",
    "FROZEN",
    "TRANSITIONS",
    "WAITING_FOR_VOTE",
    "Handler",
    "next_epoch",
    "step",
    "vote_outlook",
    "peer_role",
    "STALE_HANDOVER",
    "IN_MAINTENANCE",
]


_ACCEPT = Accept()


def step(
    machine: Machine,
    event: Event,
    now: float,
    peer: PeerInfo | None = None,
    *,
    thaw_seq: int = 0,
) -> Outcome:
    """Feed one event to the machine at monotonic time `now`.

    Peer events must carry the peer's state message as `peer`, and `event` must be
    `PEER_EVENT[peer.state]`; other events carry no peer. PAUSED carries `thaw_seq`, the
    first sequence number of the state messages we send after the thaw (`now`). Cheap
    enough for every Connection.Open: a dict lookup and one small allocation on the hot
    path.
    """
    if peer is None:
        if event in _PEER_EVENTS:
            raise ValueError(f"{event} needs the peer's state message")
        if event is Event.PAUSED:
            machine = replace(machine, thaw_seq=thaw_seq)
        return unfence_if_not_active(TRANSITIONS[(machine.state, event)](machine, event, now))
    if PEER_EVENT[peer.state] != event:
        raise ValueError(f"{event} does not match a peer in state {peer.state}")
    reason = misconfiguration(machine, peer)
    if reason is not None:
        return report_misconfiguration(machine, peer, reason)
    heard = replace(
        machine,
        peer=peer,
        # Never shortened: after a freeze the peer's clock runs from the thaw (PAUSED).
        peer_expiry=max(machine.peer_expiry, now + machine.timeout),
        misconfigured=None,
        peer_gone=False,
        handed_over=None if event is Event.PEER_ACTIVE else machine.handed_over,
    )
    if (
        heard.state in _STARTING
        and event in _PEER_STARTING
        and heard.in_sync
        and peer.in_sync
        and not peer.maintenance
        and peer_led_last(heard.role, heard.epoch, peer.epoch)
    ):
        # Both starting: the peer led after we last did, and may have confirmed alone what
        # we never had. We do not lead on our store; it leads, and we follow it
        # (docs/failover.md, "Who led last").
        heard = replace(heard, in_sync=False)
    if heard.fenced and peer.epoch > heard.epoch and event is not Event.PEER_ACTIVE:
        outcome = overtaken(heard, event, peer)
    else:
        outcome = after_freeze(TRANSITIONS[(machine.state, event)](heard, event, now), peer)
    return adopt_epoch(unfence_if_not_active(outcome), peer.epoch)


_PEER_EVENTS = frozenset(PEER_EVENT.values())
_STARTING = frozenset((State.PRIMARY, State.BACKUP))
_PEER_STARTING = frozenset((Event.PEER_PRIMARY, Event.PEER_BACKUP))


# Handlers whose result depends on more than the cell.


_NOT_IN_SYNC = (
    "this server is not in sync with the ACTIVE it followed (it has not caught up): "
    "taking over would lose confirmed messages; `amqha console promote --force` or "
    "failover.takeover_unsynced overrides"
)


def _unsynced(machine: Machine) -> bool:
    """Not in sync: a PASSIVE that has not caught up, or a server restarted with a store
    that was taking its peer's snapshot (it may hold part of it)."""
    return machine.state is not State.ACTIVE and not machine.in_sync


IN_MAINTENANCE = (
    "this server is in maintenance: it is never voted in nor promoted "
    "(`amqha console maintenance off`, or `promote --force`)"
)


def _peer_in_maintenance(machine: Machine) -> str:
    return (
        f"the {peer_role(machine)} is in maintenance: it does not take the service "
        "(`amqha console maintenance off` first)"
    )


def _heard_us(peer: PeerInfo | None) -> bool:
    """Whether the peer's message echoes one of this run's own (``PeerInfo.echo``): sent
    after the peer heard us, so its clock of our silence was renewed. A starting server
    that leads on a message from a peer that could be voted in waits for it."""
    return peer is not None and peer.echo > 0


def _primary_starts(why: str, *, heard_us: bool = False) -> Handler:
    """``heard_us``: lead only on a message that shows the peer has heard this run of ours
    (``PeerInfo.echo``): a PASSIVE that has not may be about to win a client's vote."""

    def primary_starts(machine: Machine, event: Event, now: float) -> Outcome:
        if machine.maintenance:
            return Outcome(machine)  # the backup, told so, leads
        if not machine.in_sync:
            # Our store may hold part of a snapshot: the backup, whose store is whole,
            # leads (it sees us not in sync), and we follow it.
            return Outcome(machine)
        if heard_us and not _heard_us(machine.peer):
            # Sent before the peer heard us: its clock of our silence still runs from our
            # last run, and a client's vote may make it ACTIVE before our first message
            # reaches it. Its next message, a heartbeat later, says whether it has heard us.
            return Outcome(machine)
        return become_active(machine, event, why)

    primary_starts.__doc__ = why + "; unless our store is incomplete (the backup leads)"
    if heard_us:
        primary_starts.__doc__ += ", or the peer has not heard this run of ours yet (we wait)"
    return primary_starts


def _client_vote(machine: Machine, event: Event, now: float) -> Outcome:
    """No peer heard for a timeout, or its process known gone: the client's request makes
    us ACTIVE (failover), unless this PASSIVE is not in sync and the configuration does not
    allow it."""
    if now < machine.peer_expiry or machine.misconfigured is not None:
        return Outcome(machine, decision=not_serving(machine, now))
    if machine.maintenance:
        return Outcome(machine, decision=_REFUSE_MAINTENANCE)
    why = _PEER_GONE_VOTE if machine.peer_gone else "no peer heard for a timeout: client vote"
    # With a witness, evidence of death does not skip it: a firewall that answers with TCP
    # resets looks like a dead process from here while the witness still hears the peer
    # serving (docs/failover.md, "Evidence").
    if machine.witnessed:
        if not machine.witness_agrees:
            return Outcome(machine, decision=Refuse(_WITNESS_DISAGREES))
        why += ", the witness agrees"
    if _unsynced(machine):
        if not machine.takeover_unsynced:
            return Outcome(machine, decision=Refuse(_NOT_IN_SYNC))
        return become_active(
            machine, event, why + ", NOT in sync (failover.takeover_unsynced)", _ACCEPT
        )
    return become_active(machine, event, why, _ACCEPT)


_PEER_GONE_VOTE = "the peer's process is gone (its link dropped, its port refuses): client vote"
_WITNESS_DISAGREES = (
    "the peer is silent here, but the witness still hears it or cannot be reached: the link "
    "between the two servers may be cut, and taking over would make a second ACTIVE"
)


FROZEN = (
    "this server was frozen past its timeout: it serves again once it hears its peer, "
    "or its peer's process is known gone, or its peer stays silent for a timeout after the "
    "thaw and a client votes"
)


def _paused(machine: Machine, event: Event, now: float) -> Outcome:
    """Frozen past the timeout, thawed at `now`: silence across the freeze means nothing.
    The peer's clock restarts at the thaw, with time for its link to us to come back;
    evidence and the witness's verdict from before are dropped. An ACTIVE is fenced."""
    thawed = replace(
        machine,
        peer_expiry=max(machine.peer_expiry, now + machine.timeout + machine.reconnect),
        peer_gone=False,
        witness_agrees=False,
    )
    if machine.state is not State.ACTIVE:
        return Outcome(replace(thawed, paused_at=now))
    return Outcome(replace(thawed, thawed=now), actions=(Fence(FROZEN),))


def _active_client(machine: Machine, event: Event, now: float) -> Outcome:
    """Serving clients is the ACTIVE server's job; after a freeze, only once the fence is
    lifted, and a client's vote lifts it under the rules of a PASSIVE whose peer is silent
    (counted from the thaw)."""
    if not machine.fenced:
        return Outcome(machine, decision=_ACCEPT)
    if now < machine.peer_expiry or machine.misconfigured is not None:
        decision = not_serving(machine, now)
        return Outcome(
            machine, decision=decision if decision != NO_ACTIVE_KNOWN else _REFUSE_FROZEN
        )
    why = (
        _PEER_GONE_VOTE
        if machine.peer_gone
        else "no peer heard for a timeout since the thaw: client vote"
    )
    # With a witness, evidence of death does not skip it (a firewall answering with resets
    # looks like a dead process from here while the witness still hears the peer serving).
    if machine.witnessed:
        if not machine.witness_agrees:
            return Outcome(machine, decision=Refuse(_WITNESS_DISAGREES))
        why += ", the witness agrees"
    return Outcome(replace(machine, thawed=None), decision=_ACCEPT, actions=(Unfence(why),))


_REFUSE_FROZEN = Refuse(FROZEN)
_REFUSE_MAINTENANCE = Refuse(IN_MAINTENANCE)


def _active_peer_gone(machine: Machine, event: Event, now: float) -> Outcome:
    """The peer's process is gone (evidence gathered after any freeze: the controller
    drops older reports). A fenced ACTIVE serves again: nothing serves at the peer."""
    outcome = _peer_gone(machine, event, now)
    if not machine.fenced or machine.witnessed:  # with a witness, a client's vote decides
        return outcome
    return replace(
        outcome,
        machine=replace(outcome.machine, thawed=None),
        actions=(Unfence("the peer's process is gone (its link dropped, its port refuses)"),),
    )


def _witness_says(agrees: bool) -> Handler:
    def witness_says(machine: Machine, event: Event, now: float) -> Outcome:
        if machine.witness_agrees == agrees:
            return Outcome(machine)
        return Outcome(replace(machine, witness_agrees=agrees))

    witness_says.__doc__ = (
        "the witness's latest answers: a majority has not heard the peer for twice the timeout"
        if agrees
        else "the witness's latest answers: the peer is heard, or no majority answered"
    )
    return witness_says


def _peer_gone(machine: Machine, event: Event, now: float) -> Outcome:
    """The peer's process is gone: its link dropped and its port refuses connections, so
    nothing serves there. The peer counts as lost now rather than after a timeout; what
    that allows (a client vote, in sync) is decided as for a silent peer."""
    if machine.peer_gone and machine.peer_expiry <= now:
        return Outcome(machine)
    return Outcome(replace(machine, peer_expiry=min(machine.peer_expiry, now), peer_gone=True))


def _backup_never_serves_first(machine: Machine, event: Event, now: float) -> Outcome:
    """A backup that has not seen an ACTIVE primary never serves first."""
    return Outcome(machine, decision=not_serving(machine, now))


def _resolve_dual_active(machine: Machine, event: Event, now: float) -> Outcome:
    """Split brain healed: the higher epoch stays ACTIVE, on equal epochs the primary."""
    peer = machine.peer
    assert peer is not None  # step() remembered the peer before calling us
    if machine.epoch != peer.epoch:
        we_stay = machine.epoch > peer.epoch
        rule = "the higher epoch stays"
    else:
        we_stay = machine.role is Role.PRIMARY
        rule = "equal epochs: the primary stays"
    if we_stay:
        if machine.dual_active_logged == peer.epoch:
            return Outcome(machine)
        reason = f"peer {peer.name} also ACTIVE in epoch {peer.epoch}; we stay ({rule})"
        logged = replace(machine, dual_active_logged=peer.epoch)
        return Outcome(logged, actions=(LogDualActive(peer.name, peer.epoch, reason),))
    reason = f"peer {peer.name} also ACTIVE in epoch {peer.epoch}; we yield ({rule})"
    return move(
        machine,
        State.PASSIVE,
        event,
        reason,
        actions=(LogDualActive(peer.name, peer.epoch, reason), RedirectClients(peer.listen)),
    )


def _manual_recover(machine: Machine, event: Event, now: float) -> Outcome:
    """Failback: an ACTIVE backup hands the service to its healthy PASSIVE primary."""
    peer = machine.peer
    if machine.role is not Role.BACKUP:
        return Outcome(machine, decision=Refuse("the primary is already ACTIVE: nothing to do"))
    if machine.fenced:
        return Outcome(machine, decision=_REFUSE_FROZEN)
    if machine.misconfigured is not None:
        return Outcome(machine, decision=Refuse(machine.misconfigured))
    if peer is None or not machine.peer_alive(now):
        return Outcome(machine, decision=Refuse("the primary is not heard from: keep serving"))
    if peer.state != State.PASSIVE:
        return Outcome(machine, decision=Refuse(f"the primary is {peer.state}, not PASSIVE"))
    if peer.maintenance:
        return Outcome(machine, decision=Refuse(_peer_in_maintenance(machine)))
    # Clients sent on before HANDOVER reaches the primary are told "no active server" (or
    # sent back here) for that moment; they retry, as after any failover.
    return move(
        replace(machine, handed_over=now),
        State.PASSIVE,
        event,
        "manual recovery: handing the service back to the primary",
        decision=_ACCEPT,
        actions=(SendHandover(), RedirectClients(peer.listen)),
    )


def _switchover(machine: Machine, event: Event, now: float) -> Outcome:
    """A planned switchover: the ACTIVE (either role), drained by its host (nothing read
    left unconfirmed, its in-sync PASSIVE holding everything), hands the service to that
    PASSIVE, which takes it in the next epoch of its own (HANDOVER)."""
    peer = machine.peer
    if machine.fenced:
        return Outcome(machine, decision=_REFUSE_FROZEN)
    if machine.misconfigured is not None:
        return Outcome(machine, decision=Refuse(machine.misconfigured))
    if peer is None or not machine.peer_alive(now):
        return Outcome(machine, decision=Refuse(f"the {peer_role(machine)} is not heard from"))
    if peer.state != State.PASSIVE:
        return Outcome(
            machine, decision=Refuse(f"the {peer_role(machine)} is {peer.state}, not PASSIVE")
        )
    if peer.maintenance:
        return Outcome(machine, decision=Refuse(_peer_in_maintenance(machine)))
    if not peer.in_sync:
        return Outcome(
            machine,
            decision=Refuse(
                f"the {peer_role(machine)} is not in sync: it would serve without messages "
                "this server confirmed"
            ),
        )
    return move(
        replace(machine, handed_over=now),
        State.PASSIVE,
        event,
        f"planned switchover: handing the service to the {peer_role(machine)}",
        decision=_ACCEPT,
        actions=(SendHandover(), RedirectClients(peer.listen)),
    )


def peer_role(machine: Machine) -> str:
    """The peer's role, in words."""
    return "backup" if machine.role is Role.PRIMARY else "primary"


def _take_handover(machine: Machine, event: Event, now: float) -> Outcome:
    """The failback's other half: the ACTIVE peer has stepped down in our favour."""
    if machine.misconfigured is not None:
        return Outcome(machine, decision=Refuse(machine.misconfigured))
    if machine.maintenance:
        return Outcome(machine, decision=_REFUSE_MAINTENANCE)
    if machine.paused_at is not None and now < (
        machine.paused_at + machine.timeout + machine.reconnect
    ):
        return Outcome(machine, decision=Refuse(STALE_HANDOVER))
    return become_active(machine, event, "the peer handed the service over", _ACCEPT)


def _promote(machine: Machine, event: Event, now: float) -> Outcome:
    """An administrator makes this server ACTIVE; refused while the peer is heard ACTIVE."""
    if machine.misconfigured is not None:
        return Outcome(machine, decision=Refuse(machine.misconfigured))
    peer = machine.peer
    if peer is not None and peer.state is State.ACTIVE and machine.peer_alive(now):
        if event is not Event.FORCE_PROMOTE:
            return Outcome(
                machine,
                decision=Refuse(
                    f"the peer {peer.name} is ACTIVE (epoch {peer.epoch}) and alive: promoting "
                    "would make two ACTIVE servers; --force makes the peer step down"
                ),
            )
        why = f"forced promotion by an administrator: the peer {peer.name} steps down"
    elif machine.peer_alive(now):
        why = "promoted by an administrator: the peer follows"
    else:
        why = "promoted by an administrator: the peer is not heard"
    if machine.maintenance:
        if event is not Event.FORCE_PROMOTE:
            return Outcome(machine, decision=_REFUSE_MAINTENANCE)
        why += "; forced while in maintenance"
    if _unsynced(machine):
        if event is not Event.FORCE_PROMOTE:
            return Outcome(machine, decision=Refuse(_NOT_IN_SYNC))
        why += "; forced while NOT in sync"
    return become_active(machine, event, why, _ACCEPT)


def _primary_leads(machine: Machine, event: Event, now: float) -> Outcome:
    """Both PASSIVE: the primary takes ACTIVE, the backup stays; never leave no server.
    If exactly one of them is in sync with the ACTIVE they followed, that one leads."""
    peer = machine.peer
    assert peer is not None
    if machine.handed_over is not None and now < machine.handed_over + machine.timeout:
        return Outcome(machine)  # the peer's state crossed our handover: it takes it next
    if machine.maintenance:
        return Outcome(machine)  # the peer, told so, leads
    if peer.maintenance:
        if machine.in_sync:
            return become_active(machine, event, "both servers PASSIVE: the peer is in maintenance")
        return Outcome(machine)
    if machine.in_sync != peer.in_sync:
        if machine.in_sync:
            return become_active(
                machine, event, "both servers PASSIVE: we are in sync, the peer is not"
            )
        return Outcome(machine)
    if machine.role is Role.PRIMARY:
        return become_active(machine, event, "both servers PASSIVE: the primary leads")
    return Outcome(machine)


def _backup_returns(machine: Machine, event: Event, now: float) -> Outcome:
    """The backup restarted while we stood by: we hold the service, unless we are not in
    sync (then the backup, which held it, leads) or in maintenance (the backup leads)."""
    if machine.maintenance or (_unsynced(machine) and not machine.takeover_unsynced):
        return Outcome(machine)
    return become_active(machine, event, "the backup restarted: we hold the service")


def _backup_waits_for_primary(machine: Machine, event: Event, now: float) -> Outcome:
    """The primary goes ACTIVE when it sees a BACKUP; if the primary is not in sync (a
    PASSIVE that has not caught up, or restarted with an incomplete store), it will not,
    and this backup (whose store held the service) leads, if its own store is whole. Both
    starting and the backup led last, it leads only on a message that shows the primary
    has heard this run of it (``PeerInfo.echo``)."""
    peer = machine.peer
    assert peer is not None
    if machine.maintenance or not machine.in_sync:
        return Outcome(machine)
    if peer.maintenance:
        return become_active(
            machine, event, f"the primary is {peer.state} and in maintenance: the backup leads"
        )
    if peer.state is State.PRIMARY and peer_led_last(peer.role, peer.epoch, machine.epoch):
        if not _heard_us(peer) and (peer.in_sync or machine.takeover_unsynced):
            # Sent before the primary heard this run of ours: a primary that restarted
            # while we were down may be voted in on our silence before our first message
            # reaches it (one not in sync takes no vote, unless the pair's configuration
            # says `takeover_unsynced`). Its next message, a heartbeat later, says whether
            # it has heard us (the mirror of the restarted primary's rule).
            return Outcome(machine)
        return become_active(
            machine, event, "both starting, and the backup led last: the backup leads"
        )
    if not peer.in_sync:
        return become_active(
            machine, event, f"the primary is {peer.state} and not in sync: the backup leads"
        )
    return Outcome(machine)


def _passive_sees_primary_start(machine: Machine, event: Event, now: float) -> Outcome:
    """The restarted primary goes ACTIVE on seeing us PASSIVE (racing it risks dual
    active), unless its store is incomplete: then we lead, if we are in sync."""
    peer = machine.peer
    assert peer is not None
    if machine.maintenance or not machine.in_sync:
        return Outcome(machine)
    if peer.maintenance:
        return become_active(machine, event, "the restarted primary is in maintenance: we lead")
    if not peer.in_sync:
        return become_active(machine, event, "the restarted primary's store is incomplete: we lead")
    return Outcome(machine)


def _same_role(machine: Machine, event: Event, now: float) -> Outcome:
    """A peer in our own start state shares our role: step() reports it before the table."""
    raise AssertionError(f"{machine.state} + {event}: a misconfigured peer reached the table")


_RECOVER_ON_ACTIVE_BACKUP = "recover runs on the backup while it is ACTIVE; this server is "
STALE_HANDOVER = (
    "a handover read right after this server was frozen may be stale (the peer was voted "
    "back in meanwhile): not taken"
)
_HANDOVER_ONLY_PASSIVE = "a handover is taken only while PASSIVE; this server is "
_ALREADY_ACTIVE = "this server is already ACTIVE: nothing to promote"
_SWITCHOVER_ONLY_ACTIVE = "a switchover runs on the ACTIVE server; this server is "

# The whole machine. Every (state, event) pair is a key: a missing one is a bug, not a no-op.
TRANSITIONS: dict[tuple[State, Event], Handler] = {
    # PRIMARY: the primary has started and not yet heard its peer.
    (State.PRIMARY, Event.PEER_PRIMARY): _same_role,
    (State.PRIMARY, Event.PEER_BACKUP): _primary_starts("the peer is a fresh backup: we lead"),
    (State.PRIMARY, Event.PEER_ACTIVE): go_passive("the backup took over while we were down"),
    (State.PRIMARY, Event.PEER_PASSIVE): _primary_starts(
        "the backup waits PASSIVE, none ACTIVE", heard_us=True
    ),
    (State.PRIMARY, Event.CLIENT_REQUEST): _client_vote,
    (State.PRIMARY, Event.MANUAL_RECOVER): refuse(_RECOVER_ON_ACTIVE_BACKUP + "PRIMARY"),
    (State.PRIMARY, Event.HANDOVER): refuse(_HANDOVER_ONLY_PASSIVE + "PRIMARY"),
    (State.PRIMARY, Event.PROMOTE): _promote,
    (State.PRIMARY, Event.PEER_GONE): _peer_gone,
    (State.PRIMARY, Event.WITNESS_AGREES): _witness_says(True),
    (State.PRIMARY, Event.WITNESS_DISAGREES): _witness_says(False),
    (State.PRIMARY, Event.PAUSED): _paused,
    (State.PRIMARY, Event.FORCE_PROMOTE): _promote,
    (State.PRIMARY, Event.SWITCHOVER): refuse(_SWITCHOVER_ONLY_ACTIVE + "PRIMARY"),
    # BACKUP: the backup has started and not yet seen an ACTIVE primary.
    (State.BACKUP, Event.PEER_PRIMARY): _backup_waits_for_primary,
    (State.BACKUP, Event.PEER_BACKUP): _same_role,
    (State.BACKUP, Event.PEER_ACTIVE): go_passive("the primary is ACTIVE: normal start"),
    (State.BACKUP, Event.PEER_PASSIVE): _backup_waits_for_primary,
    (State.BACKUP, Event.CLIENT_REQUEST): _backup_never_serves_first,
    (State.BACKUP, Event.MANUAL_RECOVER): refuse(_RECOVER_ON_ACTIVE_BACKUP + "BACKUP"),
    (State.BACKUP, Event.HANDOVER): refuse(_HANDOVER_ONLY_PASSIVE + "BACKUP"),
    (State.BACKUP, Event.PROMOTE): _promote,
    (State.BACKUP, Event.PEER_GONE): _peer_gone,
    (State.BACKUP, Event.WITNESS_AGREES): _witness_says(True),
    (State.BACKUP, Event.WITNESS_DISAGREES): _witness_says(False),
    (State.BACKUP, Event.PAUSED): _paused,
    (State.BACKUP, Event.FORCE_PROMOTE): _promote,
    (State.BACKUP, Event.SWITCHOVER): refuse(_SWITCHOVER_ONLY_ACTIVE + "BACKUP"),
    # ACTIVE: this server serves clients.
    (State.ACTIVE, Event.PEER_PRIMARY): stay("the restarted primary follows us"),
    (State.ACTIVE, Event.PEER_BACKUP): stay("the restarted backup follows us"),
    (State.ACTIVE, Event.PEER_ACTIVE): _resolve_dual_active,
    (State.ACTIVE, Event.PEER_PASSIVE): stay("the peer follows us"),
    (State.ACTIVE, Event.CLIENT_REQUEST): _active_client,
    (State.ACTIVE, Event.MANUAL_RECOVER): _manual_recover,
    (State.ACTIVE, Event.HANDOVER): refuse(_HANDOVER_ONLY_PASSIVE + "ACTIVE"),
    (State.ACTIVE, Event.PROMOTE): refuse(_ALREADY_ACTIVE),
    (State.ACTIVE, Event.PEER_GONE): _active_peer_gone,
    (State.ACTIVE, Event.WITNESS_AGREES): _witness_says(True),
    (State.ACTIVE, Event.WITNESS_DISAGREES): _witness_says(False),
    (State.ACTIVE, Event.PAUSED): _paused,
    (State.ACTIVE, Event.FORCE_PROMOTE): refuse(_ALREADY_ACTIVE),
    (State.ACTIVE, Event.SWITCHOVER): _switchover,
    # PASSIVE: the peer serves (or did until recently); this server stands by.
    (State.PASSIVE, Event.PEER_PRIMARY): _passive_sees_primary_start,
    (State.PASSIVE, Event.PEER_BACKUP): _backup_returns,
    (State.PASSIVE, Event.PEER_ACTIVE): stay("normal passive duty"),
    (State.PASSIVE, Event.PEER_PASSIVE): _primary_leads,
    (State.PASSIVE, Event.CLIENT_REQUEST): _client_vote,
    (State.PASSIVE, Event.MANUAL_RECOVER): refuse(_RECOVER_ON_ACTIVE_BACKUP + "PASSIVE"),
    (State.PASSIVE, Event.HANDOVER): _take_handover,
    (State.PASSIVE, Event.PROMOTE): _promote,
    (State.PASSIVE, Event.PEER_GONE): _peer_gone,
    (State.PASSIVE, Event.WITNESS_AGREES): _witness_says(True),
    (State.PASSIVE, Event.WITNESS_DISAGREES): _witness_says(False),
    (State.PASSIVE, Event.PAUSED): _paused,
    (State.PASSIVE, Event.FORCE_PROMOTE): _promote,
    (State.PASSIVE, Event.SWITCHOVER): refuse(_SWITCHOVER_ONLY_ACTIVE + "PASSIVE"),
}


WAITING_FOR_VOTE = (
    "takeover waits for a client: the peer is lost, and the next client to connect "
    "votes this server ACTIVE (the client vote)"
)


def vote_outlook(machine: Machine, now: float) -> str | None:
    """What the next client's connection would do to a PASSIVE that has lost its peer, in
    words for the console's status: ``WAITING_FOR_VOTE``, or why no takeover will come of
    it. None while the peer is heard, in the grace after a start, or when not PASSIVE.

    It asks the table itself (``step`` is pure, its outcome is dropped), so the console
    never says other than what a client's vote would do (docs/operations.md, "Console").
    """
    if machine.state is not State.PASSIVE or machine.peer_alive(now):
        return None
    decision = step(machine, Event.CLIENT_REQUEST, now).decision
    if isinstance(decision, Accept):
        return WAITING_FOR_VOTE
    if isinstance(decision, Refuse):
        return f"no takeover by client vote: {decision.reason}"
    return None
