"""The report's test scenarios: two-server histories written as the servers would log them.
Times are seconds after ``logs.T0``; every server sends state once a second, the failover
timeout is 3 s, and a state message takes 0.1 s to arrive."""

from __future__ import annotations

from tests.spark.logs import Server

PRIMARY_LISTEN, BACKUP_LISTEN = "127.0.0.1:5672", "127.0.0.1:5673"


def pair(backup_skew: float = 0.0) -> tuple[Server, Server]:
    return Server("primary", "primary"), Server("backup", "backup", skew=backup_skew)


def _start(primary: Server, backup: Server) -> None:
    """Both start, see each other; the primary goes ACTIVE, the backup PASSIVE (epoch 1)."""
    primary.record(0.0, "started", "PRIMARY", listen=PRIMARY_LISTEN, peer="127.0.0.1:6673")
    backup.record(0.5, "started", "BACKUP", listen=BACKUP_LISTEN, peer="127.0.0.1:6672")
    backup.record(
        0.9, "peer_up", "BACKUP", peer="primary", peer_state="PRIMARY",
        last_seen=primary.clock(0.8),
    )
    primary.record(
        1.0, "peer_up", "PRIMARY", peer="backup", peer_state="BACKUP",
        last_seen=backup.clock(0.9),
    )
    primary.record(
        1.01, "transition", "ACTIVE", 1,
        **{"from": "PRIMARY", "to": "ACTIVE"}, trigger="PEER_BACKUP", reason="peer is a backup",
    )
    backup.record(
        1.1, "transition", "PASSIVE", 1,
        **{"from": "BACKUP", "to": "PASSIVE"}, trigger="PEER_ACTIVE", reason="normal start",
    )
    for at in (5.0, 6.0):
        backup.record(at, "redirect", "PASSIVE", 1, client="127.0.0.1:40001", to=PRIMARY_LISTEN)


def crash_takeover() -> tuple[Server, Server]:
    """kill -9 of the ACTIVE primary at ~10 s (its last state message left at 9.5 s); the
    backup loses it at 12.5 s and a client's vote makes it ACTIVE at 14 s. The primary does
    not come back; the backup is stopped at 20 s."""
    primary, backup = pair()
    _start(primary, backup)
    backup.record(
        12.5, "peer_lost", "PASSIVE", 1, peer="primary", peer_state="ACTIVE",
        last_seen=primary.clock(9.5),
    )
    backup.record(
        14.0, "transition", "ACTIVE", 2,
        **{"from": "PASSIVE", "to": "ACTIVE"}, trigger="CLIENT_REQUEST", reason="client vote",
    )
    backup.record(20.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer="127.0.0.1:6672")
    return primary, backup


def _restart_passive(primary: Server, backup: Server) -> None:
    """After crash_takeover's first 14 s: the primary restarts at 30 s and goes PASSIVE."""
    backup.record(
        12.5, "peer_lost", "PASSIVE", 1, peer="primary", peer_state="ACTIVE",
        last_seen=primary.clock(9.5),
    )
    backup.record(
        14.0, "transition", "ACTIVE", 2,
        **{"from": "PASSIVE", "to": "ACTIVE"}, trigger="CLIENT_REQUEST", reason="client vote",
    )
    primary.record(30.0, "started", "PRIMARY", 1, listen=PRIMARY_LISTEN, peer="127.0.0.1:6673")
    backup.record(
        30.5, "peer_up", "ACTIVE", 2, peer="primary", peer_state="PRIMARY",
        last_seen=primary.clock(30.4),
    )
    primary.record(
        31.0, "peer_up", "PRIMARY", 1, peer="backup", peer_state="ACTIVE",
        last_seen=backup.clock(30.9),
    )
    primary.record(
        31.01, "transition", "PASSIVE", 2,
        **{"from": "PRIMARY", "to": "PASSIVE"}, trigger="PEER_ACTIVE",
        reason="backup took over while we were down",
    )
    for at in (40.0, 41.0):
        primary.record(at, "redirect", "PASSIVE", 2, client="127.0.0.1:40002", to=BACKUP_LISTEN)


def restart_passive() -> tuple[Server, Server]:
    """crash_takeover, then the primary restarts at 30 s and goes PASSIVE behind the ACTIVE
    backup; it refuses a client at 50 s; the primary stops at 58 s, the backup at 60 s."""
    primary, backup = pair()
    _start(primary, backup)
    _restart_passive(primary, backup)
    primary.record(50.0, "refuse", "PASSIVE", 2, client="127.0.0.1:40003", to=None)
    primary.record(58.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer="127.0.0.1:6673")
    backup.record(60.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer="127.0.0.1:6672")
    return primary, backup


def console_recovery() -> tuple[Server, Server]:
    """restart_passive up to 41 s, then failback from the console: a refused attempt at 35 s,
    ``recover`` at 45 s: the backup hands over (PASSIVE at 45.01 s), the primary takes
    ACTIVE at 45.05 s. The backup stops at 59 s, the primary at 60 s."""
    primary, backup = pair()
    _start(primary, backup)
    _restart_passive(primary, backup)
    backup.record(
        35.0, "console", "ACTIVE", 2, user="admin", command="recover",
        result="refused: peer is not a healthy PASSIVE primary",
    )
    primary.record(44.0, "console", "PASSIVE", 2, user="admin", command="status", result="ok")
    backup.record(45.0, "console", "ACTIVE", 2, user="admin", command="recover", result="ok")
    backup.record(
        45.01, "transition", "PASSIVE", 2,
        **{"from": "ACTIVE", "to": "PASSIVE"}, trigger="MANUAL_RECOVER", reason="failback",
    )
    primary.record(
        45.05, "transition", "ACTIVE", 3,
        **{"from": "PASSIVE", "to": "ACTIVE"}, trigger="HANDOVER", reason="failback",
    )
    backup.record(47.0, "redirect", "PASSIVE", 3, client="127.0.0.1:40004", to=PRIMARY_LISTEN)
    backup.record(59.0, "stopped", "PASSIVE", 3, listen=BACKUP_LISTEN, peer="127.0.0.1:6672")
    primary.record(60.0, "stopped", "ACTIVE", 3, listen=PRIMARY_LISTEN, peer="127.0.0.1:6673")
    return primary, backup


def link_cut(backup_skew: float = 0.0) -> tuple[Server, Server]:
    """The peer link is cut at ~10 s (last messages: primary's at 9.5 s, backup's at 9.6 s).
    Both log peer_lost; the still-ACTIVE primary keeps serving and a client's vote makes the
    backup ACTIVE too at 15 s: dual active. The link heals at ~19.8 s; the backup has the
    higher epoch, so the primary logs dual_active and goes PASSIVE at 20.02 s. A third server
    also configured as primary is reported at 5 s. Stops: primary 30 s, backup 31 s."""
    primary, backup = pair(backup_skew)
    _start(primary, backup)
    primary.record(
        5.0, "misconfigured", "ACTIVE", 1, peer="primary-2", peer_epoch=0,
        reason="peer role primary equals ours",
    )
    backup.record(
        12.5, "peer_lost", "PASSIVE", 1, peer="primary", peer_state="ACTIVE",
        last_seen=primary.clock(9.5),
    )
    primary.record(
        12.6, "peer_lost", "ACTIVE", 1, peer="backup", peer_state="PASSIVE",
        last_seen=backup.clock(9.6),
    )
    backup.record(
        15.0, "transition", "ACTIVE", 2,
        **{"from": "PASSIVE", "to": "ACTIVE"}, trigger="CLIENT_REQUEST", reason="client vote",
    )
    backup.record(
        19.95, "peer_up", "ACTIVE", 2, peer="primary", peer_state="ACTIVE",
        last_seen=primary.clock(19.85),
    )
    primary.record(
        20.0, "peer_up", "ACTIVE", 1, peer="backup", peer_state="ACTIVE",
        last_seen=backup.clock(19.9),
    )
    primary.record(
        20.01, "dual_active", "ACTIVE", 1, peer="backup", peer_epoch=2,
        reason="peer ACTIVE with higher epoch 2",
    )
    primary.record(
        20.02, "transition", "PASSIVE", 2,
        **{"from": "ACTIVE", "to": "PASSIVE"}, trigger="DUAL_ACTIVE", reason="lower epoch",
    )
    for at in (25.0, 26.0):
        primary.record(at, "redirect", "PASSIVE", 2, client="127.0.0.1:40005", to=BACKUP_LISTEN)
    primary.record(30.0, "stopped", "PASSIVE", 2, listen=PRIMARY_LISTEN, peer="127.0.0.1:6673")
    backup.record(31.0, "stopped", "ACTIVE", 2, listen=BACKUP_LISTEN, peer="127.0.0.1:6672")
    return primary, backup
