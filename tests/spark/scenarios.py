"""The report's test scenarios: two-server histories written as the servers would log them.
Times are seconds after ``logs.T0``; every server sends state once a second, the failover
timeout is 3 s, and a state message takes 0.1 s to arrive."""

from __future__ import annotations

import json

from tests.spark.logs import Server

PRIMARY_LISTEN, BACKUP_LISTEN = "127.0.0.1:5672", "127.0.0.1:5673"
PRIMARY_PEER, BACKUP_PEER = "127.0.0.1:6673", "127.0.0.1:6672"


def pair(backup_skew: float = 0.0) -> tuple[Server, Server]:
    return Server("primary", "primary"), Server("backup", "backup", skew=backup_skew)


def _start(primary: Server, backup: Server) -> None:
    """Both start, see each other; the primary goes ACTIVE, the backup PASSIVE (epoch 1)."""
    primary.record(0.0, "started", "PRIMARY", listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(0.5, "started", "BACKUP", listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    backup.heard(0.9, "peer_up", "BACKUP", 0, primary, "PRIMARY", sent=0.8)
    primary.heard(1.0, "peer_up", "PRIMARY", 0, backup, "BACKUP", sent=0.9)
    primary.transition(1.01, "PRIMARY", "ACTIVE", 1, "PEER_BACKUP", "peer is a backup")
    backup.transition(1.1, "BACKUP", "PASSIVE", 1, "PEER_ACTIVE", "normal start")
    for at in (5.0, 6.0):
        backup.record(at, "redirect", "PASSIVE", 1, client="127.0.0.1:40001", to=PRIMARY_LISTEN)


def _takeover(primary: Server, backup: Server, evidence: str | None = None) -> None:
    """kill -9 of the ACTIVE primary at ~10 s (its last state message left at 9.5 s); the
    backup loses it at 12.5 s and a client's vote makes it ACTIVE at 14 s."""
    backup.heard(12.5, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.5, evidence=evidence)
    backup.transition(14.0, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")


def crash_takeover() -> tuple[Server, Server]:
    """_takeover; the primary does not come back; the backup is stopped at 20 s."""
    primary, backup = pair()
    _start(primary, backup)
    _takeover(primary, backup)
    backup.record(20.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


def _restart_passive(primary: Server, backup: Server) -> None:
    """_takeover, then the primary restarts at 30 s and goes PASSIVE behind the backup."""
    _takeover(primary, backup)
    primary.record(30.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(30.5, "peer_up", "ACTIVE", 2, primary, "PRIMARY", sent=30.4)
    primary.heard(31.0, "peer_up", "PRIMARY", 1, backup, "ACTIVE", sent=30.9)
    primary.transition(31.01, "PRIMARY", "PASSIVE", 2, "PEER_ACTIVE", "backup took over")
    for at in (40.0, 41.0):
        primary.record(at, "redirect", "PASSIVE", 2, client="127.0.0.1:40002", to=BACKUP_LISTEN)


def restart_passive() -> tuple[Server, Server]:
    """_restart_passive; the primary refuses a client at 50 s, stops at 58 s; the backup
    stops at 60 s."""
    primary, backup = pair()
    _start(primary, backup)
    _restart_passive(primary, backup)
    primary.record(50.0, "refuse", "PASSIVE", 2, client="127.0.0.1:40003", to=None)
    primary.record(58.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(60.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


def _left_out(server: Server, at: float, event: str, count: int | None) -> None:
    """Give ``server``'s ``event`` record at ``at`` an ``unrecorded`` count: a server writes
    at most one redirect and one refusal a second, and the next one it writes says how many
    of its kind it left out since the last."""
    for i, line in enumerate(server.lines):
        record = json.loads(line)
        if record["event"] == event and record["ts"] == server.clock(at):
            server.lines[i] = json.dumps({**record, "unrecorded": count})
            return
    raise AssertionError(f"{server.name} has no {event} record at {at}")


def throttled() -> tuple[Server, Server]:
    """restart_passive in a flood of clients, logged as the servers throttle it: the backup's
    redirect at 6 s says 41 were left out since the one at 5 s, the primary's refusal at 50 s
    says 9, its redirect at 41 s says null (none). Redirects: the backup 1 + 1 + 41 = 43 in
    the first minute, the primary 2 in the second; refusals: the primary 1 + 9 = 10."""
    primary, backup = restart_passive()
    _left_out(backup, 6.0, "redirect", 41)
    _left_out(primary, 41.0, "redirect", None)
    _left_out(primary, 50.0, "refuse", 9)
    return primary, backup


def console_recovery() -> tuple[Server, Server]:
    """_restart_passive, then failback from the console: a refused attempt at 35 s,
    ``recover`` at 45 s: the backup hands over (PASSIVE at 45.01 s), the primary takes
    ACTIVE at 45.05 s. The backup stops at 59 s, the primary at 60 s."""
    primary, backup = pair()
    _start(primary, backup)
    _restart_passive(primary, backup)
    refused = "refused: peer is not a healthy PASSIVE primary"
    backup.record(35.0, "console", "ACTIVE", 2, user="admin", command="recover", result=refused)
    primary.record(44.0, "console", "PASSIVE", 2, user="admin", command="status", result="ok")
    backup.record(45.0, "console", "ACTIVE", 2, user="admin", command="recover", result="ok")
    backup.transition(45.01, "ACTIVE", "PASSIVE", 2, "MANUAL_RECOVER", "failback")
    primary.transition(45.05, "PASSIVE", "ACTIVE", 3, "HANDOVER", "failback")
    backup.record(47.0, "redirect", "PASSIVE", 3, client="127.0.0.1:40004", to=PRIMARY_LISTEN)
    backup.record(59.0, "stopped", "PASSIVE", 3, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    primary.record(60.0, "stopped", "ACTIVE", 3, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    return primary, backup


def healed_blip_switchover() -> tuple[Server, Server]:
    """A blip, then a planned switchover: the link stalls at ~10 s and both log peer_lost
    (silence: the primary's last message left at 9.5 s, the backup's at 9.6 s), both hear
    each other again at 13 s, and the primary serves throughout. At 20 s a switchover: the
    primary drains and hands over (PASSIVE at 20.0 s), the backup is ACTIVE at 20.03 s.
    Both stop at 30 s."""
    primary, backup = pair()
    _start(primary, backup)
    backup.heard(12.5, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.5, evidence="silence")
    primary.heard(12.6, "peer_lost", "ACTIVE", 1, backup, "PASSIVE", sent=9.6, evidence="silence")
    backup.heard(13.0, "peer_up", "PASSIVE", 1, primary, "ACTIVE", sent=12.9)
    primary.heard(13.1, "peer_up", "ACTIVE", 1, backup, "PASSIVE", sent=13.0)
    primary.record(19.99, "switchover", "ACTIVE", 1, phase="requested", user="admin", to="backup")
    primary.transition(20.0, "ACTIVE", "PASSIVE", 1, "SWITCHOVER", "planned switchover")
    backup.transition(20.03, "PASSIVE", "ACTIVE", 2, "HANDOVER", "the peer handed over")
    primary.record(30.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(30.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


def link_cut(backup_skew: float = 0.0) -> tuple[Server, Server]:
    """The peer link is cut at ~10 s (last messages: primary's at 9.5 s, backup's at 9.6 s).
    Both log peer_lost; the still-ACTIVE primary keeps serving and a client's vote makes the
    backup ACTIVE too at 15 s: dual active. The link heals at ~19.8 s; the backup has the
    higher epoch, so the primary logs dual_active and goes PASSIVE at 20.02 s. A third server
    also configured as primary is reported at 5 s. Stops: primary 30 s, backup 31 s."""
    primary, backup = pair(backup_skew)
    _start(primary, backup)
    primary.record(
        5.0, "misconfigured", "ACTIVE", 1, peer="primary-2", peer_epoch=0, reason="two primaries"
    )
    backup.heard(12.5, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.5)
    primary.heard(12.6, "peer_lost", "ACTIVE", 1, backup, "PASSIVE", sent=9.6)
    backup.transition(15.0, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")
    backup.heard(19.95, "peer_up", "ACTIVE", 2, primary, "ACTIVE", sent=19.85)
    primary.heard(20.0, "peer_up", "ACTIVE", 1, backup, "ACTIVE", sent=19.9)
    primary.record(
        20.01, "dual_active", "ACTIVE", 1, peer="backup", peer_epoch=2, reason="higher epoch 2"
    )
    primary.transition(20.02, "ACTIVE", "PASSIVE", 2, "DUAL_ACTIVE", "lower epoch")
    for at in (25.0, 26.0):
        primary.record(at, "redirect", "PASSIVE", 2, client="127.0.0.1:40005", to=BACKUP_LISTEN)
    primary.record(30.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(31.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


def dense_bulk() -> tuple[Server, Server]:
    """Redirects and refusals many to a second, with state changes in their midst, the case
    the Spark job's per-second compression of bulk records must get right: refusals as
    PRIMARY then redirects as PASSIVE in one second (0 s); a PRIMARY refusal among PASSIVE
    redirects (1 s); ACTIVE for 0.1 s between redirects (2 s); a restart among redirects
    (3 s); two identical records (5 s). The backup is ACTIVE from 0.05 s."""
    primary, backup = pair()
    backup.record(0.0, "started", "BACKUP", listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    backup.transition(0.05, "BACKUP", "ACTIVE", 1, "PEER_PASSIVE")
    primary.record(0.0, "started", "PRIMARY", listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    for at in (0.1, 0.2, 0.3):
        primary.record(at, "refuse", "PRIMARY", 0, client="127.0.0.1:40010", to=None)
    primary.transition(0.4, "PRIMARY", "PASSIVE", 1, "PEER_ACTIVE")

    def redirect(at: float) -> None:
        primary.record(at, "redirect", "PASSIVE", 1, client="127.0.0.1:40011", to=BACKUP_LISTEN)

    for step in range(10):
        redirect(0.45 + step * 0.05)
    redirect(1.1)
    primary.record(1.2, "refuse", "PRIMARY", 1, client="127.0.0.1:40012", to=None)
    redirect(1.3)
    redirect(2.1)
    primary.transition(2.3, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST")
    primary.transition(2.4, "ACTIVE", "PASSIVE", 2, "DUAL_ACTIVE")
    redirect(2.5)
    redirect(2.9)
    redirect(3.1)
    primary.record(3.5, "started", "PRIMARY", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    redirect(3.9)
    for _ in range(2):
        primary.record(5.0, "console", "PASSIVE", 2, user="admin", command="status", result="ok")
    primary.record(6.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(6.0, "stopped", "ACTIVE", 1, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


# ---------------------------------------------------------------- clock evidence
# State messages take 1 ms here. The true story of the three is the same: both start, the
# primary goes ACTIVE at 1 s; it is killed at ~10 s (last message 9.5 s), the backup loses it
# at 12.5 s and takes over at 13.75 s (outage 9.5 .. 13.75); the primary restarts at 20 s and
# follows as PASSIVE; at 30 s a console ``recover`` hands back: the backup is PASSIVE at 30.0 s,
# the primary ACTIVE at 30.1 s (outage 30.0 .. 30.1, never dual active); both stop at 40 s.
LATENCY = 0.001


def _evidence_story(
    backup_skew: float, primary_peer_up: bool, backup_peer_up: bool, primary_blip: bool
) -> tuple[Server, Server]:
    primary, backup = pair(backup_skew)
    primary.record(0.0, "started", "PRIMARY", listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(0.5, "started", "BACKUP", listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    if backup_peer_up:
        backup.heard(0.9 + LATENCY, "peer_up", "BACKUP", 0, primary, "PRIMARY", sent=0.9)
    if primary_peer_up:
        primary.heard(0.95 + LATENCY, "peer_up", "PRIMARY", 0, backup, "BACKUP", sent=0.95)
    primary.transition(1.0, "PRIMARY", "ACTIVE", 1, "PEER_BACKUP")
    backup.transition(1.1, "BACKUP", "PASSIVE", 1, "PEER_ACTIVE")
    if primary_blip:
        # A peer-link blip the primary alone logs: its only record about the backup, with
        # the failover timeout (0.8 s) between last_seen and ts.
        primary.heard(4.0, "peer_lost", "ACTIVE", 1, backup, "PASSIVE", sent=3.2)
    backup.heard(12.5, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.5)
    backup.transition(13.75, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST")
    primary.record(20.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    if backup_peer_up:
        backup.heard(20.5 + LATENCY, "peer_up", "ACTIVE", 2, primary, "PRIMARY", sent=20.5)
    if primary_peer_up:
        primary.heard(20.6 + LATENCY, "peer_up", "PRIMARY", 1, backup, "ACTIVE", sent=20.6)
    primary.transition(21.01, "PRIMARY", "PASSIVE", 2, "PEER_ACTIVE")
    backup.record(29.99, "console", "ACTIVE", 2, user="admin", command="recover", result="ok")
    backup.transition(30.0, "ACTIVE", "PASSIVE", 2, "MANUAL_RECOVER")
    primary.transition(30.1, "PASSIVE", "ACTIVE", 3, "HANDOVER")
    backup.record(40.0, "stopped", "PASSIVE", 3, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    primary.record(40.0, "stopped", "ACTIVE", 3, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    return primary, backup


def synced_no_primary_peer_up() -> tuple[Server, Server]:
    """Synced clocks; the primary logged no peer_up, only the blip's peer_lost."""
    return _evidence_story(0.0, primary_peer_up=False, backup_peer_up=True, primary_blip=True)


def skewed_one_side() -> tuple[Server, Server]:
    """The backup's clock 5 s ahead; the primary logged no peer record at all."""
    return _evidence_story(5.0, primary_peer_up=False, backup_peer_up=True, primary_blip=False)


def skewed_both_sides() -> tuple[Server, Server]:
    """The backup's clock 5 s ahead; both logged their peer_up records."""
    return _evidence_story(5.0, primary_peer_up=True, backup_peer_up=True, primary_blip=False)


# ---------------------------------------------------------------- replication
# The ACTIVE logs ``sync`` records about its PASSIVE: out_of_sync when it becomes ACTIVE with
# none in sync and when it loses it, in_sync when one has caught up; the PASSIVE logs its own
# (side "passive"), which say nothing about the pair's protection.
NONE_IN_SYNC = "ACTIVE with no in-sync passive"


def _in_order(primary: Server, backup: Server) -> tuple[Server, Server]:
    """Each log in its own time order, as a server writes it (the stories add records late)."""
    for server in (primary, backup):
        server.lines.sort(key=lambda line: json.loads(line)["ts"])
    return primary, backup


def _start_replicating(primary: Server, backup: Server) -> None:
    """_start; the primary is ACTIVE with no in-sync PASSIVE from 1.01 s until the backup has
    caught up (its own record at 2.9 s, the primary's at 3.0 s)."""
    _start(primary, backup)
    primary.sync(1.01, "ACTIVE", 1, "out_of_sync", NONE_IN_SYNC)
    backup.sync(2.9, "PASSIVE", 1, "in_sync", "snapshot applied in 0.1 s", side="passive")
    primary.sync(3.0, "ACTIVE", 1, "in_sync", "snapshot of 12 changes applied")


def sync_caught_up() -> tuple[Server, Server]:
    """_start_replicating; the PASSIVE's replication link drops at 20 s and it has caught up
    again at 25 s, both in the primary's one ACTIVE run. Stops: backup 40 s, primary 41 s.
    Unprotected: 1.01 .. 3.0 and 20 .. 25."""
    primary, backup = pair()
    _start_replicating(primary, backup)
    primary.sync(20.0, "ACTIVE", 1, "out_of_sync", "the in-sync PASSIVE left")
    backup.sync(20.1, "PASSIVE", 1, "out_of_sync", "a new snapshot from the ACTIVE", "passive")
    backup.sync(24.9, "PASSIVE", 1, "in_sync", "snapshot applied in 0.2 s", side="passive")
    primary.sync(25.0, "ACTIVE", 1, "in_sync", "snapshot of 40 changes applied")
    backup.record(40.0, "stopped", "PASSIVE", 1, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    primary.record(41.0, "stopped", "ACTIVE", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    return _in_order(primary, backup)


def maintenance_patch() -> tuple[Server, Server]:
    """sync_caught_up, with the backup put in maintenance on the ACTIVE primary at 19.5 s
    and out of it at 23 s (a refused attempt at 19.6 s changes nothing). Unprotected: 1.01 ..
    3.0 and 20 .. 25, of which 20 .. 23 planned."""
    primary, backup = sync_caught_up()
    on = {"server": "backup", "by": "console", "user": "admin"}
    primary.record(19.5, "maintenance", "ACTIVE", 1, on=True, **on)
    primary.record(19.6, "maintenance", "ACTIVE", 1, on=False, result="refused: no", **on)
    backup.record(19.51, "maintenance", "PASSIVE", 1, server="backup", on=True, by="peer")
    primary.record(23.0, "maintenance", "ACTIVE", 1, on=False, **on)
    return _in_order(primary, backup)


def unprotected_takeover(backup_skew: float = 0.0) -> tuple[Server, Server]:
    """_start_replicating, then _restart_passive: the in-sync backup takes over at 14 s with
    no PASSIVE (its out_of_sync record at 14.001 s); the primary, back at 30 s and PASSIVE at
    31.01 s, has caught up at 33 s. Stops: primary 58 s, backup 60 s. Unprotected: 1.01 ..
    3.0 (primary) and 14 .. 33 (backup); the outage 9.5 .. 14 is not: nobody was ACTIVE."""
    primary, backup = pair(backup_skew)
    _start_replicating(primary, backup)
    _restart_passive(primary, backup)
    backup.sync(14.001, "ACTIVE", 2, "out_of_sync", NONE_IN_SYNC)
    primary.sync(32.9, "PASSIVE", 2, "in_sync", "snapshot applied in 1.8 s", side="passive")
    backup.sync(33.0, "ACTIVE", 2, "in_sync", "snapshot of 800 changes applied")
    primary.record(58.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(60.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


def crash_unprotected() -> tuple[Server, Server]:
    """_start_replicating; the backup takes over at 14 s unprotected (_takeover); the primary
    restarts at 18 s and follows (PASSIVE at 18.51 s) but the backup is killed at ~22 s,
    before the primary has caught up (the backup's last state message left at 21.5 s; the
    primary loses it at 24.5 s, and, not in sync, stays PASSIVE). The primary stops at 30 s.
    Unprotected: 1.01 .. 3.0 (primary) and 14 .. 21.5 (backup, to its last sign of life)."""
    primary, backup = pair()
    _start_replicating(primary, backup)
    _takeover(primary, backup)
    backup.sync(14.0, "ACTIVE", 2, "out_of_sync", NONE_IN_SYNC)
    primary.record(18.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(18.45, "peer_up", "ACTIVE", 2, primary, "PRIMARY", sent=18.4)
    primary.heard(18.5, "peer_up", "PRIMARY", 1, backup, "ACTIVE", sent=18.45)
    primary.transition(18.51, "PRIMARY", "PASSIVE", 2, "PEER_ACTIVE", "backup took over")
    primary.heard(24.5, "peer_lost", "PASSIVE", 2, backup, "ACTIVE", sent=21.5)
    primary.record(30.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    return _in_order(primary, backup)


def split_quarantine() -> tuple[Server, Server]:
    """link_cut with replication: the primary is in sync from 2 s and loses its PASSIVE when
    the link is cut (12.6 s); the backup is ACTIVE too from 15 s with no PASSIVE; when the
    link heals the primary steps down (20.02 s), quarantines the 7 messages it accepted
    alone (20.5 s) and catches up: the backup is in sync at 22 s. Unprotected: 1.01 .. 2.0
    and 12.6 .. 20.02 (primary), 15 .. 22 (backup): 0.99 s + 9.4 s for the pair."""
    primary, backup = link_cut()
    primary.sync(1.01, "ACTIVE", 1, "out_of_sync", NONE_IN_SYNC)
    primary.sync(2.0, "ACTIVE", 1, "in_sync", "snapshot of 3 changes applied")
    primary.sync(12.6, "ACTIVE", 1, "out_of_sync", "the in-sync PASSIVE left")
    backup.sync(15.0, "ACTIVE", 2, "out_of_sync", NONE_IN_SYNC)
    primary.record(
        20.5,
        "quarantine",
        "PASSIVE",
        2,
        messages=7,
        path="/var/lib/amqha/primary/quarantine/1700000020-primary.sqlite",
        queues=["orders"],
    )
    backup.sync(22.0, "ACTIVE", 2, "in_sync", "snapshot of 90 changes applied")
    return _in_order(primary, backup)


def witnessed_cut() -> tuple[Server, Server]:
    """A pair with a witness: the primary's link goes down at ~10 s (its last state message
    left at 9.5 s). It stops serving at 12.6 s, having lost its peer and the witness; the
    witness agrees the primary is gone and a client's vote makes the backup ACTIVE at 14 s.
    Both stop at 20 s."""
    primary, backup = pair()
    _start(primary, backup)
    primary.record(
        12.6, "witness_fence", "ACTIVE", 1, fenced=True, reason="lost both the peer and the witness"
    )
    backup.heard(12.5, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.5)
    backup.transition(
        14.0,
        "PASSIVE",
        "ACTIVE",
        2,
        "CLIENT_REQUEST",
        "no peer heard for a timeout: client vote, the witness agrees",
    )
    primary.record(20.0, "stopped", "ACTIVE", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(20.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


# ---------------------------------------------------------------- failover causes
# Each story has one failover of one cause (docs/report.md, "Failovers").


def killed_refused() -> tuple[Server, Server]:
    """kill -9 of the ACTIVE primary on a live host: its last state message left at 9.5 s;
    the link drops and its port refuses, so the backup logs the loss with ``evidence:
    refused`` at 10.2 s and a client's vote makes it ACTIVE at 10.5 s. The primary restarts
    at 30 s and follows. Client outage 9.5 .. 10.5 (1.0 s); the process was gone by the
    loss, so at least 0.3 s. Both stop at 40 s."""
    primary, backup = pair()
    _start(primary, backup)
    backup.heard(10.2, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.5, evidence="refused")
    backup.transition(10.5, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")
    primary.record(30.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(30.5, "peer_up", "ACTIVE", 2, primary, "PRIMARY", sent=30.4)
    primary.heard(31.0, "peer_up", "PRIMARY", 1, backup, "ACTIVE", sent=30.9)
    primary.transition(31.01, "PRIMARY", "PASSIVE", 2, "PEER_ACTIVE", "backup took over")
    primary.record(40.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(40.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


def host_silent() -> tuple[Server, Server]:
    """The ACTIVE primary's host goes dark at ~10 s (last message 9.5 s): no refusal, only
    silence, lost at 12.5 s (``evidence: silence``), the backup ACTIVE at 14 s; the primary
    comes back (restarted) at 30 s. Client outage 9.5 .. 14 (4.5 s), at least 1.5 s."""
    primary, backup = pair()
    _start(primary, backup)
    _takeover(primary, backup, evidence="silence")
    primary.record(30.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(30.5, "peer_up", "ACTIVE", 2, primary, "PRIMARY", sent=30.4)
    primary.heard(31.0, "peer_up", "PRIMARY", 1, backup, "ACTIVE", sent=30.9)
    primary.transition(31.01, "PRIMARY", "PASSIVE", 2, "PEER_ACTIVE", "backup took over")
    primary.record(40.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(40.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


def link_cut_silence() -> tuple[Server, Server]:
    """link_cut with its losses logged as ``silence``: both servers alive, the primary serves
    on (no client outage) and is dual active with the backup 15 .. 20.02 (5.02 s)."""
    primary, backup = link_cut()
    for server in (primary, backup):
        server.lines = [
            json.dumps({**r, "evidence": "silence"} if r["event"] == "peer_lost" else r)
            for r in map(json.loads, server.lines)
        ]
    return primary, backup


def clean_stop() -> tuple[Server, Server]:
    """The ACTIVE primary is stopped cleanly at 10 s (``stopped``); its port refuses at once,
    the backup logs the loss at 10.1 s and a client's vote makes it ACTIVE at 10.3 s: a
    client outage of 0.3 s, exact. The backup stops at 20 s."""
    primary, backup = pair()
    _start(primary, backup)
    primary.record(10.0, "stopped", "ACTIVE", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(10.1, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.9, evidence="refused")
    backup.transition(10.3, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")
    backup.record(20.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


def forced_dual() -> tuple[Server, Server]:
    """Both ACTIVE with no loss logged: a PASSIVE backup that hears nothing wrong is made
    ACTIVE by a client's vote at 10 s (as after a state message refused), the primary yields
    to its higher epoch at 12 s. Dual active 10 .. 12, no client outage. Stops at 20 s."""
    primary, backup = pair()
    _start(primary, backup)
    backup.transition(10.0, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")
    primary.record(
        11.99, "dual_active", "ACTIVE", 1, peer="backup", peer_epoch=2, reason="higher epoch 2"
    )
    primary.transition(12.0, "ACTIVE", "PASSIVE", 2, "DUAL_ACTIVE", "lower epoch")
    primary.record(20.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(20.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return primary, backup


def three_recovers() -> tuple[Server, Server]:
    """Three rounds of kill -9 of the ACTIVE primary (refused port) and a console failback,
    every 100 s: at 100 k + 10 the primary dies (last message 100 k + 9.5), the backup loses
    it at + 10.2 and is ACTIVE at + 10.5; the primary is back and PASSIVE at + 31.01; at
    + 45 ``recover`` hands back (backup PASSIVE + 45.01, primary ACTIVE + 45.05). Six
    failovers (three crashes, three manual), three failbacks. Both stop at 300 s."""
    primary, backup = pair()
    _start(primary, backup)
    for k in range(3):
        t = 100.0 * k
        epoch = 1 + 2 * k
        backup.heard(
            t + 10.2,
            "peer_lost",
            "PASSIVE",
            epoch,
            primary,
            "ACTIVE",
            sent=t + 9.5,
            evidence="refused",
        )
        backup.transition(t + 10.5, "PASSIVE", "ACTIVE", epoch + 1, "CLIENT_REQUEST")
        primary.record(t + 30.0, "started", "PRIMARY", epoch, listen=PRIMARY_LISTEN)
        backup.heard(t + 30.5, "peer_up", "ACTIVE", epoch + 1, primary, "PRIMARY", sent=t + 30.4)
        primary.heard(t + 31.0, "peer_up", "PRIMARY", epoch, backup, "ACTIVE", sent=t + 30.9)
        primary.transition(t + 31.01, "PRIMARY", "PASSIVE", epoch + 1, "PEER_ACTIVE")
        backup.record(
            t + 45.0,
            "console",
            "ACTIVE",
            epoch + 1,
            user="admin",
            command="recover",
            result="handed over to the primary",
        )
        backup.transition(t + 45.01, "ACTIVE", "PASSIVE", epoch + 1, "MANUAL_RECOVER")
        primary.transition(t + 45.05, "PASSIVE", "ACTIVE", epoch + 2, "HANDOVER")
    primary.record(300.0, "stopped", "ACTIVE", 7, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(300.0, "stopped", "PASSIVE", 7, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


def _link(server: Server, at: float, kind: str, link: str, epoch: int) -> None:
    """A federation record of the ACTIVE ``server``: ``link`` from upstream ``central``."""
    server.record(at, "federation", "ACTIVE", epoch, kind=kind, link=link, upstream="central")


def federation_links() -> tuple[Server, Server]:
    """crash_takeover with two federated exchanges from ``central``. The primary's links
    come up at 2 s (market) and 2.5 s (rpc); market goes down at 5 s, fails to reconnect at
    6 and 7 s, is up again at 8 s; both end with the primary's kill (its last sign of life
    9.5 s). The backup, ACTIVE at 14 s, brings market up at 14.5 s; rpc fails there at 15 s
    (its exchange is missing upstream) and stays down until the stop at 20 s.
    market: watched 2 .. 20, down 5 .. 8 and 9.5 .. 14.5 (8 s, 2 downs, 2 failures).
    rpc: watched 2.5 .. 20, down 9.5 .. 20 (10.5 s, 1 down, 1 failure)."""
    primary, backup = pair()
    _start(primary, backup)
    _link(primary, 2.0, "link_up", "market", 1)
    _link(primary, 2.5, "link_up", "rpc", 1)
    _link(primary, 5.0, "link_down", "market", 1)
    _link(primary, 6.0, "link_failed", "market", 1)
    _link(primary, 7.0, "link_failed", "market", 1)
    _link(primary, 8.0, "link_up", "market", 1)
    _takeover(primary, backup)
    _link(backup, 14.5, "link_up", "market", 2)
    _link(backup, 15.0, "link_failed", "rpc", 2)
    backup.record(20.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


# Midnight UTC after T0 (2023-11-14T22:13:20Z): T0 + 6400 s.
MIDNIGHT = 6400.0


def federation_midnight() -> tuple[Server, Server]:
    """_start; the primary's market link is up at 2 s, down from 10 s before midnight to
    20 s after, and both servers stop 100 s after midnight. Day one: watched 2 .. 6400,
    down 10 s, 1 down; day two: watched 100 s, down 20 s, no new down."""
    primary, backup = pair()
    _start(primary, backup)
    _link(primary, 2.0, "link_up", "market", 1)
    _link(primary, MIDNIGHT - 10, "link_down", "market", 1)
    _link(primary, MIDNIGHT + 20, "link_up", "market", 1)
    backup.record(MIDNIGHT + 99, "stopped", "PASSIVE", 1, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    primary.record(MIDNIGHT + 100, "stopped", "ACTIVE", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    return _in_order(primary, backup)


# ---------------------------------------------------------------- freezes
# A frozen process (SIGSTOP, a VM paused) writes nothing; when it runs again its heartbeat
# thread finds the gap in its ticks and writes ``paused`` with it, often after the records
# the thaw's first messages caused (docs/failover.md, "Freezes").
BACKUP_QUARANTINE = "/var/lib/amqha/backup/quarantine/1700000062-backup.sqlite"


def _paused(server: Server, at: float, state: str, epoch: int, frozen_at: float) -> None:
    server.record(at, "paused", state, epoch, gap=round(at - frozen_at, 3))


def frozen_active() -> tuple[Server, Server]:
    """The ACTIVE primary is frozen from 10 s (its last tick; its last state message left at
    9.95 s) to 30 s. The backup loses it by silence at 13 s and a client's vote makes it
    ACTIVE at 14 s. At the thaw the primary hears the higher epoch and steps down (30.01 s),
    then writes ``paused`` (30.02 s, gap 20.02 s). Both stop at 40 s. A freeze with its gap:
    client outage 10 .. 14 (4.0 s proven, 4.05 s at most), no dual active (the primary
    served nothing frozen, and stepped down as it woke)."""
    primary, backup = pair()
    _start(primary, backup)
    primary.sync(9.0, "ACTIVE", 1, "in_sync", "snapshot of 3 changes applied")
    backup.heard(13.0, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.95, evidence="silence")
    backup.transition(14.0, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")
    backup.record(
        30.005, "dual_active", "ACTIVE", 2, peer="primary", peer_epoch=1, reason="we stay"
    )
    primary.record(
        30.01, "dual_active", "PASSIVE", 2, peer="backup", peer_epoch=2, reason="we yield"
    )
    primary.transition(30.01, "ACTIVE", "PASSIVE", 2, "PEER_ACTIVE", "higher epoch 2")
    _paused(primary, 30.02, "PASSIVE", 2, frozen_at=10.0)
    primary.record(40.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(40.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


def zombie_day() -> tuple[Server, Server]:
    """Freezes, a zombie, a restart and a SIGTERM (three takeovers, three rows):

    - 10 .. 30 s the ACTIVE primary is frozen (last message 9.95 s); the backup loses it at
      13 s and is voted ACTIVE at 14 s (epoch 2): #1, a freeze, outage 10 .. 14.
    - At 30 s the primary thaws (``paused``, gap 20 s), hears nothing from the backup (its
      link is stuck), loses it at 30.6 s and serves on in epoch 1: dual active 30 .. 60.
    - At 60 s the backup is restarted (SIGTERM while ACTIVE: ``stopped``; the primary is
      ACTIVE already, so no takeover); it starts at 62 s, follows the primary (PASSIVE at
      62.5 s) and quarantines the 3,152 messages it confirmed alone (62.6 s).
    - At 80 s the primary is stopped with SIGTERM; its port refuses, the backup logs the
      loss at 80.2 s and is voted ACTIVE at 80.5 s (epoch 3): #2, stopped, 0.5 s exact.
    - The primary restarts at 85 s and follows (PASSIVE 85.51 s). 100 .. 120 s the ACTIVE
      backup is frozen (last message 99.95 s); the primary loses it at 103 s and is voted
      ACTIVE at 104 s (epoch 4): #3, a freeze, outage 100 .. 104. The thawed backup yields
      at 120.01 s and writes ``paused`` at 120.02 s.
    - Both stop at 130 s. Dual active: 30 s in all, all of it #1's."""
    primary, backup = pair()
    _start(primary, backup)
    backup.heard(13.0, "peer_lost", "PASSIVE", 1, primary, "ACTIVE", sent=9.95, evidence="silence")
    backup.transition(14.0, "PASSIVE", "ACTIVE", 2, "CLIENT_REQUEST", "client vote")
    _paused(primary, 30.0, "ACTIVE", 1, frozen_at=10.0)
    primary.heard(30.6, "peer_lost", "ACTIVE", 1, backup, "PASSIVE", sent=9.9, evidence="silence")
    backup.record(60.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    backup.record(62.0, "started", "BACKUP", 2, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    backup.heard(62.4, "peer_up", "BACKUP", 2, primary, "ACTIVE", sent=62.3)
    primary.heard(62.45, "peer_up", "ACTIVE", 1, backup, "BACKUP", sent=62.35)
    backup.transition(62.5, "BACKUP", "PASSIVE", 2, "PEER_ACTIVE", "the primary is ACTIVE")
    backup.record(
        62.6, "quarantine", "PASSIVE", 2, messages=3152, path=BACKUP_QUARANTINE, queues=["q"]
    )
    primary.record(80.0, "stopped", "ACTIVE", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(80.2, "peer_lost", "PASSIVE", 2, primary, "ACTIVE", sent=79.9, evidence="refused")
    backup.transition(80.5, "PASSIVE", "ACTIVE", 3, "CLIENT_REQUEST", "client vote")
    primary.record(85.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.heard(85.45, "peer_up", "ACTIVE", 3, primary, "PRIMARY", sent=85.4)
    primary.heard(85.5, "peer_up", "PRIMARY", 1, backup, "ACTIVE", sent=85.45)
    primary.transition(85.51, "PRIMARY", "PASSIVE", 3, "PEER_ACTIVE", "backup took over")
    primary.heard(103.0, "peer_lost", "PASSIVE", 3, backup, "ACTIVE", sent=99.95)
    primary.transition(104.0, "PASSIVE", "ACTIVE", 4, "CLIENT_REQUEST", "client vote")
    backup.record(
        120.01, "dual_active", "PASSIVE", 4, peer="primary", peer_epoch=4, reason="we yield"
    )
    backup.transition(120.01, "ACTIVE", "PASSIVE", 4, "PEER_ACTIVE", "higher epoch 4")
    _paused(backup, 120.02, "PASSIVE", 4, frozen_at=100.0)
    primary.record(130.0, "stopped", "ACTIVE", 4, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    backup.record(130.0, "stopped", "PASSIVE", 4, listen=BACKUP_LISTEN, peer=BACKUP_PEER)
    return _in_order(primary, backup)


def flapping() -> tuple[Server, Server]:
    """_start, then seven handovers a second apart from 10 s (the ACTIVE steps down, the
    other is ACTIVE 0.05 s later: seven manual failovers whose labels would cover each
    other), a crash of the ACTIVE backup at 40 s (refused, the primary ACTIVE at 40.5 s).
    Both stop at 60 s."""
    primary, backup = pair()
    _start(primary, backup)
    servers, epoch = [primary, backup], 1
    for k in range(7):
        old, new = servers[k % 2], servers[(k + 1) % 2]
        old.transition(10.0 + k, "ACTIVE", "PASSIVE", epoch, "MANUAL_RECOVER", "hand over")
        epoch += 1
        new.transition(10.05 + k, "PASSIVE", "ACTIVE", epoch, "HANDOVER", "handed over")
    primary.heard(40.2, "peer_lost", "PASSIVE", epoch, backup, "ACTIVE", 39.9, "refused")
    primary.transition(40.5, "PASSIVE", "ACTIVE", epoch + 1, "CLIENT_REQUEST", "client vote")
    primary.record(60.0, "stopped", "ACTIVE", epoch + 1, listen=PRIMARY_LISTEN, peer=PRIMARY_PEER)
    return primary, backup
