"""The witness protocol's datagrams and what a server makes of its witnesses' answers."""

from __future__ import annotations

import pytest

from failover.witness import (
    Answer,
    BadDatagram,
    PeerSeen,
    Ping,
    WitnessView,
    encode_answer,
    encode_ping,
    parse_answer,
    parse_ping,
)
from failover.witness_net import WitnessServer

SECRET = b"witness-test-secret"


def test_a_ping_and_an_answer_go_through_signed() -> None:
    ping = Ping("a+b", "a", "ACTIVE", 3, "n1", 0.0, "boot1", 7, "c1")
    assert parse_ping(SECRET, encode_ping(SECRET, ping)) == ping
    answer = Answer("a+b", "a", "n1", 12.5, {"b": PeerSeen(0.25, "PASSIVE", 3)}, False, "c2")
    assert parse_answer(SECRET, encode_answer(SECRET, answer)) == answer


def test_datagrams_are_signed_with_a_key_derived_from_the_secret_not_the_secret() -> None:
    """A witness holds the pair's secret, but its datagrams' MAC is made with the key derived
    for the witness: neither the secret itself nor the state messages' key verifies it."""
    import hashlib
    import hmac

    from failover import keys, peer_message

    data = encode_ping(SECRET, Ping("a+b", "a", "ACTIVE", 3, "n1"))
    mac, body = data[3:35], data[35:]
    witness_key = keys.derive(SECRET, keys.WITNESS)
    assert mac == hmac.new(witness_key, b"amqha-witness\x00" + body, hashlib.sha256).digest()
    for other in (SECRET, keys.derive(SECRET, keys.PEER_MESSAGES)):
        assert mac != hmac.new(other, b"amqha-witness\x00" + body, hashlib.sha256).digest()
    assert len({witness_key, keys.derive(SECRET, keys.PEER_MESSAGES), SECRET}) == 3
    assert keys.derive(b"another secret", keys.WITNESS) != witness_key
    # State messages: signed with their own derived key, not the pair's secret.
    signed = peer_message.signature(SECRET, "t", b"{}")
    assert signed != hmac.new(SECRET, b"t\n{}", hashlib.sha256).hexdigest()


def test_a_replayed_ping_is_answered_but_never_heard() -> None:
    """A ping captured and sent again (the same one, or an older one of the same boot, or
    one of an earlier boot) never counts as hearing its sender: its age at the witness keeps
    growing while the real server is silent (a frozen ACTIVE is not vouched for)."""
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    captured = []
    challenge = ""
    for seq in range(1, 8):  # boot 1 pings, every one captured on the way
        ping = Ping("a+b", "a", "ACTIVE", 1, f"n{seq}", 0.0, "boot1", seq, challenge)
        captured.append(encode_ping(SECRET, ping))
        witness.datagram_received(captured[-1], None)
        challenge = parse_answer(SECRET, sent.datagrams[-1]).challenge
    assert witness.pings == 6  # the first only fetched a challenge
    clock.now += 5.0  # a is frozen; its pings are replayed, newest first, then all again
    for data in [*reversed(captured), *captured]:
        witness.datagram_received(data, None)
        assert not parse_answer(SECRET, sent.datagrams[-1]).counted
    assert witness.pings == 6
    assert ask(witness, sent, "b", "PASSIVE", 1).peers["a"].age == pytest.approx(5.0)
    # A restarted witness gave none of these challenges: still nothing heard.
    fresh = WitnessServer(SECRET, clock)
    fresh.transport = sent  # type: ignore[assignment]
    for data in captured:
        fresh.datagram_received(data, None)
    assert fresh.pings == 0 and fresh.seen == {}
    # The real server, on its next ping (echoing the challenge it holds), is heard again.
    ping = Ping("a+b", "a", "ACTIVE", 1, "n8", 0.0, "boot1", 8, challenge)
    witness.datagram_received(encode_ping(SECRET, ping), None)
    assert parse_answer(SECRET, sent.datagrams[-1]).counted
    assert witness.seen[("a+b", "a")][0] == clock.now


def test_a_restarted_server_is_heard_on_its_new_boot_and_its_old_pings_stay_stale() -> None:
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    old = []
    challenge = ""
    for seq in range(1, 4):
        old.append(
            encode_ping(SECRET, Ping("a+b", "a", "ACTIVE", 1, "n", 0.0, "b1", seq, challenge))
        )
        witness.datagram_received(old[-1], None)
        challenge = parse_answer(SECRET, sent.datagrams[-1]).challenge
    # The server restarts: a new boot, seq from 1, no challenge yet.
    challenge = ""
    for seq in range(1, 8):
        ping = Ping("a+b", "a", "PASSIVE", 1, "n", 0.0, "b2", seq, challenge)
        witness.datagram_received(encode_ping(SECRET, ping), None)
        challenge = parse_answer(SECRET, sent.datagrams[-1]).challenge
    heard = witness.pings
    for data in old:  # the previous boot's pings echo challenges long replaced
        witness.datagram_received(data, None)
    assert witness.pings == heard and witness.seen[("a+b", "a")][1] == "PASSIVE"


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d[:-1] + bytes([d[-1] ^ 1]),  # a body changed
        lambda d: d[:5] + bytes([d[5] ^ 1]) + d[6:],  # the MAC changed
        lambda d: b"XX1" + d[3:],  # not ours
        lambda d: d + b" " * 5000,  # too long
    ],
)
def test_a_datagram_changed_or_foreign_is_refused(mangle) -> None:
    data = encode_ping(SECRET, Ping("a+b", "a", "ACTIVE", 3, "n1"))
    with pytest.raises(BadDatagram):
        parse_ping(SECRET, mangle(data))
    with pytest.raises(BadDatagram):
        parse_ping(b"another secret", data)
    with pytest.raises(BadDatagram):
        parse_answer(SECRET, data)  # a ping is no answer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Sent:
    def __init__(self) -> None:
        self.datagrams: list[bytes] = []

    def sendto(self, data: bytes, addr: object) -> None:
        self.datagrams.append(data)


# Per server name: (seq, the challenge to echo), as a server's witness client keeps them.
_CLIENTS: dict[tuple[int, str], list] = {}


def ask(
    witness: WitnessServer, sent: Sent, name: str, state: str, epoch: int, silent_for: float = 0.0
) -> Answer:
    """A fresh ping from ``name`` (the first one of a server only fetches a challenge)."""
    client = _CLIENTS.setdefault((id(witness), name), [0, ""])
    while True:
        client[0] += 1
        ping = Ping("a+b", name, state, epoch, "n", silent_for, "boot-" + name, *client)
        witness.datagram_received(encode_ping(SECRET, ping), None)
        answer = parse_answer(SECRET, sent.datagrams[-1])
        client[1] = answer.challenge
        if answer.counted:
            return answer


def test_the_witness_answers_how_long_ago_it_heard_the_other_server() -> None:
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    first = ask(witness, sent, "a", "ACTIVE", 1)
    assert first.peers == {} and first.to == "a"  # b never heard: silent since the pair was
    clock.now += 0.5
    assert ask(witness, sent, "b", "PASSIVE", 1).peers == {"a": PeerSeen(0.5, "ACTIVE", 1)}
    clock.now += 2.0
    assert ask(witness, sent, "a", "ACTIVE", 1).peers["b"].age == pytest.approx(2.0)
    answered = len(sent.datagrams)
    witness.datagram_received(b"junk", None)
    assert witness.refused == 1 and len(sent.datagrams) == answered  # junk is never answered


def answer(age: float | None, uptime: float = 100.0, state: str = "ACTIVE", epoch: int = 1):
    peers = {} if age is None else {"b": PeerSeen(age, state, epoch)}
    return Answer("a+b", "a", "n", uptime, peers)


def test_the_view_needs_a_majority_of_fresh_answers() -> None:
    view = WitnessView(3)
    assert view.majority == 2 and not view.reachable(10.0, 1.0)
    view.heard(0, 10.0, answer(5.0), "b")
    assert not view.reachable(10.0, 1.0) and not view.peer_gone(10.0, 1.0, 1.2)
    view.heard(1, 10.0, answer(0.1), "b")  # this one still hears the peer
    assert view.reachable(10.0, 1.0) and not view.peer_gone(10.0, 1.0, 1.2)
    view.heard(2, 10.0, answer(None, uptime=3.0), "b")  # never heard it in 3 s up
    assert view.peer_gone(10.0, 1.0, 1.2)
    # Ages count on from each answer; answers older than the window do not count.
    assert not view.reachable(11.5, 1.0) and not view.peer_gone(11.5, 1.0, 1.2)


def test_the_view_sees_a_peer_that_took_over() -> None:
    view = WitnessView(1)
    view.heard(0, 10.0, answer(0.1, state="ACTIVE", epoch=4), "b")
    assert view.peer_leads_above(3, 10.0, 1.0) and not view.peer_leads_above(4, 10.0, 1.0)
    view.heard(0, 11.0, answer(0.1, state="PASSIVE", epoch=4), "b")
    assert not view.peer_leads_above(3, 11.0, 1.0)


def test_with_one_witness_the_peer_is_the_only_other_server_it_knows() -> None:
    view = WitnessView(1)
    view.heard(0, 10.0, answer(2.0), None)
    assert view.peer_gone(10.0, 1.0, 1.2)
    with pytest.raises(ValueError):
        WitnessView(0)


def test_a_server_the_witness_called_silent_is_overtaken_until_it_steps_down() -> None:
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    ask(witness, sent, "a", "ACTIVE", 1)
    ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2)
    assert not ask(witness, sent, "a", "ACTIVE", 1).overtaken  # b was told a is heard
    clock.now += 1.0
    assert not ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2).peers["a"].age >= 1.2
    clock.now += 0.5  # a silent 1.5 s at the witness: b is told so, and the witness recalls
    assert ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2).peers["a"].age >= 1.2
    assert ask(witness, sent, "a", "ACTIVE", 1).overtaken  # a must not serve on its word
    assert ask(witness, sent, "a", "ACTIVE", 1).overtaken
    assert not ask(witness, sent, "a", "PASSIVE", 2).overtaken  # a stepped down: cleared
    assert not ask(witness, sent, "a", "ACTIVE", 3).overtaken


def test_a_server_called_silent_before_the_witness_ever_heard_it_is_overtaken() -> None:
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    ask(witness, sent, "b", "PASSIVE", 1)
    clock.now += 1.5
    assert ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2).known_for >= 1.2
    assert ask(witness, sent, "a", "ACTIVE", 1).overtaken


def test_a_witness_up_long_before_the_pair_counts_silence_from_the_pairs_first_ping() -> None:
    """A witness up for minutes has not heard a primary still fetching its first challenge
    when the backup first asks: the primary has been silent for no longer than the witness
    has known the pair, so the backup is not told it is gone, nor the primary marked."""
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    clock.now += 300.0
    first = ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2)
    assert first.peers == {} and first.known_for < 1.2
    view = WitnessView(1)
    view.heard(0, clock.now, first, "a")
    assert not view.peer_gone(clock.now, 1.0, 1.2)
    assert not ask(witness, sent, "a", "ACTIVE", 1).overtaken
    clock.now += 5.0  # a silent since: the usual count
    later = ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2)
    view.heard(0, clock.now, later, "a")
    assert later.peers["a"].age >= 1.2 and view.peer_gone(clock.now, 1.0, 1.2)


async def test_a_witness_that_cannot_be_reached_is_logged_once_not_every_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    from failover.witness_net import WitnessClient

    client = WitnessClient((("no-such-host.invalid", 7000),), SECRET, "a+b", "a", print)
    with caplog.at_level("WARNING", logger="amqha.witness"):
        for _ in range(10):  # ten heartbeats, each trying to open the endpoint again
            client.ping("ACTIVE", 1, 0.0)
            for _ in range(200):  # bounded: until this heartbeat's attempt has ended
                await asyncio.sleep(0.01)
                if not client._opening:
                    break
    said = [r for r in caplog.records if "cannot reach it" in r.getMessage()]
    assert len(said) == 1 and "no-such-host.invalid:7000" in said[0].getMessage()
    assert client.endpoints == [None]
    client.close()


def test_a_peering_login_proof_holds_for_its_nonce_user_and_secret_only() -> None:
    from failover import keys

    proof = keys.peering_login_proof(SECRET, b"n" * 16, "peering")
    assert proof.startswith(keys.PROOF_PREFIX)
    assert keys.peering_login_holds(SECRET, b"n" * 16, "peering", proof)
    assert not keys.peering_login_holds(SECRET, b"m" * 16, "peering", proof)  # another nonce
    assert not keys.peering_login_holds(SECRET, b"n" * 16, "other", proof)
    assert not keys.peering_login_holds(b"another secret", b"n" * 16, "peering", proof)
    assert not keys.peering_login_holds(SECRET, b"", "peering", proof)
    assert SECRET.decode() not in proof


def test_a_restarted_server_is_not_overtaken_for_its_earlier_process() -> None:
    """A server overtaken, then restarted (a new boot): its first ping only fetches a
    challenge, and by its second it may be ACTIVE again. The mark was of its earlier
    process: the new one's first counted ping clears it. Its earlier boot, still marked,
    would not: only a step down clears that."""
    clock, sent = Clock(), Sent()
    witness = WitnessServer(SECRET, clock)
    witness.transport = sent  # type: ignore[assignment]
    ask(witness, sent, "a", "ACTIVE", 1)
    clock.now += 2.0
    assert ask(witness, sent, "b", "PASSIVE", 1, silent_for=1.2).peers["a"].age >= 1.2
    assert ask(witness, sent, "a", "ACTIVE", 1).overtaken
    echo, counted = "", None
    for seq in range(1, 4):  # the restarted process: a new boot, ACTIVE from its first ping
        ping = Ping("a+b", "a", "ACTIVE", 3, "n", 0.0, "boot-a-2", seq, echo)
        witness.datagram_received(encode_ping(SECRET, ping), None)
        answered = parse_answer(SECRET, sent.datagrams[-1])
        echo = answered.challenge
        if answered.counted:
            counted = answered
            break
    assert counted is not None and not counted.overtaken


async def test_pings_and_answers_leave_marked_as_control_traffic() -> None:
    """Both ends' sockets carry the control mark (amqha.netmark), and a ping still gets its
    answer through them."""
    import asyncio
    import socket

    from amqha.netmark import CONTROL_TOS
    from failover.witness_net import WitnessClient, open_witness

    server = await open_witness("127.0.0.1", 0, SECRET)
    port = server.get_extra_info("sockname")[1]
    answers: list[object] = []
    client = WitnessClient(
        (("127.0.0.1", port),), SECRET, "a+b", "a", lambda _, answer: answers.append(answer)
    )
    try:
        for _ in range(300):  # bounded: a ping every 10 ms until one is answered
            client.ping("ACTIVE", 1, 0.0)
            await asyncio.sleep(0.01)
            if answers:
                break
        assert answers, "the witness never answered"
        endpoint = client.endpoints[0]
        assert endpoint is not None and endpoint.transport is not None
        for transport in (server, endpoint.transport):
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == CONTROL_TOS
    finally:
        client.close()
        server.close()
