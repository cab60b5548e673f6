"""The management API over real HTTP against real servers: RabbitMQ's shapes after real
client traffic (aio-pika), read with plain aiohttp and with a RabbitMQ management client
from PyPI (pyrabbit2); purge, delete and close; who may see and do what by tag; the
pair's control plane and its own login out of reach; a pair's two nodes and the health
checks through a kill -9 of the ACTIVE (no confirmed message lost)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import subprocess
import sys
from typing import Any
from urllib.parse import quote

import aio_pika
import aiohttp
import pytest
from pyrabbit2.api import Client

from tests.certs import Pki
from tests.integration.protocol_support import unique
from tests.pairs import client_vote
from tests.support import RABBITMQADMIN_MISSING, USERS, free_port, wait_for_port
from tests.support import rabbitmqadmin as rabbitmqadmin_tool

# guest (no tags) and limited (no tags) come from tests.support; these add RabbitMQ's tags.
MGMT_USERS = [
    *USERS,
    {"name": "mgmt", "password": "mgmt-pw-x1", "vhosts": ["/"], "tags": ["management"]},
    {"name": "watcher", "password": "watch-pw-x1", "vhosts": ["other"], "tags": ["monitoring"]},
]
CREDENTIALS = {
    "admin": "admin",
    "guest": "guest",
    "limited": "limited",
    "peering": "peering",
    "mgmt": "mgmt-pw-x1",
    "watcher": "watch-pw-x1",
}


def _auth(user: str, password: str | None = None) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password or CREDENTIALS[user]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


class Api:
    """Plain HTTP calls to one management listener."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    async def call(
        self, method: str, path: str, user: str = "admin", password: str | None = None, **kw: Any
    ) -> tuple[int, Any]:
        timeout = aiohttp.ClientTimeout(total=20)
        headers = {**_auth(user, password), **kw.pop("headers", {})}
        if not headers.get("Authorization", True):
            headers.pop("Authorization")
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, self.base + path, headers=headers, **kw) as answer,
        ):
            text = await answer.text()
            return answer.status, (json.loads(text) if text else None)

    async def get(self, path: str, user: str = "admin", **kw: Any) -> Any:
        status, body = await self.call("GET", path, user, **kw)
        assert status == 200, (path, status, body)
        return body


def rabbitmqadmin(api: Api, user: str = "admin", password: str = "admin") -> Any:
    """RabbitMQ's command-line tool against ``api``'s listener, as ``user``: the words after
    the connection options, run to their end."""
    port = api.base.rsplit(":", 1)[1]
    tool = rabbitmqadmin_tool()
    assert tool is not None, RABBITMQADMIN_MISSING

    def admin(*words: str) -> subprocess.CompletedProcess[str]:
        # A Python script of the standard library's alone: run by this interpreter, which
        # is there whatever the script's first line names.
        return subprocess.run(
            [
                sys.executable,
                tool,
                "-H",
                "127.0.0.1",
                "-P",
                port,
                "-u",
                user,
                "-p",
                password,
                *words,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    return admin


def managed_pair(make_pair: Any) -> tuple[Any, tuple[Api, Api]]:
    """A pair (not started) whose servers each have a management listener, and their APIs."""
    pair = make_pair(users=MGMT_USERS)
    apis = []
    for server in pair.servers:
        port = free_port()
        server.config["management"] = {"listen": f"127.0.0.1:{port}"}
        apis.append(Api(port))
    return pair, (apis[0], apis[1])


def managed(make_server: Any, name: str = "solo", **overrides: Any) -> tuple[Any, Api]:
    port = free_port()
    server = make_server(
        name, users=MGMT_USERS, management={"listen": f"127.0.0.1:{port}"}, **overrides
    )
    server.start()
    return server, Api(port)


async def until_value(fetch: Any, predicate: Any, timeout: float, what: str) -> Any:
    """Await ``fetch()`` until ``predicate`` holds of its value, at most ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await fetch()
        if predicate(value):
            return value
        if loop.time() >= deadline:
            raise TimeoutError(f"not true after {timeout} s: {what}; last: {value}")
        await asyncio.sleep(0.1)


async def test_queue_figures_connections_channels_consumers(make_server) -> None:
    server, api = managed(make_server)
    name = unique("figures")
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=7)
        queue = await channel.declare_queue(name, durable=True)
        for _index in range(5):
            await channel.default_exchange.publish(
                aio_pika.Message(b"x" * 10, delivery_mode=2), routing_key=name
            )
        first = await queue.get(timeout=5)
        await first.ack()
        held = await queue.get(timeout=5)
        shape = await api.get(f"/api/queues/%2F/{name}")
        assert shape["messages_ready"] == 3
        assert shape["messages_unacknowledged"] == 1
        assert shape["messages"] == 4
        assert shape["consumers"] == 0
        assert shape["durable"] is True and shape["vhost"] == "/"
        stats = shape["message_stats"]
        assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (5, 2, 1)
        await held.ack()

        async def ack(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()

        tag = await queue.consume(ack, consumer_tag="watched")
        consumers = await until_value(
            lambda: api.get("/api/consumers"),
            lambda found: any(c["consumer_tag"] == "watched" for c in found),
            10,
            "the consumer is listed",
        )
        mine = next(c for c in consumers if c["consumer_tag"] == "watched")
        assert mine["queue"] == {"name": name, "vhost": "/"}
        assert mine["ack_required"] is True and mine["prefetch_count"] == 7
        connections = await api.get("/api/connections")
        assert [c["user"] for c in connections] == ["guest"]
        assert connections[0]["name"] == mine["channel_details"]["connection_name"]
        assert connections[0]["vhost"] == "/" and connections[0]["channels"] == 1
        channels = await api.get("/api/channels")
        assert [c["name"] for c in channels] == [mine["channel_details"]["name"]]
        assert channels[0]["confirm"] is True and channels[0]["consumer_count"] == 1

        overview = await api.get("/api/overview")
        assert overview["object_totals"]["queues"] == 1
        assert overview["object_totals"]["connections"] == 1
        assert overview["queue_totals"]["messages"] == 0
        assert overview["product_name"] == "amqha" and overview["node"] == "amqha@solo"
        await queue.cancel(tag)

        # Rates: messages published between two looks a second or more apart.
        async def publish_and_look() -> Any:
            await channel.default_exchange.publish(aio_pika.Message(b"r"), routing_key=name)
            return await api.get(f"/api/queues/%2F/{name}")

        await until_value(
            publish_and_look,
            lambda q: q["message_stats"]["publish_details"]["rate"] > 0,
            20,
            "a publish rate",
        )

        # The same through a RabbitMQ management client from PyPI.
        client = Client(api.base.removeprefix("http://"), "admin", "admin", timeout=10)
        listed = await asyncio.to_thread(client.get_queues, "/")
        assert [q["name"] for q in listed] == [name]
        # With a trailing slash, as RabbitMQ answers it (Celery Flower's broker page asks so).
        assert [q["name"] for q in await api.get("/api/queues/")] == [name]
        depth = await asyncio.to_thread(client.get_queue_depth, "/", name)
        assert depth == listed[0]["messages"]
        [listed_connection] = await asyncio.to_thread(client.get_connections)
        assert listed_connection["user"] == "guest"
        whoami = await asyncio.to_thread(client.get_whoami)
        assert whoami == {"name": "admin", "tags": ["administrator"]}


async def test_exchanges_and_bindings_without_the_control_plane(make_server) -> None:
    server, api = managed(make_server)
    exchange_name, queue_name = unique("ex"), unique("bound")
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(exchange_name, "topic", durable=True)
        queue = await channel.declare_queue(queue_name, durable=True)
        await queue.bind(exchange, routing_key="a.*", arguments={"x-note": "n"})
        shape = await api.get(f"/api/exchanges/%2F/{exchange_name}")
        assert (shape["type"], shape["durable"], shape["name"]) == ("topic", True, exchange_name)
        names = [e["name"] for e in await api.get("/api/exchanges")]
        assert "amq.topic" in names and exchange_name in names and "" in names
        assert "amq.peer" not in names and "amq.console" not in names
        for control in ("amq.peer", "amq.console"):
            status, _ = await api.call("GET", f"/api/exchanges/%2F/{control}")
            assert status == 404
        bindings = await api.get("/api/bindings/%2F")
        assert {
            "source": exchange_name,
            "vhost": "/",
            "destination": queue_name,
            "destination_type": "queue",
            "routing_key": "a.*",
            "arguments": {"x-note": "n"},
        }.items() <= next(b for b in bindings if b["source"] == exchange_name).items()
        # The default exchange's implicit binding, as RabbitMQ lists it.
        assert any(b["source"] == "" and b["destination"] == queue_name for b in bindings)
        assert not any("amq.peer" in (b["source"], b["destination"]) for b in bindings)


async def test_purge_delete_and_close(make_server) -> None:
    server, api = managed(make_server)
    name, other = unique("purged"), unique("deleted")
    connection = await aio_pika.connect(server.url)
    closed = asyncio.get_running_loop().create_future()
    connection.close_callbacks.add(lambda _c, exc: closed.done() or closed.set_result(exc))
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(name, durable=True)
    await channel.declare_queue(other)
    for _ in range(4):
        await channel.default_exchange.publish(aio_pika.Message(b"p"), routing_key=name)
    await channel.default_exchange.publish(aio_pika.Message(b"d"), routing_key=other)

    assert (await api.call("DELETE", f"/api/queues/%2F/{name}/contents"))[0] == 204
    again = await channel.declare_queue(name, durable=True, passive=True)
    assert again.declaration_result.message_count == 0

    status, body = await api.call("DELETE", f"/api/queues/%2F/{other}?if-empty=true")
    assert status == 400 and "not empty" in body["reason"]
    assert (await api.call("DELETE", f"/api/queues/%2F/{other}"))[0] == 204
    assert (await api.call("GET", f"/api/queues/%2F/{other}"))[0] == 404
    assert (await api.call("DELETE", f"/api/queues/%2F/{other}"))[0] == 404

    [listed] = await api.get("/api/connections")
    # A reason longer than a close text may be (255 bytes) is cut, not an error.
    reason = "bye " + "é" * 300
    status, _ = await api.call(
        "DELETE", f"/api/connections/{quote(listed['name'], safe='')}", headers={"X-Reason": reason}
    )
    assert status == 204
    error = await asyncio.wait_for(closed, 10)
    assert "bye" in str(error)
    await until_value(lambda: api.get("/api/connections"), lambda c: c == [], 10, "closed")


async def test_who_may_see_and_do_what(make_server) -> None:
    """RabbitMQ's tags: no tag, no API; management sees its own; monitoring sees all and
    changes nothing of others'; only an administrator reads or imports definitions."""
    server, api = managed(make_server)
    name, elsewhere = unique("mine"), unique("other-vhost")
    guest = await aio_pika.connect(server.url)
    limited = await aio_pika.connect(f"amqp://limited:limited@{server.address}/other")
    mgmt = await aio_pika.connect(f"amqp://mgmt:mgmt-pw-x1@{server.address}/")
    async with guest, limited, mgmt:
        channel = await guest.channel()
        await channel.declare_queue(name)
        await channel.default_exchange.publish(aio_pika.Message(b"keep"), routing_key=name)
        other_channel = await limited.channel()
        await other_channel.declare_queue(elsewhere)
        await mgmt.channel()

        guest_conn = next(c for c in await api.get("/api/connections") if c["user"] == "guest")
        guest_path = f"/api/connections/{quote(guest_conn['name'], safe='')}"
        # No management tag: nothing at all, whatever the route (reads and changes).
        for user in ("guest", "limited", "peering"):
            for method, path in (
                ("GET", "/api/overview"),
                ("GET", "/api/queues"),
                ("GET", "/api/whoami"),
                ("GET", "/api/definitions"),
                ("DELETE", f"/api/queues/%2F/{name}"),
                ("DELETE", f"/api/queues/%2F/{name}/contents"),
                ("DELETE", guest_path),
                ("POST", "/api/definitions"),
            ):
                status, body = await api.call(method, path, user, json={})
                assert status == 401, (user, method, path, status, body)
        # A wrong password or an unknown user: 401.
        assert (await api.call("GET", "/api/overview", "admin", "wrong"))[0] == 401
        assert (await api.call("GET", "/api/overview", "nobody", "x"))[0] == 401
        assert (await api.call("GET", "/api/overview", headers={"Authorization": ""}))[0] == 401

        # management: its own connection only, its vhost's queues only.
        assert [c["user"] for c in await api.get("/api/connections", "mgmt")] == ["mgmt"]
        assert await api.get("/api/channels", "mgmt") != []
        assert all(c["user"] == "mgmt" for c in await api.get("/api/channels", "mgmt"))
        names = {q["name"] for q in await api.get("/api/queues", "mgmt")}
        assert name in names and elsewhere not in names
        assert (await api.call("GET", f"/api/queues/other/{elsewhere}", "mgmt"))[0] == 404
        assert [v["name"] for v in await api.get("/api/vhosts", "mgmt")] == ["/"]
        assert (await api.call("GET", "/api/nodes", "mgmt"))[0] == 401
        assert (await api.call("GET", guest_path, "mgmt"))[0] == 404
        assert (await api.call("DELETE", guest_path, "mgmt"))[0] == 404
        assert (await api.call("DELETE", f"/api/queues/other/{elsewhere}", "mgmt"))[0] == 404
        for method in ("GET", "POST"):
            status, _ = await api.call(method, "/api/definitions", "mgmt", json={})
            assert status == 401
        assert (await api.call("GET", "/api/users", "mgmt"))[0] == 401

        # monitoring: sees every connection and vhost, closes and deletes nothing of others'.
        seen = {c["user"] for c in await api.get("/api/connections", "watcher")}
        assert seen == {"guest", "limited", "mgmt"}
        assert {v["name"] for v in await api.get("/api/vhosts", "watcher")} >= {"/", "other"}
        assert len(await api.get("/api/nodes", "watcher")) == 1
        assert (await api.call("DELETE", guest_path, "watcher"))[0] == 401
        assert (await api.call("DELETE", f"/api/queues/%2F/{name}", "watcher"))[0] == 401
        assert (await api.call("DELETE", f"/api/queues/%2F/{name}/contents", "watcher"))[0] == 401
        assert (await api.call("GET", "/api/definitions", "watcher"))[0] == 401

        # Nothing above changed anything: the queue and its message are still there.
        kept = await channel.declare_queue(name, passive=True)
        assert kept.declaration_result.message_count == 1
        assert not guest.is_closed

        # management may purge a queue of its own vhost, as RabbitMQ lets it.
        assert (await api.call("DELETE", f"/api/queues/%2F/{name}/contents", "mgmt"))[0] == 204
        kept = await channel.declare_queue(name, passive=True)
        assert kept.declaration_result.message_count == 0


def rabbit_hash(password: str, salt: bytes = b"salt") -> str:
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


async def test_definitions_export_and_import(make_server) -> None:
    server, api = managed(make_server)
    exported = await api.get("/api/definitions")
    users = {u["name"]: u for u in exported["users"]}
    assert "peering" not in users and {"guest", "admin", "mgmt"} <= set(users)
    assert users["admin"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    raw = base64.b64decode(users["admin"]["password_hash"])
    assert raw[4:] == hashlib.sha256(raw[:4] + b"admin").digest()
    assert not any(p["user"] == "peering" for p in exported["permissions"])

    queue, exchange = unique("imported"), unique("imported-ex")
    good = {
        "rabbit_version": "3.12.0",
        "users": [
            {
                "name": "guest",
                "password_hash": rabbit_hash("guest"),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [],
            }
        ],
        "vhosts": [{"name": "/"}],
        "permissions": [
            {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
        "queues": [
            {
                "name": queue,
                "vhost": "/",
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-max-length": 10},
            }
        ],
        "exchanges": [
            {
                "name": exchange,
                "vhost": "/",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "bindings": [
            {
                "source": exchange,
                "vhost": "/",
                "destination": queue,
                "destination_type": "queue",
                "routing_key": "k",
                "arguments": {},
            }
        ],
    }
    refusals = [
        # The pair's own login: never created, changed or given permissions.
        (403, {"users": [{"name": "peering", "password_hash": rabbit_hash("x"), "tags": []}]}),
        (
            403,
            {"users": [{"name": "evil", "password_hash": rabbit_hash("x"), "tags": ["peering"]}]},
        ),
        (403, {"permissions": [{"user": "peering", "vhost": "/", "configure": ".*"}]}),
        # The control plane and reserved names.
        (403, {"exchanges": [{"name": "amq.peer", "vhost": "/", "type": "fanout"}]}),
        (403, {"queues": [{"name": "amq.replication", "vhost": "/"}]}),
        (
            403,
            {
                "bindings": [
                    {
                        "source": "amq.peer",
                        "vhost": "/",
                        "destination": queue,
                        "destination_type": "queue",
                        "routing_key": "",
                    }
                ]
            },
        ),
        (
            403,
            {
                "queues": [
                    {
                        "name": "dl",
                        "vhost": "/",
                        "arguments": {"x-dead-letter-exchange": "amq.console"},
                    }
                ]
            },
        ),
        # A new user without its hash; a config user with another password, other tags.
        (400, {"users": [{"name": "newcomer", "tags": []}]}),
        (400, {"users": [{"name": "guest", "password_hash": rabbit_hash("nope"), "tags": []}]}),
        (
            400,
            {
                "users": [
                    {
                        "name": "guest",
                        "password_hash": rabbit_hash("guest"),
                        "tags": ["administrator"],
                    }
                ]
            },
        ),
        (400, {"permissions": [{"user": "guest", "vhost": "/", "configure": "^app"}]}),
        (400, {"policies": [{"name": "p"}]}),
        (400, [1, 2]),
    ]
    for status, body in refusals:
        got, answer = await api.call("POST", "/api/definitions", json=body)
        assert got == status, (body, got, answer)
    # Refused files changed nothing.
    assert (await api.call("GET", f"/api/queues/%2F/{queue}"))[0] == 404
    assert (await api.call("GET", "/api/queues/%2F/dl"))[0] == 404

    # Only an administrator imports.
    assert (await api.call("POST", "/api/definitions", "mgmt", json=good))[0] == 401
    status, answer = await api.call("POST", "/api/definitions", json=good)
    assert status == 204, answer
    shape = await api.get(f"/api/queues/%2F/{queue}")
    assert shape["arguments"] == {"x-max-length": 10} and shape["durable"] is True
    bindings = await api.get("/api/bindings/%2F")
    assert any(b["source"] == exchange and b["destination"] == queue for b in bindings)
    # The imported wiring routes real messages.
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(exchange)
        await target.publish(aio_pika.Message(b"routed", delivery_mode=2), routing_key="k")
        declared = await channel.declare_queue(queue, passive=True)
        assert declared.declaration_result.message_count == 1
    # Durable: it is in the store, so a restart keeps it.
    server.terminate()
    server.start()
    await asyncio.to_thread(wait_for_port, int(api.base.rsplit(":", 1)[1]), 30.0)
    assert (await api.get(f"/api/queues/%2F/{queue}"))["messages"] == 1
    again = await api.get("/api/definitions")
    assert any(q["name"] == queue for q in again["queues"])
    assert any(e["name"] == exchange for e in again["exchanges"])


async def test_health_checks_standalone(make_server) -> None:
    _, api = managed(make_server)
    assert await api.get("/api/health/checks/alarms") == {"status": "ok"}
    assert await api.get("/api/health/checks/local-alarms") == {"status": "ok"}
    assert (await api.get("/api/health/checks/amqha-active"))["status"] == "ok"
    status, body = await api.call("GET", "/api/health/checks/amqha-active-in-sync")
    assert status == 503 and "standalone" in body["reason"]
    # RabbitMQ's aliveness test: a message through a queue of the vhost, the check's own
    # (it leaves no queue behind).
    assert await api.get("/api/aliveness-test/%2F") == {"status": "ok"}
    assert (await api.call("GET", "/api/queues/%2F/aliveness-test"))[0] == 404
    assert (await api.call("GET", "/api/aliveness-test/nowhere"))[0] == 404
    assert (await api.call("GET", "/api/aliveness-test/other", "mgmt"))[0] == 404
    assert await api.get("/api/policies") == []
    permissions = await api.get("/api/permissions")
    assert {"user": "mgmt", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"} in (
        permissions
    )
    assert not any(p["user"] == "peering" for p in permissions)
    assert (await api.call("GET", "/api/permissions", "watcher"))[0] == 401
    # A management user may ask; a user without the tag may not.
    assert (await api.call("GET", "/api/health/checks/alarms", "mgmt"))[0] == 200
    assert (await api.call("GET", "/api/health/checks/alarms", "guest"))[0] == 401


@pytest.mark.slow
async def test_pair_nodes_health_and_failover(make_pair) -> None:
    """Both nodes seen from each server; the health checks follow the roles through a
    kill -9 of the ACTIVE; the peering login's connections are never listed or closable;
    a PASSIVE refuses changes; every confirmed message is on the new ACTIVE."""
    pair, (primary_api, backup_api) = managed_pair(make_pair)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    name = unique("kept")
    connection = await aio_pika.connect(pair.primary.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True)
        for index in range(50):
            await channel.default_exchange.publish(
                aio_pika.Message(str(index).encode(), delivery_mode=2), routing_key=name
            )
    confirmed = 50

    nodes = await until_value(
        lambda: primary_api.get("/api/nodes"),
        lambda found: len(found) == 2 and found[1]["amqha"]["in_sync"] is True,
        30,
        "the PASSIVE in sync, as the ACTIVE sees it",
    )
    this, peer = nodes
    assert (this["name"], this["amqha"]["state"], this["amqha"]["role"]) == (
        "amqha@primary",
        "ACTIVE",
        "primary",
    )
    assert (peer["name"], peer["amqha"]["state"], peer["running"]) == (
        "amqha@backup",
        "PASSIVE",
        True,
    )
    assert peer["amqha"]["epoch"] == this["amqha"]["epoch"]
    assert peer["amqha"]["lag_changes"] == 0
    backup_nodes = await backup_api.get("/api/nodes")
    assert [n["amqha"]["state"] for n in backup_nodes] == ["PASSIVE", "ACTIVE"]
    assert (await primary_api.get("/api/health/checks/amqha-active-in-sync"))["status"] == "ok"
    assert (await backup_api.call("GET", "/api/health/checks/amqha-active-in-sync"))[0] == 503
    assert (await backup_api.call("GET", "/api/health/checks/amqha-active"))[0] == 503
    # The PASSIVE's queues follow the ACTIVE's: it changes none of them.
    status, body = await backup_api.call("DELETE", f"/api/queues/%2F/{name}/contents")
    assert status == 503 and "ACTIVE" in body["reason"]
    # The pair's own connections (heartbeat, replication) are the peering login's: never
    # listed, on either server, whoever asks.
    for api in (primary_api, backup_api):
        for user in ("admin", "watcher"):
            assert not any(c["user"] == "peering" for c in await api.get("/api/connections", user))
            assert not any(c["user"] == "peering" for c in await api.get("/api/channels", user))
            assert not any(
                c["channel_details"]["user"] == "peering"
                for c in await api.get("/api/consumers", user)
            )
        assert not any(u["name"] == "peering" for u in await api.get("/api/users"))

    pair.kill(pair.primary)
    # A client's vote moves the service (docs/failover.md).
    await client_vote(pair.servers, retry_for=30.0)
    await until_value(
        lambda: backup_api.call("GET", "/api/health/checks/amqha-active"),
        lambda answer: answer[0] == 200,
        30,
        "the backup ACTIVE",
    )
    nodes = await backup_api.get("/api/nodes")
    assert nodes[0]["amqha"]["state"] == "ACTIVE"
    assert nodes[1]["running"] is False
    shape = await backup_api.get(f"/api/queues/%2F/{name}")
    assert shape["messages"] == confirmed
    backup = await aio_pika.connect(pair.backup.url)
    async with backup:
        channel = await backup.channel()
        queue = await channel.declare_queue(name, durable=True, passive=True)
        bodies = set()
        for _ in range(confirmed):
            message = await queue.get(timeout=5)
            bodies.add(int(message.body))
            await message.ack()
        assert bodies == set(range(confirmed))


async def test_the_page_is_served_without_data(make_server) -> None:
    """``/`` is the static page (no figures in it: it reads them with the user's login)."""
    _, api = managed(make_server)
    timeout = aiohttp.ClientTimeout(total=20)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(api.base + "/") as answer,
    ):
        assert answer.status == 200
        assert answer.content_type == "text/html"
        text = await answer.text()
    assert "<script" in text
    # Self-contained: nothing loaded from elsewhere (the SVG namespace is a name, not a load).
    loads = re.findall(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", text)
    loads += re.findall(r"""(?:url\(|@import|fetch\()\s*["'`]?\s*(?:https?:)?//""", text)
    assert loads == []


async def test_management_over_tls(make_server, tmp_path) -> None:
    """management.tls: https with the amqps listener's certificate (client certificates
    are not asked for there: logins are basic auth); plain HTTP gets no answer."""
    pki = Pki(tmp_path / "pki")
    port = free_port()
    server = make_server(
        "tlsed",
        users=MGMT_USERS,
        tls=pki.listener(free_port(), client_certs="required"),
        management={"listen": f"127.0.0.1:{port}", "tls": True},
    )
    server.start()
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(
            f"https://127.0.0.1:{port}/api/whoami", headers=_auth("admin"), ssl=pki.client_context()
        ) as answer:
            assert answer.status == 200
            assert (await answer.json())["name"] == "admin"
        async with session.get(
            f"https://127.0.0.1:{port}/api/whoami", headers=_auth("guest"), ssl=pki.client_context()
        ) as answer:
            assert answer.status == 401
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{port}/api/whoami", headers=_auth("admin")):
                pass
        # A client that does not trust the CA refuses the server.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with session.get(f"https://127.0.0.1:{port}/api/whoami"):
                pass


async def test_silent_sockets_do_not_keep_an_operator_out(make_server) -> None:
    """Past MAX_CONNECTIONS sockets that send nothing, the oldest silent one gives way to
    the newcomer; a socket whose request never comes is dropped after REQUEST_TIMEOUT."""
    from amqha.management.sockets import MAX_CONNECTIONS, REQUEST_TIMEOUT

    _, api = managed(make_server)
    port = int(api.base.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(MAX_CONNECTIONS + 20):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        assert (await api.get("/api/whoami"))["name"] == "admin"
        # The oldest silent sockets were dropped for the newcomers; every one of them is
        # dropped by REQUEST_TIMEOUT.
        reader, _ = held[0]
        assert await asyncio.wait_for(reader.read(1), REQUEST_TIMEOUT + 20) == b""
        reader, _ = held[-1]
        assert await asyncio.wait_for(reader.read(1), REQUEST_TIMEOUT + 20) == b""
        assert (await api.get("/api/whoami"))["name"] == "admin"
    finally:
        for _, writer in held:
            writer.close()


async def test_rabbitmqadmin_against_amqha(make_server, tmp_path) -> None:
    """RabbitMQ's own command-line tool (Debian's rabbitmq-server package ships it): list,
    export, import, purge, delete and close against amqha."""
    if rabbitmqadmin_tool() is None:
        pytest.skip(RABBITMQADMIN_MISSING)
    server, api = managed(make_server)
    admin = rabbitmqadmin(api)
    name = unique("admin-tool")
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True)
        for _ in range(3):
            await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=name)
        listed = await asyncio.to_thread(admin, "-f", "tsv", "list", "queues", "name", "messages")
        assert listed.returncode == 0, listed.stderr
        assert f"{name}\t3" in listed.stdout.splitlines()
        exported = tmp_path / "definitions.json"
        done = await asyncio.to_thread(admin, "export", str(exported))
        assert done.returncode == 0, done.stderr
        assert any(q["name"] == name for q in json.loads(exported.read_text())["queues"])
        done = await asyncio.to_thread(admin, "purge", "queue", f"name={name}")
        assert done.returncode == 0, done.stderr
        again = await channel.declare_queue(name, durable=True, passive=True)
        assert again.declaration_result.message_count == 0
        done = await asyncio.to_thread(admin, "delete", "queue", f"name={name}")
        assert done.returncode == 0, done.stderr
        assert (await api.call("GET", f"/api/queues/%2F/{name}"))[0] == 404
        # The export imports back (its users are the config's): the queue is declared again.
        done = await asyncio.to_thread(admin, "import", str(exported))
        assert done.returncode == 0, done.stdout + done.stderr
        assert (await api.get(f"/api/queues/%2F/{name}"))["durable"] is True
        [listed_connection] = await api.get("/api/connections")
        done = await asyncio.to_thread(
            admin, "close", "connection", f"name={listed_connection['name']}"
        )
        assert done.returncode == 0, done.stderr
        await until_value(lambda: api.get("/api/connections"), lambda c: c == [], 10, "closed")
    # A login without a management tag is refused by the tool as by the API.
    refused = await asyncio.to_thread(rabbitmqadmin(api, "guest", "guest"), "list", "queues")
    assert refused.returncode != 0 and "Access refused" in refused.stderr
