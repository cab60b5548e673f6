"""``amqha report`` on the logs a real pair wrote through a kill -9 failover and a recovery.

Two real ``amqha`` processes; the primary is killed with SIGKILL, a client's connect makes
the backup ACTIVE, the primary restarts PASSIVE, ``console recover`` hands the service
back. Then the real command line runs the Spark job on both servers' event logs.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqha.console import ConsoleClient
from tests.pairs import ADMIN, MakePair, client_vote, url_of
from tests.support import ROOT


@pytest.mark.spark(child=True)  # Spark in a child process only
async def test_report_shows_the_failover_and_the_recovery(
    make_pair: MakePair, tmp_path: Path
) -> None:
    # Peered through proxies: a proxy accepts while its server is down, so the backup has no
    # evidence of death (docs/failover.md) and loses the primary by silence, the timeout's
    # way, as this report reads it; and stopping the pair at the end is no second incident.
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.kill(pair.primary)
    assert (await client_vote([pair.backup]))["name"] == "backup"
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE")
    async with ConsoleClient(url_of(pair.backup, ADMIN)) as admin:
        assert (await admin.call("recover"))["state"] == "PASSIVE"
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.stop()

    out = tmp_path / "report"
    command = [sys.executable, "-m", "amqha", "report", "--out", str(out), "--master", "local[2]"]
    for server in pair.servers:
        command += ["--events", str(server.events_path.parent)]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # its own class archive
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads((out / "summary.json").read_text())
    assert report["bad_lines"] == 0
    (summary,) = report["pairs"].values()  # the servers name no pair: one, after them
    assert summary["pair"] == "backup+primary"
    assert sorted(summary["nodes"]) == ["backup", "primary"]
    # The kill: the backup lost the primary, then took over through the client vote.
    assert summary["incidents"]["count"] == 1
    assert summary["incidents"]["by_outcome"]["takeover"] == 1
    with open(out / "incidents" / "incidents.csv", newline="") as stream:
        (incident,) = list(csv.DictReader(stream))
    assert (incident["node"], incident["peer"], incident["trigger"]) == (
        "backup",
        "primary",
        "CLIENT_REQUEST",
    )
    detection = float(incident["detection_delay_s"])
    assert detection >= pair.timeout  # lost only once silent for a whole timeout
    assert float(incident["takeover_delay_s"]) >= 0
    # The recovery, and no dual active anywhere.
    recoveries = summary["manual_recoveries"]
    assert (recoveries["recover_commands"], recoveries["handovers"]) == (1, 1)
    # Loopback clocks are one clock: whatever the offsets' intervals, never dual active.
    assert summary["dual_active"]["max_seconds"] == 0
    assert summary["state_seconds"]["primary"]["DOWN"] > 0
    assert 0 < summary["availability"] < 1
    assert "backup lost primary" in result.stdout
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
