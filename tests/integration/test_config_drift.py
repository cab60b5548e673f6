"""Configs that cannot drift unseen (docs/operations.md, "Configs that must match"): a
user missing from the backup's file is named, by key only, within two heartbeats of the
start, in the event log, console status (exit 9 and ``--json``), the management health
check, the metric and ``console config-diff``; no secret crosses; once the file is
fixed and the server restarted, every one of them says the settings match."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from typing import Any

from tests.pairs import ADMIN, MakePair, poll, url_of
from tests.support import ROOT, USERS, free_port

EXTRA = {"name": "alice", "password": "alice-secret-pw", "vhosts": ["/"], "tags": ["monitoring"]}


def console(pair: Any, *words: str) -> subprocess.CompletedProcess:
    servers = [a for s in pair.servers for a in ("--server", url_of(s, ADMIN))]
    return subprocess.run(
        [sys.executable, "-m", "amqha", "console", *servers, *words],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def drift_records(pair: Any, server: Any) -> list[list[str]]:
    return [e["keys"] for e in pair.events(server) if e["event"] == "config_drift"]


def metric(server: Any) -> str:
    port = server.config["metrics"]["listen"].rsplit(":", 1)[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return next(
            line
            for line in answer.read().decode().splitlines()
            if line.startswith("amqha_config_drift_keys ")
        )


def health(server: Any) -> int:
    port = server.config["management"]["listen"].rsplit(":", 1)[1]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/health/checks/amqha-config-match",
        headers={"Authorization": "Basic YWRtaW46YWRtaW4="},  # admin:admin
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


async def test_a_user_missing_from_one_file_is_named_until_fixed(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False)
    for server in pair.servers:
        server.config["metrics"] = {"listen": f"127.0.0.1:{free_port()}"}
        server.config["management"] = {"listen": f"127.0.0.1:{free_port()}"}
    pair.primary.config["users"] = [*USERS, EXTRA]  # the backup's file lacks alice
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    for server in pair.servers:
        await poll(lambda s=server: ["users.alice"] in drift_records(pair, s), 10, "the record")
    status = console(pair, "--json", "status")
    assert status.returncode == 9, status.stdout + status.stderr
    answer = json.loads(status.stdout)
    assert answer["health"]["code"] == "config_drift"
    assert all(s["config_drift"] == ["users.alice"] for s in answer["servers"])
    assert "alice-secret-pw" not in status.stdout
    diff = console(pair, "config-diff")
    assert diff.returncode == 9 and diff.stdout.startswith("users.alice\n"), diff.stdout
    assert "(not set)" in diff.stdout and '"monitoring"' in diff.stdout
    assert "alice-secret-pw" not in diff.stdout and "hmac:" in diff.stdout
    assert metric(pair.primary) == "amqha_config_drift_keys 1.0"
    assert health(pair.primary) == 503
    for server in pair.servers:
        for line in (server.events_path.read_text(), server.log_path.read_text()):
            assert "alice-secret-pw" not in line

    # Fixed: the backup's file gets alice too, and the backup restarts.
    pair.backup.config["users"] = [*USERS, EXTRA]
    pair.kill(pair.backup)
    pair.backup.start()
    await poll(lambda: [] in drift_records(pair, pair.primary), 30, "the drift cleared")
    await pair.settled(timeout=60)
    status = console(pair, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert console(pair, "config-diff").stdout.startswith("the ")
    # A scrape's page is up to SNAPSHOT_PERIOD (1 s) old: on a fast machine the fix can
    # land within a second of the scrape above.
    await poll(
        lambda: metric(pair.primary) == "amqha_config_drift_keys 0.0",
        10,
        "the metric at 0",
        interval=0.2,
    )
    assert health(pair.primary) == 200
