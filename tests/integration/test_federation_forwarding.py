"""Federation beyond one link (docs/federation.md): request and response across places
(forwarding up, global reply names back down), a loop of three places, duplicate names."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqha.console import ConsoleClient
from tests.certs import Pki
from tests.integration.test_federation import FED_USERS, links, wait_link
from tests.integration.test_federation import running_with as running
from tests.integration.test_metrics import scrape_path
from tests.pairs import ADMIN, EFA, url_of
from tests.support import ServerProcess, free_port

TIMINGS = {"reconcile": 1, "probe": 0.2}
WAIT = 30.0


def federating(
    server: ServerProcess,
    upstream: ServerProcess | list[ServerProcess],
    exchange: str,
    **options: Any,
) -> ServerProcess:
    """``server``'s config federates ``exchange`` from ``upstream`` (a server, or both of
    a pair), set before it starts."""
    upstreams = upstream if isinstance(upstream, list) else [upstream]
    server.config["federation"] = {
        "upstreams": {"up": {"urls": [url_of(one, EFA) for one in upstreams]}},
        "exchanges": [{"exchange": exchange, "upstream": "up", **options}],
        **TIMINGS,
    }
    return server


async def declare(server: ServerProcess, exchange: str, kind: str) -> None:
    connection = await aio_pika.connect(server.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        await channel.declare_exchange(exchange, kind, durable=True)


async def get_one(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        message = await queue.get(fail=False, no_ack=True)
        if message is not None:
            return message
        await asyncio.sleep(0.02)
    raise TimeoutError(f"nothing on {queue.name} after {WAIT} s")


async def test_a_request_from_two_places_gets_each_its_own_reply_through_central(
    tmp_path: Path, make_server: Any, make_pair: Any
) -> None:
    """The whitepaper's request-response example, from London and Paris at once, through
    a central pair (each place's link lists both of its servers)."""
    pair = make_pair(proxied=False, users=FED_USERS).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    central = pair.primary
    await declare(central, "rpc", "direct")
    places = {}
    metrics_port = free_port()
    for name in ("london", "paris"):
        metrics = {"metrics": {"listen": f"127.0.0.1:{metrics_port}"}} if name == "london" else {}
        place = make_server(name, **metrics)
        federating(place, [pair.backup, pair.primary], "rpc", forward=True).start()
        await declare(place, "rpc", "direct")
        places[name] = place
    service_connection = await aio_pika.connect(central.url, timeout=10)
    async with service_connection:
        service = await service_connection.channel()
        requests = await service.declare_queue("adder", durable=True)
        await requests.bind("rpc", "service.add")
        rpc_central = await service.get_exchange("rpc")
        clients: dict[str, tuple[Any, Any, Any]] = {}
        for name, place in places.items():
            connection = await aio_pika.connect(place.url, timeout=10)
            channel = await connection.channel(publisher_confirms=True)
            reply_queue = await channel.declare_queue("", exclusive=True)
            # A server-named queue carries this place's global name: replies find it.
            assert reply_queue.name.startswith(f"amq.gen-{name}-"), reply_queue.name
            await reply_queue.bind("rpc", reply_queue.name)
            await wait_link(place, running(1), "the reply queue's binding upstream")
            clients[name] = (connection, channel, reply_queue)
        for name, (_, channel, reply_queue) in clients.items():
            rpc = await channel.get_exchange("rpc")
            await rpc.publish(
                aio_pika.Message(
                    json.dumps([2, len(name)]).encode(),
                    reply_to=reply_queue.name,
                    correlation_id=name,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="service.add",
            )
        for _ in range(2):  # the service answers both, each to its reply-to
            request = await get_one(requests)
            assert request.headers["x-amqha-path"] in (["london"], ["paris"])
            total = sum(json.loads(request.body))
            await rpc_central.publish(
                aio_pika.Message(str(total).encode(), correlation_id=request.correlation_id),
                routing_key=request.reply_to,
            )
        for name, (connection, _, reply_queue) in clients.items():
            reply = await get_one(reply_queue)
            assert reply.correlation_id == name
            assert reply.body.decode() == str(2 + len(name))
            link = (await links(places[name]))[0]
            # The pair's global name, from its answer to the link's hello.
            assert link["upstream_name"] not in ("up", None), link
            assert reply.headers["x-amqha-path"] == [link["upstream_name"]]
            assert await reply_queue.get(fail=False) is None  # not the other's reply
            assert link["out"] == 1 and link["forward"]["depth"] == 0
            await connection.close()
        # The same figures as Prometheus reads them.
        text = await asyncio.to_thread(scrape_path, metrics_port, "/metrics")
        series = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("amqha_federation_")
        }
        running_series = [k for k, v in series.items() if 'state="running"' in k and v == 1.0]
        assert len(running_series) == 1 and 'exchange="rpc"' in running_series[0], series
        out = [v for k, v in series.items() if k.startswith("amqha_federation_messages_out_total")]
        assert out == [1.0], series


async def test_a_loop_of_three_pairs_delivers_once_and_counts_what_it_stops(
    make_pair: Any,
) -> None:
    """Pairs alpha, beta and gamma: alpha federates x from beta, beta from gamma, gamma
    from alpha (max_hops 2); a queue on alpha and one on gamma. Each link lists both
    servers of its upstream pair, and only each pair's ACTIVE runs its link."""
    names = ("alpha", "beta", "gamma")
    pairs = {
        name: make_pair(proxied=False, users=FED_USERS, failover_extra={"pair": name})
        for name in names
    }
    for name, upstream in zip(names, names[1:] + names[:1], strict=True):
        for server in pairs[name].servers:
            federating(server, pairs[upstream].servers, "x", max_hops=2)
    for pair in pairs.values():
        pair.start()
    for pair in pairs.values():
        await pair.wait_states("ACTIVE", "PASSIVE")
    a, b, c = (pairs[name].primary for name in names)
    for server in (a, b, c):
        await declare(server, "x", "topic")
    queues = {}
    connections = []
    for name, server in (("alpha", a), ("gamma", c)):
        connection = await aio_pika.connect(server.url, timeout=10)
        connections.append(connection)
        channel = await connection.channel()
        queue = await channel.declare_queue(f"on-{name}", durable=True)
        await queue.bind("x", "k.#")
        queues[name] = queue
    # Bindings travel: alpha's own to beta (path [alpha]) and gamma's, which came to alpha
    # with [gamma], to beta as [gamma, alpha]; beta passes on only the first ([alpha,
    # beta]: the other would go back to gamma); gamma passes its own to alpha, not beta's.
    await wait_link(a, running(2), "alpha's link")
    await wait_link(b, running(1), "beta's link")
    await wait_link(c, running(1), "gamma's link")
    for name, server in (("beta", b), ("gamma", c)):
        # The refusal is counted when the binding that would loop arrives, which may be
        # after the link reports running.
        link = await wait_link(
            server, lambda link: link["bindings_refused"] == {"loop": 1}, f"{name} refuses one"
        )
        assert link["upstream_name"] in names, link
    connection = await aio_pika.connect(a.url, timeout=10)
    connections.append(connection)
    channel = await connection.channel(publisher_confirms=True)
    x = await channel.get_exchange("x")
    await x.publish(
        aio_pika.Message(b"from-alpha", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key="k.1",
    )
    # gamma has it from alpha (one hop); gamma's copy goes on to beta ([alpha, gamma]) and
    # beta's to alpha, where alpha's own name in its path stops it: counted, not delivered
    # twice.
    assert (await get_one(queues["gamma"])).headers["x-amqha-path"] == ["alpha"]
    first = await get_one(queues["alpha"])
    assert first.body == b"from-alpha" and "x-amqha-path" not in (first.headers or {})
    await wait_link(a, lambda link: link["dropped"].get("loop", 0) == 1, "the loop stopped")
    assert await queues["alpha"].get(fail=False) is None
    assert await queues["gamma"].get(fail=False) is None
    for connection in connections:
        await connection.close()


async def test_a_second_place_with_a_taken_name_is_refused_and_the_first_keeps_running(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare(central, "market", "topic")
    first = make_server("london")
    federating(first, central, "market").start()
    await declare(first, "market", "topic")
    await wait_link(first, running(0), "the first London's link")
    # Another standalone server called london: another federation id, the same name.
    second = ServerProcess(tmp_path / "elsewhere", "london")
    federating(second, central, "market")
    try:
        second.start()
        await declare(second, "market", "topic")
        refused = await wait_link(
            second, lambda link: "duplicate" in (link["reason"] or ""), "refused"
        )
        assert "duplicate name" in refused["reason"], refused
        assert (await links(first))[0]["state"] == "running"
        async with asyncio.timeout(15), ConsoleClient(url_of(central, ADMIN)) as console:
            status = await console.call("status")
        text = json.dumps(status)
        assert "duplicate" in text, text[:2000]
    finally:
        second.stop()


@pytest.mark.parametrize("user", ["guest", "admin"])
async def test_a_link_whose_user_lacks_the_federation_tag_says_so(
    tmp_path: Path, make_server: Any, user: str
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare(central, "market", "topic")
    london = make_server("london")
    federating(london, central, "market")
    london.config["federation"]["upstreams"]["up"]["urls"] = [url_of(central, (user, user))]
    london.start()
    await declare(london, "market", "topic")
    failed = await wait_link(
        london, lambda link: "ACCESS_REFUSED" in (link["reason"] or ""), "failed on the tag"
    )
    assert "federation" in failed["reason"] and "ACCESS_REFUSED" in failed["reason"], failed


async def test_a_binding_deleted_upstream_by_hand_is_made_again_and_messages_flow(
    make_server: Any,
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare(central, "market", "topic")
    london = make_server("london")
    federating(london, central, "market").start()
    await declare(london, "market", "topic")
    connection = await aio_pika.connect(london.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("prices", durable=True)
        await queue.bind("market", "eu.#")
        link = await wait_link(london, running(1), "the binding upstream")
        before = link["repairs"]
        # An operator removes the buffer queue's binding upstream (and adds a stray one).
        admin = await aio_pika.connect(url_of(central, ADMIN), timeout=10)
        async with admin:
            admin_channel = await admin.channel()
            buffer = await admin_channel.declare_queue(link["buffer_queue"], passive=True)
            path = {"x-amqha-path": ["london"]}
            await buffer.unbind("market", "eu.#", arguments=path)
            await buffer.bind("market", "stray.#")
            async with asyncio.timeout(15), ConsoleClient(url_of(central, ADMIN)) as console:
                bound = [
                    b["routing_key"]
                    for b in await console.call("bindings")
                    if b.get("destination") == link["buffer_queue"]
                ]
            assert "eu.#" not in bound and "stray.#" in bound, bound
            # Within a reconcile both are repaired: eu.# back, stray.# gone.
            await wait_link(london, lambda link: link["repairs"] >= before + 2, "repaired")
            await publish_one(central, "market", "stray.x", b"stray")
            await publish_one(central, "market", "eu.fr", b"after-repair")
            message = await get_one(queue)
            assert message.body == b"after-repair"
            assert await queue.get(fail=False) is None


async def publish_one(server: ServerProcess, exchange: str, key: str, body: bytes) -> None:
    connection = await aio_pika.connect(server.url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(exchange)
        await target.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=key
        )


async def test_a_storm_of_binds_and_unbinds_converges_upstream_to_the_final_set(
    make_server: Any,
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare(central, "market", "topic")
    london = make_server("london")
    federating(london, central, "market").start()
    await declare(london, "market", "topic")
    rng = random.Random(20)
    keys = [f"k{i}.#" for i in range(20)]
    connection = await aio_pika.connect(london.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queues = [await channel.declare_queue(f"storm-{i}", durable=True) for i in range(3)]
        bound: set[tuple[int, str]] = set()
        for _ in range(400):  # binds and unbinds as fast as the client sends them
            queue_index, key = rng.randrange(3), rng.choice(keys)
            if (queue_index, key) in bound:
                await queues[queue_index].unbind("market", key)
                bound.discard((queue_index, key))
            else:
                await queues[queue_index].bind("market", key)
                bound.add((queue_index, key))
        final = {key for _, key in bound}  # equal bindings of several queues make one
        link = await wait_link(london, running(len(final)), "the final count upstream")

        async def upstream_keys() -> set[str]:
            async with asyncio.timeout(15), ConsoleClient(url_of(central, ADMIN)) as console:
                return {
                    b["routing_key"]
                    for b in await console.call("bindings")
                    if b.get("destination") == link["buffer_queue"]
                    and not b["routing_key"].startswith("amqha.probe.")
                }

        # The upstream's own set (not the link's view of it) settles on the final one.
        deadline = time.monotonic() + WAIT
        keys = await upstream_keys()
        while keys != final and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            keys = await upstream_keys()
        assert keys == final, (sorted(keys - final), sorted(final - keys))
        assert (await links(london))[0]["bindings"]["desired"] == len(final)


async def test_an_amqps_link_trusts_only_its_upstreams_ca(tmp_path: Path, make_server: Any) -> None:
    """An amqps URL with the upstream's own ``tls.ca``: the link runs and messages come
    down encrypted; a link trusting another CA fails, naming the certificate."""
    pki, rogue = Pki(tmp_path / "pki"), Pki(tmp_path / "rogue", "rogue")
    tls_port = free_port()
    central = make_server("central", users=FED_USERS, tls=pki.listener(tls_port)).start()
    await declare(central, "market", "topic")
    places = {}
    for name, ca in (("london", pki.ca), ("paris", rogue.ca)):
        place = make_server(name)
        place.config["federation"] = {
            "upstreams": {
                "up": {
                    "urls": [f"amqps://efa:efa@localhost:{tls_port}/"],
                    "tls": {"ca": ca},
                }
            },
            "exchanges": [{"exchange": "market", "upstream": "up"}],
            **TIMINGS,
        }
        place.start()
        await declare(place, "market", "topic")
        places[name] = place
    # Attempts made before "market" was declared on paris fail for that: wait for one after.
    failed = await wait_link(
        places["paris"],
        lambda link: link["state"] == "failed" and "not found here" not in link["reason"],
        "failed on the upstream",
    )
    assert "certificate" in failed["reason"].lower(), failed
    connection = await aio_pika.connect(places["london"].url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("prices", durable=True)
        await queue.bind("market", "eu.#")
        link = await wait_link(places["london"], running(1), "the amqps link running")
        assert link["server"] == f"localhost:{tls_port}"
        await publish_one(central, "market", "eu.fr", b"over-tls")
        assert (await get_one(queue)).body == b"over-tls"
