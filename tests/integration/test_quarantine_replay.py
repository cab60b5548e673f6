"""``amqha quarantine replay`` on a real server: a replay that stops part-way keeps its
progress in the file, and the next run publishes only what is left.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import aiormq
from pamqp import commands
from pamqp.header import ContentHeader

from amqha.quarantine import keep, replayed_count
from tests.integration.test_replication import run_replay
from tests.pairs import ADMIN, url_of
from tests.support import ROOT, ServerProcess

MESSAGES = 50
ROOM = 30  # the queue's x-max-length: the 31st replayed message is nacked


def header(body: bytes, **properties: Any) -> bytes:
    return ContentHeader(0, len(body), commands.Basic.Properties(**properties)).marshal()


async def take_all(url: str, queue: str) -> list[tuple[bytes, str | None]]:
    """Every message on ``queue`` (body, user_id), acked as it is read (bounded)."""
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        found = []
        for _ in range(10 * MESSAGES):
            got = await channel.basic_get(queue, no_ack=True)
            if got.delivery_tag is None:
                return found
            found.append((got.body, got.header.properties.user_id))
        raise AssertionError(f"{queue} still had messages after {10 * MESSAGES}")
    finally:
        await connection.close()


async def test_a_replay_that_stops_part_way_publishes_each_message_once_over_two_runs(
    make_server: Any, tmp_path: Path
) -> None:
    """50 messages, one with user_id 'guest', replayed as admin to a queue with room for
    30 (reject-publish): the user_id is removed with a note, 30 are confirmed, the 31st is
    nacked and the command stops with the counts done and left. Once the queue is
    emptied, a second run publishes the other 20 only: every message exactly once."""
    server: ServerProcess = make_server("active").start()
    connection = await aiormq.connect(server.url)
    channel = await connection.channel()
    await channel.queue_declare(
        "orders", durable=True, arguments={"x-max-length": ROOM, "x-overflow": "reject-publish"}
    )
    await connection.close()
    rows = []
    for msg_id in range(1, MESSAGES + 1):
        body = b"order-%d" % msg_id
        user = {"user_id": "guest"} if msg_id == 5 else {}
        rows.append(("/", "orders", msg_id, b"", header(body, delivery_mode=2, **user), body))
    path = Path(keep(rows, str(tmp_path / "lost"), "lost", None)["path"])
    url = url_of(server, ADMIN)

    first = run_replay(path, url)
    assert first.returncode == 1, first.stderr
    assert "user_id 'guest' removed from 1 messages" in first.stdout, first.stdout
    errors = first.stderr.strip().splitlines()
    assert errors == [
        f"Error: replay stopped: message {ROOM + 1} for queue 'orders' in vhost '/' was nacked"
        " (its queue is full, or the server could not store it);"
        f" {ROOM} of {MESSAGES} messages are replayed ({ROOM} in this run),"
        f" {MESSAGES - ROOM} left: run the same command again to publish only those"
    ], first.stderr
    assert path.exists() and replayed_count(str(path)) == ROOM
    listed = subprocess.run(
        [sys.executable, "-m", "amqha", "quarantine", "list", str(tmp_path / "lost")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert f"{path}: {MESSAGES} messages on //orders ({ROOM} replayed," in listed.stdout
    taken = await take_all(server.url, "orders")
    assert [body for body, _ in taken] == [row[5] for row in rows[:ROOM]]
    assert dict(taken)[b"order-5"] is None  # the user_id was removed

    second = run_replay(path, url)
    assert second.returncode == 0, second.stderr
    assert f"replayed {MESSAGES - ROOM} messages to 1 queues ({ROOM} replayed before)" in (
        second.stdout
    )
    assert not path.exists() and Path(f"{path}.replayed").exists()
    taken += await take_all(server.url, "orders")
    assert sorted(body for body, _ in taken) == sorted(row[5] for row in rows)
