"""Which of a pair's connections leave marked as control traffic (docs/failover.md, "On a
full link"), read from the kernel's own view of each socket (``ss --tos``): both ends of
each peering link (the state messages), neither end of the replication link (bulk)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from amqha.console import ConsoleClient
from amqha.core.reserved import PEERING_PRODUCT
from amqha.netmark import CONTROL_PRIORITY, CONTROL_TOS
from tests.pairs import ADMIN, MakePair, Pair, url_of

REPLICATION_PRODUCT = "amqha replication"


def socket_marks() -> dict[tuple[str, str], tuple[int, int]]:
    """(local address, peer address) -> (TOS, priority) of each established TCP socket."""
    shown = subprocess.run(
        ["ss", "-tnH", "--tos", "state", "established"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    marks = {}
    for line in shown.splitlines():
        fields = line.split()
        found = dict(field.split(":", 1) for field in fields[4:] if ":" in field)
        marks[(fields[2], fields[3])] = (
            int(found.get("tos", "0"), 16),
            int(found.get("class_id", "0"), 16),
        )
    return marks


async def pair_links(pair: Pair) -> list[tuple[str, str, tuple[int, int], tuple[int, int]]]:
    """Each peering and replication connection both servers list, with the marks of its
    client side and of its server side: (server's address, product, client's, server's).
    A connection gone before ``ss`` looked is left out."""
    listed = []
    for server in pair.servers:
        async with ConsoleClient(url_of(server, ADMIN)) as console:
            for connection in await console.call("connections"):
                if connection["client"] in (PEERING_PRODUCT, REPLICATION_PRODUCT):
                    listed.append((server.address, connection["name"], connection["client"]))
    marks = socket_marks()
    return [
        (server_address, product, marks[(client, server_address)], marks[(server_address, client)])
        for server_address, client, product in listed
        if (client, server_address) in marks and (server_address, client) in marks
    ]


async def test_the_peer_links_leave_marked_and_the_replication_link_does_not(
    make_pair: MakePair,
) -> None:
    if shutil.which("ss") is None:
        pytest.skip("no ss (iproute2) here to read the sockets' marks")
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=60)
    await pair.wait_in_sync(pair.backup, timeout=60)
    primary, backup = pair.primary.address, pair.backup.address
    # Each server's state goes to the other over a peering link of its own; the PASSIVE
    # (the backup) follows the ACTIVE's feed over one replication link.
    expected = sorted(
        [(primary, PEERING_PRODUCT), (backup, PEERING_PRODUCT), (primary, REPLICATION_PRODUCT)]
    )
    links: list[tuple[str, str, tuple[int, int], tuple[int, int]]] = []
    for _ in range(50):  # bounded: until the three are seen once each (a link may reconnect)
        links = await pair_links(pair)
        if sorted((server, product) for server, product, _, _ in links) == expected:
            break
        await asyncio.sleep(0.2)
    assert sorted((server, product) for server, product, _, _ in links) == expected, links
    for _, product, client_side, server_side in links:
        want = (CONTROL_TOS, CONTROL_PRIORITY) if product == PEERING_PRODUCT else (0, 0)
        assert client_side == want, (product, "client side")
        assert server_side == want, (product, "server side")
