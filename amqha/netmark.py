"""The pair's own traffic marked ahead of bulk traffic (docs/failover.md, "On a full link").

What the failover rules read (a server's state messages to its peer, its pings to the
witness and the witness's answers) is a few hundred bytes a heartbeat; what else leaves
a server (deliveries to clients, runs to the PASSIVE, a catch-up) is bulk. On a link
that fills, a queue in front of it holds whatever comes after the bulk, and a heartbeat
late by the failover timeout reads as a server gone: an ACTIVE that lost its peer and
then hears its witness too late fences itself. Marked as network control (DSCP CS6)
and with the socket priority of interactive traffic (6: the first band of Linux's
``pfifo_fast`` and ``prio`` queueing disciplines), that traffic passes the bulk wherever
a queue honours either mark; where none does, the marks change nothing.

Must not know: what the socket carries, the pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

CONTROL_DSCP = 48  # CS6, "network control"
CONTROL_TOS = CONTROL_DSCP << 2  # the DSCP in the TOS / traffic class byte, ECN bits clear
CONTROL_PRIORITY = 6  # TC_PRIO_INTERACTIVE: the highest priority a process sets unprivileged


def mark_control(sock: socket.socket) -> str | None:
    """Mark ``sock``'s packets as the pair's control traffic: None, or why a mark could not
    be set (the socket works as before, unmarked)."""
    family = sock.family
    try:
        if family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, CONTROL_TOS)
        elif family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, CONTROL_TOS)
            # An IPv4 peer reached through this socket (a mapped address) reads IP_TOS.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, CONTROL_TOS)
        else:
            return f"not an IP socket ({socket.AddressFamily(family).name})"
        # Linux only; after the TOS, whose setting resets the priority from the TOS bits.
        if hasattr(socket, "SO_PRIORITY"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, CONTROL_PRIORITY)
    except OSError as error:
        return f"cannot mark the socket as control traffic: {error}"
    return None


def mark_transport(transport: asyncio.BaseTransport) -> str | None:
    """``mark_control`` on the socket under an asyncio transport (TCP, TLS or datagrams)."""
    sock = transport.get_extra_info("socket")
    return "no socket to mark" if sock is None else mark_control(sock)
