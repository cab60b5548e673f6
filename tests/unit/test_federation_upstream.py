"""The upstream's registry of linked names and its orphan watch (pure parts of
amqha/federation/upstream.py; docs/federation.md, "Duplicate names")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from amqha.core import names
from amqha.federation.upstream import CLAIM_HOLD, Link, OrphanWatch, Registry


def link(name: str, id_: str, server: str, exchange: str = "x", connection: Any = None) -> Link:
    connection = connection or SimpleNamespace(peer="127.0.0.1:1", user=SimpleNamespace(name="e"))
    return Link(name, id_, server, exchange, "/", connection, 0.0)


def test_a_hello_with_the_upstreams_own_name_is_a_link_to_itself() -> None:
    registry = Registry("central")
    kind, text, closed = registry.hello(link("central", "a" * 16, "s1"))
    assert kind == "self_link" and text is not None and text.startswith("link to itself: ")
    assert closed == [] and registry.links == {}


def test_a_name_linked_from_another_place_is_refused_and_the_first_link_kept() -> None:
    registry = Registry("central")
    first = link("london", "1111111111111111", "s1")
    assert registry.hello(first) == (None, None, [])
    kind, text, closed = registry.hello(link("london", "2222222222222222", "s9"))
    assert kind == "duplicate_name" and closed == []
    assert text is not None and text.startswith("duplicate name: 'london' is claimed here")
    assert "1111111111111111" not in text  # nothing of the holder's is disclosed
    assert registry.links["london"] == [first]


def test_several_links_of_one_server_live_side_by_side() -> None:
    registry = Registry("central")
    market = link("london", "1" * 16, "s1", "market")
    rpc = link("london", "1" * 16, "s1", "rpc")
    assert registry.hello(market)[2] == [] and registry.hello(rpc)[2] == []
    assert registry.links["london"] == [market, rpc]


def test_the_pairs_other_server_replaces_the_old_actives_links() -> None:
    registry = Registry("central")
    old_market = link("london", "1" * 16, "s1", "market")
    old_rpc = link("london", "1" * 16, "s1", "rpc")
    registry.hello(old_market)
    registry.hello(old_rpc)
    new = link("london", "1" * 16, "s2", "market")
    kind, _, closed = registry.hello(new)
    assert kind is None and closed == [old_market, old_rpc]
    assert registry.links["london"] == [new]


def test_a_reconnected_link_replaces_its_own_older_connection() -> None:
    registry = Registry("central")
    old = link("london", "1" * 16, "s1", "market")
    registry.hello(old)
    again = link("london", "1" * 16, "s1", "market")
    assert registry.hello(again)[2] == [old]
    # The same connection saying hello again replaces nothing.
    same = link("london", "1" * 16, "s1", "market", connection=again.connection)
    assert registry.hello(same)[2] == [] and registry.links["london"] == [same]


def test_links_go_with_their_connection_and_the_name_is_held_for_a_while() -> None:
    """A name with no link stays its place's for CLAIM_HOLD: a link reconnecting finds it,
    another place does not get it meanwhile; after that it is free."""
    registry = Registry("central")
    first = link("london", "1" * 16, "s1")
    registry.hello(first, now=100.0)
    assert registry.forget(first.connection, now=200.0) == [first]
    assert registry.links == {}
    assert registry.hello(link("london", "2" * 16, "s9"), now=200.0 + CLAIM_HOLD - 1)[0] == (
        "duplicate_name"
    )
    assert registry.hello(link("london", "1" * 16, "s2"), now=200.0 + CLAIM_HOLD - 1)[0] is None
    again = registry.links["london"][0]
    registry.forget(again.connection, now=300.0)
    assert registry.hello(link("london", "2" * 16, "s9"), now=300.0 + CLAIM_HOLD)[0] is None


def test_a_buffer_queue_belongs_to_the_connection_linked_for_its_downstream() -> None:
    registry = Registry("central")
    first = link("london", "1" * 16, "s1", "market")
    registry.hello(first)
    assert registry.linked_for(first.connection, "london", "market", "/")
    assert not registry.linked_for(first.connection, "london", "rpc", "/")
    assert not registry.linked_for(first.connection, "paris", "market", "/")
    assert not registry.linked_for(object(), "london", "market", "/")
    assert names.parse_buffer_queue(names.buffer_queue_name("market", "central", "london")) == (
        "market",
        "central",
        "london",
    )
    for bad in ("federation: market to central", "federation: a b c d", "x", "federation: "):
        assert names.parse_buffer_queue(bad) is None


def test_a_claim_key_is_per_upstream_and_its_token_proves_nothing_shown() -> None:
    key = names.claim_key("place-secret", "central")
    assert key != names.claim_key("place-secret", "elsewhere")
    assert key != names.claim_key("another-place", "central")
    token = names.claim_token(key)
    assert token != key and names.claim_token(token) != token


def test_an_orphan_is_reported_once_after_the_delay_and_forgotten_with_a_consumer() -> None:
    watch = OrphanWatch(after=60)
    queue = SimpleNamespace(name="federation: x central to london", consumer_count=0)
    found = [("/", queue)]
    assert watch.sweep(found, 1000) == []
    assert watch.sweep(found, 1059) == [] and not watch.is_orphan("/", queue.name)
    assert watch.sweep(found, 1060) == [("/", queue.name)]
    assert watch.is_orphan("/", queue.name)
    assert watch.sweep(found, 2000) == []  # logged once
    queue.consumer_count = 1
    assert watch.sweep(found, 2001) == [] and not watch.is_orphan("/", queue.name)
    queue.consumer_count = 0
    assert watch.sweep(found, 2002) == []  # idle again: the delay starts over
    assert watch.sweep(found, 2062) == [("/", queue.name)]
    assert watch.sweep([], 2063) == [] and not watch.orphans and not watch.idle_since
