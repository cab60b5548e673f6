"""The pair's health as `amqha console status` judges it, and the exit status it gives."""

from __future__ import annotations

from typing import Any

from amqha.console import ERROR_EXITS, Server
from amqha.console_health import health


def server(port: int) -> Server:
    return Server(f"amqp://admin:x@127.0.0.1:{port}/", f"127.0.0.1:{port}", "admin", "/")


def member(name: str, state: str, peer_state: str, alive: bool = True, **replication: Any) -> dict:
    return {
        "name": name,
        "role": name,
        "state": state,
        "in_sync": True,
        "peer": {"name": "other", "state": peer_state, "alive": alive},
        "replication": {"enabled": True, **replication},
    }


def judge(*statuses: dict) -> tuple[str, str, int]:
    code, text = health([(server(5672 + i), s) for i, s in enumerate(statuses)])
    return code, text, ERROR_EXITS.get(code, 0)


IN_SYNC_FEED = {"feed": {"state": "in_sync"}}
FOLLOWING = {"follower": {"state": "in_sync", "in_sync": True}}


def test_healthy_is_one_active_and_a_passive_in_sync() -> None:
    assert judge(
        member("primary", "ACTIVE", "PASSIVE", **IN_SYNC_FEED),
        member("backup", "PASSIVE", "ACTIVE", **FOLLOWING),
    ) == ("healthy", "healthy: one ACTIVE, its PASSIVE in sync", 0)


def test_a_passive_catching_up_is_not_in_sync() -> None:
    code, text, status = judge(
        member("primary", "ACTIVE", "PASSIVE", feed={"state": "catching_up", "lag_changes": 120}),
        member("backup", "PASSIVE", "ACTIVE", follower={"state": "catching_up", "in_sync": False}),
    )
    assert (code, status) == ("not_in_sync", 4)
    assert text == "not in sync: primary is ACTIVE, catching up (lag 120)"


def test_down_split_no_active_and_a_lone_active() -> None:
    down = {"error": {"code": "connection_refused", "message": "down: connection refused"}}
    assert judge(member("primary", "ACTIVE", "PASSIVE", **IN_SYNC_FEED), down) == (
        "connection_refused",
        "127.0.0.1:5673 does not answer: down: connection refused",
        3,
    )
    assert judge(
        member("primary", "ACTIVE", "ACTIVE", **IN_SYNC_FEED),
        member("backup", "ACTIVE", "ACTIVE", **IN_SYNC_FEED),
    )[::2] == ("split", 7)
    waiting = member("backup", "PASSIVE", "ACTIVE", alive=False, **FOLLOWING)
    waiting["takeover"] = "takeover waits for a client: ..."
    assert judge(waiting) == (
        "no_active",
        "no server is ACTIVE: backup's takeover waits for a client: ...",
        3,
    )
    assert judge(member("backup", "ACTIVE", "ACTIVE", alive=False, **IN_SYNC_FEED))[::2] == (
        "peer_lost",
        3,
    )


def test_a_refused_login_outranks_a_server_that_is_down() -> None:
    down = {"error": {"code": "connection_refused", "message": "down"}}
    wrong = {"error": {"code": "auth_failed", "message": "auth failed: ..."}}
    assert judge(down, wrong) == ("auth_failed", "127.0.0.1:5673: auth failed: ...", 6)
