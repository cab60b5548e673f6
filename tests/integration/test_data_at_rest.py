"""What a server leaves on disk: readable by its own user only, and a store file that is
not a store is refused, never taken for a new one.

Real ``amqha start`` processes started with a umask of 0: the modes are the server's
doing, not the test runner's.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiormq
import yaml

from tests.durability import PERSISTENT
from tests.pairs import client_vote, failover_section
from tests.support import ServerProcess, free_port, start_to_exit, wait_until


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The test process's umask for the block (children started in it inherit it)."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def modes(root: Path) -> dict[str, int]:
    """The permission bits of ``root`` and of everything under it, by relative path."""
    found = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for folder, directories, files in os.walk(root):
        for name in [*directories, *files]:
            path = Path(folder, name)
            found[str(path.relative_to(root))] = stat.S_IMODE(os.stat(path).st_mode)
    return found


async def test_every_file_a_server_writes_is_its_users_alone(make_server: Any) -> None:
    """A primary whose backup never comes serves alone: store, WAL, event log, epoch and unprotected mark are all written; each is 0600, the data dir 0700.
    (A client vote makes it ACTIVE: a server alone waits one timeout for its peer.)"""
    server: ServerProcess = make_server(
        "primary", failover=failover_section("primary", free_port(), 0.1, 0.4)
    )
    with umask(0):
        server.start()
    await client_vote([server], retry_for=20)
    connection = await aiormq.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.queue_declare("kept", durable=True)
    for n in range(20):
        await channel.basic_publish(b"secret-%d" % n, routing_key="kept", properties=PERSISTENT)
    await connection.close()
    wait_until(
        lambda: (
            (server.data_dir / "unprotected").exists()
            and (server.data_dir / "store.sqlite-wal").exists()
        ),
        what="the unprotected mark and the store's WAL",
    )
    found = modes(server.data_dir)
    # No -shm file: the store is opened in exclusive locking mode, its WAL index in memory.
    for name in ("store.sqlite", "store.sqlite-wal", "events.jsonl", "epoch", "unprotected"):
        assert name in found, found
    assert found.pop(".") == 0o700
    assert found == {name: 0o600 for name in found}


def test_an_empty_store_file_is_refused_naming_it(make_server: Any) -> None:
    server: ServerProcess = make_server("empty")
    store = server.data_dir / "store.sqlite"
    store.parent.mkdir(parents=True)
    store.write_bytes(b"")
    server.config_path.write_text(yaml.safe_dump(server.config))
    result = start_to_exit(server.config_path)
    assert result.returncode == 1, result.stderr
    assert "listening" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: cannot open the message store: {store}: not a readable store (an empty"
        " file, which no store ever is: remove it if nothing was stored there): with no peer"
        " to take its state from, this server does not start on it; move the file aside to"
        " start empty, or restore it from a backup"
    ], result.stderr
    assert store.stat().st_size == 0
