"""The peering links over TLS: a pair settles ACTIVE/PASSIVE and replicates; a peer not
trusted is refused.

Each server has an amqps listener that requires client certificates and its
``failover.peer`` points (through the test proxy) at the other's amqps listener only, so
the pair can hear itself only over TLS with both certificates checked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.certs import Pki
from tests.pairs import MakePair, hold


def sections(pki: Pki, trusted: Pki) -> tuple[dict[str, Any], dict[str, Any]]:
    """A server's ``tls`` (without listen) and ``failover.peer_tls``, trusting ``trusted``."""
    tls = {"cert": pki.server_cert, "key": pki.server_key, "ca": pki.ca, "client_certs": "required"}
    peer_tls = {"ca": trusted.ca, "cert": pki.client_cert, "key": pki.client_key}
    return tls, peer_tls


async def test_pair_over_tls_goes_active_passive(make_pair: MakePair, tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    pair = make_pair(peering_tls=(sections(pki, pki), sections(pki, pki))).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=20)
    for server in pair.servers:
        assert "peer_up" in [e["event"] for e in pair.events(server)]
        assert pair.log_lines(server, "link up to amqps://***@127.0.0.1:")
        assert not pair.log_lines(server, "TLS to")
    status = await pair.status(pair.backup)
    assert status["peer"]["name"] == "primary" and status["peer"]["state"] == "ACTIVE"
    # The replication link (a consuming link of its own) rides TLS as well, to in sync.
    for _ in range(200):
        follower = (await pair.status(pair.backup))["replication"].get("follower") or {}
        if follower.get("in_sync"):
            break
        await asyncio.sleep(0.05)
    assert follower.get("in_sync"), follower
    assert pair.log_lines(pair.backup, "backup->replication: link up to amqps://***@127.0.0.1:")


async def test_a_peer_whose_certificate_is_not_trusted_is_refused_and_logged(
    make_pair: MakePair, tmp_path: Path
) -> None:
    pki, rogue = Pki(tmp_path / "pki"), Pki(tmp_path / "rogue", "rogue")
    # The primary trusts only the rogue CA: the backup's certificate (from pki) is refused.
    pair = make_pair(peering_tls=(sections(pki, rogue), sections(pki, pki))).start()

    def refused_lines() -> list[str]:
        return pair.log_lines(pair.primary, "TLS to amqps://***@127.0.0.1:")

    await hold(lambda: True, 3 * pair.timeout, "retries of the refused link")
    lines = refused_lines()
    # One error line, however many times the link was retried.
    assert len(lines) == 1, lines
    assert "ERROR" in lines[0] and "certificate verify failed" in lines[0]
    assert not pair.log_lines(pair.primary, "link up to")
    # The backup never hears the primary over the refused link.
    assert "peer_up" not in [e["event"] for e in pair.events(pair.backup)]
