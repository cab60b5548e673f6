"""State messages as data from the network: every check, on values alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from failover import fsm
from failover.peer_message import (
    EPOCH_LIMIT,
    EPOCH_STEP_MAX,
    HANDOVER_TYPE,
    MAC_HEADER,
    STATE_TYPE,
    Expected,
    MalformedPeerMessage,
    encode,
    parse,
    signature,
)

SECRET = b"the-pair-secret-0123"
EXPECTED = Expected(SECRET, frozenset({"beta.example:5673"}), "beta")


def fields(**changes: Any) -> dict[str, Any]:
    base = {
        "name": "beta",
        "role": "backup",
        "state": "PASSIVE",
        "epoch": 4,
        "boot": "b1",
        "seq": 7,
        "heard": ["a1", 3],
        "ts": 1700000000.5,
        "listen": "beta.example:5673",
    }
    base.update(changes)
    return base


def parsed(kind: str = STATE_TYPE, known_epoch: int = 4, **changes: Any):
    body, kind, headers = encode(SECRET, kind, fields(**changes))
    return parse(EXPECTED, kind, body, headers, known_epoch)


def refused(kind: str, body: bytes, headers: dict[str, Any], known_epoch: int = 4) -> str:
    with pytest.raises(MalformedPeerMessage) as error:
        parse(EXPECTED, kind, body, headers, known_epoch)
    return error.value.kind


def test_a_valid_message_parses_into_the_machines_peer() -> None:
    message = parsed()
    assert message.peer == fsm.PeerInfo(
        "beta", fsm.Role.BACKUP, fsm.State.PASSIVE, 4, "beta.example:5673"
    )
    assert (message.boot, message.seq, message.ts, message.heard) == (
        "b1",
        7,
        1700000000.5,
        ("a1", 3),
    )


def test_the_signature_covers_body_and_type_and_needs_the_secret() -> None:
    body, kind, headers = encode(SECRET, STATE_TYPE, fields())
    assert refused(kind, body, {}) == "signature"
    assert refused(kind, body + b" ", headers) == "signature"
    assert refused(HANDOVER_TYPE, body, headers) == "signature"  # not replayable as a handover
    other = encode(b"another-secret-of-16", STATE_TYPE, fields())
    assert refused(kind, other[0], other[2]) == "signature"
    assert refused("amqha.peer.other", body, headers) == "type"


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({"epoch": EPOCH_LIMIT}, "epoch"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": 4 + EPOCH_STEP_MAX + 1}, "epoch_leap"),
        ({"epoch": "4"}, "field"),
        ({"epoch": True}, "field"),
        ({"listen": "attacker.example:5672"}, "listen"),
        ({"name": "mallory"}, "name"),
        ({"role": "leader"}, "field"),
        ({"state": "KING"}, "field"),
        ({"seq": -1}, "field"),
        ({"boot": None}, "field"),
        ({"maintenance": {"on": ["tertiary"], "seq": 1}}, "field"),
        ({"maintenance": {"on": [], "seq": -1}}, "field"),
        ({"maintenance": ["primary"]}, "field"),
    ],
)
def test_invalid_fields_are_refused_even_when_signed(changes: dict[str, Any], kind: str) -> None:
    body, message_type, headers = encode(SECRET, STATE_TYPE, fields(**changes))
    assert refused(message_type, body, headers) == kind


def test_the_epoch_bound_follows_the_highest_known_epoch() -> None:
    assert parsed(epoch=4 + EPOCH_STEP_MAX).peer.epoch == 4 + EPOCH_STEP_MAX
    assert parsed(epoch=EPOCH_LIMIT - 1, known_epoch=EPOCH_LIMIT - 2).peer.epoch == EPOCH_LIMIT - 1


def test_signed_garbage_is_refused() -> None:
    for body in (b"not json", b"[1, 2]", json.dumps({"name": "beta"}).encode()):
        headers = {MAC_HEADER: signature(SECRET, STATE_TYPE, body)}
        assert refused(STATE_TYPE, body, headers) in ("json", "field")


@given(st.binary(max_size=300), st.dictionaries(st.text(max_size=10), st.text(max_size=70)))
def test_arbitrary_input_is_refused_never_raised_otherwise(body: bytes, headers: dict) -> None:
    with pytest.raises(MalformedPeerMessage):
        parse(EXPECTED, STATE_TYPE, body, headers, 4)
