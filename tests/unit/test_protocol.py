"""The pair's protocol version (amqha/core/protocol.py): what a peer's number means, what is
spoken to it, and how a state message carries it."""

from __future__ import annotations

import pytest

from amqha.core import protocol
from failover.peer_message import STATE_TYPE, MalformedPeerMessage, encode, parse
from tests.unit.test_peer_message import EXPECTED, SECRET, fields


def test_the_lower_of_the_two_is_spoken() -> None:
    assert protocol.parse(None) == protocol.OLDEST == 1  # the previous release sends none
    assert protocol.spoken(1) == 1
    assert protocol.spoken(protocol.PROTOCOL) == protocol.PROTOCOL
    assert protocol.spoken(protocol.PROTOCOL + 5) == protocol.PROTOCOL  # a newer peer
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ValueError, match="protocol"):
            protocol.parse(bad)


def test_a_state_message_carries_it_and_a_bad_one_is_refused() -> None:
    body, kind, headers = encode(SECRET, STATE_TYPE, fields(protocol=protocol.PROTOCOL))
    assert parse(EXPECTED, kind, body, headers, 4).protocol == protocol.PROTOCOL
    body, kind, headers = encode(SECRET, STATE_TYPE, fields())
    assert parse(EXPECTED, kind, body, headers, 4).protocol == 1
    body, kind, headers = encode(SECRET, STATE_TYPE, fields(protocol="two"))
    with pytest.raises(MalformedPeerMessage, match="field 'protocol'"):
        parse(EXPECTED, kind, body, headers, 4)
