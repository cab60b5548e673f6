"""A federation's names and buffer queues under attack, on real servers: a downstream
``london`` linked to an upstream ``central``, and other users of ``central`` trying to take
london's name or the messages its buffer queue holds for it (docs/security.md, "Federation
names"; docs/federation.md, "Buffer queues")."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import aiohttp
import aiormq
from pamqp import commands

from amqha.console import ConsoleClient
from tests.integration.test_federation import (
    EXCHANGE,
    bound_queue,
    declare_exchange,
    downstream,
    drain,
    links,
    publish,
    running_with,
    wait_link,
)
from tests.pairs import ADMIN, EFA, url_of
from tests.support import USERS, ServerProcess, free_port

# central's users: london's link (efa), another place's link login (rival, also tagged
# federation), an application user with no tags, a management user.
RIVAL = ("rival", "rival-pw-x1")
APP = ("app", "app-pw-x1")
MGMT = ("mgmt", "mgmt-pw-x1")
CENTRAL_USERS = [
    *USERS,
    {"name": "efa", "password": "efa", "vhosts": ["/"], "tags": ["federation"]},
    {"name": RIVAL[0], "password": RIVAL[1], "vhosts": ["/"], "tags": ["federation"]},
    {"name": APP[0], "password": APP[1], "vhosts": ["/"]},
    {"name": MGMT[0], "password": MGMT[1], "vhosts": ["/"], "tags": ["management"]},
]
REPLY_TO = "amq.rabbitmq.reply-to"


async def ask(url: str, request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One request on central's amq.federation; (the answer, the connection, still open)."""
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    answered: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def on_answer(message: Any) -> None:
        if not answered.done():
            answered.set_result(json.loads(message.body))

    await channel.basic_consume(REPLY_TO, on_answer, no_ack=True)
    await channel.basic_publish(
        json.dumps(request).encode(),
        exchange="amq.federation",
        routing_key="hello",
        properties=commands.Basic.Properties(reply_to=REPLY_TO, correlation_id=uuid.uuid4().hex),
    )
    return await asyncio.wait_for(answered, 10), connection


def hello(name: str, server: str, proof: str) -> dict[str, Any]:
    """A hello as any version of the link sent it: the proof as the key, and as the id."""
    return {
        "op": "hello",
        "name": name,
        "server": server,
        "exchange": EXCHANGE,
        "vhost": "/",
        "key": proof,
        "id": proof,
    }


async def linked_london(tmp_path: Path, make_server: Any) -> tuple[ServerProcess, ServerProcess]:
    central = make_server(
        "central", users=CENTRAL_USERS, management={"listen": f"127.0.0.1:{free_port()}"}
    )
    central.start()
    await declare_exchange(central.url)
    london = downstream(tmp_path, [url_of(central, EFA)])
    london.start()
    await declare_exchange(london.url)
    await bound_queue(london.url)
    await wait_link(london, running_with(1), "the binding upstream")
    return central, london


async def upstream_links(central: ServerProcess) -> list[dict[str, Any]]:
    async with asyncio.timeout(15), ConsoleClient(url_of(central, ADMIN)) as console:
        return list((await console.call("status"))["federation"]["upstream"]["linked"])


async def test_another_place_cannot_take_a_linked_name_nor_close_its_links(
    tmp_path: Path, make_server: Any
) -> None:
    """A user tagged federation at central says hello as 'london': refused, and the refusal
    names nothing of the holder's; with whatever it could read there (and guesses) it
    neither closes london's link nor holds the name, now or after london's link closes;
    everything published at central still reaches london."""
    central, london = await linked_london(tmp_path, make_server)
    rival_url = url_of(central, RIVAL)
    opened: list[Any] = []
    try:
        before = (await links(london))[0]
        first, connection = await ask(rival_url, hello("london", "rival-1", "0" * 64))
        opened.append(connection)
        assert first["ok"] is False and first["error"].startswith("duplicate name")
        # The attack as found: the holder's id, read from the refusal, as the proof.
        disclosed = re.findall(r"id ([0-9a-f]{8,})", first["error"])
        shown = [link["id"] for link in await upstream_links(central)]
        for proof in (*disclosed, *shown, "1" * 32):
            answer, connection = await ask(rival_url, hello("london", "rival-2", proof))
            opened.append(connection)
            assert answer["ok"] is False, (proof, answer)
        assert not disclosed, first["error"]
        await publish(central.url, [("eu.fr", "fr-1"), ("eu.end", "end")])
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            queue = await (await connection.channel()).get_queue("eu-prices")
            got = [m.body.decode() for m in await drain(queue, "end")]
        assert got == ["fr-1", "end"]
        after = (await links(london))[0]
        assert (after["state"], after["since"]) == ("running", before["since"]), after
        assert {link["server"] for link in await upstream_links(central)} == {"london"}
        # london goes away: its name stays its own (a rival cannot take it meanwhile).
        london.stop()
        await until_async(lambda: _no_links(central), 30, "london's link gone from central")
        answer, connection = await ask(rival_url, hello("london", "rival-3", "2" * 64))
        opened.append(connection)
        assert answer["ok"] is False and answer["error"].startswith("duplicate name")
    finally:
        for connection in opened:
            with contextlib.suppress(Exception):
                await connection.close()
        london.stop()


async def _no_links(central: ServerProcess) -> bool:
    return not await upstream_links(central)


async def until_async(predicate: Any, timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.1)


async def refusal(url: str, action: Any) -> str | None:
    """Run ``action(channel)`` on a fresh connection: None if it went through, else the
    error's class name (a refused operation closes the channel with 403)."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        try:
            await asyncio.wait_for(action(channel), 10)
            await asyncio.wait_for(channel.basic_qos(prefetch_count=1), 10)  # a round trip
        except aiormq.exceptions.AMQPError as error:
            return type(error).__name__
        return None
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def test_a_buffer_queue_is_its_links_alone_by_every_route(
    tmp_path: Path, make_server: Any
) -> None:
    """london frozen, 20 messages wait in its buffer queue at central. A user with no tags
    and another place's federation login try every route to them: get, consume, purge,
    delete, bind, unbind, a passive and an active declare, the default exchange; a
    management user the API's purge and delete; an administrator over AMQP get and
    consume. Each is refused, and once london wakes all 20 reach it."""
    central, london = await linked_london(tmp_path, make_server)
    buffer = (await links(london))[0]["buffer_queue"]
    assert london.process is not None
    os.kill(london.process.pid, signal.SIGSTOP)
    try:
        await publish(central.url, [(f"eu.{i}", f"m-{i}") for i in range(20)])
        got: list[bytes] = []

        async def on_message(message: Any) -> None:
            got.append(message.body)

        routes = {
            "get": lambda ch: ch.basic_get(buffer, no_ack=True),
            "consume": lambda ch: ch.basic_consume(buffer, on_message, no_ack=True),
            "purge": lambda ch: ch.queue_purge(buffer),
            "delete": lambda ch: ch.queue_delete(buffer),
            "bind": lambda ch: ch.queue_bind(buffer, EXCHANGE, routing_key="#"),
            "unbind": lambda ch: ch.queue_unbind(buffer, EXCHANGE, routing_key="eu.#"),
            "declare passive": lambda ch: ch.queue_declare(buffer, passive=True),
            "declare": lambda ch: ch.queue_declare(buffer, durable=True),
        }
        for user in (APP, RIVAL):
            for route, action in routes.items():
                refused = await refusal(url_of(central, user), action)
                assert refused == "ChannelAccessRefused", (user[0], route, refused)
        # An administrator may repair or remove it (as in the API), never take its messages.
        for route in ("get", "consume"):
            refused = await refusal(url_of(central, ADMIN), routes[route])
            assert refused == "ChannelAccessRefused", ("admin", route, refused)
        assert got == []
        # The default exchange routes nothing to it.
        connection = await aio_pika.connect(url_of(central, APP), timeout=10)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.default_exchange.publish(aio_pika.Message(b"forged"), routing_key=buffer)
        # The management API: a management user of the vhost may not purge or delete it.
        port = central.config["management"]["listen"].rsplit(":", 1)[1]
        path = f"http://127.0.0.1:{port}/api/queues/%2F/{quote(buffer, safe='')}"
        token = base64.b64encode(":".join(MGMT).encode()).decode()
        auth = {"Authorization": f"Basic {token}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            for target in (path + "/contents", path):
                async with session.delete(target, headers=auth) as answer:
                    text = await answer.text()  # RabbitMQ's answer to a tag that may not
                    assert (answer.status, "not_authorised" in text) == (401, True), text
    finally:
        os.kill(london.process.pid, signal.SIGCONT)
    try:
        await publish(central.url, [("eu.end", "end")])
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            queue = await (await connection.channel()).get_queue("eu-prices")
            bodies = [m.body.decode() for m in await drain(queue, "end", timeout=60)]
        assert sorted(bodies) == sorted([f"m-{i}" for i in range(20)] + ["end"]), bodies
    finally:
        london.stop()


async def test_hellos_on_one_connection_are_bounded(tmp_path: Path, make_server: Any) -> None:
    """200 hellos, each for a new name, on one connection of a federation user: the first
    16 are linked, the rest refused (`too many links`); the console's status keeps 16 and
    the log says each new link once, not once per hello."""
    central = make_server("central", users=CENTRAL_USERS).start()
    connection = await aiormq.connect(url_of(central, RIVAL))
    try:
        channel = await connection.channel()
        answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def on_answer(message: Any) -> None:
            answers.put_nowait(json.loads(message.body))

        await channel.basic_consume(REPLY_TO, on_answer, no_ack=True)
        for number in range(200):
            request = hello(f"place-{number}", "s", f"{number:064x}")
            await channel.basic_publish(
                json.dumps(request).encode(),
                exchange="amq.federation",
                routing_key="hello",
                properties=commands.Basic.Properties(reply_to=REPLY_TO),
            )
        got = [await asyncio.wait_for(answers.get(), 30) for _ in range(200)]
        accepted = [a for a in got if a["ok"]]
        assert len(accepted) == 16, len(accepted)
        assert all("too many links" in a["error"] for a in got if not a["ok"])
        assert len(await upstream_links(central)) == 16
        # The same hello again on the same connection: accepted, nothing new.
        for _ in range(50):
            await channel.basic_publish(
                json.dumps(hello("place-0", "s", f"{0:064x}")).encode(),
                exchange="amq.federation",
                routing_key="hello",
                properties=commands.Basic.Properties(reply_to=REPLY_TO),
            )
        again = [await asyncio.wait_for(answers.get(), 30) for _ in range(50)]
        assert all(a["ok"] for a in again)
        assert len(await upstream_links(central)) == 16
        assert central.log().count("linked for exchange") == 16
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def test_upstream_publishers_cannot_forge_what_the_link_acts_on(
    tmp_path: Path, make_server: Any
) -> None:
    """A publisher at central sets london's name in `x-amqha-path` (a loop, to the link),
    london's own probe header, another link's probe header, and a `user_id` (its own, so
    central accepts it): every message reaches london, with the path central gave it and
    no `user_id` (central's publisher is not london's to vouch for)."""
    central, london = await linked_london(tmp_path, make_server)
    forged = [
        ({"x-amqha-path": ["london"]}, "path"),
        ({"x-amqha-path": ["a", "b", "c", "d", "e", "f"]}, "hops"),
        ({"amqha-probe": "amqha.probe.london.market"}, "own-probe"),
        ({"amqha-probe": "amqha.probe.paris.market"}, "other-probe"),
    ]
    try:
        connection = await aio_pika.connect(url_of(central, APP), timeout=10)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(EXCHANGE)
            for headers, body in forged:
                await exchange.publish(
                    aio_pika.Message(body.encode(), headers=headers), routing_key="eu.x"
                )
            await exchange.publish(aio_pika.Message(b"signed", user_id=APP[0]), routing_key="eu.x")
            await exchange.publish(aio_pika.Message(b"end"), routing_key="eu.end")
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            queue = await (await connection.channel()).get_queue("eu-prices")
            got = await drain(queue, "end")
        assert [m.body.decode() for m in got] == [b for _, b in forged] + ["signed", "end"]
        for message in got:
            assert message.headers.get("x-amqha-path") == ["central"], message.headers
            assert "amqha-probe" not in message.headers
        assert got[-2].user_id is None
        assert (await links(london))[0]["dropped"] == {}
    finally:
        london.stop()
