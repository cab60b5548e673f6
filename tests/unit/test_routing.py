"""Exchanges: topic wildcards (table and trie against the reference matcher), direct,
fanout, headers, binding idempotence and unbinding."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqha.core.routing import (
    BINDING_COST,
    ArgumentBytes,
    DirectExchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
    headers_match,
    topic_matches,
)


def no_headers() -> dict:
    return {}


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.b", "a.b.c", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.*.c", "a.b.b.c", False),
        ("*", "a", True),
        ("*", "", True),
        ("*", "a.b", False),
        ("*.*", "a.b", True),
        ("*.*", "a", False),
        ("#", "", True),
        ("#", "a", True),
        ("#", "a.b.c", True),
        ("#.#", "", True),
        ("#.#", "a.b", True),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b.a", False),
        ("#.a", "a", True),
        ("#.a", "x.y.a", True),
        ("#.a", "a.x", False),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y.c", False),
        ("a.#.b", "a.b.b", True),
        ("#.b.#", "b", True),
        ("#.b.#", "a.b.c", True),
        ("#.b.#", "a.c", False),
        ("*.#", "", True),
        ("*.#", "a.b", True),
        ("#.*", "", True),
        ("#.*.*", "a", False),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
        ("", "", True),
        ("", "a", False),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("a.#", "a.", True),
        ("a.b", "A.b", False),
        ("a*.b", "ax.b", False),
        ("a#", "a", False),
    ],
)
def test_topic_table(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected
    exchange = TopicExchange("t")
    exchange.bind("dest", pattern, {})
    assert exchange.route(key, no_headers) == (("dest",) if expected else ())


WORDS = st.sampled_from(["a", "b", "c", ""])
PATTERN_WORDS = st.sampled_from(["a", "b", "c", "", "*", "#"])
PATTERNS = st.lists(PATTERN_WORDS, min_size=1, max_size=5).map(".".join)
KEYS = st.lists(WORDS, min_size=1, max_size=6).map(".".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(PATTERNS, min_size=1, max_size=8), st.lists(KEYS, min_size=1, max_size=8))
def test_topic_trie_equals_reference(patterns: list[str], keys: list[str]) -> None:
    exchange = TopicExchange("t")
    for index, pattern in enumerate(patterns):
        exchange.bind(index, pattern, {})
    for key in keys:
        expected = {i for i, pattern in enumerate(patterns) if topic_matches(pattern, key)}
        routed = exchange.route(key, no_headers)
        assert len(routed) == len(set(routed)), "a destination is routed to at most once"
        assert set(routed) == expected
        # The cached answer is the same answer.
        assert set(exchange.route(key, no_headers)) == expected


def test_topic_cache_is_invalidated_by_bind_and_unbind() -> None:
    exchange = TopicExchange("t")
    exchange.bind("q1", "a.*", {})
    assert exchange.route("a.b", no_headers) == ("q1",)
    exchange.bind("q2", "#", {})
    assert set(exchange.route("a.b", no_headers)) == {"q1", "q2"}
    exchange.unbind("q1", "a.*", {})
    assert exchange.route("a.b", no_headers) == ("q2",)


def test_topic_cache_stays_bounded() -> None:
    exchange = TopicExchange("t")
    exchange.bind("q", "#", {})
    for number in range(TopicExchange.CACHE_LIMIT * 2 + 5):
        assert exchange.route(f"k{number}", no_headers) == ("q",)
    assert len(exchange._cache) <= TopicExchange.CACHE_LIMIT


def test_same_destination_by_two_patterns_once() -> None:
    exchange = TopicExchange("t")
    exchange.bind("q", "a.#", {})
    exchange.bind("q", "*.b", {})
    assert exchange.route("a.b", no_headers) == ("q",)


def test_direct() -> None:
    exchange = DirectExchange("d")
    exchange.bind("q1", "k", {})
    exchange.bind("q2", "k", {})
    exchange.bind("q3", "other", {})
    assert set(exchange.route("k", no_headers)) == {"q1", "q2"}
    assert exchange.route("K", no_headers) == ()
    assert exchange.route("", no_headers) == ()
    exchange.bind("q1", "", {})
    assert exchange.route("", no_headers) == ("q1",)


def test_direct_same_destination_two_arguments_once() -> None:
    exchange = DirectExchange("d")
    exchange.bind("q", "k", {})
    exchange.bind("q", "k", {"x": 1})
    assert len(exchange.bindings) == 2
    assert exchange.route("k", no_headers) == ("q",)


def test_fanout_ignores_the_key() -> None:
    exchange = FanoutExchange("f")
    assert exchange.route("anything", no_headers) == ()
    exchange.bind("q1", "a", {})
    exchange.bind("q2", "b", {})
    exchange.bind("q1", "c", {})
    assert exchange.route("zzz", no_headers) == ("q1", "q2")


@pytest.mark.parametrize(
    ("arguments", "headers", "expected"),
    [
        ({}, {}, True),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {}, False),
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1, "b": 2}, {"a": 1, "b": 3}, False),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 1, "b": 3}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 0, "b": 3}, False),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": b"any", "a": 1}, {"a": 1}, True),
        # A void (None) value matches on presence alone.
        ({"a": None}, {"a": "whatever"}, True),
        ({"a": None}, {"b": 1}, False),
        ({"x-match": "any", "a": None, "b": 2}, {"a": 0}, True),
        # x- arguments are not compared ...
        ({"x-other": 1, "a": 1}, {"a": 1}, True),
        ({"x-match": "any", "x-other": 1}, {"x-other": 1}, False),
        # ... unless the mode ends in -with-x.
        ({"x-match": "all-with-x", "x-other": 1, "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-other": 1, "a": 1}, {"a": 1, "x-other": 1}, True),
        ({"x-match": "any-with-x", "x-other": 1}, {"x-other": 1}, True),
        ({"x-match": "any-with-x", "x-other": 1}, {"x-other": 2}, False),
    ],
)
def test_headers_matching(arguments: dict, headers: dict, expected: bool) -> None:
    assert headers_match(arguments, headers) is expected
    exchange = HeadersExchange("h")
    exchange.bind("q", "ignored", arguments)
    assert exchange.route("key", lambda: headers) == (("q",) if expected else ())


def test_headers_exchange_reads_headers_only_when_it_has_bindings() -> None:
    exchange = HeadersExchange("h")
    calls = []

    def headers() -> dict:
        calls.append(1)
        return {"a": 1}

    assert exchange.route("k", headers) == ()
    assert calls == []
    exchange.bind("q1", "", {"a": 1})
    exchange.bind("q2", "", {"x-match": "any", "a": 1, "b": 1})
    exchange.bind("q3", "", {"b": 1})
    assert exchange.route("k", headers) == ("q1", "q2")


def test_headers_exchange_rejects_an_unknown_x_match() -> None:
    exchange = HeadersExchange("h")
    with pytest.raises(ValueError, match="x-match"):
        exchange.bind("q", "", {"x-match": "some"})
    assert not exchange.bindings


@pytest.mark.parametrize("kind", [DirectExchange, FanoutExchange, TopicExchange, HeadersExchange])
def test_binding_is_idempotent_and_unbind_removes_it(kind: type) -> None:
    exchange = kind("e")
    arguments = {"a": 1}
    assert exchange.bind("q", "k", arguments) is True
    assert exchange.bind("q", "k", dict(arguments)) is False
    assert len(exchange.bindings) == 1
    assert exchange.route("k", lambda: {"a": 1}) == ("q",)
    # Unbinding needs the same key and arguments.
    assert exchange.unbind("q", "k", {"a": 2}) is False
    assert exchange.unbind("q", "other", arguments) is False
    assert exchange.unbind("q", "k", arguments) is True
    assert exchange.unbind("q", "k", arguments) is False
    assert exchange.route("k", lambda: {"a": 1}) == ()


@pytest.mark.parametrize("kind", [DirectExchange, FanoutExchange, TopicExchange, HeadersExchange])
def test_unbind_destination_removes_every_binding_to_it(kind: type) -> None:
    exchange = kind("e")
    exchange.bind("q1", "k", {})
    exchange.bind("q1", "j", {})
    exchange.bind("q2", "k", {})
    assert exchange.unbind_destination("q1") == 2
    assert exchange.unbind_destination("q1") == 0
    assert exchange.route("k", no_headers) == ("q2",)


# -- the index follows each binding, and always equals one built from scratch ----------


def scratch_index(exchange: DirectExchange | FanoutExchange | TopicExchange) -> dict[str, set]:
    index: dict[str, set] = {}
    for binding in exchange.bindings.values():
        key = "" if isinstance(exchange, FanoutExchange) else binding.routing_key
        index.setdefault(key, set()).add(binding.destination)
    return index


operations = st.lists(
    st.tuples(
        st.sampled_from(["bind", "unbind", "unbind_destination"]),
        st.sampled_from(["q1", "q2", "q3"]),
        st.sampled_from(["a", "a.b", "*.b", "#", "a.#", ""]),
        st.sampled_from([{}, {"x": 1}, {"x": True}, {"x": "1"}]),
    ),
    max_size=60,
)


@pytest.mark.parametrize("kind", [DirectExchange, FanoutExchange, TopicExchange])
@given(steps=operations)
@settings(max_examples=150, deadline=None)
def test_the_index_after_binds_and_unbinds_equals_one_built_from_scratch(
    kind: type, steps: list
) -> None:
    exchange = kind("e")
    for operation, destination, key, arguments in steps:
        if operation == "bind":
            exchange.bind(destination, key, arguments)
        elif operation == "unbind":
            exchange.unbind(destination, key, arguments)
        else:
            exchange.unbind_destination(destination)
        assert exchange.index() == scratch_index(exchange)
        for routing_key in ("a", "a.b", "c.b", "", "a.b.c"):
            expected = {
                b.destination
                for b in exchange.bindings.values()
                if kind is FanoutExchange
                or (kind is DirectExchange and b.routing_key == routing_key)
                or (kind is TopicExchange and topic_matches(b.routing_key, routing_key))
            }
            assert set(exchange.route(routing_key, no_headers)) == expected
    for destination in ("q1", "q2", "q3"):
        exchange.unbind_destination(destination)
    assert exchange.index() == {} and not exchange.bindings and not exchange.by_destination


class NoWalk(dict):
    """Bindings that may be looked up and changed, never walked."""

    def _walked(self, *args: object) -> None:
        raise AssertionError("a bind or unbind walked every binding")

    values = items = keys = __iter__ = _walked  # type: ignore[assignment]


@pytest.mark.parametrize("kind", [DirectExchange, FanoutExchange, TopicExchange])
def test_a_bind_or_unbind_does_not_walk_the_other_bindings(kind: type) -> None:
    exchange = kind("e")
    queues = [f"q{index}" for index in range(1000)]
    for index, queue in enumerate(queues):
        exchange.bind(queue, f"k.{index}", {})
    exchange.bindings = NoWalk(exchange.bindings)
    assert exchange.bind("new", "k.new", {"x": 1}) is True
    assert exchange.unbind(queues[5], "k.5", {}) is True
    assert exchange.unbind_destination(queues[6]) == 1
    assert len(exchange.bindings) == 999
    assert "new" in exchange.route("k.new", no_headers)


def test_a_topic_trie_keeps_no_empty_node_after_unbinding() -> None:
    exchange = TopicExchange("e")
    exchange.bind("q", "a.b.c.d", {})
    exchange.bind("q", "a.b", {})
    exchange.unbind("q", "a.b.c.d", {})
    assert exchange.index() == {"a.b": {"q"}}
    exchange.unbind("q", "a.b", {})
    assert exchange._root.children == {}


def test_arguments_equal_in_value_but_not_in_type_are_different_bindings() -> None:
    exchange = DirectExchange("e")
    assert exchange.bind("q", "k", {"x": 1}) is True
    assert exchange.bind("q", "k", {"x": True}) is True
    assert exchange.bind("q", "k", {"x": 1.0}) is True
    assert exchange.bind("q", "k", {"x": {"y": [1, "z"]}}) is True
    assert exchange.bind("q", "k", {"x": {"y": [1, "z"]}}) is False
    assert len(exchange.bindings) == 4
    assert exchange.route("k", no_headers) == ("q",)


def test_bindings_count_their_arguments_while_they_live() -> None:
    gc.collect()  # earlier tests' garbage freed now, not between the counts below
    before = ArgumentBytes.held
    exchange = DirectExchange("e")
    exchange.bind("q", "k1", {"big": "x" * 100_000})
    exchange.bind("q", "k2", {})
    assert ArgumentBytes.held - before >= 100_000 + 2 * BINDING_COST
    exchange.unbind("q", "k1", {"big": "x" * 100_000})
    # A binding without arguments counts its own cost and its routing key.
    assert ArgumentBytes.held == before + BINDING_COST + len("k2")
    exchange.bind("q", "k3", {"big": "y" * 50_000})
    del exchange  # an exchange deleted with its bindings
    assert ArgumentBytes.held == before
