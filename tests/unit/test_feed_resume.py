"""Resuming after a handover (docs/durability.md, section 5, "Resuming after a
handover"): the server that handed the service over subscribes naming the point of the
handover, proven with the session key, and is sent the changes kept since the takeover
with no snapshot; any other point, a forged one, or a change that went by unkept gets a
snapshot, as any subscription does."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from amqha.core import codec, feedauth
from amqha.core.changes import Enqueued, Reset
from amqha.wire import address_of
from tests.unit.test_feed_runs import RecordingOutlet, in_sync_feed

KEY = b"k" * 32


def enqueued(first_id: int, count: int) -> list[Enqueued]:
    return [
        Enqueued("/", "q", n, address_of("", "q"), b"", b"body", None, True)
        for n in range(first_id, first_id + count)
    ]


def first_changes(outlet: RecordingOutlet) -> list[object]:
    """The changes of the first run with any (a marker carries none)."""
    for _, body in outlet.runs:
        _, changes = codec.decode(body)
        if changes:
            return changes
    return []


def taken_over(tmp_path: Path) -> tuple[Any, int]:
    """A feed whose in-sync subscriber went, keeping for a resume at (7, 1234): the feed
    and the LSN it keeps from."""
    _, feed, _ = in_sync_feed(tmp_path)
    feed.drop("the old subscriber goes", cancel=False)
    base = feed.sent_lsn
    feed.keep_for_resume((7, 1234), base)
    return feed, base


def test_the_point_of_the_handover_resumes_with_the_changes_kept_since(tmp_path: Path) -> None:
    async def check() -> None:
        feed, base = taken_over(tmp_path)
        feed.submit(base + 1, enqueued(1, 5))  # taken before the old ACTIVE subscribes
        outlet = RecordingOutlet()
        feed.subscribe(outlet, KEY, resume=(7, 1234))
        assert feed.resumes == 1 and feed.in_sync  # nothing confirmed alone since
        changes = first_changes(outlet)
        assert [type(c) for c in changes] == [Enqueued] * 5  # no Reset: no snapshot
        assert feed.status()["snapshots"] == 1  # the first subscriber's, only

    asyncio.run(check())


def test_another_point_or_an_unkept_change_gets_a_snapshot(tmp_path: Path) -> None:
    async def check() -> None:
        feed, base = taken_over(tmp_path)
        outlet = RecordingOutlet()
        feed.subscribe(outlet, KEY, resume=(7, 1233))  # not where the handover was
        assert feed.resumes == 0
        assert type(first_changes(outlet)[0]) is Reset
        feed.drop("gone", cancel=False)
        # Kept for the first subscription only: the same point later is a snapshot too.
        outlet = RecordingOutlet()
        feed.subscribe(outlet, KEY, resume=(7, 1234))
        assert feed.resumes == 0 and type(first_changes(outlet)[0]) is Reset
        feed.drop("gone", cancel=False)
        # A change handed to the feed past the takeover before it began keeping: none.
        feed.submit(feed.sent_lsn + 100, enqueued(100, 1))
        feed.keep_for_resume((9, 50), base)
        outlet = RecordingOutlet()
        feed.subscribe(outlet, KEY, resume=(9, 50))
        assert feed.resumes == 0 and type(first_changes(outlet)[0]) is Reset

    asyncio.run(check())


def test_a_resume_point_needs_the_session_key() -> None:
    value = feedauth.resume_argument(KEY, 7, 1234)
    assert feedauth.parse_resume(KEY, value) == (7, 1234)
    assert feedauth.parse_resume(b"x" * 32, value) is None  # another session's key
    epoch, lsn, mac = value.split(":")
    assert feedauth.parse_resume(KEY, f"{epoch}:{int(lsn) + 1}:{mac}") is None  # altered
    for junk in (None, 7, "", "7:1234", "a:b:c", f"-1:{lsn}:{mac}", f"{'9' * 30}:{lsn}:{mac}"):
        assert feedauth.parse_resume(KEY, junk) is None
