"""What a management request must be to change something, and JSON bodies' depth
(amqha.management.guard)."""

from __future__ import annotations

import json

import pytest

from amqha.management import guard


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "same"),
    [
        ("http://127.0.0.1:15672", "127.0.0.1:15672", "http", True),
        ("http://127.0.0.1:15672/page?x", "127.0.0.1:15672", "http", True),
        ("http://localhost", "localhost:80", "http", True),
        ("https://broker.example", "broker.example", "https", True),
        ("http://127.0.0.1:15673", "127.0.0.1:15672", "http", False),
        ("https://127.0.0.1:15672", "127.0.0.1:15672", "http", False),
        ("http://evil.example", "127.0.0.1:15672", "http", False),
        ("null", "127.0.0.1:15672", "http", False),
        ("http://[::1]:15672", "[::1]:15672", "http", True),
        ("http://host:notaport", "host:15672", "http", False),
    ],
)
def test_same_origin(origin: str, host: str, scheme: str, same: bool) -> None:
    assert guard.same_origin(origin, host, scheme) is same


def test_a_change_needs_its_own_origin_and_a_json_body() -> None:
    own = {"Host": "127.0.0.1:15672"}
    json_type = {"Content-Type": "application/json; charset=utf-8"}
    guard.check_change("GET", {**own, "Origin": "http://evil.example"}, "http")
    guard.check_change("POST", {**own, **json_type}, "http")
    guard.check_change("DELETE", own, "http")
    guard.check_change("POST", {**own, **json_type, "Origin": "http://127.0.0.1:15672"}, "http")
    for headers, status in (
        ({**json_type, "Origin": "http://evil.example"}, 403),
        ({**json_type, "Referer": "http://evil.example/form"}, 403),
        ({"Content-Type": "text/plain"}, 415),
        ({}, 415),
    ):
        with pytest.raises(guard.Forbidden) as refused:
            guard.check_change("POST", {**own, **headers}, "http")
        assert refused.value.status == status
    with pytest.raises(guard.Forbidden):
        guard.check_change("DELETE", {**own, "Origin": "http://evil.example"}, "http")


def test_json_bodies_are_read_to_a_bounded_depth() -> None:
    assert guard.loads(json.dumps({"queues": [{"arguments": {"a": [1]}}]}))["queues"]
    within = "[" * guard.MAX_DEPTH + "]" * guard.MAX_DEPTH
    assert guard.loads(within)
    for depth in (guard.MAX_DEPTH + 1, 100_000):
        with pytest.raises(ValueError, match="nested deeper"):
            guard.loads("[" * depth + "]" * depth)
    with pytest.raises(ValueError):
        guard.loads("{not json")
