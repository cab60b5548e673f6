"""What `amqha console status` says about replication, read as an operator reads it."""

from __future__ import annotations

from amqha.console_text import replication_text


def feed(**values: object) -> dict[str, object]:
    return {"replication": {"enabled": True, "leading": True, "feed": values}}


def follower(**values: object) -> dict[str, object]:
    return {"replication": {"enabled": True, "leading": False, "follower": values}}


def test_each_phase_of_the_in_sync_rule_reads_as_what_it_is() -> None:
    assert replication_text(feed(state="none", phase="none")) == "unprotected"
    assert (
        replication_text(feed(state="catching_up", phase="snapshot", lag_changes=120))
        == "catching up (lag 120)"
    )
    assert (
        replication_text(feed(state="catching_up", phase="closing", sync_lsn=4711))
        == "catching up (snapshot acked, in sync at LSN 4711)"
    )
    assert replication_text(feed(state="in_sync", phase="in_sync")) == "in sync"
    assert replication_text(follower(state="in_sync", in_sync=True)) == "following, in sync"
    assert (
        replication_text(follower(state="closing", in_sync=False))
        == "following, snapshot on disk, not yet in sync"
    )
    assert (
        replication_text(follower(state="in_sync", in_sync=True, unapplied_runs=412))
        == "following, in sync, 412 runs to apply"
    )
    assert (
        replication_text(follower(state="catching_up", in_sync=False)) == "following, catching up"
    )
    assert replication_text({"replication": {"enabled": False}}) == "off"
