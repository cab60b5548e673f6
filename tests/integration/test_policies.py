"""Policies and operator policies (amqha/core/policies.py, amqha/management/policies.py) on
a real server and a real pair: RabbitMQ's answers, limits that hold on the queues they
match at once and on queues declared later, RabbitMQ's rules where a queue's own argument
says too (the lower number wins, the queue's own dead-lettering wins, an operator policy
caps), kept across a restart and replicated (a kill -9 of the ACTIVE: the new one holds
them), carried by a definitions export and import; every change tried by every login
that may not, and a policy that would dead-letter into the control plane refused."""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import pytest

from tests.integration.protocol_support import unique
from tests.integration.test_management import Api, managed, managed_pair, until_value
from tests.integration.test_runtime_users import call, explain, restart
from tests.pairs import MakePair, client_vote

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


async def publish(
    url: str, queue: str, count: int, arguments: dict[str, Any] | None = None
) -> None:
    """Declare durable ``queue`` (with ``arguments``) and publish ``count`` confirmed
    persistent messages to it."""
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True, arguments=arguments)
        for i in range(count):
            await channel.default_exchange.publish(
                aio_pika.Message(f"{queue}-{i}".encode(), delivery_mode=2), routing_key=queue
            )


async def count(api: Api, queue: str) -> int:
    return (await api.get(f"/api/queues/%2F/{queue}"))["messages"]


async def bodies(url: str, queue: str) -> list[bytes]:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel()
        kept = await channel.declare_queue(queue, durable=True, passive=True)
        got = []
        for _ in range(1000):
            message = await kept.get(fail=False, no_ack=True, timeout=5)
            if message is None:
                break
            got.append(message.body)
        return got


async def test_policies_as_rabbitmq_answers_and_their_limits_hold(make_server) -> None:
    server, api = managed(make_server)
    prefix = unique("pq")
    capped, own, later = f"{prefix}-a", f"{prefix}-b", f"{prefix}-later"
    await publish(server.url, capped, 10)
    await publish(server.url, own, 2, {"x-max-length": 3})
    policy = {
        "pattern": f"^{prefix}-",
        "definition": {"max-length": 5, "message-ttl": 600000},
        "apply-to": "queues",
        "priority": 1,
    }
    path = f"/api/policies/%2F/{prefix}-cap"
    assert await call(api, "PUT", path, policy) == 201
    # Held at once: the oldest dropped, as drop-head does on a publish.
    assert await bodies(server.url, capped) == [f"{capped}-{i}".encode() for i in range(5, 10)]
    shown = await api.get(f"/api/queues/%2F/{capped}")
    assert shown["policy"] == f"{prefix}-cap", shown
    assert shown["effective_policy_definition"] == {"max-length": 5, "message-ttl": 600000}
    assert await call(api, "PUT", path, {**policy, "priority": 2}) == 204
    # The queue's own lower number wins over the policy's; a queue declared later takes it.
    await publish(server.url, own, 5, {"x-max-length": 3})
    assert await count(api, own) == 3
    assert (
        "max-length" not in (await api.get(f"/api/queues/%2F/{own}"))["effective_policy_definition"]
    )
    await publish(server.url, later, 7)
    assert await count(api, later) == 5
    assert (await api.get(f"/api/policies/%2F/{prefix}-cap"))["priority"] == 2
    assert [p["name"] for p in await api.get("/api/policies/%2F")] == [f"{prefix}-cap"]

    # A TTL: the policy's lower one expires messages; a queue's own lower one stays its own.
    short, longer = f"{prefix}-ttl-short", f"{prefix}-ttl-own"
    ttl = {"pattern": f"^{prefix}-ttl-", "definition": {"message-ttl": 300}, "priority": 5}
    assert await call(api, "PUT", f"/api/policies/%2F/{prefix}-ttl", ttl) == 201
    await publish(server.url, short, 3, {"x-message-ttl": 600000})
    await publish(server.url, longer, 3, {"x-message-ttl": 100})
    await until_value(lambda: count(api, short), lambda n: n == 0, 20, "the policy's TTL")
    await until_value(lambda: count(api, longer), lambda n: n == 0, 20, "the queue's own TTL")
    # Dead-lettering: the queue's own exchange wins over the policy's.
    dl = f"{prefix}-dl"
    dead = {"pattern": f"^{dl}$", "definition": {"dead-letter-exchange": "from-policy"}}
    assert (
        await call(api, "PUT", f"/api/policies/%2F/{prefix}-dead", {**dead, "priority": 9}) == 201
    )
    await publish(server.url, dl, 0, {"x-dead-letter-exchange": "own"})
    assert (await api.get(f"/api/queues/%2F/{dl}"))["effective_policy_definition"] == {}

    # An operator policy caps what the policy allows (the lower number wins).
    cap = {
        "pattern": f"^{prefix}-(a|later)$",
        "definition": {"max-length": 2},
        "apply-to": "queues",
    }
    assert await call(api, "PUT", f"/api/operator-policies/%2F/{prefix}-op", cap) == 201
    assert await count(api, later) == 2
    shown = await api.get(f"/api/queues/%2F/{later}")
    assert (shown["policy"], shown["operator_policy"]) == (f"{prefix}-cap", f"{prefix}-op")
    status, reason = await explain(
        api,
        "PUT",
        f"/api/operator-policies/%2F/{prefix}-bad",
        {"pattern": ".", "definition": {"dead-letter-exchange": "x"}},
    )
    assert status == 400 and "operator policy" in reason, reason

    # Kept across a restart, and still holding.
    restart(server, api)
    await publish(server.url, later, 4)
    assert await count(api, later) == 2
    assert {p["name"] for p in await api.get("/api/policies")} >= {f"{prefix}-cap", f"{prefix}-ttl"}
    # Deleted: the limits go with them.
    for kind, name in (("operator-policies", "op"), ("policies", "cap"), ("policies", "ttl")):
        assert await call(api, "DELETE", f"/api/{kind}/%2F/{prefix}-{name}") == 204
        assert await call(api, "DELETE", f"/api/{kind}/%2F/{prefix}-{name}") == 404
    await publish(server.url, later, 4)
    assert await count(api, later) == 6


async def test_bad_policies_are_refused_naming_the_problem(make_server) -> None:
    server, api = managed(make_server)
    base = {"pattern": "^x", "definition": {"max-length": 1}}
    for body, status, word in (
        ({**base, "pattern": "(unclosed"}, 400, "regular expression"),
        ({**base, "definition": {"max-lenght": 1}}, 400, "not recognised"),
        ({**base, "definition": {"max-length": -1}}, 400, "at least 0"),
        ({**base, "definition": {"expires": 0}}, 400, "at least 1"),
        ({**base, "definition": {"overflow": "drop-tail"}}, 400, "overflow"),
        ({**base, "apply-to": "streams"}, 400, "apply-to"),
        ({**base, "definition": {}}, 400, "empty"),
        ({**base, "definition": {"dead-letter-exchange": "amq.peer"}}, 403, "reserved"),
        ({**base, "definition": {"dead-letter-exchange": "amq.console"}}, 403, "reserved"),
        ({"definition": {"max-length": 1}}, 400, "pattern"),
    ):  # fmt: skip
        got, reason = await explain(api, "PUT", f"/api/policies/%2F/{unique('bad')}", body)
        assert (got, word in reason) == (status, True), (body, got, reason)
    assert await api.get("/api/policies") == []
    # Mirroring keys are taken and ignored: the pair replicates every durable queue.
    mirror = {"pattern": "^m", "definition": {"ha-mode": "all", "max-length": 4}}
    assert await call(api, "PUT", "/api/policies/%2F/mirror", mirror) == 201
    assert await call(api, "PUT", "/api/policies/nowhere/p", mirror) == 404


async def test_no_login_but_a_policymaker_or_an_administrator_sets_a_policy(make_server) -> None:
    """Every policy change tried as guest, a user without tags, the pair's own login, a
    monitoring and a management user: refused, nothing set. A policymaker (made at run
    time) sets policies in its own vhost only, and no operator policy."""
    server, api = managed(make_server)
    body = {"pattern": "^p", "definition": {"max-length": 1}}
    assert await call(api, "PUT", "/api/policies/%2F/kept", body) == 201
    changes = [
        ("PUT", "/api/policies/%2F/new", body),
        ("DELETE", "/api/policies/%2F/kept", None),
        ("PUT", "/api/operator-policies/%2F/new", body),
        ("DELETE", "/api/operator-policies/%2F/kept", None),
    ]
    for user in ("guest", "limited", "peering", "watcher", "mgmt"):
        for method, path, payload in changes:
            status = await call(api, method, path, payload, user)
            assert status in (401, 403, 404), (user, method, path, status)
    assert [p["name"] for p in await api.get("/api/policies")] == ["kept"]
    assert await api.get("/api/operator-policies") == []
    maker = unique("pm")
    assert (
        await call(api, "PUT", f"/api/users/{maker}", {"password": "pm-pw", "tags": "policymaker"})
        == 201
    )
    assert await call(api, "PUT", f"/api/permissions/%2F/{maker}", FULL) == 201
    as_maker = Api(int(api.base.rsplit(":", 1)[1]))
    data = json.dumps(body)
    headers = {"Content-Type": "application/json"}

    async def as_pm(method: str, path: str) -> int:
        status, _ = await as_maker.call(method, path, maker, "pm-pw", data=data, headers=headers)
        return status

    assert await as_pm("PUT", "/api/policies/%2F/by-maker") == 201
    assert await as_pm("PUT", "/api/policies/other/by-maker") in (403, 404)
    assert await as_pm("PUT", "/api/operator-policies/%2F/by-maker") in (401, 403)
    assert await as_pm("DELETE", "/api/policies/%2F/kept") == 204


async def test_a_definitions_file_carries_policies_both_ways(make_server) -> None:
    server, api = managed(make_server)
    queue = unique("dq")
    policy = {
        "vhost": "/",
        "name": "limits",
        "pattern": f"^{queue}$",
        "apply-to": "queues",
        "definition": {"max-length": 2, "overflow": "reject-publish"},
        "priority": 3,
    }
    body = {"policies": [policy], "queues": [{"name": queue, "vhost": "/", "durable": True}]}
    status, answer = await api.call(
        "POST",
        "/api/definitions",
        data=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    assert status == 204, answer
    assert (await api.get("/api/definitions"))["policies"] == [policy]
    # reject-publish: the third is refused (nacked), the first two kept.
    connection = await aio_pika.connect(server.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for i in range(2):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await channel.default_exchange.publish(aio_pika.Message(b"2"), routing_key=queue)
    assert await count(api, queue) == 2


@pytest.mark.slow
async def test_a_policy_set_on_the_active_holds_on_the_new_one_after_a_kill(
    make_pair: MakePair,
) -> None:
    """A policy's max-length and message-ttl set through the ACTIVE's API (refused on the
    PASSIVE): after a kill -9 of the ACTIVE the new one holds both, on a queue it had and
    on one declared after."""
    pair, (primary_api, backup_api) = managed_pair(make_pair)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await pair.wait_in_sync(pair.backup, timeout=30)
    prefix = unique("pp")
    body = {"pattern": f"^{prefix}-", "definition": {"max-length": 3}, "apply-to": "queues"}
    ttl = {"pattern": f"^{prefix}-ttl", "definition": {"message-ttl": 300}, "priority": 1}
    assert await call(primary_api, "PUT", f"/api/policies/%2F/{prefix}-len", body) == 201
    assert await call(primary_api, "PUT", f"/api/policies/%2F/{prefix}-ttl", ttl) == 201
    status, reason = await explain(backup_api, "PUT", f"/api/policies/%2F/{prefix}-no", body)
    assert status == 503 and str(pair.primary.port) in reason, reason
    await publish(pair.primary.url, f"{prefix}-q", 5)
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=30)
    await pair.wait_states(None, "ACTIVE", timeout=30)
    url = pair.backup.url
    assert len(await bodies(url, f"{prefix}-q")) == 3
    await publish(url, f"{prefix}-q", 5)
    await publish(url, f"{prefix}-later", 6)
    assert await count(backup_api, f"{prefix}-q") == 3
    assert await count(backup_api, f"{prefix}-later") == 3
    await publish(url, f"{prefix}-ttl-q", 2)
    await until_value(
        lambda: count(backup_api, f"{prefix}-ttl-q"), lambda n: n == 0, 20, "the TTL held"
    )
    shown = await backup_api.get(f"/api/queues/%2F/{prefix}-later")
    assert shown["policy"] == f"{prefix}-len"
