"""Users, vhosts, permissions and policies made at run time (replicated state) through the
faults that test every change of the stream: kill -9s at the worst moments with a long
backlog and a confirming publisher (the PASSIVE while it catches up on a snapshot that
carries them, the ACTIVE the moment the restarted PASSIVE is in sync), and freezes past
every timeout (the PASSIVE while an administrator makes a user, then the ACTIVE). Each
counts the confirmed messages lost (none) and quarantined (none), and checks that the
user logs in and the policy holds on whichever server serves at the end; through the
freezes never two servers confirm and no link stays dead (the pair settles in sync)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiormq

from tests.durability import Ledger, drain, keep_publishing
from tests.integration.test_management import MGMT_USERS, Api
from tests.integration.test_pair_freezes import (
    FREEZE,
    LINK_HEARTBEAT,
    assert_nothing_confirmed_lost,
    freeze,
    paused_gap,
    publishers,
)
from tests.integration.test_replication import (
    fill_confirmed,
    kill_in_catch_up_then_at_in_sync,
)
from tests.integration.test_runtime_users import call, url_of
from tests.pairs import MakePair, poll
from tests.support import free_port

JSON = {"Content-Type": "application/json"}
FULL = {"configure": ".*", "write": ".*", "read": ".*"}
VHOST, USER, PASSWORD = "shop", "shopper", "shop-pw-1"
# Applies to the backlog's queue; far above what it holds, so it drops nothing.
POLICY = {"pattern": "^orders$", "definition": {"max-length": 1_000_000}, "apply-to": "queues"}


def managed(make_pair: MakePair, **options: Any) -> tuple[Any, dict[str, Api]]:
    pair = make_pair(users=MGMT_USERS, **options)
    apis = {}
    for server in pair.servers:
        port = free_port()
        server.config["management"] = {"listen": f"127.0.0.1:{port}"}
        apis[server.name] = Api(port)
    return pair, apis


async def make_access(api: Api) -> None:
    """A vhost, a user with a password, its permission and a policy, through the API."""
    assert await call(api, "PUT", f"/api/vhosts/{VHOST}", {}) == 201
    body = {"password": PASSWORD, "tags": "management"}
    assert await call(api, "PUT", f"/api/users/{USER}", body) == 201
    assert await call(api, "PUT", f"/api/permissions/{VHOST}/{USER}", FULL) == 201
    assert await call(api, "PUT", f"/api/policies/{VHOST}/limit", POLICY) == 201


async def access_holds(server: Any, api: Api) -> None:
    """On ``server``: the user logs in to its vhost and the policy applies to the queue."""
    connection = await aiormq.connect(url_of(server.port, USER, PASSWORD, VHOST))
    await connection.close()
    queue = await api.get(f"/api/queues/{VHOST}/orders")
    assert queue["policy"] == "limit", queue


async def test_run_time_access_survives_kills_in_catch_up_and_at_in_sync(
    make_pair: MakePair,
) -> None:
    """A backlog of 10,000 confirmed messages in a vhost made at run time, published by a
    user made at run time, a policy on its queue, a publisher confirming all along: the
    PASSIVE is killed while it catches up (on a snapshot that carries the access changes
    first), then the ACTIVE the moment the restarted PASSIVE logs in sync. The survivor
    has the user, the vhost, the permission and the policy, and every confirmed message;
    none is lost, none quarantined."""
    pair, apis = managed(make_pair)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await make_access(apis["primary"])
    urls = [url_of(s.port, USER, PASSWORD, VHOST) for s in pair.servers]
    connection = await aiormq.connect(urls[0])
    await (await connection.channel()).queue_declare("orders", durable=True)
    await connection.close()
    ledger = Ledger()
    await fill_confirmed(urls[0], "orders", ledger, 10_000, 2000)
    stop = asyncio.Event()
    publisher = asyncio.create_task(keep_publishing(urls, "orders", ledger, "live", stop, 50))
    try:
        await kill_in_catch_up_then_at_in_sync(pair, ledger)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(publisher, return_exceptions=True), 60)
    await access_holds(pair.backup, apis["backup"])
    assert pair.quarantine_files() == []
    remaining = [body for body, _ in await drain(urls[1], "orders")]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented and len(ledger.confirmed) >= 10_200


async def test_run_time_access_through_freezes_of_the_passive_and_the_active(
    make_pair: MakePair,
) -> None:
    """Publishers knock at both addresses throughout. The PASSIVE frozen past every
    timeout while an administrator makes a vhost, a user, its permission and a policy on
    the ACTIVE: each answer comes (the ACTIVE stops waiting for the PASSIVE that left
    sync), and the thawed PASSIVE takes them with its new snapshot. Then the ACTIVE frozen
    past every timeout: the backup is voted in, the thawed old ACTIVE never confirms
    again and follows. The user logs in and the policy holds on the new ACTIVE; never two
    servers confirm; the pair settles in sync (no link left dead); nothing confirmed is
    lost or quarantined."""
    pair, apis = managed(
        make_pair, proxied=False, failover_extra={"link_heartbeat": LINK_HEARTBEAT}
    )
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    queue = "freeze-orders"
    connection = await aiormq.connect(pair.primary.url)
    await (await connection.channel()).queue_declare(queue, durable=True)
    await connection.close()
    async with publishers(pair, queue) as confirms:
        await poll(lambda: confirms.by("primary") >= 50, 30, "the primary confirming")
        frozen_at = time.monotonic()
        made = asyncio.ensure_future(make_access(apis["primary"]))
        thaw = await freeze(pair.backup, FREEZE, made)
        assert made.done() and made.exception() is None
        shop = await aiormq.connect(url_of(pair.primary.port, USER, PASSWORD, VHOST))
        await (await shop.channel()).queue_declare("orders", durable=True)
        await shop.close()
        await pair.settled(timeout=60)
        await pair.wait_in_sync(pair.backup, timeout=60)
        assert confirms.by("backup", after=frozen_at) == 0, "the frozen PASSIVE confirmed"
        assert confirms.switches(after=frozen_at) == 0
        users = await apis["backup"].get("/api/users")
        assert USER in [u["name"] for u in users], "the thawed PASSIVE lacks the user"

        since = time.monotonic()
        takeover = asyncio.ensure_future(
            poll(lambda: confirms.by("backup", after=since) >= 50, FREEZE, "backup confirming")
        )
        thaw = await freeze(pair.primary, FREEZE, takeover)
        await poll(lambda: pair.state(pair.primary) == "PASSIVE", 30, "the primary PASSIVE")
        await pair.settled(timeout=60)
        await pair.wait_in_sync(pair.primary, timeout=60)
        serving = confirms.by("backup", after=thaw)
        await poll(lambda: confirms.by("backup", after=thaw) >= serving + 50, 30, "backup serving")
        assert confirms.by("primary", after=thaw) == 0, "the frozen ACTIVE confirmed after"
        assert confirms.switches(after=thaw + pair.heartbeat) == 0
        assert paused_gap(pair, pair.primary) > FREEZE * 0.9
        await access_holds(pair.backup, apis["backup"])
    # A frozen server may set aside what it held unconfirmed, never a confirmed message.
    await assert_nothing_confirmed_lost(pair, confirms, queue)
