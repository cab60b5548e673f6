"""Replication to the PASSIVE: real pairs, real clients, real kill -9s.

Every test that kills a server checks that no confirmed message went missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from typing import Any

import aiormq
import pytest

from amqha.client import Publisher
from amqha.core import release
from amqha.quarantine import read_quarantine
from amqha.replication import (
    FOLLOWER_PREFETCH,
    RUN_BYTES,
    RUN_CHANGES,
    UNAPPLIED_BYTES,
    UNAPPLIED_CHANGES,
)
from tests.durability import (
    PERSISTENT,
    Ledger,
    drain,
    keep_consuming,
    keep_publishing,
    nothing_lost,
    publish_confirmed,
    take_all,
)
from tests.pairs import (
    ADMIN,
    MakePair,
    Pair,
    client_vote,
    hold,
    poll,
    raw_open,
    url_of,
    vote_in,
    vote_refused,
)
from tests.support import ROOT, ServerProcess, soak_size


def run_replay(path: Any, url: str) -> subprocess.CompletedProcess[str]:
    """``amqha quarantine replay PATH --url URL``, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "amqha", "quarantine", "replay", str(path), "--url", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def replay(path: Any, url: str) -> None:
    result = run_replay(path, url)
    assert result.returncode == 0, result.stderr


async def declare(url: str, queue: str, **arguments: Any) -> None:
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(queue, durable=True, arguments=arguments or None)
    await connection.close()


async def replication(pair: Pair, server: Any) -> dict[str, Any]:
    return (await pair.status(server)).get("replication", {})


async def wait_in_sync(pair: Pair, active: Any, timeout: float = 30.0) -> None:
    async def in_sync() -> bool:
        feed = (await replication(pair, active)).get("feed") or {}
        return feed.get("state") == "in_sync"

    deadline = asyncio.get_running_loop().time() + timeout
    while not await in_sync():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(
                f"no in-sync passive after {timeout} s: {await replication(pair, active)}"
            )
        await asyncio.sleep(0.05)


async def test_confirmed_messages_survive_a_kill_9_of_the_active(make_pair: Any) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "orders")
    await wait_in_sync(pair, pair.primary)
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    for n in range(2000):
        if n % 100 == 0:
            await asyncio.gather(
                *(
                    channel.basic_publish(
                        f"o-{k}".encode(), routing_key="orders", properties=PERSISTENT
                    )
                    for k in range(n, n + 100)
                )
            )
    await kill_the_primary_and_vote(pair)
    found = [body for body, _ in await drain(pair.backup.url, "orders")]
    assert found == [f"o-{k}".encode() for k in range(2000)]


def in_sync_at(pair: Pair, server: ServerProcess, moment: float) -> bool:
    """Whether ``server``'s last passive ``sync`` record before ``moment`` says in sync."""
    records = [
        e
        for e in pair.events(server)
        if e["event"] == "sync" and e.get("side") == "passive" and e["ts"] < moment
    ]
    return bool(records) and records[-1].get("sync") == "in_sync"


async def kill_the_active_repeatedly(pair: Pair, kills: int, queue: str) -> Ledger:
    """A confirming publisher and an acking consumer through ``kills`` kill -9s of
    whichever server is ACTIVE, each killed one restarted and caught up before the next."""
    ledger = Ledger()
    stop = asyncio.Event()
    urls = [pair.primary.url, pair.backup.url]
    tasks = [
        asyncio.create_task(keep_publishing(urls, queue, ledger, "p", stop)),
        asyncio.create_task(keep_consuming(urls, queue, ledger, stop)),
    ]
    try:
        done = 0
        for _ in range(3 * kills):  # bounded: a kill is not counted if its PASSIVE was behind
            if done == kills:
                break
            active, _ = await pair.settled()
            target = len(ledger.confirmed) + 200
            await poll(lambda: len(ledger.confirmed) >= target, 60, "publishes confirmed")  # noqa: B023
            killed_at = pair.kill(active).before
            other = pair.other(active)
            # In sync when settled, but a stall of both servers on a loaded machine can
            # drop the PASSIVE from the feed before the kill (its confirms then go on
            # without it): such a PASSIVE rightly does not take over. That kill is not
            # counted; the killed server restarts and the pair settles again.
            await poll(
                lambda: pair.state(other) == "ACTIVE" or not in_sync_at(pair, other, killed_at),  # noqa: B023
                30,
                "the takeover",
            )
            done += pair.state(other) == "ACTIVE"
            active.start()
        assert done == kills, f"{done} of {kills} kills found the PASSIVE in sync"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    return ledger


@pytest.mark.soak
async def test_kill_9s_of_the_active_in_a_row_lose_no_confirmed_message(make_pair: Any) -> None:
    """6 kills in ``make test``, 20 in ``make soak``."""
    kills = soak_size(6, 20)
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "work")
    ledger = await kill_the_active_repeatedly(pair, kills, "work")
    active, _ = await pair.settled()
    # A restarted server may be voted ACTIVE by a client before it hears its peer (a dual
    # active): what it confirmed alone is in a quarantine file, replayed as an operator would.
    for path in pair.quarantine_files():
        await asyncio.to_thread(replay, path, active.url)
    remaining = [body for body, _ in await drain(active.url, "work")]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented
    assert len(ledger.confirmed) > 200 * kills  # each round confirms 200 before its kill
    # The consumer kept up through every failover: most of what was confirmed was acked.
    assert len(ledger.acked) > len(ledger.confirmed) // 2


async def fill_confirmed(url: str, queue: str, ledger: Ledger, count: int, size: int) -> None:
    """``count`` persistent messages of about ``size`` bytes, 500 confirms in flight."""
    connection = await aiormq.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    filler = b"x" * size
    for start in range(0, count, 500):
        bodies = [b"fill-%d-" % n + filler for n in range(start, min(count, start + 500))]
        ledger.sent.update(bodies)
        results = await asyncio.gather(
            *(channel.basic_publish(b, routing_key=queue, properties=PERSISTENT) for b in bodies)
        )
        ledger.confirmed.update(b for b, r in zip(bodies, results, strict=True) if r)
    await connection.close()


# A backlog's messages: what a PASSIVE takes as a snapshot when it restarts. Its bytes (80
# MB) make the catch-up last long enough to be seen and killed; fewer, larger messages
# cost the clients and the servers less per byte.
BACKLOG = 10_000


async def pair_with_a_backlog(make_pair: Any) -> tuple[Pair, Ledger]:
    """A pair in sync whose queue 'big' holds BACKLOG confirmed messages of 8 KB (80 MB):
    enough that a PASSIVE's catch-up can be seen."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "big")
    ledger = Ledger()
    await fill_confirmed(pair.primary.url, "big", ledger, BACKLOG, 8000)
    await wait_in_sync(pair, pair.primary)
    return pair, ledger


async def kill_the_primary_and_vote(pair: Pair) -> None:
    """kill -9 of the primary (ACTIVE), and a client's vote: the backup serves."""
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=20)
    await pair.wait_states(None, "ACTIVE", timeout=20)


async def assert_every_confirmed_message(
    pair: Pair, url: str, queue: str, ledger: Ledger, count: int
) -> None:
    """``queue`` holds exactly the ``count`` confirmed messages: none lost, none invented,
    and none set aside in a quarantine file either (one failure at a time needs none)."""
    assert pair.quarantine_files() == []
    remaining = [body for body, _ in await drain(url, queue)]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented and len(remaining) == count


async def refused_for_sync(server: Any) -> list[str]:
    """Client votes at ``server`` until one is refused as not in sync (at most ~20 s,
    until the peer counts as gone); the answers."""
    answers: list[str] = []
    for _ in range(200):
        answer = await asyncio.to_thread(raw_open, server.port)
        answers.append(str(getattr(answer, "reply_text", answer)))
        if "not in sync" in answers[-1]:
            break
        await asyncio.sleep(0.1)
    assert "not in sync" in answers[-1], answers[-3:]
    return answers


async def restart_into_catch_up(
    pair: Pair, server: Any, attempts: int = 5, stored: bool = False
) -> bool:
    """Restart ``server`` and return once its follower reports catching up (True), or
    False when every attempt caught up before it could be seen. ``stored``: and once the
    snapshot has begun to replace its store (its data dir's ``incomplete`` mark, written
    before the snapshot's first change; catching up starts at the subscription, before
    the snapshot's first run has come)."""
    for _ in range(attempts):
        pair.kill(server)
        server.start()
        deadline = asyncio.get_running_loop().time() + 30
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(Exception):
                follower = (await replication(pair, server)).get("follower") or {}
                begun = not stored or (server.data_dir / "incomplete").exists()
                if follower.get("state") == "catching_up" and begun:
                    return True
                if follower.get("in_sync"):
                    break
            await asyncio.sleep(0.01)
    return False


async def test_a_passive_still_catching_up_does_not_take_over_and_loses_nothing(
    make_pair: Any,
) -> None:
    """kill -9 of the ACTIVE while its restarted PASSIVE catches up: the PASSIVE refuses
    the client vote (saying why) and stays PASSIVE; the ACTIVE restarted leads again from
    its own store, and every confirmed message is there."""
    pair, ledger = await pair_with_a_backlog(make_pair)
    assert await restart_into_catch_up(pair, pair.backup), "the catch-up was never seen"
    pair.kill(pair.primary)
    await refused_for_sync(pair.backup)
    await hold(lambda: pair.state(pair.backup) == "PASSIVE", 1.5, "the backup stays PASSIVE")
    pair.primary.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await assert_every_confirmed_message(pair, pair.primary.url, "big", ledger, BACKLOG)


async def test_takeover_unsynced_lets_a_catching_up_passive_take_over_and_says_so(
    make_pair: Any,
) -> None:
    pair = make_pair(failover_extra={"takeover_unsynced": True}).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "big")
    await fill_confirmed(pair.primary.url, "big", Ledger(), BACKLOG, 8000)
    await wait_in_sync(pair, pair.primary)
    assert await restart_into_catch_up(pair, pair.backup), "the catch-up was never seen"
    await kill_the_primary_and_vote(pair)
    transitions = [e for e in pair.events(pair.backup) if e["event"] == "transition"]
    assert "NOT in sync (failover.takeover_unsynced)" in transitions[-1]["reason"]


async def test_a_split_brain_keeps_the_losers_confirmed_messages_in_quarantine(
    make_pair: Any, tmp_path: Any
) -> None:
    """The peer link cut while publishing: the backup is voted ACTIVE too (dual active);
    on heal the primary yields, and what it confirmed alone is kept in a quarantine file,
    reported, and replayed onto the winner: no confirmed message is lost."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "split")
    await wait_in_sync(pair, pair.primary)
    before = Ledger()
    await fill_confirmed(pair.primary.url, "split", before, 300, 10)
    pair.cut()
    await poll(lambda: pair.state(pair.primary) == "ACTIVE", 5, "primary still ACTIVE")
    alone = Ledger()
    stop = asyncio.Event()
    await poll(
        lambda: any(e["event"] == "peer_lost" for e in pair.events(pair.primary)),
        10,
        "the primary noticing the cut",
    )
    await publish_confirmed(pair.primary.url, "split", alone, "alone", stop, limit=400)
    await vote_in(pair.backup)
    await pair.wait_states("ACTIVE", "ACTIVE", timeout=20)
    winner_side = Ledger()
    await publish_confirmed(pair.backup.url, "split", winner_side, "winner", stop, limit=200)
    pair.heal()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=30)
    found = await poll(
        lambda: [e for e in pair.events(pair.primary) if e["event"] == "quarantine"],
        30,
        "a quarantine record",
    )
    assert found[0]["messages"] == len(alone.confirmed)
    held = {row[5] for row in read_quarantine(found[0]["path"])}
    assert held == alone.confirmed
    status = await replication(pair, pair.primary)
    assert status["quarantined"][0]["path"] == found[0]["path"]
    # The operator replays them onto the winner: now every confirmed message is there.
    result = await asyncio.to_thread(run_replay, found[0]["path"], pair.backup.url)
    assert result.returncode == 0, result.stderr
    # Replayed whole: the status no longer counts it as held.
    assert "quarantined" not in await replication(pair, pair.primary)
    remaining = [body for body, _ in await drain(pair.backup.url, "split")]
    confirmed = before.confirmed | alone.confirmed | winner_side.confirmed
    assert confirmed <= set(remaining)


async def test_replication_can_be_turned_off_per_queue_and_for_the_server(make_pair: Any) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "kept")
    await declare(pair.primary.url, "local", **{"x-amqha-replicate": False})
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    for queue in ("kept", "local"):
        await asyncio.gather(
            *(
                channel.basic_publish(b"%d" % n, routing_key=queue, properties=PERSISTENT)
                for n in range(50)
            )
        )
    await connection.close()
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=20)
    assert len(await drain(pair.backup.url, "kept")) == 50
    # The queue that is not replicated was never declared on the backup.
    probe = await aiormq.connect(pair.backup.url)
    probe_channel = await probe.channel()
    with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):
        await probe_channel.queue_declare("local", passive=True)
        raise AssertionError("the unreplicated queue reached the backup")
    await probe.close()

    off = make_pair(replication={"enabled": False}).start()
    await off.wait_states("ACTIVE", "PASSIVE")
    status = await replication(off, off.primary)
    assert status == {"enabled": False}
    assert not [e for e in off.events(off.primary) if e["event"] == "sync"]


async def test_a_queue_left_out_of_replication_is_quarantined_when_its_server_resyncs(
    make_pair: Any,
) -> None:
    """Messages confirmed on a queue that is not replicated are on one server only: kill -9
    of it while in sync, the backup serves, and when it comes back and takes the backup's
    snapshot they are kept in a quarantine file and reported, never dropped. Replaying
    names the queue the ACTIVE lacks and publishes nothing; once it is declared, every
    message is back."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "local", **{"x-amqha-replicate": False})
    await wait_in_sync(pair, pair.primary)
    ledger = Ledger()
    await publish_confirmed(pair.primary.url, "local", ledger, "l", asyncio.Event(), limit=200)
    assert len(ledger.confirmed) == 200
    await kill_the_primary_and_vote(pair)
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=30)
    found = await poll(
        lambda: [e for e in pair.events(pair.primary) if e["event"] == "quarantine"],
        30,
        "a quarantine record",
    )
    assert found[0]["messages"] == 200
    assert {row[5] for row in read_quarantine(found[0]["path"])} == ledger.confirmed
    refused = run_replay(found[0]["path"], pair.backup.url)
    assert refused.returncode != 0
    assert "no queue 'local' in vhost '/' on the server" in refused.stderr, refused.stderr
    await declare(pair.backup.url, "local", **{"x-amqha-replicate": False})
    replay(found[0]["path"], pair.backup.url)
    remaining = [body for body, _ in await drain(pair.backup.url, "local")]
    lost, invented = ledger.check(remaining)
    assert not lost and not invented and len(remaining) == 200


async def test_a_clean_stop_while_replicating_exits_cleanly_and_keeps_every_message(
    make_pair: Any,
) -> None:
    """SIGTERM of the ACTIVE while its PASSIVE is subscribed (its shutdown closes the
    replication link), then of the PASSIVE, and after a restart the other way round: each
    stops with exit code 0, no traceback, its `stopped` record last, and its store closed
    with every confirmed message."""
    pair: Pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    active, passive = await pair.settled()
    ledger = Ledger()
    await declare(active.url, "kept")
    await publish_confirmed(active.url, "kept", ledger, "k", asyncio.Event(), limit=300)
    assert len(ledger.confirmed) == 300
    for server in (active, passive):
        assert server.terminate() == 0, server.log()
        assert "Traceback" not in server.log(), server.log()
        assert pair.events(server)[-1]["event"] == "stopped"
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    active, _ = await pair.settled()
    remaining = [body for body, _ in await drain(active.url, "kept")]
    lost, invented = ledger.check(remaining)
    assert not lost and not invented and len(remaining) == 300
    # The other order (the PASSIVE first, as when both get the signal at once) is clean too.
    for server in reversed(await pair.settled()):
        assert server.terminate() == 0, server.log()
        assert pair.events(server)[-1]["event"] == "stopped"
    assert all("Traceback" not in server.log() for server in pair.servers)


async def promote_force(server: Any) -> None:
    """``amqha console promote --force`` on ``server``, as an operator would type it."""
    promoted = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "amqha", "console", "--server", url_of(server, ADMIN)]
        + ["promote", "--force"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert promoted.returncode == 0, promoted.stderr


async def test_the_passives_own_disk_holds_every_confirmed_message(make_pair: Any) -> None:
    """A confirm means both stores have the message on disk. kill -9 of the PASSIVE
    under a confirming publisher (runs it acked may still wait to be written as rows),
    then of the ACTIVE: the PASSIVE restarted alone and promoted serves every message
    confirmed before its kill, from its own store."""
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "orders")
    await wait_in_sync(pair, pair.primary)
    ledger = Ledger()
    stop = asyncio.Event()
    publisher = asyncio.create_task(
        publish_confirmed(pair.primary.url, "orders", ledger, "o", stop, limit=100_000)
    )
    try:
        await poll(lambda: len(ledger.confirmed) >= 3000, 60, "publishes confirmed")
        before_the_kill = set(ledger.confirmed)
        pair.kill(pair.backup)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(publisher, return_exceptions=True), 60)
    pair.kill(pair.primary)
    pair.backup.start()
    await promote_force(pair.backup)
    await pair.wait_states(None, "ACTIVE", timeout=20)
    remaining = [body for body, _ in await drain(pair.backup.url, "orders")]
    assert before_the_kill <= set(remaining), len(before_the_kill - set(remaining))
    assert not set(remaining) - ledger.sent  # nothing invented


async def kills_under_a_publisher(pair: Pair, queue: str, ledger: Ledger) -> None:
    """``kill_in_catch_up_then_at_in_sync`` with a publisher confirming into ``ledger`` on
    ``queue`` (50 in flight) through both failovers, stopped once they are done."""
    stop = asyncio.Event()
    urls = [pair.primary.url, pair.backup.url]
    publisher = asyncio.create_task(keep_publishing(urls, queue, ledger, "live", stop, window=50))
    try:
        await kill_in_catch_up_then_at_in_sync(pair, ledger)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(publisher, return_exceptions=True), 60)


async def kill_in_catch_up_then_at_in_sync(pair: Pair, ledger: Ledger) -> None:
    """The worst moments, under a publisher confirming through failovers into ``ledger``:
    the backup (PASSIVE) killed -9 while it catches up (it must not count as in sync, nor
    lead), restarted, and the primary (ACTIVE) killed -9 the moment the restarted backup
    logs in sync; the backup voted in and confirming 200 more."""
    await wait_in_sync(pair, pair.primary)
    assert await restart_into_catch_up(pair, pair.backup), "the catch-up was never seen"
    pair.kill(pair.backup)
    seen = len(passive_syncs(pair, pair.backup))
    pair.backup.start()
    await poll(
        lambda: any(e.get("sync") == "in_sync" for e in passive_syncs(pair, pair.backup)[seen:]),
        60,
        "the restarted passive in sync",
        interval=0.005,
    )
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=30)
    await poll(lambda: pair.state(pair.backup) == "ACTIVE", 30, "the takeover")
    target = len(ledger.confirmed) + 200
    await poll(lambda: len(ledger.confirmed) >= target, 60, "publishes confirmed after")


def left_to_apply(syncs: list[dict[str, Any]]) -> tuple[int, int, int]:
    """What a PASSIVE said it had left to apply when it went in sync: runs, changes,
    bytes (its ``sync`` record's reason)."""
    (reason,) = [e["reason"] for e in syncs if e.get("sync") == "in_sync"][:1]
    found = re.search(r"(\d+) runs to apply: (\d+) changes, (\d+) bytes", reason)
    assert found, reason
    runs, changes, size = found.groups()
    return int(runs), int(changes), int(size)


def passive_syncs(pair: Pair, server: Any) -> list[dict[str, Any]]:
    return [e for e in pair.events(server) if e["event"] == "sync" and e.get("side") == "passive"]


async def test_a_kill_of_the_active_the_moment_its_passive_is_in_sync_loses_nothing(
    make_pair: Any,
) -> None:
    """The recipe that lost confirmed messages silently: a long backlog and a confirming
    publisher still running; kill -9 and restart the PASSIVE; the moment its event log
    says in sync, kill -9 the ACTIVE; restart it; two rounds. While the snapshot went
    out the ACTIVE confirmed alone, and a PASSIVE that counted as in sync at the
    snapshot's end took over without those messages. Now it is in sync only once it
    holds every one: nothing is lost, nothing needs quarantining."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "backlog")
    ledger = Ledger()
    await fill_confirmed(pair.primary.url, "backlog", ledger, 12_500, 2000)
    stop = asyncio.Event()
    urls = [pair.primary.url, pair.backup.url]
    publisher = asyncio.create_task(
        keep_publishing(urls, "backlog", ledger, "live", stop, window=50)
    )
    try:
        for _ in range(2):
            active, passive = await pair.settled()
            target = len(ledger.confirmed) + 500
            await poll(lambda: len(ledger.confirmed) >= target, 60, "publishes confirmed")  # noqa: B023
            pair.kill(passive)
            seen = len(passive_syncs(pair, passive))
            passive.start()
            # The moment the restarted PASSIVE logs in sync, the ACTIVE dies.
            await poll(
                lambda: any(
                    e.get("sync") == "in_sync"
                    for e in passive_syncs(pair, passive)[seen:]  # noqa: B023
                ),
                60,
                "the restarted passive in sync",
                interval=0.005,
            )
            pair.kill(active)
            # In sync with little left to apply: a takeover applies it before it serves.
            # The backlog (25 MB) is over the bound: before it, the whole snapshot was
            # left to apply at this moment.
            _, changes, size = left_to_apply(passive_syncs(pair, passive)[seen:])
            assert changes <= UNAPPLIED_CHANGES + FOLLOWER_PREFETCH * RUN_CHANGES
            # (a run holds at most RUN_BYTES and one more 2 KB message)
            assert size <= UNAPPLIED_BYTES + FOLLOWER_PREFETCH * (RUN_BYTES + 4096)
            await client_vote([passive], retry_for=30)
            await poll(lambda: pair.state(passive) == "ACTIVE", 30, "the takeover")  # noqa: B023
            active.start()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(publisher, return_exceptions=True), 60)
    active, _ = await pair.settled()
    assert pair.quarantine_files() == []
    remaining = [body for body, _ in await drain(active.url, "backlog")]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented
    assert len(ledger.confirmed) > 13_500


async def test_a_server_killed_while_catching_up_never_leads_on_part_of_a_snapshot(
    make_pair: Any,
) -> None:
    """A double failure: the primary, restarted after a takeover, is killed while it
    takes the backup's snapshot; then the backup (ACTIVE) is killed too. Started alone,
    the primary's store holds part of the snapshot: it used to win the client vote and
    serve it, losing confirmed messages. Its data dir says it is incomplete now: the
    vote is refused with the reason; the backup, started again, leads (the primary is
    not in sync), the primary follows it, and every confirmed message is there."""
    pair, ledger = await pair_with_a_backlog(make_pair)
    await kill_the_primary_and_vote(pair)
    assert await restart_into_catch_up(pair, pair.primary, stored=True), "never seen"
    pair.kill(pair.primary)
    assert (pair.primary.data_dir / "incomplete").exists()  # the kill left it
    pair.kill(pair.backup)
    pair.primary.start()
    await refused_for_sync(pair.primary)
    await hold(lambda: pair.state(pair.primary) != "ACTIVE", 1.0, "the primary does not lead")
    pair.backup.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=30)
    await assert_every_confirmed_message(pair, pair.backup.url, "big", ledger, BACKLOG)
    await pair.wait_in_sync(pair.primary, timeout=60)
    assert not (pair.primary.data_dir / "incomplete").exists()


async def restart_into_applying(pair: Pair, server: Any, attempts: int = 5) -> bool:
    """Restart ``server`` and return once it is in sync with runs of its snapshot still
    to apply (True: on its disk, not yet in its state or its store's rows), or False
    when every attempt had applied them all before it could be seen."""
    for _ in range(attempts):
        pair.kill(server)
        server.start()
        deadline = asyncio.get_running_loop().time() + 60
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(Exception):
                follower = (await replication(pair, server)).get("follower") or {}
                if follower.get("in_sync"):
                    if follower.get("unapplied_runs"):
                        return True
                    break
            await asyncio.sleep(0.005)
    return False


async def test_a_passive_killed_while_it_applies_its_snapshot_keeps_every_message(
    make_pair: Any,
) -> None:
    """A PASSIVE acks a snapshot's runs once they are on its disk and applies them after:
    in sync, it may still have most of them to apply. kill -9 of it then, and of the
    ACTIVE: started alone, it writes the runs it kept when its store opens and,
    promoted, serves every confirmed message from its own store."""
    pair, ledger = await pair_with_a_backlog(make_pair)
    assert await restart_into_applying(pair, pair.backup), "runs left to apply never seen"
    pair.kill(pair.backup)
    pair.kill(pair.primary)
    pair.backup.start()
    recovered = (await pair.status(pair.backup)).get("store", {}).get("recovered") or {}
    assert recovered.get("pending_runs", 0) > 0, recovered
    await promote_force(pair.backup)
    await pair.wait_states(None, "ACTIVE", timeout=30)
    await assert_every_confirmed_message(pair, pair.backup.url, "big", ledger, BACKLOG)


async def test_a_snapshot_of_large_messages_stays_within_what_the_passive_reads(
    make_pair: Any,
) -> None:
    """The PASSIVE refuses a delivery larger than a run can be (a run and one message,
    twice limits.max_message_size): a snapshot taken 64 changes at a time once put 64
    large messages in one run, which it refused, resubscribing for ever. With 200 KB
    messages and a 256 KiB message limit the PASSIVE catches up, and after a kill -9
    of the ACTIVE serves every confirmed message."""
    pair = make_pair(limits={"max_message_size": "256KiB"}).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "large")
    ledger = Ledger()
    await fill_confirmed(pair.primary.url, "large", ledger, 150, 200_000)
    await wait_in_sync(pair, pair.primary)
    pair.kill(pair.backup)
    pair.backup.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await pair.wait_in_sync(pair.backup, timeout=60)
    await kill_the_primary_and_vote(pair)
    await assert_every_confirmed_message(pair, pair.backup.url, "large", ledger, 150)
    follower_log = pair.backup.log()
    assert "over the" not in follower_log


async def requeue_some(url: str, queue: str, count: int) -> int:
    """Basic.Get and nack back (requeue) ``count`` times: the head message goes back to the
    head each time, its delivery count one higher, a change of its own on a quorum queue.
    How many were nacked."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        nacked = 0
        for _ in range(count):
            got = await channel.basic_get(queue)
            if got.delivery_tag is None:
                break
            await channel.basic_nack(got.delivery_tag, requeue=True)
            nacked += 1
        return nacked
    finally:
        await connection.close()


async def test_a_quorum_backlog_with_delivery_counts_survives_kills_in_catch_up_and_at_in_sync(
    make_pair: Any,
) -> None:
    """A quorum queue's backlog carries delivery counts (each a change of its own,
    replicated and stored) while a confirming publisher runs: the PASSIVE is killed while
    it catches up, then the ACTIVE the moment the restarted PASSIVE logs in sync. Every
    confirmed message is on the survivor, none in a quarantine file, and the counts made
    before the kills are still there."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "qbacklog", **{"x-queue-type": "quorum"})
    ledger = Ledger()
    await fill_confirmed(pair.primary.url, "qbacklog", ledger, 10_000, 2000)
    assert await requeue_some(pair.primary.url, "qbacklog", 300) == 300
    await kills_under_a_publisher(pair, "qbacklog", ledger)
    assert pair.quarantine_files() == []
    taken = await take_all(pair.backup.url, "qbacklog")
    remaining = [got.body for got in taken]
    counts = [
        int((got.header.properties.headers or {}).get("x-delivery-count", 0) or 0) for got in taken
    ]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented
    # The head message, nacked 300 times before the kills, came through the snapshot and
    # the failover with its count; every other message was never delivered before.
    assert counts[0] == 300 and not any(counts[1:])


async def test_a_big_priority_backlog_purged_then_refilled_survives_kills_in_catch_up_and_at_in_sync(
    make_pair: Any,
) -> None:
    """A priority queue past ``release.AT_ONCE`` purged on the ACTIVE: the PASSIVE lets its
    lanes go whole, both free them a slice a turn (docs/limits.md, "Big drops"). Then a
    backlog again under a confirming publisher: the PASSIVE killed while it catches up,
    the ACTIVE the moment the restarted PASSIVE logs in sync. Every message confirmed
    after the purge is on the survivor, none purged comes back, none is quarantined."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "pbacklog", **{"x-max-priority": 2})
    purged = Ledger()
    count = release.AT_ONCE + 5000
    await fill_confirmed(pair.primary.url, "pbacklog", purged, count, 10)
    await wait_in_sync(pair, pair.primary)
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    assert (await channel.queue_purge("pbacklog")).message_count == count
    await connection.close()
    ledger = Ledger()
    await fill_confirmed(pair.primary.url, "pbacklog", ledger, 5000, 2000)
    await kills_under_a_publisher(pair, "pbacklog", ledger)
    assert pair.quarantine_files() == []
    remaining = [got.body for got in await take_all(pair.backup.url, "pbacklog")]
    lost, invented = ledger.check(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    assert not invented, f"{len(invented)} not sent after the purge, e.g. {sorted(invented)[:3]}"


async def test_a_consumer_acking_through_kills_in_catch_up_and_at_in_sync_loses_nothing(
    make_pair: Any,
) -> None:
    """A consumer drains a long backlog, acking each message, while a publisher confirms
    into a queue of its own: most of the ACTIVE's runs then hold acks alone, which the
    PASSIVE keeps without an fsync (``follower.keep_entries``). The PASSIVE is killed while
    it catches up, the ACTIVE the moment the restarted PASSIVE logs in sync. Every
    confirmed message, of both queues, was acked or is on the survivor; none is in a
    quarantine file."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    await declare(pair.primary.url, "drained")
    await declare(pair.primary.url, "fresh")
    drained, fresh = Ledger(), Ledger()
    await fill_confirmed(pair.primary.url, "drained", drained, BACKLOG, 8000)
    stop = asyncio.Event()
    urls = [pair.primary.url, pair.backup.url]
    consumer = asyncio.create_task(keep_consuming(urls, "drained", drained, stop, prefetch=5))
    try:
        await poll(lambda: len(drained.acked) >= 200, 60, "the consumer acking")
        acked_before = len(drained.acked)
        await kills_under_a_publisher(pair, "fresh", fresh)
        acked_after = len(drained.acked)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(consumer, return_exceptions=True), 60)
    # The kills came while the backlog was being drained (on a quiet machine it still is
    # at the second kill; on a busy one it may be drained by then).
    assert acked_before < BACKLOG and acked_after > acked_before
    assert pair.quarantine_files() == []
    await nothing_lost(pair.backup.url, "drained", drained)  # the survivor, ACTIVE
    await nothing_lost(pair.backup.url, "fresh", fresh)


async def test_a_passive_in_sync_in_the_term_before_does_not_take_over_from_a_new_one(
    make_pair: MakePair,
) -> None:
    """The ACTIVE primary killed and restarted at once leads again (by a client's vote)
    before its backup can subscribe to it (the backup's way to it held: blackholed), and
    confirms alone. The backup was in sync in the term before only: killed again, the
    primary is not replaced by it (a client's vote there is refused, not in sync), and,
    restarted, it serves every message it confirmed; nothing is quarantined."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary, backup = pair.primary, pair.backup
    await pair.wait_in_sync(backup, timeout=30)
    pair.kill(primary)
    pair.proxies[1].cut("blackhole")  # the backup's way to the primary: its feed too
    primary.start()
    # A client's vote at the primary alone (it hears no backup, which does hear it).
    assert (await client_vote([primary], retry_for=30))["name"] == "primary"
    connection = await aiormq.connect(primary.url)
    channel = await connection.channel()
    await channel.queue_declare("term", durable=True)
    await connection.close()
    ledger = Ledger()
    await publish_confirmed(primary.url, "term", ledger, "t", asyncio.Event(), limit=50)
    assert len(ledger.confirmed) == 50
    await poll(
        lambda: any(
            e["event"] == "sync"
            and e.get("side") == "passive"
            and e["sync"] == "out_of_sync"
            and "catches up again" in e.get("reason", "")
            for e in pair.events(backup)
        ),
        30,
        "the backup no longer in sync once the primary leads in a new term",
    )
    await vote_refused(pair, backup, primary, "not in sync")
    pair.proxies[1].heal()
    primary.start()
    await pair.settled(timeout=60, interval=0.1)
    assert pair.state(primary) == "ACTIVE"
    kept = {m.body for m in await take_all(primary.url, "term")}
    assert ledger.confirmed <= kept, f"{len(ledger.confirmed - kept)} confirmed messages lost"
    assert pair.quarantine_files() == []


async def test_a_clean_stop_of_the_active_under_load_quarantines_nothing(
    make_pair: MakePair,
) -> None:
    """SIGTERM of the ACTIVE while publishers confirm through it: it stops reading them,
    lets what it read be confirmed on both disks, then stops (exit 0). The backup takes
    over, the old ACTIVE restarts and follows: no run was in flight as it stopped, so
    nothing of its is quarantined (a run in flight would mark what it carries as possibly
    its own), every confirmed message is there, and none twice."""
    pair = make_pair().start()
    active, passive = await pair.settled()
    urls = [pair.primary.url, pair.backup.url]
    await declare(active.url, "stopping")
    sent: list[bytes] = []
    futures: list[asyncio.Future[None]] = []
    stop = asyncio.Event()

    async def keep_sending(publisher: Publisher, name: str) -> None:
        number = 0
        while not stop.is_set():
            body = f"{name}-{number}".encode()
            futures.append(await publisher.send(body, routing_key="stopping"))
            sent.append(body)
            number += 1
            if number % 20 == 0:
                await asyncio.sleep(0.005)

    publishers = [Publisher(urls, max_pending=100) for _ in range(2)]
    for publisher in publishers:
        await publisher.start()
    tasks = [asyncio.create_task(keep_sending(p, f"p{i}")) for i, p in enumerate(publishers)]
    try:
        await poll(lambda: len(sent) >= 500, 60, "messages sent")
        assert await asyncio.to_thread(active.terminate) == 0, active.log()
        await poll(lambda: pair.state(passive) == "ACTIVE", 60, "the backup ACTIVE")
        target = len(sent) + 300
        await poll(lambda: len(sent) >= target, 60, "messages sent to the new ACTIVE")
        active.start()
        await poll(lambda: pair.state(active) == "PASSIVE", 60, "the old ACTIVE PASSIVE")
        await pair.wait_in_sync(active, timeout=60)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    for publisher in publishers:
        await publisher.flush(60)
        await publisher.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert pair.quarantine_files() == []
    assert not any("quarantined" in server.log() for server in pair.servers)
    remaining = [body for body, _ in await drain(passive.url, "stopping")]
    assert set(sent) <= set(remaining)
    assert len(remaining) == len(set(remaining)), "a message stored twice"
