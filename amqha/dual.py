"""What a dual active looks like from the servers' own status answers, in words.

Owns: finding two ACTIVE servers in the status of one or both servers of a pair (both
answers, or one server's answer and its view of its live peer), naming both with their epochs and whether each serves, and saying what will
resolve it: the higher epoch stays (equal epochs: the primary), and the other yields as
soon as it hears the winner's state, which travels on the winner's own link to it
(docs/failover.md, "Dual active").

Must not know: sockets, the console's transport, the machine (it reads status values
only: ``FailoverController.status``'s fields ``name``, ``role``, ``state``, ``epoch``,
``serving``, ``fenced``, ``peer``, ``peering``).
"""

from __future__ import annotations

from typing import Any


def dual_active(statuses: list[dict[str, Any]]) -> str | None:
    """The text naming both ACTIVE servers and what resolves it; None if not two ACTIVE."""
    answered = {s.get("name"): s for s in statuses if s.get("name")}
    actives: dict[str, dict[str, Any]] = {
        name: s for name, s in answered.items() if s.get("state") == "ACTIVE"
    }
    if len(answered) == 1:  # one server's answer: its live peer as it hears it
        (status,) = answered.values()
        peer = status.get("peer") or {}
        name = peer.get("name")
        if name and name not in answered and peer.get("state") == "ACTIVE" and peer.get("alive"):
            actives[name] = {**peer, "seen_by": status.get("name")}
    if len(actives) < 2:
        return None
    first, second = list(actives.values())[:2]
    winner, loser = sorted((first, second), key=_rank, reverse=True)
    rule = (
        "the higher epoch stays"
        if winner.get("epoch") != loser.get("epoch")
        else "equal epochs: the primary stays"
    )
    return (
        f"two servers are ACTIVE: {_who(winner)} and {_who(loser)}; {rule}, so "
        f"{loser.get('name')} yields {_resolution(winner, loser)}"
    )


def _rank(status: dict[str, Any]) -> tuple[int, int]:
    return int(status.get("epoch") or 0), 1 if status.get("role") == "primary" else 0


def _who(status: dict[str, Any]) -> str:
    name = status.get("name")
    epoch = status.get("epoch")
    if "seen_by" in status:
        return f"{name} (epoch {epoch}, as {status['seen_by']} hears it)"
    if status.get("fenced"):
        serving = "not serving: held after a freeze"
    elif status.get("serving"):
        serving = "serving"
    else:
        serving = "not serving"
    return f"{name} (epoch {epoch}, {serving})"


def _resolution(winner: dict[str, Any], loser: dict[str, Any]) -> str:
    """When the loser will yield, from what each side says of the other."""
    heard = loser.get("peer") or {}
    if (
        "seen_by" not in loser
        and heard.get("name") == winner.get("name")
        and heard.get("alive")
        and heard.get("state") == "ACTIVE"
    ):
        return f"within a heartbeat: it hears {winner.get('name')} ACTIVE now"
    link = (winner.get("peering") or {}) if "seen_by" not in winner else {}
    if link.get("connected") is True:
        return (
            f"at {winner.get('name')}'s next state message: its link to {loser.get('name')} is up"
        )
    if link.get("connected") is False:
        return (
            f"once it hears {winner.get('name')}: {winner.get('name')}'s link to it is "
            "down (resolved when that link reconnects, or by stopping one of them)"
        )
    return f"once it hears {winner.get('name')}'s state (the other server did not answer)"
