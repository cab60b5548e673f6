"""The management API's declare and delete routes (amqha/management/writes.py) on a real
server and a real pair: RabbitMQ's answers (201, 204, 400 not equivalent), objects that
route real messages, replicated to the PASSIVE (there after a kill -9 of the ACTIVE),
refused on the PASSIVE; every route tried by every login that may not, and against the
control plane by the one that may do everything else; rabbitmqadmin's declare and delete."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika
import pytest

from tests.integration.protocol_support import unique
from tests.integration.test_management import Api, managed, managed_pair, rabbitmqadmin
from tests.pairs import MakePair, client_vote
from tests.support import RABBITMQADMIN_MISSING
from tests.support import rabbitmqadmin as rabbitmqadmin_tool

JSON = {"Content-Type": "application/json"}


async def put(api: Api, path: str, body: Any, user: str = "admin") -> tuple[int, Any]:
    return await api.call("PUT", path, user, data=json.dumps(body), headers=JSON)


async def post(api: Api, path: str, body: Any, user: str = "admin") -> tuple[int, Any]:
    return await api.call("POST", path, user, data=json.dumps(body), headers=JSON)


async def routed(url: str, exchange: str, key: str, queue: str) -> bytes | None:
    """Publish one message through ``exchange`` and take it from ``queue`` (None: it did
    not arrive there)."""
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(exchange, ensure=False)
        body = unique("through").encode()
        await target.publish(aio_pika.Message(body, delivery_mode=2), routing_key=key)
        got = await (await channel.get_queue(queue, ensure=False)).get(fail=False, timeout=5)
        if got is None:
            return None
        await got.ack()
        return got.body


async def test_declare_and_delete_queues_exchanges_and_bindings_as_rabbitmq_answers(
    make_server,
) -> None:
    server, api = managed(make_server)
    queue, exchange = unique("orders"), unique("events")
    assert (await put(api, f"/api/queues/%2F/{queue}", {"durable": True}))[0] == 201
    assert (await put(api, f"/api/queues/%2F/{queue}", {"durable": True}))[0] == 204
    status, answer = await put(api, f"/api/queues/%2F/{queue}", {"durable": False})
    assert status == 400 and answer["error"] == "bad_request", answer
    assert f"queue '{queue}'" in answer["reason"], answer
    shown = await api.get(f"/api/queues/%2F/{queue}")
    assert shown["durable"] is True and shown["arguments"] == {}
    status, answer = await put(api, f"/api/exchanges/%2F/{exchange}", {"durable": True})
    assert status == 400 and "type is missing" in answer["reason"]
    body = {"type": "topic", "durable": True}
    assert (await put(api, f"/api/exchanges/%2F/{exchange}", body))[0] == 201
    assert (await put(api, f"/api/exchanges/%2F/{exchange}", body))[0] == 204
    status, _ = await put(api, f"/api/exchanges/%2F/{exchange}", {**body, "type": "fanout"})
    assert status == 400

    between = f"/api/bindings/%2F/e/{exchange}/q/{queue}"
    status, _ = await post(api, between, {"routing_key": "order.*", "arguments": {}})
    assert status == 201
    [binding] = await api.get(between)
    assert (binding["routing_key"], binding["properties_key"]) == ("order.*", "order.%2A")
    assert await routed(server.url, exchange, "order.new", queue) is not None
    assert await routed(server.url, exchange, "invoice.new", queue) is None
    # In use: if-unused refuses; the binding goes by its properties key, then the exchange.
    status, _ = await api.call("DELETE", f"/api/exchanges/%2F/{exchange}?if-unused=true")
    assert status == 400
    assert (await api.call("DELETE", f"{between}/{binding['properties_key']}"))[0] == 204
    assert await api.get(between) == []
    assert (await api.call("DELETE", f"{between}/{binding['properties_key']}"))[0] == 404
    assert (await api.call("DELETE", f"/api/exchanges/%2F/{exchange}?if-unused=true"))[0] == 204
    assert (await api.call("DELETE", f"/api/exchanges/%2F/{exchange}"))[0] == 404
    # An exchange to exchange binding, with arguments: its key carries their hash.
    source, target = unique("src"), unique("dst")
    for name in (source, target):
        assert (await put(api, f"/api/exchanges/%2F/{name}", {"type": "fanout"}))[0] == 201
    status, _ = await post(
        api, f"/api/bindings/%2F/e/{source}/e/{target}", {"arguments": {"x-note": "a"}}
    )
    assert status == 201
    [binding] = await api.get(f"/api/bindings/%2F/e/{source}/e/{target}")
    assert binding["properties_key"].startswith("~")
    assert (await api.call("DELETE", f"/api/bindings/%2F/e/{source}/e/{target}/~"))[0] == 404
    path = f"/api/bindings/%2F/e/{source}/e/{target}/{binding['properties_key']}"
    assert (await api.call("DELETE", path))[0] == 204


async def test_no_login_but_one_that_may_changes_anything_and_nobody_the_control_plane(
    make_server,
) -> None:
    """Every write route tried by every login that may not take it (no tags, the pair's
    own login, a management user outside its vhosts, a monitoring one), then, as an
    administrator, against the control plane by every way a declare can name it."""
    server, api = managed(make_server)
    queue, exchange = unique("q"), unique("x")
    assert (await put(api, f"/api/queues/%2F/{queue}", {}))[0] == 201
    assert (await put(api, f"/api/exchanges/%2F/{exchange}", {"type": "direct"}))[0] == 201
    writes = [
        ("PUT", f"/api/queues/%2F/{unique('q')}", {}),
        ("PUT", f"/api/exchanges/%2F/{unique('x')}", {"type": "direct"}),
        ("DELETE", f"/api/exchanges/%2F/{exchange}", None),
        ("POST", f"/api/bindings/%2F/e/{exchange}/q/{queue}", {"routing_key": "k"}),
        ("DELETE", f"/api/bindings/%2F/e/{exchange}/q/{queue}/k", None),
    ]
    for user, expected in (("guest", 401), ("limited", 401), ("peering", 401), ("watcher", 401)):
        for method, path, body in writes:
            data = None if body is None else json.dumps(body)
            status, answer = await api.call(method, path, user, data=data, headers=JSON)
            assert status == expected, (user, method, path, status, answer)
    assert (await api.get(f"/api/bindings/%2F/e/{exchange}/q/{queue}")) == []
    assert (await api.get(f"/api/exchanges/%2F/{exchange}"))["name"] == exchange
    # Not from a page of another origin, nor as a form a page could post.
    path = f"/api/queues/%2F/{unique('forged')}"
    forged = {**JSON, "Origin": "http://evil.example"}
    assert (await api.call("PUT", path, data="{}", headers=forged))[0] == 403
    form = {"Content-Type": "text/plain"}
    assert (await api.call("PUT", path, data="{}", headers=form))[0] == 415
    assert (await api.call("GET", path))[0] == 404
    # A management user in its own vhost may (RabbitMQ: configure permission there).
    assert (await put(api, f"/api/queues/%2F/{unique('mine')}", {}, "mgmt"))[0] == 201

    refused = [
        ("PUT", "/api/exchanges/%2F/amq.peer", {"type": "topic"}),
        ("PUT", "/api/exchanges/%2F/amq.console", {"type": "direct"}),
        ("PUT", "/api/exchanges/%2F/amq.direct", {"type": "direct"}),
        ("PUT", "/api/queues/%2F/amq.replication", {}),
        ("PUT", f"/api/queues/%2F/{unique('dl')}", {"arguments": {"x-dead-letter-exchange": "amq.peer"}}),
        ("PUT", f"/api/exchanges/%2F/{unique('ae')}", {"type": "direct", "arguments": {"alternate-exchange": "amq.console"}}),
        ("POST", f"/api/bindings/%2F/e/amq.peer/q/{queue}", {"routing_key": "#"}),
        ("POST", f"/api/bindings/%2F/e/{exchange}/e/amq.console", {}),
        ("POST", f"/api/bindings/%2F/e/amq.default/q/{queue}", {}),
        ("POST", f"/api/bindings/%2F/e/{exchange}/q/amq.replication", {}),
        ("DELETE", "/api/exchanges/%2F/amq.direct", None),
    ]  # fmt: skip
    for method, path, body in refused:
        data = None if body is None else json.dumps(body)
        status, answer = await api.call(method, path, data=data, headers=JSON)
        assert status == 403, (method, path, status, answer)
    for path in ("/api/exchanges/%2F/amq.peer", "/api/bindings/%2F/e/amq.peer/q/x/~"):
        assert (await api.call("DELETE", path))[0] == 404, path  # the control plane is not there
    bound = await api.get("/api/bindings/%2F")
    assert not any(b["source"] in ("amq.peer", "amq.console") for b in bound)
    assert not any(b["destination"] in ("amq.console", "amq.replication") for b in bound)


@pytest.mark.slow
async def test_declared_through_the_api_on_the_active_they_serve_on_the_new_one(
    make_pair: MakePair,
) -> None:
    """A queue, an exchange and a binding declared through the ACTIVE's API reach the
    PASSIVE (refused there: 503 naming the ACTIVE); after a kill -9 of the ACTIVE they
    route a message on the new one."""
    pair, (primary_api, backup_api) = managed_pair(make_pair)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    queue, exchange = unique("kept"), unique("route")
    assert (await put(primary_api, f"/api/queues/%2F/{queue}", {"durable": True}))[0] == 201
    assert (await put(primary_api, f"/api/exchanges/%2F/{exchange}", {"type": "direct"}))[0] == 201
    status, _ = await post(
        primary_api, f"/api/bindings/%2F/e/{exchange}/q/{queue}", {"routing_key": "k"}
    )
    assert status == 201
    status, answer = await put(backup_api, f"/api/queues/%2F/{unique('no')}", {})
    assert status == 503 and str(pair.primary.port) in answer["reason"], answer
    await pair.wait_in_sync(pair.backup, timeout=30)
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=30)
    await pair.wait_states(None, "ACTIVE", timeout=30)
    assert await routed(pair.backup.url, exchange, "k", queue) is not None


async def test_rabbitmqadmin_declares_and_deletes(make_server) -> None:
    if rabbitmqadmin_tool() is None:
        pytest.skip(RABBITMQADMIN_MISSING)
    server, api = managed(make_server)
    admin = rabbitmqadmin(api)
    queue, exchange = unique("tool-q"), unique("tool-x")
    steps = [
        ("declare", "queue", f"name={queue}", "durable=true"),
        ("declare", "exchange", f"name={exchange}", "type=direct"),
        ("declare", "binding", f"source={exchange}", f"destination={queue}", "routing_key=k"),
    ]
    for words in steps:
        done = await asyncio.to_thread(admin, *words)
        assert done.returncode == 0, (words, done.stdout, done.stderr)
    assert await routed(server.url, exchange, "k", queue) is not None
    steps = [
        (
            "delete",
            "binding",
            f"source={exchange}",
            f"destination={queue}",
            "destination_type=queue",
            "properties_key=k",
        ),
        ("delete", "exchange", f"name={exchange}"),
        ("delete", "queue", f"name={queue}"),
    ]
    for words in steps:
        done = await asyncio.to_thread(admin, *words)
        assert done.returncode == 0, (words, done.stdout, done.stderr)
    assert (await api.call("GET", f"/api/queues/%2F/{queue}"))[0] == 404
    assert (await api.call("GET", f"/api/exchanges/%2F/{exchange}"))[0] == 404
