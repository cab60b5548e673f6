"""Federation on real brokers (docs/federation.md): the global name announced, the
upstream's ``amq.federation`` (hello, duplicate names, bindings), who may use it, and the
hidden forward queues that no client reaches by any route, whose copies are confirmed
only once safe (a kill -9 loses none)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
import pytest
from pamqp import commands

from amqha.console import ConsoleClient
from amqha.core import names
from tests.integration.test_management import Api
from tests.pairs import ADMIN, Knocker, url_of
from tests.support import USERS, ServerProcess, free_port, until, wait_until

EFA = {"name": "efa", "password": "efa-pw-x1", "vhosts": ["/"], "tags": ["federation"]}
APP = {"name": "app", "password": "app-pw-x1", "vhosts": ["/"]}
EFA_OTHER = {
    "name": "efa-other",
    "password": "efa-o-x1",
    "vhosts": ["other"],
    "tags": ["federation"],
}
FED_USERS = [*USERS, EFA, APP, EFA_OTHER]
PASSWORDS = {
    "guest": "guest",
    "admin": "admin",
    "efa": "efa-pw-x1",
    "app": "app-pw-x1",
    "efa-other": "efa-o-x1",
}
REPLY_TO = "amq.rabbitmq.reply-to"
REFUSED = "closed ChannelAccessRefused"  # 403 on the channel
FORWARD = names.forward_queue_name("rpc", "central")
WAIT = 10.0


def url(server: ServerProcess, user: str) -> str:
    return url_of(server, (user, PASSWORDS[user]))


class Link:
    """An EFA's control connection: requests on amq.federation, answers by direct reply-to."""

    def __init__(self, connection: aiormq.abc.AbstractConnection) -> None:
        self.connection = connection
        self.answers: dict[str, asyncio.Future[Any]] = {}

    @classmethod
    async def open(cls, server: ServerProcess, user: str = "efa", vhost: str = "") -> Link:
        link = cls(await aiormq.connect(url(server, user) + vhost))
        link.channel = await link.connection.channel()
        await link.channel.basic_consume(REPLY_TO, link._on_answer, no_ack=True)
        return link

    async def _on_answer(self, message: aiormq.abc.DeliveredMessage) -> None:
        future = self.answers.pop(message.header.properties.correlation_id or "", None)
        if future is not None and not future.done():
            future.set_result(json.loads(message.body))

    async def ask(self, **request: Any) -> dict[str, Any]:
        correlation_id = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self.answers[correlation_id] = future
        await self.channel.basic_publish(
            json.dumps(request).encode(),
            exchange="amq.federation",
            routing_key="",
            properties=commands.Basic.Properties(reply_to=REPLY_TO, correlation_id=correlation_id),
        )
        return await asyncio.wait_for(future, WAIT)

    async def hello(self, name: str, id_: str, server: str, exchange: str = "x") -> dict:
        """``id_``: the place; its claim key is made from it (docs/security.md)."""
        return await self.ask(
            op="hello", name=name, key=id_ * 4, server=server, exchange=exchange, vhost="/"
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.connection.close()


async def status(server: ServerProcess) -> dict[str, Any]:
    async with ConsoleClient(url_of(server, ADMIN)) as console:
        return await console.call("status")


async def hidden_messages(server: ServerProcess) -> int:
    hidden = (await status(server))["federation"]["hidden"]
    return next(h["messages"] for h in hidden if h["queue"] == FORWARD)


async def outcome(action: Callable[[Any], Awaitable[Any]], server: ServerProcess, user: str) -> str:
    """Run ``action`` on a fresh channel as ``user``: "ok", or "closed" and the error."""
    connection = await aiormq.connect(url(server, user))
    try:
        channel = await connection.channel()
        try:
            await asyncio.wait_for(action(channel), WAIT)
            # A publish is refused asynchronously: a round trip tells whether the channel lives.
            await asyncio.wait_for(channel.basic_qos(prefetch_count=1), WAIT)
        except aiormq.exceptions.AMQPError as error:
            return f"closed {type(error).__name__}"
        return "ok"
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


def forwarding(make_server: Any, *forwards: str, **overrides: Any) -> ServerProcess:
    """A standalone broker whose exchanges are forwarded (tests/forwarding_broker.py)."""
    server = make_server("fed", users=FED_USERS, **overrides)
    server.command = ("-m", "tests.forwarding_broker")
    server.start(extra_args=forwards)
    return server


# -- names ----------------------------------------------------------------------------------


async def test_a_pair_announces_its_name_and_records_refused_hellos(make_pair) -> None:
    pair = make_pair(users=FED_USERS).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=20)
    for server in pair.servers:
        async with ConsoleClient(url_of(server, ADMIN)) as console:
            assert console.connection is not None
            properties = console.connection.transport.connection.server_properties
            assert properties["amqha-name"] == "backup+primary"
    connection = await aiormq.connect(url(pair.primary, "guest"))
    try:
        channel = await connection.channel()
        declared = await channel.queue_declare("", exclusive=True)
        assert declared.queue.startswith("amq.gen-backup+primary-")
    finally:
        await connection.close()

    first = await Link.open(pair.primary)
    other = await Link.open(pair.primary)
    try:
        assert await first.hello("london", "1" * 16, "s1") == {
            "ok": True,
            "name": "backup+primary",
        }
        refused = await other.hello("london", "2" * 16, "s7")
        assert refused["ok"] is False and refused["error"].startswith("duplicate name: ")
        itself = await other.hello("backup+primary", "2" * 16, "s7")
        assert itself["ok"] is False and itself["error"].startswith("link to itself: ")
        assert not first.connection.is_closed
    finally:
        await first.close()
        await other.close()

    def records() -> list[dict[str, Any]]:
        return [e for e in pair.events(pair.primary) if e["event"] == "federation"]

    wait_until(lambda: len(records()) == 2, WAIT, what="two federation records")
    kinds = {r["kind"]: r for r in records()}
    assert set(kinds) == {"duplicate_name", "self_link"}
    assert kinds["duplicate_name"]["name"] == "london"
    # The record names the refused claim by a fingerprint, never by its key.
    assert kinds["duplicate_name"]["id"] == names.claim_token("2" * 64)[:16]
    assert kinds["duplicate_name"]["user"] == "efa"


# -- hello ------------------------------------------------------------------------------------


async def test_hello_duplicate_names_and_a_pairs_other_server(make_server) -> None:
    server = make_server("central", users=FED_USERS).start()
    first, rival, successor, later = [await Link.open(server) for _ in range(4)]
    try:
        properties = first.connection.server_properties
        assert properties["amqha-name"] == "central"
        assert await first.hello("london", "1" * 16, "ldn-a", "market") == {
            "ok": True,
            "name": "central",
        }
        assert await first.hello("london", "1" * 16, "ldn-a", "rpc") == {
            "ok": True,
            "name": "central",
        }
        itself = await rival.hello("central", "9" * 16, "c")
        assert itself["ok"] is False
        assert itself["error"].startswith("link to itself: ")
        duplicate = await rival.hello("london", "2" * 16, "elsewhere")
        assert duplicate["ok"] is False
        assert duplicate["error"].startswith("duplicate name: 'london' is claimed here")
        assert "1" * 16 not in duplicate["error"]  # nothing of the holder's
        unproven = await rival.ask(op="hello", name="paris", server="s", exchange="e")
        assert unproven["ok"] is False and "no 'key'" in unproven["error"]
        bad = await rival.ask(op="hello", name="no such.name", id="x", server="s", exchange="e")
        assert bad["ok"] is False and "not a valid name" in bad["error"]
        assert (await rival.ask(op="nothing"))["ok"] is False
        assert not first.connection.is_closed

        linked = (await status(server))["federation"]["upstream"]
        assert [(x["name"], x["server"], x["exchange"]) for x in linked["linked"]] == [
            ("london", "ldn-a", "market"),
            ("london", "ldn-a", "rpc"),
        ]
        assert linked["refused"] == {"self_link": 1, "duplicate_name": 1}

        # The pair's other server after its failover: same name and id, another server.
        assert (await successor.hello("london", "1" * 16, "ldn-b", "market"))["ok"] is True
        await until(lambda: first.connection.is_closed, WAIT, "the old link closed")
        assert not successor.connection.is_closed
        linked = (await status(server))["federation"]["upstream"]["linked"]
        assert [x["server"] for x in linked] == ["ldn-b"]

        # Entries go with their connection: the name is free again.
        await successor.close()

        async def freed() -> bool:
            return not (await status(server))["federation"]["upstream"]["linked"]

        for _ in range(200):
            if await freed():
                break
            await asyncio.sleep(0.05)
        assert await freed()
        # The name stays claimed once its links are gone: another place is refused, the
        # holder's key still works.
        assert (await later.hello("london", "2" * 16, "elsewhere"))["ok"] is False
        assert (await later.hello("london", "1" * 16, "ldn-c"))["ok"] is True
    finally:
        for link in (first, rival, successor, later):
            await link.close()
    assert "hello refused" in server.log()


# -- who may use amq.federation -------------------------------------------------------------


async def test_only_a_federation_user_reaches_amq_federation(make_server) -> None:
    server = make_server("central", users=FED_USERS).start()
    hello = json.dumps({"op": "hello", "name": "x", "id": "1", "server": "s", "exchange": "e"})

    async def publish(channel: Any) -> None:
        await channel.basic_publish(hello.encode(), exchange="amq.federation", routing_key="")

    async def bind(channel: Any) -> None:
        await channel.queue_declare("tap", auto_delete=True)
        await channel.queue_bind("tap", "amq.federation", routing_key="")

    for user in ("guest", "app", "admin"):
        assert await outcome(publish, server, user) == REFUSED, user
    for user in ("guest", "app", "efa"):
        assert await outcome(bind, server, user) == REFUSED, user
    assert await outcome(publish, server, "efa") == "ok"
    received = (await status(server))["control_received"]["amq.federation"]
    assert received == {"efa": 1}
    # Every vhost answers, not only the default one.
    elsewhere = await Link.open(server, "efa-other", "other")
    try:
        assert await elsewhere.hello("london", "1" * 16, "s1") == {"ok": True, "name": "central"}
    finally:
        await elsewhere.close()


# -- bindings ------------------------------------------------------------------------------


async def test_the_bindings_of_a_buffer_queue_and_nothing_else(make_server) -> None:
    server = forwarding(make_server, "rpc=central")
    buffer = names.buffer_queue_name("market", "fed", "london")
    path = {"x-amqha-path": ["paris"]}
    link = await Link.open(server)
    try:
        channel = link.channel
        await channel.exchange_declare("market", exchange_type="topic", durable=True)
        # Only london's link (its proven hello said) may use london's buffer queue.
        assert (await link.hello("london", "1" * 16, "ldn", "market"))["ok"] is True
        await channel.queue_declare(buffer, durable=True)
        await channel.queue_bind(buffer, "market", routing_key="a.#")
        await channel.queue_bind(buffer, "market", routing_key="b", arguments=path)
        await channel.queue_declare("plain", durable=True)
        answer = await link.ask(op="bindings", vhost="/", queue=buffer)
        assert answer["ok"] is True
        assert sorted(answer["bindings"], key=lambda b: b["routing_key"]) == [
            {"exchange": "market", "routing_key": "a.#", "arguments": {}},
            {"exchange": "market", "routing_key": "b", "arguments": path},
        ]
        plain = await link.ask(op="bindings", vhost="/", queue="plain")
        assert plain["ok"] is False and "not a federation buffer queue" in plain["error"]
        hidden = await link.ask(op="bindings", vhost="/", queue=FORWARD)
        assert hidden["ok"] is False and "ACCESS_REFUSED" in hidden["error"]
        missing = names.buffer_queue_name("market", "another", "london")
        missing_answer = await link.ask(op="bindings", vhost="/", queue=missing)
        assert missing_answer["ok"] is False and "NOT_FOUND" in missing_answer["error"]
        # Another place's buffer queue: not this connection's to read.
        paris = await link.ask(op="bindings", vhost="/", queue=buffer.replace("london", "paris"))
        assert paris["ok"] is False and "ACCESS_REFUSED" in paris["error"]
    finally:
        await link.close()
    # A buffer queue in a vhost the asking user may not read.
    link = await Link.open(server)
    try:
        other = await link.ask(op="bindings", vhost="other", queue=buffer)
        assert other["ok"] is False and "ACCESS_REFUSED" in other["error"]
    finally:
        await link.close()


# -- hidden queues ------------------------------------------------------------------------------


def _routes() -> dict[str, Callable[[Any], Awaitable[Any]]]:
    async def declare_passive(channel: Any) -> None:
        await channel.queue_declare(FORWARD, passive=True)

    async def declare(channel: Any) -> None:
        await channel.queue_declare(FORWARD, durable=True)

    async def declare_hidden_argument(channel: Any) -> None:
        await channel.queue_declare("mine", durable=True, arguments={"x-amqha-hidden": True})

    async def bind(channel: Any) -> None:
        await channel.queue_bind(FORWARD, "amq.direct", routing_key="k")

    async def unbind(channel: Any) -> None:
        await channel.queue_unbind(FORWARD, "rpc", routing_key="k")

    async def consume(channel: Any) -> None:
        await channel.basic_consume(FORWARD, lambda message: None)

    async def get(channel: Any) -> None:
        await channel.basic_get(FORWARD)

    async def purge(channel: Any) -> None:
        await channel.queue_purge(FORWARD)

    async def delete(channel: Any) -> None:
        await channel.queue_delete(FORWARD)

    return {
        "declare passive": declare_passive,
        "declare": declare,
        "declare with x-amqha-hidden": declare_hidden_argument,
        "bind": bind,
        "unbind": unbind,
        "consume": consume,
        "get": get,
        "purge": purge,
        "delete": delete,
    }


async def test_no_client_reaches_a_hidden_queue_by_any_route(make_server) -> None:
    port = free_port()
    server = forwarding(make_server, "rpc=central", management={"listen": f"127.0.0.1:{port}"})

    async def forwarded(channel: Any) -> None:
        await channel.confirm_delivery()
        await channel.basic_publish(
            b"up",
            exchange="rpc",
            routing_key="k",
            properties=commands.Basic.Properties(delivery_mode=2),
        )

    # The oracle works: a publish to the forwarded exchange reaches the hidden queue.
    assert await outcome(forwarded, server, "guest") == "ok"
    assert await hidden_messages(server) == 1

    for user in ("guest", "app", "admin"):
        for what, route in _routes().items():
            assert await outcome(route, server, user) == REFUSED, (user, what)

    async def by_default_exchange(channel: Any) -> None:
        await channel.basic_publish(b"in", exchange="", routing_key=FORWARD)

    async def by_dead_letter(channel: Any) -> None:
        await channel.queue_declare(
            "dies",
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": FORWARD,
                "x-message-ttl": 0,
            },
        )
        await channel.confirm_delivery()
        await channel.basic_publish(b"dead", exchange="", routing_key="dies")

    async def by_dead_letter_to_a_visible_queue(channel: Any) -> None:
        await channel.queue_declare("seen")
        await channel.queue_declare(
            "dies-visibly",
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "seen",
                "x-message-ttl": 0,
            },
        )
        await channel.confirm_delivery()
        await channel.basic_publish(b"dead", exchange="", routing_key="dies-visibly")

    for user in ("guest", "app"):
        assert await outcome(by_default_exchange, server, user) == "ok"
        assert await outcome(by_dead_letter, server, user) == "ok"
    # The same dead-letter route to a visible queue does deliver (the route is real).
    assert await outcome(by_dead_letter_to_a_visible_queue, server, "guest") == "ok"

    async def seen_one() -> bool:
        async with ConsoleClient(url_of(server, ADMIN)) as console:
            rows = await console.call("queues")
        return any(q["name"] == "seen" and q["messages"] == 1 for q in rows)

    for _ in range(100):
        if await seen_one():
            break
        await asyncio.sleep(0.05)
    assert await seen_one()
    # Mandatory: nothing took it, so it comes back.
    connection = await aiormq.connect(url(server, "guest"))
    try:
        channel = await connection.channel(on_return_raises=True)
        with pytest.raises(aiormq.exceptions.PublishError):
            await channel.basic_publish(b"in", exchange="", routing_key=FORWARD, mandatory=True)
    finally:
        await connection.close()
    assert await hidden_messages(server) == 1

    # Listings leave it out; the API cannot name it.
    api = Api(port)
    queues = {q["name"] for q in await api.get("/api/queues")}
    assert "dies" in queues and FORWARD not in queues
    bindings = await api.get("/api/bindings")
    assert all(FORWARD not in (b["source"], b["destination"]) for b in bindings)
    quoted = urllib.parse.quote(FORWARD, safe="")
    assert (await api.call("GET", f"/api/queues/%2F/{quoted}"))[0] == 404
    assert (await api.call("DELETE", f"/api/queues/%2F/{quoted}"))[0] == 404
    assert (await api.call("DELETE", f"/api/queues/%2F/{quoted}/contents"))[0] == 404
    exported = await api.get("/api/definitions")
    assert FORWARD not in {q["name"] for q in exported["queues"]}
    async with ConsoleClient(url_of(server, ADMIN)) as console:
        assert FORWARD not in {q["name"] for q in await console.call("queues")}
        with pytest.raises(Exception, match="hidden"):
            await console.call("purge", queue=FORWARD)
        with pytest.raises(Exception, match="hidden"):
            await console.call("delete", queue=FORWARD)
    assert await hidden_messages(server) == 1


async def test_a_forwarded_copy_is_confirmed_once_stored_and_survives_a_kill(
    make_server,
) -> None:
    server = forwarding(make_server, "rpc=central")
    connection = await aiormq.connect(url(server, "app"))
    confirmed = 0
    try:
        channel = await connection.channel()
        await channel.confirm_delivery()
        for index in range(50):
            ack = await channel.basic_publish(
                f"m{index}".encode(),
                exchange="rpc",
                routing_key="nobody-binds-this",
                properties=commands.Basic.Properties(delivery_mode=2),
            )
            assert isinstance(ack, commands.Basic.Ack)
            confirmed += 1
    finally:
        await connection.close()
    server.kill()
    server.start(extra_args=("rpc=central",))
    wait_until(
        lambda: f"hidden {FORWARD}: " in server.log().split("listening on")[-1],
        WAIT,
        what="the restarted server's hidden queue line",
    )
    after = server.log().split("listening on")[-1]
    line = next(x for x in after.splitlines() if x.startswith(f"hidden {FORWARD}: "))
    assert line == f"hidden {FORWARD}: {confirmed} messages"  # 0 confirmed lost
    assert await hidden_messages(server) == confirmed

    async def peek(channel: Any) -> None:
        await channel.queue_declare(FORWARD, passive=True)

    assert await outcome(peek, server, "guest") == REFUSED  # recovered hidden


async def test_forwarded_copies_survive_a_kill_of_the_active(make_pair) -> None:
    """The hidden queue is replicated like any durable queue: what a publisher had
    confirmed is on the new ACTIVE's hidden queue after a kill -9 of the old one."""
    pair = make_pair(users=FED_USERS)
    for server in pair.servers:
        server.command = ("-m", "tests.forwarding_broker")
        server.start(extra_args=("rpc=central",))
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    wait_until(lambda: f"hidden {FORWARD}: 0 messages" in pair.primary.log(), WAIT)
    await pair.wait_in_sync(pair.backup)
    connection = await aiormq.connect(url(pair.primary, "app"))
    confirmed = 0
    try:
        channel = await connection.channel()
        await channel.confirm_delivery()
        for index in range(50):
            ack = await channel.basic_publish(
                f"m{index}".encode(),
                exchange="rpc",
                routing_key="k",
                properties=commands.Basic.Properties(delivery_mode=2),
            )
            assert isinstance(ack, commands.Basic.Ack)
            confirmed += 1
    finally:
        await connection.close()
    pair.kill(pair.primary)
    with Knocker(pair.backup):
        await pair.wait_states(None, "ACTIVE", timeout=30)
    wait_until(lambda: f"hidden {FORWARD}: " in pair.backup.log(), WAIT, what="forwards set")
    line = next(x for x in pair.backup.log().splitlines() if x.startswith(f"hidden {FORWARD}"))
    assert line == f"hidden {FORWARD}: {confirmed} messages"  # 0 confirmed lost
    assert await hidden_messages(pair.backup) == confirmed

    async def peek(channel: Any) -> None:
        await channel.queue_declare(FORWARD, passive=True)

    assert await outcome(peek, pair.backup, "guest") == REFUSED


async def test_a_buffer_queue_without_a_consumer_is_reported_once_as_an_orphan(
    make_server,
) -> None:
    server = forwarding(make_server, "--orphan-after", "1")
    buffer = names.buffer_queue_name("market", "fed", "london")
    link = await Link.open(server)
    try:
        assert (await link.hello("london", "1" * 16, "ldn", "market"))["ok"] is True
        await link.channel.queue_declare(buffer, durable=True)
        await link.channel.queue_declare("plain", durable=True)

        async def rows() -> dict[str, dict[str, Any]]:
            async with ConsoleClient(url_of(server, ADMIN)) as console:
                return {q["name"]: q for q in await console.call("queues")}

        async def orphan() -> bool:
            return bool((await rows())[buffer].get("orphan"))

        for _ in range(200):
            if await orphan():
                break
            await asyncio.sleep(0.05)
        assert await orphan()
        assert "orphan" not in (await rows())["plain"]
        orphans = (await status(server))["federation"]["upstream"]["orphans"]
        assert orphans == [{"vhost": "/", "queue": buffer}]
        # A consumer comes back: no longer an orphan.
        await link.channel.basic_consume(buffer, lambda message: None)
        for _ in range(200):
            if not await orphan():
                break
            await asyncio.sleep(0.05)
        assert not await orphan()
        assert server.log().count("has had no consumer") == 1  # logged once
    finally:
        await link.close()
