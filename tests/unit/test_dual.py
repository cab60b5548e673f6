"""A dual active in words (amqha/dual.py), as `amqha console status` and the management
page say it: both servers named with their epochs, whether each serves, and what will
resolve it, from both servers' own answers."""

from __future__ import annotations

from typing import Any

from amqha.console import Server
from amqha.console_health import health
from amqha.dual import dual_active
from amqha.management.shapes import nodes_shape


def status(
    name: str,
    state: str,
    epoch: int,
    peer_state: str,
    peer_epoch: int,
    alive: bool = True,
    connected: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    other = "backup" if name == "primary" else "primary"
    return {
        "name": name,
        "role": name,
        "state": state,
        "epoch": epoch,
        "serving": state == "ACTIVE",
        "fenced": None,
        "peer": {
            "name": other,
            "role": other,
            "state": peer_state,
            "epoch": peer_epoch,
            "alive": alive,
        },
        "peering": {"connected": connected},
        "replication": {"enabled": False},
        **extra,
    }


def test_one_active_is_no_dual_active() -> None:
    assert dual_active([status("primary", "ACTIVE", 1, "PASSIVE", 1)]) is None
    assert (
        dual_active(
            [
                status("primary", "ACTIVE", 3, "PASSIVE", 3),
                status("backup", "PASSIVE", 3, "ACTIVE", 3),
            ]
        )
        is None
    )


def test_both_named_and_the_loser_hearing_the_winner_yields_within_a_heartbeat() -> None:
    text = dual_active(
        [status("primary", "ACTIVE", 1, "ACTIVE", 2), status("backup", "ACTIVE", 2, "ACTIVE", 1)]
    )
    assert text == (
        "two servers are ACTIVE: backup (epoch 2, serving) and primary (epoch 1, serving); "
        "the higher epoch stays, so primary yields within a heartbeat: it hears backup "
        "ACTIVE now"
    )


def test_a_healthy_link_is_not_called_broken() -> None:
    # The loser has not heard the winner yet (it still knows it PASSIVE), and the winner's
    # link to it is up: the next state message settles it, no heal is waited for.
    text = dual_active(
        [
            status("primary", "ACTIVE", 1, "PASSIVE", 1, fenced="frozen", serving=False),
            status("backup", "ACTIVE", 2, "ACTIVE", 1),
        ]
    )
    assert text is not None
    assert "primary (epoch 1, not serving: held after a freeze)" in text
    assert "at backup's next state message: its link to primary is up" in text
    assert "heals" not in text


def test_a_link_down_says_what_will_resolve_it() -> None:
    text = dual_active(
        [
            status("primary", "ACTIVE", 1, "PASSIVE", 1, alive=False),
            status("backup", "ACTIVE", 2, "ACTIVE", 1, alive=False, connected=False),
        ]
    )
    assert text is not None
    assert "backup's link to it is down" in text and "primary yields" in text


def test_one_servers_view_of_its_live_peer_counts() -> None:
    text = dual_active([status("primary", "ACTIVE", 3, "ACTIVE", 2)])
    assert text is not None
    assert text.startswith(
        "two servers are ACTIVE: primary (epoch 3, serving) and backup (epoch 2, as primary "
        "hears it); the higher epoch stays, so backup yields"
    )
    assert dual_active([status("primary", "ACTIVE", 3, "ACTIVE", 2, alive=False)]) is None


def test_console_status_and_the_page_say_it() -> None:
    statuses = [
        status("primary", "ACTIVE", 1, "ACTIVE", 2),
        status("backup", "ACTIVE", 2, "ACTIVE", 1),
    ]
    servers = [Server(f"amqp://a:x@127.0.0.1:{p}/", f"127.0.0.1:{p}", "a", "/") for p in (1, 2)]
    code, text = health(list(zip(servers, statuses, strict=True)))
    assert code == "split" and text == dual_active(statuses)
    own = {
        "name": "primary",
        "uptime": 1.0,
        "mem_used": 0,
        "mem_limit": 1,
        "mem_alarm": False,
        "disk_alarm": False,
    }
    nodes = nodes_shape(statuses[0], {"enabled": False}, own, 0.0)
    assert nodes[0]["amqha"]["dual_active"] == dual_active([statuses[0]])
    assert "backup (epoch 2, as primary hears it)" in nodes[0]["amqha"]["dual_active"]
