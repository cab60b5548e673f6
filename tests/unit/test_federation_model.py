"""The federation link's pure rules (amqha/federation/model.py), with known answers."""

from __future__ import annotations

import random

from amqha.federation import model
from amqha.federation.model import UpstreamBinding

PATH = "x-amqha-path"


def test_equal_local_bindings_make_one_upstream_binding_counted() -> None:
    local = [
        ("eu.#", {}),
        ("eu.#", {}),
        ("us.#", {"a": 1, "b": "x"}),
        ("us.#", {"b": "x", "a": 1}),  # the same table, another order
        ("us.#", {"a": True, "b": "x"}),  # True is not 1
    ]
    wanted = model.desired(local, "london", "central", 1)
    assert sorted(wanted.counts.values()) == [1, 2, 2]
    assert len(wanted.bindings) == 3
    first = wanted.bindings[UpstreamBinding("eu.#", {PATH: ["london"]}).key]
    assert first.arguments == {PATH: ["london"]}
    assert wanted.refused == {}


def test_a_binding_carries_its_path_and_is_refused_round_a_loop_or_past_max_hops() -> None:
    # A buffer queue of paris (downstream of london) bound with paris's path.
    from_paris = ("eu.#", {PATH: ["paris"]})
    # Back to paris: a loop.
    assert model.upstream_binding(*from_paris, "london", "paris", 5) == "loop"
    # On to central: two hops, one allowed.
    assert model.upstream_binding(*from_paris, "london", "central", 1) == "max_hops"
    made = model.upstream_binding(*from_paris, "london", "central", 2)
    assert made == UpstreamBinding("eu.#", {PATH: ["paris", "london"]})
    wanted = model.desired([from_paris, ("a", {})], "london", "paris", 5)
    assert wanted.refused == {"loop": 1} and len(wanted.bindings) == 1


def test_repairs_bind_what_is_missing_and_unbind_what_is_surplus() -> None:
    a = UpstreamBinding("a", {PATH: ["london"]})
    b = UpstreamBinding("b", {PATH: ["london"]})
    c = UpstreamBinding("c", {PATH: ["london"]})
    wanted = {a.key: a, b.key: b}
    assert model.repairs(wanted, [b, c]) == ([a], [c])
    assert model.repairs(wanted, [a, b]) == ([], [])
    assert model.repairs({}, []) == ([], [])
    # Arguments as they come back from the upstream (a list, another key order) still match.
    back = UpstreamBinding("a", {PATH: ("london",)})
    assert model.repairs({a.key: a}, [back]) == ([], [])


def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() -> None:
    rng = random.Random(7)
    for attempts, step in [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (7, 5.0), (500, 5.0)]:
        for _ in range(50):
            delay = model.backoff(attempts, 0.1, 5.0, rng)
            assert step / 2 <= delay <= step
    assert model.backoff(3, 0.1, 5.0, random.Random(1)) == model.backoff(
        3, 0.1, 5.0, random.Random(1)
    )


def test_link_state_failures_count_attempts_and_running_resets_them() -> None:
    state = model.LinkState()
    assert (state.state, state.attempts) == ("connecting", 0)
    state.failed("access refused", 10.0)
    state.connecting(11.0)
    assert (state.state, state.reason, state.attempts) == ("connecting", "access refused", 1)
    state.failed("access refused", 12.0)
    assert (state.state, state.reason, state.since, state.attempts) == (
        "failed",
        "access refused",
        12.0,
        2,
    )
    state.failed("access refused", 13.0)
    assert state.since == 12.0 and state.attempts == 3  # the same failure since 12
    state.failed("exchange not found upstream", 14.0)
    assert state.since == 14.0 and state.attempts == 4
    state.running(15.0)
    assert (state.state, state.reason, state.since, state.attempts) == ("running", None, 15.0, 0)


def test_a_link_is_stalled_with_no_probe_back_in_three_intervals() -> None:
    probes = model.Probes(interval=1.0)
    running = model.LinkState()
    running.running(100.0)
    probes.up(100.0)
    assert model.shown_state(running, probes, 103.0) == "running"
    assert model.shown_state(running, probes, 103.5) == "stalled"
    probes.came_back(103.2)
    assert model.shown_state(running, probes, 106.0) == "running"
    assert model.shown_state(running, probes, 106.3) == "stalled"
    assert probes.back == 1
    failed = model.LinkState()
    failed.failed("x", 100.0)
    assert model.shown_state(failed, probes, 1000.0) == "failed"


def test_counters() -> None:
    counters = model.Counters()
    counters.taken(5.0, redelivered=False)
    counters.taken(6.0, redelivered=True)
    counters.drop("loop")
    counters.drop("loop")
    counters.drop("max_hops")
    assert (counters.received, counters.duplicates, counters.last_message) == (2, 1, 6.0)
    assert counters.dropped == {"loop": 2, "max_hops": 1}


def test_a_message_path_grows_by_the_upstream_and_is_checked_against_this_server() -> None:
    assert model.message_crossing({}, "central", "london", 1) == (["central"], None)
    assert model.message_crossing(None, "central", "london", 1) == (["central"], None)
    assert model.message_crossing({PATH: ["london"]}, "central", "london", 5) == (
        ["london", "central"],
        "loop",
    )
    assert model.message_crossing({PATH: [b"paris"]}, "central", "london", 1) == (
        ["paris", "central"],
        "max_hops",
    )


def test_a_buffer_queue_name_is_one_every_client_library_accepts() -> None:
    from pamqp import commands

    from amqha.core import names

    name = names.buffer_queue_name("market.eu", "central", "backup+primary")
    commands.Queue.Declare(queue=name, durable=True)  # pamqp validates the name here
    commands.Queue.Bind(queue=name, exchange="market.eu", routing_key="#")


def test_a_probe_binding_is_never_passed_on() -> None:
    probe = {"x-match": "all", model.PROBE_HEADER: "amqha.probe.paris.x"}
    wanted = model.desired(
        [("amqha.probe.paris.x", probe), ("k.#", {})], "london", "central", max_hops=2
    )
    assert [b.routing_key for b in wanted.bindings.values()] == ["k.#"]
    assert wanted.refused == {}
