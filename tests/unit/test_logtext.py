"""amqha.logtext: client-chosen text in a log line stays on that line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqha.logtext import escaped


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", "orders"),
        ("q\nforged", "q\\nforged"),
        ("a\r\nb\tc", "a\\r\\nb\\tc"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("line\u2028sep\x85", "line\\u2028sep\\x85"),
        ("очередь 'q' \\n", "очередь 'q' \\n"),
        (None, "None"),
    ],
)
def test_escaped(text: object, expected: str) -> None:
    assert escaped(text) == expected


@given(st.text())
def test_escaped_text_is_one_printable_line(text: str) -> None:
    result = escaped(text)
    assert result.isprintable()
    assert len(result.splitlines()) <= 1
    if text.isprintable():
        assert result == text
