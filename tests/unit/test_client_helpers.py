"""amqha.client's pure helpers: Deduplicator, the failover log and its quieting of the
client libraries' records, and the arguments Publisher and Consumer refuse."""

from __future__ import annotations

import logging

import pytest
from yarl import URL

from amqha.client import (
    Consumer,
    Deduplicator,
    FailoverLog,
    Publisher,
    QuietDuringFailover,
    address_of,
)
from amqha.client.failover_log import current_failover


def test_a_message_id_is_seen_once_then_a_duplicate() -> None:
    dedupe = Deduplicator(capacity=10)
    assert not dedupe.seen("a")
    assert dedupe.seen("a") and dedupe.seen("a")
    assert "a" in dedupe and len(dedupe) == 1


def test_a_message_without_an_id_is_never_a_duplicate() -> None:
    dedupe = Deduplicator()
    assert not dedupe.seen(None) and not dedupe.seen(None)
    assert len(dedupe) == 0


def test_the_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    dedupe = Deduplicator(capacity=3)
    for message_id in "abc":
        dedupe.add(message_id)
    assert dedupe.seen("a")  # seen again: now the most recent
    dedupe.add("d")  # "b" goes, the least recent
    assert len(dedupe) == 3
    assert "b" not in dedupe and all(m in dedupe for m in "acd")
    assert not dedupe.seen("b")  # forgotten: no longer caught


@pytest.mark.parametrize("capacity", [0, -1, 1.5, "10"])
def test_a_bad_capacity_is_refused(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity must be a whole number"):
        Deduplicator(capacity)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "amqha.client" and r.levelno == level
    ]


def test_a_failover_is_one_info_line_naming_both_servers_and_the_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    failover = FailoverLog("publisher", clock=clock)
    failover.lost("127.0.0.1:5672", ConnectionResetError("reset"))
    failover.attempt_failed("127.0.0.1:5673", None, redirected_to="127.0.0.1:5672")
    failover.attempt_failed("127.0.0.1:5672", ConnectionRefusedError(111, "refused"))
    clock.now += 0.25
    failover.served("127.0.0.1:5673")
    assert lines(caplog, logging.INFO) == [
        "publisher failed over: lost 127.0.0.1:5672, 127.0.0.1:5673 serves now, "
        "after 0.250 s (2 failed attempts, 1 redirects)"
    ]
    debug = lines(caplog, logging.DEBUG)
    assert "publisher: 127.0.0.1:5673 redirected us to 127.0.0.1:5672" in debug
    assert any(d.startswith("publisher: attempt at 127.0.0.1:5672 failed") for d in debug)
    assert failover.failovers == 1 and not failover.quiet
    failover.served("127.0.0.1:5673")  # nothing open: nothing logged
    assert len(lines(caplog, logging.INFO)) == 1


def test_a_first_connect_is_no_failover(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    failover = FailoverLog("consumer", clock=Clock())
    failover.attempt_failed("127.0.0.1:5673", None, redirected_to="127.0.0.1:5672")
    failover.served("127.0.0.1:5672")
    assert lines(caplog, logging.INFO) == [] and failover.failovers == 0


def test_a_long_failover_is_warned_with_its_last_error_at_doubling_intervals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    failover = FailoverLog("connection", warn_after=10.0, clock=clock)
    failover.lost("h:1", None)
    for _ in range(50):  # an attempt every second for 50 s
        clock.now += 1.0
        failover.attempt_failed("h:2", ConnectionRefusedError(111, "refused"))
    warnings = lines(caplog, logging.WARNING)
    assert [w.split(" s since")[0] for w in warnings] == [
        "connection: no ACTIVE server for 10.0",
        "connection: no ACTIVE server for 20.0",
        "connection: no ACTIVE server for 40.0",
    ]
    assert (
        "since h:1 was lost" in warnings[0]
        and "last error h:2: ConnectionRefusedError" in (warnings[0])
    )


def record(name: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "Connection attempt failed", (), None)


def test_the_libraries_records_are_quieted_only_during_a_failover(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    quiet = QuietDuringFailover()
    failover = FailoverLog("connection", clock=Clock())
    token = current_failover.set(failover)
    try:
        assert quiet.filter(record("aio_pika.robust_connection"))  # not failing over
        failover.lost("h:1", None)
        assert not quiet.filter(record("aio_pika.robust_connection"))
        assert not quiet.filter(record("aio_pika.tools", logging.ERROR))
        assert failover.last_error == "Connection attempt failed"  # kept for the warning
        passed = [r for r in caplog.records if r.name == "amqha.client.during_failover"]
        assert len(passed) == 1 and passed[0].levelno == logging.DEBUG  # tools' record only
        failover.served("h:2")
        assert quiet.filter(record("aio_pika.tools", logging.ERROR))
    finally:
        current_failover.reset(token)
    assert quiet.filter(record("aio_pika.robust_connection"))  # no client in this context


def test_a_consumer_callbacks_error_goes_through_even_during_a_failover() -> None:
    channel_log = QuietDuringFailover(logging.WARNING)  # as on aiormq.channel
    failover = FailoverLog("connection", clock=Clock())
    failover.lost("h:1", None)
    token = current_failover.set(failover)
    try:
        assert not channel_log.filter(record("aiormq.channel", logging.WARNING))
        assert channel_log.filter(record("aiormq.channel", logging.ERROR))
    finally:
        current_failover.reset(token)


def test_addresses_are_host_and_port_with_ipv6_in_brackets() -> None:
    assert address_of(URL("amqp://u:p@127.0.0.1:5672/")) == "127.0.0.1:5672"
    assert address_of(URL("amqp://u:p@[::1]:5673/")) == "[::1]:5673"


def test_the_publisher_and_consumer_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_pending must be a whole number"):
        Publisher(["amqp://h:1/"], max_pending=0)
    with pytest.raises(ValueError, match='when_full must be "block" or "raise"'):
        Publisher(["amqp://h:1/"], when_full="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one server"):
        Publisher([])

    async def callback(message: object) -> None:
        return None

    with pytest.raises(ValueError, match="at least one server"):
        Consumer([], "q", callback)
