"""A damaged store (docs/durability.md, section 4, "A damaged store"): pages overwritten,
one byte of a message changed, the file cut short, or the write-ahead log of a store killed
mid-run lost, on disk while the server was down. Found at open, never served from: a server of a pair sets
the file aside and starts empty, not in sync, and takes its state from its peer (the
PASSIVE; and the primary, which would have led on it, follows its in-sync backup
instead); every confirmed message is there after. A server alone refuses to start,
saying why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aio_pika
import pytest

from tests.integration.test_dedup import message_ids
from tests.pairs import MakePair, client_vote, poll
from tests.support import start_to_exit

PAGE = 4096
BODY = b"m" * 4000  # a page a message: the store spans hundreds of pages


async def publish(url: str, prefix: str, count: int) -> set[str]:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("kept", durable=True)
        for number in range(count):
            await channel.default_exchange.publish(
                aio_pika.Message(BODY, delivery_mode=2, message_id=f"{prefix}{number}"),
                routing_key="kept",
                timeout=30,
            )
    return {f"{prefix}{number}" for number in range(count)}


def damage(store: Path) -> None:
    """Overwrite one page in the middle of a store closed cleanly (its WAL written back)."""
    size = store.stat().st_size
    assert size > 64 * PAGE, size
    offset = (size // 2) // PAGE * PAGE
    with store.open("r+b") as file:
        file.seek(offset)
        file.write(b"\xff" * PAGE)


def damaged_records(pair, server) -> list[dict]:
    return [e for e in pair.events(server) if e["event"] == "store_damaged"]


def flip_a_body_byte(store: Path) -> None:
    """One byte changed inside a message body: no page check of SQLite's sees it."""
    data = bytearray(store.read_bytes())
    at = data.find(b"m" * 512)  # a part of a body (a body spans pages)
    assert at >= 0
    data[at + 100] ^= 0x01
    store.write_bytes(bytes(data))


def cut_short(store: Path) -> None:
    """The file's last pages gone (a copy cut short, a truncation)."""
    data = store.read_bytes()
    store.write_bytes(data[: len(data) - 3 * PAGE])


def lose_the_log(store: Path) -> None:
    """The write-ahead log of a store killed mid-run deleted: its last commits with it."""
    wal = Path(f"{store}-wal")
    assert wal.exists()
    wal.unlink()


@pytest.mark.parametrize(
    ("stop", "spoil", "found"),
    [
        ("terminate", damage, "damaged pages"),
        ("terminate", flip_a_body_byte, "does not match its checksum"),
        ("terminate", cut_short, "cut short"),
        ("kill", lose_the_log, "write-ahead log store.sqlite-wal is missing"),
    ],
    ids=["page", "body-byte", "cut-short", "missing-log"],
)
async def test_a_passive_with_a_damaged_store_sets_it_aside_and_catches_up(
    make_pair: MakePair, stop: str, spoil: Callable[[Path], None], found: str
) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    confirmed = await publish(pair.primary.url, "a", 300)
    await pair.wait_in_sync(pair.backup, timeout=60)
    if stop == "kill":
        pair.kill(pair.backup)
    else:
        assert pair.backup.terminate() == 0
    store = pair.backup.data_dir / "store.sqlite"
    spoil(store)
    pair.backup.start()
    [record] = await poll(lambda: damaged_records(pair, pair.backup), 60, "a store_damaged record")
    aside = Path(record["path"])
    assert aside.parent == store.parent / "damaged" and aside.exists()
    assert found in record["reason"]
    await pair.wait_in_sync(pair.backup, timeout=60)
    status = (await pair.status(pair.backup))["replication"]
    assert status["store_damaged"]["path"] == str(aside)
    confirmed |= await publish(pair.primary.url, "b", 20)
    await pair.wait_in_sync(pair.backup, timeout=60)
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=30)
    await pair.wait_states(None, "ACTIVE", timeout=30)
    assert set(await message_ids(pair.backup.url, "kept")) == confirmed
    assert pair.quarantine_files() == []


async def test_a_primary_with_a_damaged_store_follows_its_backup_instead_of_leading(
    make_pair: MakePair,
) -> None:
    """It would lead on seeing its in-sync backup; not on a store it could not read: the
    backup leads, and the primary catches up from it."""
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    confirmed = await publish(pair.primary.url, "a", 300)
    await pair.wait_in_sync(pair.backup, timeout=60)
    assert pair.primary.terminate() == 0
    await client_vote([pair.backup], retry_for=30)  # the backup serves meanwhile
    await pair.wait_states(None, "ACTIVE", timeout=30)
    confirmed |= await publish(pair.backup.url, "b", 20)
    assert pair.backup.terminate() == 0  # both down; the backup was last in sync
    damage(pair.primary.data_dir / "store.sqlite")
    pair.primary.start()
    pair.backup.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=60)
    assert damaged_records(pair, pair.primary)
    await pair.wait_in_sync(pair.primary, timeout=60)
    assert set(await message_ids(pair.backup.url, "kept")) == confirmed


async def test_a_server_alone_refuses_a_damaged_store_and_says_why(make_server) -> None:
    server = make_server("solo")
    server.start()
    await publish(server.url, "a", 300)
    assert server.terminate() == 0
    store = server.data_dir / "store.sqlite"
    damage(store)
    refused = start_to_exit(server.config_path)
    assert refused.returncode == 1
    assert f"{store}: damaged pages" in refused.stderr, refused.stderr
    assert "no peer to take its state from" in refused.stderr
    assert store.exists()  # left where it is, for the operator
