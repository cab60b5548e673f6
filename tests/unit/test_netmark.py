"""amqha.netmark: the pair's control traffic marked ahead of bulk traffic, on real sockets
(docs/failover.md, "On a full link")."""

from __future__ import annotations

import socket

import pytest

from amqha.netmark import CONTROL_PRIORITY, CONTROL_TOS, mark_control


def _priority(sock: socket.socket) -> int | None:
    if not hasattr(socket, "SO_PRIORITY"):
        return None
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY)


@pytest.mark.parametrize("kind", [socket.SOCK_DGRAM, socket.SOCK_STREAM])
def test_an_ipv4_socket_is_marked_network_control_and_interactive(kind: int) -> None:
    with socket.socket(socket.AF_INET, kind) as sock:
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 0
        assert mark_control(sock) is None
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == CONTROL_TOS == 0xC0
        # Set after the TOS, whose setting would otherwise leave the priority at 0.
        assert _priority(sock) in (None, CONTROL_PRIORITY)


def test_an_ipv6_socket_is_marked_in_its_traffic_class() -> None:
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    except OSError as error:
        pytest.skip(f"no IPv6 here: {error}")
    with sock:
        assert mark_control(sock) is None
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS) == CONTROL_TOS
        assert _priority(sock) in (None, CONTROL_PRIORITY)


def test_a_socket_that_is_not_ip_is_left_as_it_is_and_says_why() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        assert mark_control(sock) == "not an IP socket (AF_UNIX)"
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.close()
    problem = mark_control(sock)
    assert problem is not None and problem.startswith("cannot mark the socket")


def test_the_marked_datagram_leaves_with_its_mark() -> None:
    """What the kernel puts on the wire: the receiver reads the sender's TOS byte."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        receiver.bind(("127.0.0.1", 0))
        receiver.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        receiver.settimeout(5)
        assert mark_control(sender) is None
        sender.sendto(b"ping", receiver.getsockname())
        data, ancillary, _, _ = receiver.recvmsg(16, socket.CMSG_SPACE(1))
        assert data == b"ping"
        tos = [d for level, kind, d in ancillary if kind == socket.IP_TOS]
        assert tos and tos[0][0] == CONTROL_TOS
