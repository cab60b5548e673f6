"""Maintenance (``amqha console maintenance on|off SERVER``; docs/failover.md, "Maintenance")
on a real pair: the documented patch procedure under a confirming publisher (switchover,
maintenance on, stop, restart, maintenance off, in sync, switch back) loses nothing; a
server in maintenance is never voted in (its peer killed -9) nor promoted without
``--force``, its stop raises no alarm, and every refusal says why; only administrators
may set it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import aio_pika

from amqha.client import Publisher
from tests.integration.test_dedup import message_ids
from tests.integration.test_switchover import declare, switchover
from tests.pairs import ADMIN, MakePair, poll, url_of, vote_refused
from tests.support import ROOT

QUEUE = "patch"


def console(pair: Any, *words: str, user: tuple[str, str] = ADMIN) -> subprocess.CompletedProcess:
    servers = [a for s in pair.servers for a in ("--server", url_of(s, user))]
    return subprocess.run(
        [sys.executable, "-m", "amqha", "console", *servers, "--timeout", "10", *words],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def maintenance_records(pair: Any, server: Any) -> list[tuple[str, bool, str | None]]:
    return [
        (e["server"], e["on"], e.get("by"))
        for e in pair.events(server)
        if e["event"] == "maintenance" and "result" not in e
    ]


async def publish_some(publisher: Publisher, prefix: str, count: int, confirmed: set[str]) -> None:
    futures = []
    for number in range(count):
        name = f"{prefix}-{number}"
        message = aio_pika.Message(name.encode(), message_id=name, delivery_mode=2)
        futures.append((name, await publisher.send(message, routing_key=QUEUE)))
    await publisher.flush(60)
    for message_id, future in futures:
        assert future.done() and future.exception() is None
        confirmed.add(message_id)


async def test_the_patch_procedure_loses_nothing_and_maintenance_keeps_the_server_out(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary, backup = pair.primary, pair.backup
    await pair.wait_in_sync(backup, timeout=60)
    confirmed: set[str] = set()
    urls = [primary.url, backup.url]
    async with Publisher(urls, setup=declare(QUEUE), max_pending=100) as publisher:
        await publish_some(publisher, "before", 200, confirmed)

        # Refusals, each with its reason: the ACTIVE itself, no such server, a bad word; an
        # ordinary user is not let in by any of them.
        refused = console(pair, "--json", "maintenance", "on", "primary")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "the primary is ACTIVE: hand the service to the backup first" in refused.stdout
        unknown = console(pair, "maintenance", "on", "tertiary")
        assert unknown.returncode == 1 and "no server 'tertiary'" in unknown.stderr
        usage = console(pair, "maintenance", "up", "backup")
        assert usage.returncode == 2 and "maintenance on|off SERVER" in usage.stderr
        guest = console(pair, "maintenance", "on", "backup", user=("guest", "guest"))
        assert guest.returncode == 5, guest.stdout + guest.stderr
        assert "administrator" in guest.stderr
        assert all(not maintenance_records(pair, s) for s in pair.servers)

        # 1. Switch over: the backup serves.
        await switchover(primary)
        await poll(lambda: pair.state(backup) == "ACTIVE", 30, "the backup ACTIVE")
        await publish_some(publisher, "switched", 200, confirmed)
        # 2. Maintenance on, by the primary's name; both servers know it within a heartbeat.
        on = console(pair, "maintenance", "on", primary.config["server"]["name"])
        assert on.returncode == 0, on.stdout + on.stderr
        assert "the primary is in maintenance" in on.stdout
        await poll(
            lambda: all(
                ("primary", True) in [r[:2] for r in maintenance_records(pair, s)]
                for s in pair.servers
            ),
            30,
            "both servers recording the primary in maintenance",
        )
        both = console(pair, "maintenance", "on", "backup")
        assert both.returncode == 1 and "both servers would be" in both.stderr
        # 3. Stop it: no alarm (status exits 0 and says why the pair is unprotected).
        assert primary.terminate() == 0
        status = console(pair, "--json", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        verdict = json.loads(status.stdout)["health"]
        assert verdict["code"] == "maintenance"
        assert verdict["message"].startswith("unprotected (maintenance): the primary")
        lost = [e for e in pair.events(backup) if e["event"] == "peer_lost"]
        assert lost and lost[-1]["maintenance"] is True
        await publish_some(publisher, "alone", 200, confirmed)
        # 4. Patched and restarted: still in maintenance (kept on its disk); it follows.
        primary.start()
        await poll(lambda: pair.state(primary) == "PASSIVE", 60, "the primary PASSIVE again")
        await pair.wait_in_sync(primary, timeout=60)
        # Never voted in: the backup killed -9, a client's vote at the primary is refused
        # and so is promote; the status says why.
        await vote_refused(pair, primary, backup, "in maintenance")
        promote = console(pair, "promote")
        assert promote.returncode == 1 and "in maintenance" in promote.stderr
        # The backup back: it leads (its peer is in maintenance), the primary follows.
        backup.start()
        await poll(lambda: pair.state(backup) == "ACTIVE", 60, "the backup ACTIVE again")
        await publish_some(publisher, "back", 200, confirmed)
        # 5. Maintenance off; 6. in sync, switch back.
        off = console(pair, "maintenance", "off", "primary")
        assert off.returncode == 0 and "the primary is out of maintenance" in off.stdout
        await poll(
            lambda: ("primary", False) in [r[:2] for r in maintenance_records(pair, primary)],
            30,
            "the primary out of maintenance by its own log",
        )
        active, _ = await pair.settled(timeout=60, interval=0.1)
        assert active is backup
        await switchover(backup)
        await poll(lambda: pair.state(primary) == "ACTIVE", 30, "the primary ACTIVE again")
        await publish_some(publisher, "after", 200, confirmed)
        healthy = console(pair, "status")
        await pair.settled(timeout=60, interval=0.1)
        assert healthy.returncode in (0, 4), healthy.stdout + healthy.stderr

    kept = await message_ids(primary.url, QUEUE)
    missing = confirmed - set(kept)
    assert not missing, f"{len(missing)} confirmed messages lost"
    assert pair.quarantine_files() == []
