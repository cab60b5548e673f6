"""The feed's live runs tile the LSNs they carry: a run cut by bytes is followed by one
that starts right after it. The ACTIVE counts what an acked run held by its last LSN, so
a run numbered past its changes would let confirms of changes the PASSIVE was never sent
go out (and a kill of the ACTIVE then lose them)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from pamqp import commands
from pamqp.header import ContentHeader

from amqha.core import codec
from amqha.core.changes import Enqueued
from amqha.quarantine import read_unprotected_mark, write_unprotected_mark
from amqha.replication import IN_SYNC, RUN_BYTES, RUN_CHANGES
from amqha.server import Broker
from amqha.wire import address_of
from config import load_config

BODY = b"m" * 4000  # 4 KB: a run of them is cut by bytes long before RUN_CHANGES


class RecordingOutlet:
    """A subscriber's channel as the feed sees it: the runs it was handed, in order."""

    peer = "127.0.0.1:1"
    prefetch = 1000

    def __init__(self) -> None:
        self.tag = 0
        self.runs: list[tuple[int, bytes]] = []

    def next_tag(self) -> int:
        self.tag += 1
        return self.tag

    def deliver(self, tag: int, header: bytes, body: bytes) -> None:
        self.runs.append((tag, body))

    def cancel(self) -> None:
        pass

    def detach(self) -> None:
        pass


def in_sync_feed(tmp_path: Path) -> tuple[Broker, Any, RecordingOutlet]:
    path = tmp_path / "solo.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"name": "solo", "listen": "127.0.0.1:0", "data_dir": str(tmp_path)},
                "users": [{"name": "guest", "password": "guest"}],
            }
        )
    )
    broker = Broker(load_config(path))
    feed = broker.feed
    outlet = RecordingOutlet()
    feed.subscribe(outlet, b"k" * 32)
    for tag, _ in list(outlet.runs):  # the snapshot's runs, acked: in sync
        feed.acked(outlet, tag, False)
    assert feed.in_sync
    marker, _ = outlet.runs[-1]  # the in-sync marker, acked as the PASSIVE does
    feed.acked(outlet, marker, False)
    assert not feed.leader.unacked
    outlet.runs.clear()
    return broker, feed, outlet


def test_runs_cut_by_bytes_tile_the_lsns_they_carry(tmp_path: Path) -> None:
    async def check() -> None:
        broker, feed, outlet = in_sync_feed(tmp_path)
        header = ContentHeader(0, len(BODY), commands.Basic.Properties(delivery_mode=2)).marshal()
        count = 300
        assert count * len(BODY) > 2 * RUN_BYTES and count < RUN_CHANGES
        first = feed.sent_lsn + 1
        changes = [
            Enqueued("/", "q", n, address_of("", "q"), header, BODY, None, True)
            for n in range(1, count + 1)
        ]
        feed.submit(first, changes)
        runs = list(feed.leader.unacked.values())
        assert len(runs) >= 3  # cut by bytes, not by count
        # Each run ends where its changes end; the next starts right after.
        carried = 0
        for (tag, body), run in zip(outlet.runs, runs, strict=True):
            run_first, decoded = codec.decode(body)
            assert run_first == first + carried
            carried += len(decoded)
            assert run.last_lsn == first + carried - 1, (tag, run.last_lsn)
        assert carried == count
        # Acked one at a time, the PASSIVE is counted as holding exactly what it was sent.
        for tag, _ in outlet.runs[:-1]:
            feed.acked(outlet, tag, False)
            assert feed.leader.replicated_lsn < first + count - 1
        feed.acked(outlet, outlet.runs[-1][0], False)
        assert feed.leader.replicated_lsn == first + count - 1

    asyncio.run(check())


def test_the_unprotected_mark_is_gone_before_the_in_sync_marker_leaves(tmp_path: Path) -> None:
    """The moment the marker is out, the PASSIVE may take over (a kill of this server
    the next instant): a mark still on disk then would quarantine, at this server's
    restart, messages its peer holds."""

    class MarkWatchingOutlet(RecordingOutlet):
        def __init__(self) -> None:
            super().__init__()
            self.marks: list[int | None] = []  # the mark on disk as each marker left

        def deliver(self, tag: int, header: bytes, body: bytes) -> None:
            super().deliver(tag, header, body)
            if IN_SYNC.encode() in header:
                self.marks.append(read_unprotected_mark(str(tmp_path)))

    async def check() -> None:
        broker, feed, _ = in_sync_feed(tmp_path)
        broker.open_store()  # a server keeps a mark only with a store
        try:
            feed.drop("the in-sync PASSIVE is lost", cancel=False)
            write_unprotected_mark(str(tmp_path), 1234)  # confirmed alone from id 1234 on
            outlet = MarkWatchingOutlet()
            feed.subscribe(outlet, b"k" * 32)
            for tag, _ in list(outlet.runs):
                feed.acked(outlet, tag, False)
            assert feed.in_sync and outlet.marks == [None]
        finally:
            broker.close_store()

    asyncio.run(check())
