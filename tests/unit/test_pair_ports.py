"""Where `amqha pair` puts the pair's listeners: the plan, read as an operator reads it."""

from __future__ import annotations

from typing import Any

import pytest

from amqha.ports import parse_ports, plan, set_arguments


def configs(**extra: dict[str, Any]) -> dict[str, Any]:
    """The shipped pair's shape: AMQP on 5672/5673, each naming the other as its peer."""
    primary = {
        "server": {"listen": "127.0.0.1:5672"},
        "failover": {"peer": "127.0.0.1:5673"},
        **extra.get("primary", {}),
    }
    backup = {
        "server": {"listen": "127.0.0.1:5673"},
        "failover": {"peer": "127.0.0.1:5672", "peer_listen": ["127.0.0.1:5672"]},
        **extra.get("backup", {}),
    }
    return {"primary": primary, "backup": backup}


def everything_free(host: str, port: int) -> bool:
    return True


def picker(*ports: int):
    left = list(ports)
    return lambda host: left.pop(0)


def test_given_ports_move_every_listen_key_by_the_same_offset_and_the_peers_follow() -> None:
    data = configs(
        primary={
            "metrics": {"listen": "127.0.0.1:15692"},
            "management": {"listen": "127.0.0.1:15672"},
        },
        backup={"metrics": {"listen": "127.0.0.1:15693"}, "tls": {"listen": "127.0.0.1:5674"}},
    )
    result = plan(data, (6000, 6001), everything_free, picker())
    assert result.overrides == {
        "primary": {
            "server.listen": "127.0.0.1:6000",
            "management.listen": "127.0.0.1:16000",
            "metrics.listen": "127.0.0.1:16020",
            "failover.peer": "127.0.0.1:6001",
        },
        "backup": {
            "server.listen": "127.0.0.1:6001",
            "metrics.listen": "127.0.0.1:16021",
            "tls.listen": "127.0.0.1:6002",
            "failover.peer": "127.0.0.1:6000",
            "failover.peer_listen": ["127.0.0.1:6000"],
        },
    }
    assert result.main == {"primary": "127.0.0.1:6000", "backup": "127.0.0.1:6001"}
    assert result.notes == []


def test_only_taken_ports_move_without_given_ones_and_each_move_is_said() -> None:
    taken = {5672, 15692}
    result = plan(
        configs(primary={"metrics": {"listen": "127.0.0.1:15692"}}),
        None,
        lambda host, port: port not in taken,
        picker(40001, 40002),
    )
    assert result.overrides["primary"] == {
        "server.listen": "127.0.0.1:40001",
        "metrics.listen": "127.0.0.1:40002",
    }
    assert result.overrides["backup"] == {
        "failover.peer": "127.0.0.1:40001",
        "failover.peer_listen": ["127.0.0.1:40001"],
    }
    assert result.notes == [
        "127.0.0.1:5672 (primary's server.listen) is taken: using 127.0.0.1:40001 instead",
        "127.0.0.1:15692 (primary's metrics.listen) is taken: using 127.0.0.1:40002 instead",
    ]


def test_two_listeners_on_one_port_and_a_derived_port_out_of_range_get_free_ones() -> None:
    both = {"metrics": {"listen": "127.0.0.1:15692"}}
    result = plan(configs(primary=both, backup=both), None, everything_free, picker(40001))
    assert result.overrides["backup"] == {"metrics.listen": "127.0.0.1:40001"}
    result = plan(configs(primary=both), (60000, 60001), everything_free, picker(40002))
    assert result.overrides["primary"]["metrics.listen"] == "127.0.0.1:40002"
    assert result.notes == [
        "primary's metrics.listen cannot follow --ports to 70020: using 127.0.0.1:40002 instead"
    ]


def test_a_list_of_listen_addresses_moves_item_by_item() -> None:
    data = configs()
    data["primary"]["server"]["listen"] = ["127.0.0.1:5672", "127.0.0.2:5680"]
    result = plan(data, (7000, 7001), everything_free, picker())
    assert result.overrides["primary"]["server.listen"] == ["127.0.0.1:7000", "127.0.0.2:7008"]
    assert set_arguments({"server.listen": ["[::1]:7000"]}) == [
        "--set",
        'server.listen=["[::1]:7000"]',
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("5672", "expected PRIMARY,BACKUP as two port numbers"),
        ("a,b", "expected PRIMARY,BACKUP as two port numbers"),
        ("1,2,3", "expected PRIMARY,BACKUP as two port numbers"),
        ("0,5673", "port 0 is out of range 1..65535"),
        ("5672,65536", "port 65536 is out of range 1..65535"),
        ("5672,5672", "the two servers need two ports, got 5672 twice"),
    ],
)
def test_bad_ports_are_refused_with_the_reason(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_ports(text)
    assert parse_ports(" 5672, 5673") == (5672, 5673)


def test_each_management_listener_names_its_peers_moved_one() -> None:
    data = configs(
        primary={"management": {"listen": "127.0.0.1:15672", "peer": "127.0.0.1:15673"}},
        backup={"management": {"listen": "127.0.0.1:15673", "peer": "127.0.0.1:15672"}},
    )
    result = plan(data, (6000, 6001), everything_free, picker())
    assert result.overrides["primary"]["management.peer"] == "127.0.0.1:16001"
    assert result.overrides["backup"]["management.peer"] == "127.0.0.1:16000"
    assert result.overrides["backup"]["management.listen"] == "127.0.0.1:16001"


def test_chosen_page_ports_stay_as_given_whatever_the_offset_and_the_peer_link_follows() -> None:
    data = configs(
        primary={"management": {"listen": "127.0.0.1:15672", "peer": "127.0.0.1:15673"}},
        backup={"management": {"listen": "127.0.0.1:15673", "peer": "127.0.0.1:15672"}},
    )
    result = plan(
        data, (6000, 6001), everything_free, picker(), {"management.listen": (8080, 8081)}
    )
    assert result.overrides["primary"]["management.listen"] == "127.0.0.1:8080"
    assert result.overrides["backup"]["management.listen"] == "127.0.0.1:8081"
    assert result.overrides["primary"]["management.peer"] == "127.0.0.1:8081"
    assert result.overrides["backup"]["management.peer"] == "127.0.0.1:8080"
    assert result.notes == []
