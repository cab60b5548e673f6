"""A rolling upgrade from the previous release (docs/operations.md, "Upgrading"): a pair of
the previous release under a confirming publisher, the backup upgraded first, the service
moved to it, the primary upgraded, the service moved back; nothing confirmed is lost and
nothing is quarantined. The previous release is the commit named in
tests/previous_release, taken from this repository's history into a temporary tree (its
code run with this checkout's interpreter and libraries)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tarfile
from pathlib import Path

import aio_pika
import pytest

from amqha.client import Publisher
from amqha.core.protocol import PROTOCOL
from tests.integration.test_dedup import message_ids
from tests.integration.test_maintenance import console
from tests.integration.test_switchover import declare, switchover
from tests.pairs import MakePair, poll
from tests.support import ROOT

QUEUE = "upgrade"
RELEASE_FILE = ROOT / "tests" / "previous_release"


def previous_release(into: Path) -> Path:
    """The previous release's tree under ``into``, from the commit tests/previous_release
    names; skipped, saying why, where the checkout has no history (a shallow clone)."""
    commit = RELEASE_FILE.read_text().split()[0]
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the previous release comes from git history: no git checkout here")
    archive = into / "previous.tar"
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), commit],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.skip(
            f"commit {commit} of tests/previous_release is not in this checkout's "
            f"history (a shallow clone?): {done.stderr.strip()}"
        )
    tree = into / "previous"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


async def test_a_rolling_upgrade_under_load_loses_nothing(
    make_pair: MakePair, tmp_path: Path
) -> None:
    old = previous_release(tmp_path)
    pair = make_pair(proxied=False)
    primary, backup = pair.primary, pair.backup
    for server in pair.servers:
        server.code = old
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await pair.wait_in_sync(backup, timeout=60)

    confirmed: set[str] = set()
    sent: list[str] = []
    stop = asyncio.Event()
    sending = asyncio.Event()
    sending.set()

    async def keep_sending(publisher: Publisher) -> None:
        number = 0
        while not stop.is_set():
            await sending.wait()
            name = f"m-{number}"
            message = aio_pika.Message(name.encode(), message_id=name, delivery_mode=2)
            future = await publisher.send(message, routing_key=QUEUE)
            future.add_done_callback(
                lambda f, name=name: confirmed.add(name) if f.exception() is None else None
            )
            sent.append(name)
            number += 1
            if number % 20 == 0:
                await asyncio.sleep(0.01)

    async def load_for(count: int) -> None:
        target = len(sent) + count
        await poll(lambda: len(sent) >= target, 60, "messages sent")

    urls = [primary.url, backup.url]
    async with Publisher(urls, setup=declare(QUEUE), max_pending=100) as publisher:
        task = asyncio.create_task(keep_sending(publisher))
        try:
            await load_for(300)
            # 1. The backup upgraded: stopped, started from this release on its data dir.
            assert backup.terminate() == 0
            backup.code = ROOT
            backup.start()
            await poll(lambda: pair.state(backup) == "PASSIVE", 60, "the new backup PASSIVE")
            await pair.wait_in_sync(backup, timeout=60)
            # The previous release answers without a protocol; the new one names both.
            assert "protocol" not in await pair.status(primary)
            mixed = await pair.status(backup)
            assert mixed["protocol"] == {"this": PROTOCOL, "peer": 1, "spoken": 1}
            words = console(pair, "status")
            assert f"upgrade in progress: this release speaks protocol {PROTOCOL}, its peer 1" in (
                words.stdout
            ), words.stdout + words.stderr
            await load_for(300)
            # 2. The service moved to it. The previous release has no switchover, whose
            # drain this does by hand: publishes paused and every one confirmed (so on
            # both disks) before it stops cleanly; a stop with runs in flight marks what
            # they carry as possibly its own, and its restart quarantines them. The
            # upgraded backup takes over, and the publishes go on.
            sending.clear()
            await publisher.flush(60)
            assert primary.terminate() == 0
            sending.set()
            await poll(lambda: pair.state(backup) == "ACTIVE", 60, "the new backup ACTIVE")
            await load_for(300)
            # A deduplicating queue declared on the new ACTIVE, with a message on it, before
            # a PASSIVE of either release follows: each gets what it can read.
            await _dedup_queue(backup.url)
            # The primary back on the previous release first: the new ACTIVE speaks it
            # protocol 1 (no deduplication keys, which it could not read) and it follows.
            primary.start()
            await poll(lambda: pair.state(primary) == "PASSIVE", 60, "the old primary PASSIVE")
            await pair.wait_in_sync(primary, timeout=60)
            assert (await pair.status(backup))["protocol"]["spoken"] == 1
            await load_for(300)
            # 3. The primary upgraded, back in sync; 4. switched back.
            assert primary.terminate() == 0
            primary.code = ROOT
            primary.start()
            await poll(
                lambda: pair.state(primary) == "PASSIVE" and pair.in_sync(primary),
                60,
                "the new primary PASSIVE and in sync",
            )
            upgraded = await pair.status(backup)
            assert upgraded["protocol"] == {"this": PROTOCOL, "peer": PROTOCOL, "spoken": PROTOCOL}
            await switchover(backup)
            await poll(lambda: pair.state(primary) == "ACTIVE", 30, "the primary ACTIVE again")
            await load_for(300)
        finally:
            stop.set()
            sending.set()
            await task
        await publisher.flush(60)

    kept = set(await message_ids(primary.url, QUEUE))
    lost = confirmed - kept
    assert not lost, f"{len(lost)} of {len(confirmed)} confirmed messages lost"
    assert len(confirmed) >= 1200
    assert pair.quarantine_files() == []
    # The deduplication cache came over with the snapshot to the upgraded primary: the key
    # sent again is dropped there.
    await _dedup_queue(primary.url, again=True)


async def _dedup_queue(url: str, again: bool = False) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        # Keys by message id in a cache that outlives the message: replicated as
        # deduplication keys (changes.DedupSeen), which the previous release cannot read.
        queue = await channel.declare_queue(
            "dedup-upgrade",
            durable=True,
            arguments={"x-deduplication-by": "message-id", "x-cache-size": 100},
        )
        message = aio_pika.Message(b"once", delivery_mode=2, message_id="k1")
        await channel.default_exchange.publish(message, routing_key="dedup-upgrade")
        declared = await channel.declare_queue("dedup-upgrade", passive=True)
        assert declared.declaration_result.message_count == 1, again
        del queue
