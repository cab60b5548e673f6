"""The management API's pure parts: who may do what by tag, the JSON from the model
(queues, bindings, the pair as two nodes, the health checks), rates, definitions."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import pytest

from amqha.core.vhost import VHost
from amqha.management import access, definitions, shapes
from config import User, load_config


def user(name: str, *tags: str, vhosts: tuple[str, ...] = ("/",)) -> User:
    return User(name, "pw", vhosts, tuple(tags))


@pytest.mark.parametrize(
    ("tags", "api", "monitor", "admin"),
    [
        ((), False, False, False),
        (("management",), True, False, False),
        (("policymaker",), True, False, False),
        (("monitoring",), True, True, False),
        (("administrator",), True, True, True),
        (("peering",), False, False, False),
        # The pair's own login never gets in, whatever else it is tagged.
        (("peering", "administrator"), False, True, True),
    ],
)
def test_tags(tags: tuple[str, ...], api: bool, monitor: bool, admin: bool) -> None:
    someone = user("u", *tags)
    assert access.may_use_api(someone) is api
    assert access.is_monitor(someone) is monitor
    assert access.is_admin(someone) is admin


def test_what_each_tag_sees_and_changes() -> None:
    plain = user("m", "management")
    watcher = user("w", "monitoring", vhosts=("other",))
    admin = user("a", "administrator", vhosts=())
    assert access.visible_vhosts(plain, ["/", "other"]) == ["/"]
    assert access.visible_vhosts(watcher, ["/", "other"]) == ["/", "other"]
    assert access.sees_connection(plain, "m") and not access.sees_connection(plain, "x")
    assert access.sees_connection(watcher, "x")
    assert access.may_close_connection(plain, "m")
    assert not access.may_close_connection(watcher, "x")
    assert access.may_close_connection(admin, "x")
    assert access.may_change_queue(plain, "/") and not access.may_change_queue(plain, "other")
    assert not access.may_change_queue(watcher, "/")
    assert access.may_change_queue(admin, "anywhere")


def test_rates_over_looks_a_second_apart() -> None:
    rates = shapes.Rates()
    assert rates.look("q", 100.0, (0, 0, 0)) == (0.0, 0.0, 0.0)
    # Sooner than RATE_INTERVAL: the last rates, the sample kept.
    assert rates.look("q", 100.5, (50, 0, 0)) == (0.0, 0.0, 0.0)
    assert rates.look("q", 102.0, (100, 40, 20)) == (50.0, 20.0, 10.0)
    assert rates.look("q", 102.2, (500, 40, 20)) == (50.0, 20.0, 10.0)
    rates.sweep()
    rates.look("other", 103.0, (1, 1, 1))
    rates.sweep()  # "q" was not looked at in that pass: forgotten
    assert set(rates.samples) == {"other"}


def test_queues_exchanges_and_bindings_in_rabbitmqs_shapes() -> None:
    vhost = VHost("/", time.time)
    queue = vhost.declare_queue("q", object(), 0.0, durable=True, arguments={"x-max-length": 5})
    vhost.declare_exchange("ex", "topic", durable=True)
    vhost.bind_queue("q", "ex", "a.#", {"x-k": b"v"}, None)
    shape = shapes.queue_shape("/", queue, "amqha@n", (1.0, 2.0, 3.0))
    assert shape["messages"] == 0 and shape["arguments"] == {"x-max-length": 5}
    assert shape["type"] == "classic"
    quorum = vhost.declare_queue(
        "qq", object(), 0.0, durable=True, arguments={"x-queue-type": "quorum"}
    )
    assert shapes.queue_shape("/", quorum, "amqha@n", (0.0, 0.0, 0.0))["type"] == "quorum"
    assert shape["message_stats"]["deliver_get_details"] == {"rate": 2.0}
    names = [e.name for e in shapes.visible_exchanges(vhost)]
    assert "amq.peer" not in names and "amq.console" not in names and "ex" in names
    bindings = shapes.bindings_of(vhost)
    assert bindings[0] == {
        "source": "",
        "vhost": "/",
        "destination": "q",
        "destination_type": "queue",
        "routing_key": "q",
        "arguments": {},
        "properties_key": "q",
    }
    [bound] = [b for b in bindings if b["source"] == "ex"]
    assert bound["arguments"] == {"x-k": "v"}
    assert bound["properties_key"].startswith("a.%23~")
    assert shapes.properties_key("", {}) == "~"


STATUS_ACTIVE: dict[str, Any] = {
    "name": "primary",
    "role": "primary",
    "state": "ACTIVE",
    "epoch": 3,
    "serving": True,
    "peer": {
        "name": "backup",
        "role": "backup",
        "state": "PASSIVE",
        "epoch": 3,
        "listen": "127.0.0.1:5673",
        "alive": True,
        "last_seen": 99.5,
    },
}
OWN = {
    "name": "primary",
    "uptime": 12.5,
    "mem_used": 1,
    "mem_limit": 2,
    "mem_alarm": False,
    "disk_alarm": False,
    "listen": "127.0.0.1:5672",
    "peer_name": "backup",
    "peer_listen": "127.0.0.1:5673",
}


def feed(state: str, lag: int | None) -> dict[str, Any]:
    return {
        "enabled": True,
        "leading": True,
        "feed": {"state": state, "lag_changes": lag, "lag_bytes": 0, "lag_seconds": 0.0},
    }


def test_the_pair_as_two_nodes_and_the_health_checks() -> None:
    this, peer = shapes.nodes_shape(STATUS_ACTIVE, feed("catching_up", 7), OWN, 100.0)
    assert this["name"] == "amqha@primary" and this["uptime"] == 12500
    assert this["amqha"]["state"] == "ACTIVE" and this["amqha"]["this_server"] is True
    assert peer["name"] == "amqha@backup" and peer["running"] is True
    assert peer["amqha"]["in_sync"] is False and peer["amqha"]["lag_changes"] == 7
    assert peer["amqha"]["seen_seconds_ago"] == 0.5
    assert shapes.active_in_sync(STATUS_ACTIVE, feed("catching_up", 7))[0] is False
    assert shapes.active_in_sync(STATUS_ACTIVE, feed("in_sync", 0)) == (
        True,
        "ACTIVE, PASSIVE in sync",
    )
    fenced = {**STATUS_ACTIVE, "serving": False}
    assert shapes.active_in_sync(fenced, feed("in_sync", 0))[0] is False
    assert shapes.is_active(fenced)[0] is False
    passive = {**STATUS_ACTIVE, "state": "PASSIVE", "peer": None}
    following = {"enabled": True, "follower": {"in_sync": True, "state": "live"}}
    [alone, unseen] = shapes.nodes_shape(passive, following, OWN, 100.0)
    assert alone["amqha"]["in_sync"] is True
    assert unseen["running"] is False and unseen["name"] == "amqha@backup"
    assert shapes.active_in_sync(passive, following)[0] is False
    standalone = {"name": "solo", "role": "standalone", "state": "ACTIVE", "epoch": 0}
    assert len(shapes.nodes_shape(standalone, feed("none", None), OWN, 100.0)) == 1
    assert "standalone" in shapes.active_in_sync(standalone, feed("none", None))[1]


def rabbit_hash(password: str, salt: bytes = b"abcd") -> str:
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def pair_config(tmp_path: Any) -> Any:
    path = tmp_path / "c.yaml"
    path.write_text(
        "server: {name: a, listen: '127.0.0.1:5999', data_dir: /tmp/x}\n"
        "users:\n"
        "  - {name: app, password: s3cret-app, vhosts: ['/', v2], tags: [management]}\n"
        f"  - {{name: hashed, password_hash: '{rabbit_hash('h-pw')}', vhosts: ['/']}}\n"
        "  - {name: peer, password: p-pw-long, tags: [peering]}\n"
        "failover: {role: primary, peer: '127.0.0.1:6000', peer_user: peer,"
        " secret: 'correct horse battery staple'}\n"
    )
    return load_config(path)


def test_definitions_users_must_be_the_configs(tmp_path: Any) -> None:
    config = pair_config(tmp_path)
    same = {
        "users": [
            {"name": "app", "password_hash": rabbit_hash("s3cret-app"), "tags": "management"},
            {"name": "hashed", "password_hash": rabbit_hash("h-pw"), "tags": []},
        ],
        "permissions": [{"user": "app", "vhost": "v2", "configure": ".*", "write": ".*"}],
    }
    assert definitions.plan_import(same, config).users_checked == 2
    # A user the config does not have is made at run time, with what the file gives it.
    new = {
        "users": [{"name": "new", "password_hash": rabbit_hash("n"), "tags": "management"}],
        "permissions": [{"user": "new", "vhost": "v9"}, {"user": "app", "vhost": "v3"}],
    }
    plan = definitions.plan_import(new, config)
    assert [(u.name, u.tags) for u in plan.users] == [("new", ("management",))]
    assert plan.grants == [("v9", "new"), ("v3", "app")]
    cluster = [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}]
    assert definitions.plan_import({**same, "global_parameters": cluster}, config)
    # Bindings from the standard exchanges, as RabbitMQ's exports have them.
    standard = {"bindings": [{"source": "amq.topic", "destination": "q", "routing_key": "a.#"}]}
    assert definitions.plan_import(standard, config).bindings[0]["source"] == "amq.topic"
    nested = {"queues": [{"name": "q", "arguments": {"x-a": [1, {"b": None}], "x-f": 1.5}}]}
    assert definitions.plan_import(nested, config).queues[0]["arguments"]["x-f"] == 1.5
    for body, status, words in (
        ({"users": [{"name": "peer", "tags": []}]}, 403, "pair's own login"),
        ({"users": [{"name": "app", "password_hash": rabbit_hash("x"), "tags": []}]}, 400, "app"),
        ({"users": [{"name": "x", "tags": []}]}, 400, "'x' has no password_hash"),
        ({"users": [{"name": "x", "password_hash": "bad", "tags": []}]}, 400, "refused"),
        (
            {"users": [{"name": "x", "password_hash": rabbit_hash("x"), "tags": ["federation"]}]},
            403,
            "not given at run time",
        ),
        ({"permissions": [{"user": "nobody", "vhost": "/"}]}, 400, "neither in the config"),
        ({"permissions": [{"user": "app", "vhost": "/", "read": "^a"}]}, 400, "full rights"),
        ({"exchanges": [{"name": "amq.console", "type": "direct"}]}, 403, "reserved"),
        ({"exchanges": [{"name": "e", "type": "x-delayed"}]}, 400, "unknown exchange type"),
        ({"queues": [{"name": "q", "durable": "yes"}]}, 400, "true or false"),
        ({"bindings": [{"source": "e", "destination": "amq.peer"}]}, 403, "control plane"),
        ({"parameters": [{"x": 1}]}, 400, "amqha has none"),
        ({"queues": [{"name": "q" * 256}]}, 400, "longer than 255 bytes"),
        ({"queues": [{"name": "q", "arguments": {"x-n": 2**70}}]}, 400, "not an AMQP field"),
        ({"queues": [{"name": "q", "arguments": {"x-n": float("nan")}}]}, 400, "read back"),
        ({"queues": [{"name": "q", "arguments": {"k" * 300: 1}}]}, 400, "not an AMQP field"),
        (
            {
                "exchanges": [
                    {"name": "e", "type": "direct", "arguments": {"alternate-exchange": 1}}
                ]
            },
            400,
            "exchange name",
        ),
        ({"bindings": [{"source": "amq.direct", "destination": "amq.replication"}]}, 403, "amq."),
        ("[]", 400, "JSON object"),
    ):
        with pytest.raises(definitions.Refused) as refused:
            definitions.plan_import(body, config)
        assert refused.value.status == status and words in str(refused.value), body


def test_definitions_export_then_users_as_config_lines(tmp_path: Any) -> None:
    config = pair_config(tmp_path)
    vhost = VHost("/", time.time)
    vhost.declare_queue("kept", object(), 0.0, durable=True)
    vhost.declare_queue("mine", owner := object(), 0.0, exclusive=True)
    vhost.declare_exchange("ex", "fanout", durable=True)
    vhost.bind_queue("kept", "ex", "", {}, None)
    vhost.bind_queue("mine", "ex", "", {}, owner)
    exported = definitions.export(config.users, [vhost])
    assert [u["name"] for u in exported["users"]] == ["app", "hashed"]
    assert [q["name"] for q in exported["queues"]] == ["kept"]
    assert [e["name"] for e in exported["exchanges"]] == ["ex"]
    assert [(b["source"], b["destination"]) for b in exported["bindings"]] == [("ex", "kept")]
    # What an export says, the same config accepts back.
    assert definitions.plan_import(exported, config).users_checked == 2
    lines = definitions.users_as_config(exported)
    assert lines[0]["name"] == "app" and lines[0]["vhosts"] == ["/", "v2"]
    assert lines[0]["tags"] == ["management"]
    assert lines[1]["password_hash"] == rabbit_hash("h-pw")


def test_the_definitions_users_command_prints_config_lines(tmp_path: Any) -> None:
    import json

    import yaml
    from click.testing import CliRunner

    from amqha.cli import main

    config = pair_config(tmp_path)
    exported = definitions.export(config.users, [VHost("/", time.time)])
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(exported))
    done = CliRunner().invoke(main, ["definitions", "users", str(path)])
    assert done.exit_code == 0, done.output
    users = yaml.safe_load(done.output)["users"]
    assert [u["name"] for u in users] == ["app", "hashed"]
    assert users[0]["vhosts"] == ["/", "v2"] and users[0]["tags"] == ["management"]
    # The lines load as a config, and the file's passwords log in.
    text = (tmp_path / "c.yaml").read_text().split("users:")[0] + done.output
    (tmp_path / "imported.yaml").write_text(text)
    loaded = load_config(tmp_path / "imported.yaml")
    assert loaded.user("app").verifier.check("s3cret-app")  # type: ignore[union-attr]
    assert loaded.user("hashed").verifier.check("h-pw")  # type: ignore[union-attr]
    path.write_text("{")
    done = CliRunner().invoke(main, ["definitions", "users", str(path)])
    assert done.exit_code == 1 and "not a JSON file" in done.output
    assert "Traceback" not in done.output
