"""Exchange federation between real servers (docs/federation.md): a downstream's link to
a standalone upstream and to an upstream pair, what crosses it, what it reports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqha.client import connect as ha_connect
from amqha.console import ConsoleClient
from tests.pairs import ADMIN, EFA, MakePair, poll, url_of
from tests.support import USERS, ServerProcess

EXCHANGE = "market"
# The upstream's users: the tests' own, and the login of a federation link.
FED_USERS = [*USERS, {"name": "efa", "password": "efa", "vhosts": ["/"], "tags": ["federation"]}]
# Probes every 0.2 s and a reconcile every second keep the waits below short.
TIMINGS = {"reconcile": 1, "probe": 0.2}


def downstream(
    tmp_path: Path,
    upstream_urls: list[str],
    name: str = "london",
    delivery: str = "confirm",
) -> ServerProcess:
    return ServerProcess(
        tmp_path,
        name,
        federation={
            "upstreams": {"central": {"urls": upstream_urls}},
            "exchanges": [{"exchange": EXCHANGE, "upstream": "central", "delivery": delivery}],
            **TIMINGS,
        },
    )


async def declare_exchange(url: str) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel()
        await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)


async def bound_queue(url: str) -> None:
    """A queue ``eu-prices`` bound to the exchange with ``eu.#``."""
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("eu-prices", durable=True)
        await queue.bind(EXCHANGE, "eu.#")


async def links(server: ServerProcess) -> list[dict[str, Any]]:
    async with asyncio.timeout(15), ConsoleClient(url_of(server, ADMIN)) as console:
        return list(await console.call("federation"))


async def wait_link(
    server: ServerProcess, check: Any, what: str, timeout: float = 30.0
) -> dict[str, Any]:
    """Until the server's only link satisfies ``check``; that link."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = (await links(server))[0]
            if check(last):
                return last
        await asyncio.sleep(0.1)
    raise TimeoutError(f"not reached after {timeout} s: {what}; link: {last}")


def running_with(bindings: int) -> Any:
    """A running link with ``bindings`` upstream bindings desired, all confirmed (and the
    probe's own)."""
    return lambda link: (
        link["state"] == "running"
        and link["bindings"]["desired"] == bindings
        and link["bindings"]["confirmed"] == bindings + 1
    )


async def drain(queue: aio_pika.abc.AbstractQueue, until: str, timeout: float = 30.0) -> list[Any]:
    """Every message got from ``queue`` until one whose body is ``until``."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = await queue.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.02)
            continue
        got.append(message)
        if message.body.decode() == until:
            return got
    raise TimeoutError(f"{until!r} not got after {timeout} s; got {[m.body for m in got]}")


async def publish(url: str, items: list[tuple[str, str]]) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE)
        for key, body in items:
            await exchange.publish(
                aio_pika.Message(body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=key,
            )


class Publisher:
    """Publishes to the exchange with confirms, ``eu.fr`` and ``us.ny`` in turn, persistent,
    over whichever of ``urls`` serves (amqha.client.connect), reconnecting after a failure;
    ``confirmed``: the bodies confirmed, in order."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.confirmed: list[str] = []
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Publisher:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        self.stopping.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 60)

    async def _run(self) -> None:
        seq = 0
        for _ in range(100):  # connections, each up to a failure
            if self.stopping.is_set():
                return
            try:
                connection = await ha_connect(self.urls, retry_for=30, attempt_timeout=2.0)
            except Exception:
                continue
            try:
                channel = await connection.channel(publisher_confirms=True)
                exchange = await channel.get_exchange(EXCHANGE)
                while not self.stopping.is_set():
                    seq += 1
                    key = "eu.fr" if seq % 2 else "us.ny"
                    body = f"{key}-{seq}"
                    message = aio_pika.Message(
                        body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                    )
                    await asyncio.wait_for(exchange.publish(message, routing_key=key), 5.0)
                    self.confirmed.append(body)
            except Exception:
                continue
            finally:
                with contextlib.suppress(Exception):
                    await connection.close()


def lost(confirmed: list[str], got: list[str]) -> list[str]:
    """The confirmed messages that matched eu.# and never arrived."""
    matching = [body for body in confirmed if body.startswith("eu.")]
    return sorted(set(matching) - set(got), key=lambda body: int(body.split("-")[1]))


async def kill_the_downstream_active_under_load(
    pair: Any, upstream_url: str
) -> tuple[list[str], list[str]]:
    """kill -9 of a downstream pair's ACTIVE (its primary) while a confirming publisher
    runs upstream; a client's vote moves the service to the backup, whose link resumes on
    the same buffer queue. (The bodies confirmed upstream, those got from ``eu-prices``.)"""
    primary, backup = pair.primary, pair.backup
    publisher = Publisher([upstream_url]).start()
    confirmed = publisher.confirmed
    await poll(lambda: len(confirmed) >= 200, 60, "200 confirmed before the kill")
    pair.kill(primary)
    at_kill = len(confirmed)
    vote = await ha_connect([url_of(primary), url_of(backup)], retry_for=30, attempt_timeout=2.0)
    try:
        await wait_link(backup, running_with(1), "the new ACTIVE's link running", timeout=60)
        await poll(lambda: len(confirmed) >= at_kill + 200, 90, "200 confirmed after the kill")
        await publisher.stop()
        await publish(upstream_url, [("eu.end", "end")])
        channel = await vote.channel()
        queue = await channel.get_queue("eu-prices")
        got = [m.body.decode() for m in await drain(queue, "end", timeout=90)]
    finally:
        await vote.close()
    assert pair.quarantine_files() == []  # nothing confirmed alone by a dual active
    return confirmed, got


@pytest.mark.parametrize("delivery", ["confirm", "drop"])
async def test_a_remote_binding_brings_down_the_matching_messages_only(
    tmp_path: Path, make_server: Any, delivery: str
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = downstream(tmp_path, [url_of(central, EFA)], delivery=delivery)
    london.start()
    try:
        await declare_exchange(london.url)
        await wait_link(london, running_with(0), "the link running")
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("eu-prices", durable=True)
            await queue.bind(EXCHANGE, "eu.#")
            link = await wait_link(london, running_with(1), "the binding upstream")
            assert link["server"] == central.address and link["delivery"] == delivery
            async with asyncio.timeout(15), ConsoleClient(url_of(central, ADMIN)) as console:
                buffer = next(
                    q for q in await console.call("queues") if q["name"] == link["buffer_queue"]
                )
            # confirm: stored (and replicated on a pair); drop: gone with the link.
            assert (buffer["durable"], buffer["exclusive"]) == (
                (True, False) if delivery == "confirm" else (False, True)
            )
            await publish(
                central.url,
                [("eu.fr", "fr-1"), ("us.ny", "ny-1"), ("eu.de", "de-1"), ("eu.end", "end")],
            )
            got = await drain(queue, "end")
            assert [m.body.decode() for m in got] == ["fr-1", "de-1", "end"]
            assert got[0].headers["x-amqha-path"] == ["central"]
            assert got[0].routing_key == "eu.fr"
            link = (await links(london))[0]
            assert link["in"] == 3 and link["dropped"] == {}
            assert link["probes"]["back"] >= 1
            # Unbound here: unbound upstream, and nothing more comes down.
            await queue.unbind(EXCHANGE, "eu.#")
            await wait_link(london, running_with(0), "the binding gone upstream")
            await publish(central.url, [("eu.fr", "fr-2")])
            await queue.bind(EXCHANGE, "eu.end")
            await wait_link(london, running_with(1), "the marker's binding upstream")
            await publish(central.url, [("eu.end", "end-2")])
            assert [m.body.decode() for m in await drain(queue, "end-2")] == ["end-2"]
    finally:
        london.stop()


async def test_equal_bindings_make_one_upstream_binding_and_one_copy_per_queue(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = downstream(tmp_path, [url_of(central, EFA)])
    london.start()
    try:
        await declare_exchange(london.url)
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            first = await channel.declare_queue("first", durable=True)
            second = await channel.declare_queue("second", durable=True)
            await first.bind(EXCHANGE, "eu.#")
            await second.bind(EXCHANGE, "eu.#")
            link = await wait_link(london, running_with(1), "one upstream binding")
            async with asyncio.timeout(15), ConsoleClient(url_of(central, ADMIN)) as console:
                upstream = [
                    b
                    for b in await console.call("bindings")
                    if b["destination"] == link["buffer_queue"]
                ]
            # One for both local bindings, and the probe's.
            assert sorted(b["routing_key"] for b in upstream) == sorted(
                ["eu.#", f"amqha.probe.london.{EXCHANGE}"]
            )
            assert [
                b["arguments"]["x-amqha-path"] for b in upstream if b["routing_key"] == "eu.#"
            ] == [["london"]]
            await publish(central.url, [("eu.fr", f"m{i}") for i in range(20)] + [("eu.x", "end")])
            for queue in (first, second):
                bodies = [m.body.decode() for m in await drain(queue, "end")]
                assert bodies == [f"m{i}" for i in range(20)] + ["end"]
            assert (await links(london))[0]["in"] == 21  # taken down once for both queues
            # One local binding gone: the upstream one stays for the other (two upstream
            # bindings once the next one is seen: that one and eu.#).
            await first.unbind(EXCHANGE, "eu.#")
            await second.bind(EXCHANGE, "eu.z")
            await wait_link(london, running_with(2), "eu.# kept, eu.z added")
            await second.unbind(EXCHANGE, "eu.#")
            await second.unbind(EXCHANGE, "eu.z")
            await wait_link(london, running_with(0), "the last local binding gone")
    finally:
        london.stop()


async def test_a_link_with_a_wrong_password_is_failed_and_keeps_retrying(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS, auth={"failed_login_delay": 0.05}).start()
    await declare_exchange(central.url)
    london = downstream(tmp_path, [f"amqp://guest:wrong@{central.address}/"])
    london.start()
    try:
        await declare_exchange(london.url)
        # Until the exchange is declared here the link fails on that; then on the login.
        first = await wait_link(
            london,
            lambda link: link["state"] == "failed" and "ACCESS_REFUSED" in link["reason"],
            "failed on the login",
        )
        later = await wait_link(
            london,
            lambda link: link["state"] == "failed" and link["attempts"] >= first["attempts"] + 3,
            "attempts rising",
        )
        assert later["since"] == first["since"]  # the same failure all along
        assert later["in"] == 0 and later["server"] is None
        # guest is no administrator: the console refuses it the federation command.
        with pytest.raises(Exception, match="ACCESS_REFUSED"):
            async with asyncio.timeout(15), ConsoleClient(london.url) as console:
                await console.call("federation")
    finally:
        london.stop()


async def test_a_kill_of_the_central_active_loses_no_confirmed_matching_message(
    tmp_path: Path, make_pair: MakePair
) -> None:
    central = make_pair(proxied=False, users=FED_USERS).start()
    await central.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await declare_exchange(url_of(central.primary))
    # The PASSIVE first: it sends the link on to the ACTIVE (NOT_ACTIVE - active server is).
    london = downstream(tmp_path, [url_of(central.backup, EFA), url_of(central.primary, EFA)])
    london.start()
    try:
        await declare_exchange(london.url)
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("eu-prices", durable=True)
            await queue.bind(EXCHANGE, "eu.#")
            link = await wait_link(london, running_with(1), "the binding upstream")
            assert link["server"] == central.primary.address
            await central.wait_states("ACTIVE", "PASSIVE", timeout=30)  # the buffer in sync

            publisher = Publisher([url_of(central.primary), url_of(central.backup)]).start()
            confirmed = publisher.confirmed
            await poll(lambda: len(confirmed) >= 200, 60, "200 confirmed before the kill")
            central.kill(central.primary)
            at_kill = len(confirmed)
            await poll(lambda: len(confirmed) >= at_kill + 200, 90, "200 confirmed after the kill")
            await publisher.stop()
            await publish(url_of(central.backup), [("eu.end", "end")])
            got = [m.body.decode() for m in await drain(queue, "end", timeout=90)]
            matching = [body for body in confirmed if body.startswith("eu.")]
            missing = lost(confirmed, got)
            assert missing == [], f"{len(missing)} confirmed matching messages lost: {missing[:10]}"
            assert not [b for b in got if b.startswith("us.")]
            duplicates = len(got) - len(set(got))
            link = (await links(london))[0]
            assert link["server"] == central.backup.address
            assert link["duplicates"] >= duplicates
            print(
                f"confirmed {len(confirmed)} ({len(matching)} matching), "
                f"got {len(got) - 1}, duplicates {duplicates}, link {link}"
            )
    finally:
        london.stop()


async def federating_pair(make_server: Any, make_pair: MakePair) -> tuple[ServerProcess, Any]:
    """A standalone central and a downstream pair federating ``market`` from it, serving,
    with a queue ``eu-prices`` bound to ``eu.#`` on its ACTIVE (the primary)."""
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = make_pair(
        proxied=False,
        federation={
            "upstreams": {"central": {"urls": [url_of(central, EFA)]}},
            "exchanges": [{"exchange": EXCHANGE, "upstream": "central"}],
            **TIMINGS,
        },
    ).start()
    await london.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary = london.primary
    await declare_exchange(url_of(primary))
    await bound_queue(url_of(primary))
    return central, london


async def test_only_the_downstream_active_runs_the_link_and_its_successor_resumes_it(
    tmp_path: Path, make_server: Any, make_pair: MakePair
) -> None:
    central, london = await federating_pair(make_server, make_pair)
    primary, backup = london.primary, london.backup
    link = await wait_link(primary, running_with(1), "the ACTIVE's link running")
    assert link["buffer_queue"] == "federation: market central to backup+primary"
    await london.wait_states("ACTIVE", "PASSIVE", timeout=30)
    # The PASSIVE keeps no link: configured, listed, not run.
    standby = (await links(backup))[0]
    assert standby["active"] is False and standby["state"] == "connecting"
    assert standby["server"] is None and standby["in"] == 0
    ups = [
        e for e in london.events(primary) if e["event"] == "federation" and e["kind"] == "link_up"
    ]
    assert ups and ups[-1]["exchange"] == EXCHANGE and ups[-1]["server"] == central.address

    confirmed, got = await kill_the_downstream_active_under_load(london, central.url)
    missing = lost(confirmed, got)
    assert missing == [], f"{len(missing)} confirmed matching messages lost: {missing[:10]}"
    link = (await links(backup))[0]
    assert link["buffer_queue"] == "federation: market central to backup+primary"
    assert any(e["event"] == "federation" and e["kind"] == "link_up" for e in london.events(backup))
    print(f"confirmed {len(confirmed)}, got {len(got) - 1}, link {link}")


async def test_a_link_whose_upstream_is_frozen_is_stalled_then_runs_again(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = downstream(tmp_path, [url_of(central, EFA)])
    london.start()
    try:
        await declare_exchange(london.url)
        await wait_link(london, running_with(0), "the link running")
        assert central.process is not None
        os.kill(central.process.pid, signal.SIGSTOP)
        try:
            stalled = await wait_link(london, lambda link: link["state"] == "stalled", "stalled")
        finally:
            os.kill(central.process.pid, signal.SIGCONT)
        back = await wait_link(
            london,
            lambda link: (
                link["state"] == "running" and link["probes"]["back"] > stalled["probes"]["back"]
            ),
            "running again, probes back",
        )
        assert back["in"] == 0  # a probe is counted, never routed
    finally:
        london.stop()


async def test_a_kill_of_the_downstream_active_while_it_drains_a_backlog_loses_nothing(
    make_server: Any, make_pair: MakePair
) -> None:
    """The worst moment for a link: the downstream pair was down while central confirmed
    3,000 matching messages (they wait in the buffer queue); the pair comes back, its
    ACTIVE starts draining them, and is killed -9 half way. The backup, voted ACTIVE,
    takes the rest from the same buffer queue: every confirmed message arrives."""
    central, london = await federating_pair(make_server, make_pair)
    primary, backup = london.primary, london.backup
    await wait_link(primary, running_with(1), "the ACTIVE's link running")
    await london.wait_states("ACTIVE", "PASSIVE", timeout=30)
    for server in (backup, primary):  # the whole pair down, cleanly
        server.stop()
    backlog = [f"eu-{i}" for i in range(3000)]
    await publish(central.url, [("eu.fr", body) for body in backlog])  # each confirmed
    london.start()
    await london.wait_states("ACTIVE", "PASSIVE", timeout=60)
    # Half way through the backlog (some taken down, not all), the ACTIVE dies.
    await wait_link(primary, lambda link: link["in"] >= 300, "draining the backlog", timeout=60)
    taken = (await links(primary))[0]["in"]
    london.kill(primary)
    vote = await ha_connect([url_of(primary), url_of(backup)], retry_for=30, attempt_timeout=2.0)
    try:
        await wait_link(backup, running_with(1), "the new ACTIVE's link running", timeout=60)
        await publish(central.url, [("eu.end", "end")])
        channel = await vote.channel()
        queue = await channel.get_queue("eu-prices")
        got = [m.body.decode() for m in await drain(queue, "end", timeout=120)]
    finally:
        await vote.close()
    missing = sorted(set(backlog) - set(got), key=lambda body: int(body.split("-")[1]))
    assert missing == [], (
        f"{len(missing)} of 3000 confirmed lost (killed at {taken}): {missing[:10]}"
    )
    assert london.quarantine_files() == []
    print(f"killed after {taken} taken down; got {len(got) - 1}, duplicates {len(got) - 1 - 3000}")


async def test_a_kill_of_the_central_active_the_moment_its_passive_is_in_sync_loses_nothing(
    tmp_path: Path, make_pair: MakePair
) -> None:
    """A 3,000-message backlog waits in the buffer queue on a central pair (its link is
    down); central's PASSIVE is killed -9 and restarted, catches the backlog up, and the
    moment its event log says in sync the ACTIVE is killed -9. Voted ACTIVE, it serves the
    link when it comes back: every confirmed message arrives, none quarantined."""
    central = make_pair(proxied=False, users=FED_USERS).start()
    await central.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary, backup = central.primary, central.backup
    await declare_exchange(url_of(primary))
    london = downstream(tmp_path, [url_of(primary, EFA), url_of(backup, EFA)])
    london.start()
    try:
        await declare_exchange(london.url)
        await bound_queue(london.url)
        await wait_link(london, running_with(1), "the link running")
        london.stop()  # the backlog builds up in the buffer queue
        backlog = [f"eu-{i}" for i in range(3000)]
        await publish(url_of(primary), [("eu.fr", body) for body in backlog])
        central.kill(backup)
        backup.start()
        await central.wait_in_sync(backup, timeout=120)
        central.kill(primary)  # right after in sync
        vote = await ha_connect([url_of(backup)], retry_for=30, attempt_timeout=2.0)
        await vote.close()
        london.start()
        await wait_link(london, running_with(1), "the link on the new ACTIVE", timeout=60)
        assert (await links(london))[0]["server"] == backup.address
        await publish(url_of(backup), [("eu.end", "end")])
        connection = await aio_pika.connect(london.url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue("eu-prices")
            got = [m.body.decode() for m in await drain(queue, "end", timeout=120)]
        missing = sorted(set(backlog) - set(got), key=lambda body: int(body.split("-")[1]))
        assert missing == [], f"{len(missing)} of 3000 confirmed lost: {missing[:10]}"
        assert central.quarantine_files() == []
    finally:
        london.stop()
