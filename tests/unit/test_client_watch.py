"""amqha.client_watch's rule, with the time passed in: when a frame is due from the server,
when a late one earns a probe, when the server is silent (docs/client.md, "A silent server")."""

from __future__ import annotations

import pytest
from yarl import URL

from amqha.client_watch import DEFAULT_HEARTBEAT, Silence, with_heartbeat


def run(rule: Silence, heard: float, owed: bool, times: list[float]) -> list[str]:
    return [rule.tick(now, heard, owed) for now in times]


def test_awaiting_a_confirm_the_server_is_silent_silent_after_past_its_last_frame() -> None:
    rule = Silence(silent_after=1.2, heartbeat=2, started=0.0)
    assert run(rule, heard=10.0, owed=True, times=[10.0, 10.5]) == ["wait", "wait"]
    assert rule.tick(10.65, 10.0, True) == "probe"  # half of silent_after late
    assert rule.tick(11.0, 10.0, True) == "wait"  # one probe at a time
    assert rule.tick(11.25, 10.0, True) == "silent"


def test_a_probe_answered_restarts_the_count() -> None:
    """A slow confirm from a server that answers is not silence."""
    rule = Silence(silent_after=1.2, heartbeat=2, started=0.0)
    rule.tick(0.0, 0.0, True)
    assert rule.tick(0.7, 0.0, True) == "probe"
    assert rule.tick(0.8, 0.75, True) == "wait"  # its answer
    assert rule.tick(1.9, 0.75, True) == "probe"
    assert rule.tick(1.95, 0.75, True) == "silent"


def test_a_request_after_a_quiet_spell_gives_the_server_silent_after_from_then() -> None:
    """Idle for 1.9 s (within the heartbeat), then a publish: the server has
    ``silent_after`` from the publish, not from its last heartbeat."""
    rule = Silence(silent_after=1.2, heartbeat=2, started=0.0)
    assert rule.tick(1.9, 0.0, False) == "wait"
    assert rule.tick(2.0, 0.0, True) == "wait"
    assert rule.tick(2.5, 0.0, True) == "wait"
    assert rule.tick(2.6, 0.0, True) == "probe"
    assert rule.tick(3.2, 0.0, True) == "silent"


def test_an_idle_connection_waits_a_heartbeat_before_the_server_is_late() -> None:
    rule = Silence(silent_after=1.2, heartbeat=2, started=0.0)
    assert run(rule, heard=0.0, owed=False, times=[1.0, 2.0, 2.5]) == ["wait"] * 3
    assert rule.tick(2.6, 0.0, False) == "probe"
    assert rule.tick(3.1, 0.0, False) == "wait"
    assert rule.tick(3.2, 0.0, False) == "silent"


def test_without_a_heartbeat_an_idle_connection_is_never_judged() -> None:
    rule = Silence(silent_after=1.2, heartbeat=0, started=0.0)
    assert run(rule, heard=0.0, owed=False, times=[10.0, 100.0, 1000.0]) == ["wait"] * 3
    assert rule.tick(1001.0, 0.0, True) == "wait"
    assert rule.tick(1002.2, 0.0, True) == "silent"


def test_the_count_starts_no_earlier_than_the_watch() -> None:
    rule = Silence(silent_after=1.2, heartbeat=2, started=50.0)
    assert run(rule, heard=0.0, owed=True, times=[50.0, 50.5]) == ["wait", "wait"]
    assert rule.tick(50.65, 0.0, True) == "probe"
    assert rule.tick(51.25, 0.0, True) == "silent"


def test_a_stall_of_the_clients_own_loop_is_not_the_servers_silence() -> None:
    """Ticks every 0.125 s, then none for 2 s: the client read and sent nothing meanwhile.
    The server gets ``silent_after`` again from the tick after the stall. (Times in
    eighths: exact in binary.)"""
    rule = Silence(silent_after=1.0, heartbeat=2, started=0.0, stall_after=0.25)
    assert run(rule, heard=0.0, owed=True, times=[0.125, 0.25]) == ["wait"] * 2
    assert rule.tick(2.25, 0.0, True) == "wait"  # 2 s late, but the client was not running
    assert rule.stalls == 1
    assert run(rule, heard=0.0, owed=True, times=[2.375, 2.5, 2.625]) == ["wait"] * 3
    assert rule.tick(2.75, 0.0, True) == "probe"
    assert rule.tick(3.125, 0.0, True) == "wait"  # 0.375 s after the last tick: a stall
    assert rule.stalls == 2
    times = [3.125 + 0.125 * n for n in range(1, 8)]  # 3.25 .. 4.0
    assert run(rule, heard=0.0, owed=True, times=times) == ["wait"] * 3 + ["probe"] + ["wait"] * 3
    assert rule.tick(4.125, 0.0, True) == "silent"  # 1 s of ticks on time, nothing heard


def test_without_stall_after_a_late_tick_counts_against_the_server() -> None:
    rule = Silence(silent_after=1.0, heartbeat=2, started=0.0)
    assert rule.tick(0.125, 0.0, True) == "wait"
    assert rule.tick(2.25, 0.0, True) == "silent"


@pytest.mark.parametrize("bad", [0, -1, "1", None, True, float("nan")])
def test_silent_after_must_be_a_positive_number(bad: object) -> None:
    with pytest.raises(ValueError, match="silent_after must be a number of seconds above 0"):
        Silence(silent_after=bad, heartbeat=2, started=0.0)  # type: ignore[arg-type]


def test_a_url_gets_the_default_heartbeat_unless_it_names_one() -> None:
    url = with_heartbeat(URL("amqp://guest:guest@127.0.0.1:5672/"), DEFAULT_HEARTBEAT)
    assert url.query["heartbeat"] == str(DEFAULT_HEARTBEAT)
    kept = with_heartbeat(URL("amqp://127.0.0.1:5672/?heartbeat=0&name=x"), DEFAULT_HEARTBEAT)
    assert kept.query["heartbeat"] == "0" and kept.query["name"] == "x"
