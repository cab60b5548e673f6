"""Faults that must neither split nor silence the pair: a full disk under the event log or
the epoch, a frozen process (SIGSTOP), a restarted backup with its primary down (promote),
and the step-down that closes administrators too. Real processes, real signals, a real
small filesystem."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import pytest

from tests.pairs import (
    ADMIN,
    MakePair,
    Pair,
    client_vote,
    connect_plain,
    pika_open_error,
    poll,
    url_of,
)
from tests.support import ROOT


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB filesystem (tmpfs) that tests fill up: ENOSPC from the kernel."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(mount: Path, *logs: Path) -> Path:
    """Write until the filesystem is full; returns the filler file (delete it to free).

    ``logs`` are topped up with blank lines (readers skip them) until their last page is
    full too: the kernel fails a write only when it needs a new page.
    """
    filler = mount / "filler"
    with open(filler, "wb", buffering=0) as out:
        chunk = b"\0" * 65536
        for _ in range(1000):  # 64 MiB at most: far beyond the 512 KiB filesystem
            try:
                out.write(chunk)
            except OSError:
                break
    for log in logs:
        with open(log, "ab", buffering=0) as out:
            for _ in range(10_000):
                try:
                    out.write(b"\n")
                except OSError:
                    break
    with contextlib.suppress(OSError), open(mount / "probe", "wb") as probe:
        probe.write(b"\0" * 8192)
        probe.flush()
        os.fsync(probe.fileno())
        pytest.fail("the filesystem still takes writes after filling it")
    return filler


def console(pair: Pair, *words: str, server=None) -> subprocess.CompletedProcess:
    targets = [server] if server is not None else pair.servers
    args = [a for s in targets for a in ("--server", url_of(s, ADMIN))]
    return subprocess.run(
        [sys.executable, "-m", "amqha", "console", *args, *words],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def test_a_full_event_log_disk_stops_neither_heartbeat_nor_step_down(
    make_pair: MakePair, small_fs: Path
) -> None:
    pair = make_pair(proxied=False)
    pair.primary.config["events"] = {"path": str(small_fs / "primary-events.jsonl")}
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    fill(small_fs, small_fs / "primary-events.jsonl")
    client = await connect_plain(pair.primary)
    channel = await client.channel(publisher_confirms=True)
    queue = await channel.declare_queue(f"full-{uuid.uuid4().hex}", exclusive=True)
    await channel.default_exchange.publish(aio_pika.Message(b"before"), routing_key=queue.name)
    closed = asyncio.get_running_loop().create_future()
    client.close_callbacks.add(lambda _, exc: closed.done() or closed.set_result(exc))

    # The backup takes the service by force: the primary, whose log cannot be written, must
    # still step down, close its clients and keep sending state.
    promoted = await asyncio.to_thread(console, pair, "promote", "--force", server=pair.backup)
    assert promoted.returncode == 0, promoted.stderr
    reason = await asyncio.wait_for(closed, 10)
    assert "NOT_ACTIVE" in str(reason)
    status = await poll_status(pair, pair.primary, lambda s: s["state"] == "PASSIVE")
    assert status["event_log_lost"] > 0
    backup = await poll_status(
        pair, pair.backup, lambda s: s["peer"] and s["peer"]["state"] == "PASSIVE"
    )
    assert backup["peer"]["alive"]  # the primary's heartbeat goes on
    assert "cannot write the event log" in pair.primary.log()
    assert pair.primary.alive


async def test_an_epoch_that_cannot_be_stored_never_becomes_active(
    make_pair: MakePair, small_fs: Path
) -> None:
    pair = make_pair(proxied=False)
    pair.backup.config["server"]["data_dir"] = str(small_fs / "backup")
    pair.backup.data_dir = small_fs / "backup"
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    # In sync first: a replicated change the full disk refused would take the backup out of
    # sync, and that refusal, not the epoch's, would answer the vote.
    await pair.wait_in_sync(pair.backup, timeout=60)
    # In sync comes at the snapshot (LSN 0); the changes the ACTIVE makes as it starts
    # follow within milliseconds, and one written after the fill would do the same.
    await replication_quiet(pair, pair.primary)
    fill(small_fs)
    epoch = pair.epoch(pair.backup)
    pair.kill(pair.primary)
    # Once the primary's silence allows a takeover, the client vote is refused with why.
    refusal = await poll(
        lambda: "cannot persist epoch" in (pika_open_error(pair.backup.port) or ""),
        15,
        "a refusal naming the epoch that cannot be stored",
    )
    assert refusal
    status = await pair.status(pair.backup)
    assert status["state"] == "PASSIVE" and not status["serving"]
    assert pair.epoch(pair.backup) == epoch
    # Space again: the next client vote takes over.
    (small_fs / "filler").unlink()
    assert (await client_vote([pair.backup]))["name"] == "backup"
    assert pair.epoch(pair.backup) == epoch + 1


async def replication_quiet(pair: Pair, active, timeout: float = 15.0) -> None:
    """Until the ACTIVE's feed has nothing unacked and its replicated LSN holds still for
    0.2 s (five polls): every change it has made is on its PASSIVE."""
    seen: list[tuple[object, object]] = []

    def quiet(status: dict) -> bool:
        feed = (status.get("replication") or {}).get("feed") or {}
        seen.append((feed.get("lag_changes"), feed.get("replicated_lsn")))
        last = seen[-5:]
        return len(last) == 5 and last[0][0] == 0 and last.count(last[0]) == 5

    await poll_status(pair, active, quiet, timeout)


async def poll_status(pair: Pair, server, predicate, timeout: float = 15.0) -> dict:
    last: dict = {}

    async def check() -> bool:
        nonlocal last
        last = await pair.status(server)
        return bool(predicate(last))

    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"status never matched: {last}")
        await asyncio.sleep(0.05)
    return last


async def confirming_publisher_on_the_active(
    make_pair: MakePair,
) -> tuple[Pair, aiormq.abc.AbstractConnection, aiormq.abc.AbstractChannel, str]:
    """A settled pair and an aiormq channel in confirm mode on its ACTIVE, with a queue."""
    pair = make_pair()
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    connection = await aiormq.connect(pair.primary.url)
    channel = await connection.channel()
    await channel.confirm_delivery()
    declared = await channel.queue_declare(f"frozen-{uuid.uuid4().hex}", auto_delete=True)
    return pair, connection, channel, declared.queue


async def test_a_frozen_active_confirms_nothing_after_waking_into_a_takeover(
    make_pair: MakePair,
) -> None:
    pair, connection, channel, queue = await confirming_publisher_on_the_active(make_pair)
    await channel.basic_publish(b"before", routing_key=queue)
    pid = pair.primary.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # Sent while the primary is frozen: it sits in the socket until it wakes.
        pending = asyncio.ensure_future(channel.basic_publish(b"during", routing_key=queue))
        assert (await client_vote([pair.backup], retry_for=15.0))["name"] == "backup"
    finally:
        os.kill(pid, signal.SIGCONT)
    # On waking the old ACTIVE holds the publish, hears its peer ACTIVE in a higher epoch,
    # steps down and closes: the publish is never confirmed.
    with pytest.raises((aiormq.exceptions.AMQPError, ConnectionError, asyncio.CancelledError)):
        await asyncio.wait_for(pending, 15)
    await pair.wait_states("PASSIVE", "ACTIVE")
    paused = await poll(
        lambda: [e for e in pair.events(pair.primary) if e["event"] == "paused"],
        10,
        "a paused record",
    )
    assert paused[-1]["gap"] > pair.timeout
    with contextlib.suppress(Exception):
        await connection.close()


async def test_a_short_freeze_holds_confirms_until_the_peer_is_heard(make_pair: MakePair) -> None:
    pair, connection, channel, queue = await confirming_publisher_on_the_active(make_pair)
    pid = pair.primary.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        pending = asyncio.ensure_future(channel.basic_publish(b"during", routing_key=queue))
        # Frozen longer than the timeout, with no client at the backup: no takeover.
        await asyncio.sleep(pair.timeout * 1.2)
    finally:
        os.kill(pid, signal.SIGCONT)
    confirm = await asyncio.wait_for(pending, 15)
    assert isinstance(confirm, aiormq.spec.Basic.Ack)
    await poll(
        lambda: any(e["event"] == "paused" for e in pair.events(pair.primary)),
        10,
        "a paused record",
    )
    assert pair.states() == ("ACTIVE", "PASSIVE")
    await connection.close()


async def test_promote_brings_back_a_restarted_backup_whose_primary_is_down(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.kill(pair.primary)
    assert (await client_vote([pair.backup]))["name"] == "backup"
    pair.kill(pair.backup)
    pair.backup.start()
    # Restarted with its primary down, the backup refuses every client: no way in...
    assert "NOT_ACTIVE" in (pika_open_error(pair.backup.port) or "")
    # ... until an administrator promotes it, knowingly.
    promoted = await asyncio.to_thread(console, pair, "promote")
    assert promoted.returncode == 0, promoted.stderr
    assert "ACTIVE in epoch" in promoted.stdout and "may not be here" in promoted.stdout
    assert (await client_vote([pair.backup]))["name"] == "backup"
    events = pair.events(pair.backup)
    assert any(
        e["event"] == "transition" and e["trigger"] == "PROMOTE" and e["to"] == "ACTIVE"
        for e in events
    )
    assert any(e["event"] == "console" and e["command"] == "promote" for e in events)
    # Promoting an ACTIVE server is refused, with the reason.
    again = await asyncio.to_thread(console, pair, "promote", server=pair.backup)
    assert again.returncode == 1 and "already ACTIVE" in again.stderr


async def test_a_step_down_closes_administrators_but_keeps_the_peering(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    admin = await aio_pika.connect(url_of(pair.primary, ADMIN))
    closed = asyncio.get_running_loop().create_future()
    admin.close_callbacks.add(lambda _, exc: closed.done() or closed.set_result(exc))
    refused = await asyncio.to_thread(console, pair, "promote", server=pair.backup)
    assert refused.returncode == 1 and "--force" in refused.stderr
    forced = await asyncio.to_thread(console, pair, "promote", "--force", server=pair.backup)
    assert forced.returncode == 0, forced.stderr
    assert "NOT_ACTIVE" in str(await asyncio.wait_for(closed, 10))
    await pair.wait_states("PASSIVE", "ACTIVE")
    # The pair stays paired: each hears the other.
    for server in pair.servers:
        status = await poll_status(pair, server, lambda s: s["peer"] and s["peer"]["alive"])
        assert status["misconfigured"] is None
    dual = [e for s in pair.servers for e in pair.events(s) if e["event"] == "dual_active"]
    assert dual  # the forced promotion resolved by the epoch rule, and was recorded
