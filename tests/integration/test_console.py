"""``amqha console`` as an admin uses it: the real command line against a real pair."""

from __future__ import annotations

import subprocess
import sys

from tests.pairs import ADMIN, MakePair, url_of
from tests.support import ROOT


def console(pair, *words: str, stdin: str | None = None, user=ADMIN) -> subprocess.CompletedProcess:
    servers = [a for s in pair.servers for a in ("--server", url_of(s, user))]
    return subprocess.run(
        [sys.executable, "-m", "amqha", "console", *servers, *words],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def test_interactive_prompt_runs_commands_until_quit(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    result = console(pair, stdin="help\nstatus\nqueues\nnonsense\nevents\nquit\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("amqha> ") >= 6  # one prompt per line read
    assert "status | recover | promote [--force] | connections" in out  # help
    rows = [line.split() for line in out.splitlines() if line.startswith("127.0.0.1:")]
    states = {row[1]: row[3] for row in rows if len(row) > 3}
    assert states == {"primary": "ACTIVE", "backup": "PASSIVE"}
    assert "unknown command 'nonsense'" in result.stderr  # an error, and the prompt goes on
    assert "transition from=PRIMARY to=ACTIVE" in out  # events, formatted


async def test_console_commands_and_refusals(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    status = console(pair, "--json", "status")
    assert status.returncode == 0 and '"state": "ACTIVE"' in status.stdout
    # Recover needs the backup ACTIVE: refused with the pair's state, exit status 1.
    refused = console(pair, "recover")
    assert refused.returncode == 1
    assert "recover needs the backup ACTIVE" in refused.stderr
    # Not an administrator: the server refuses, and the table says so.
    guest = console(pair, "status", user=("guest", "guest"))
    assert "ACCESS_REFUSED" in guest.stdout
    assert pair.primary.alive and pair.backup.alive


async def test_commands_with_a_server_down_read_the_other_or_say_so(make_pair: MakePair) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    pair.kill(pair.primary)
    # A read goes to the first server that answers, and says which.
    events = console(pair, "events")
    assert events.returncode == 0, events.stderr
    assert f"({pair.backup.address})" in events.stderr
    assert "backup [" in events.stdout
    # A command that acts is never moved to another server: the first one named, or an error.
    stopped = console(pair, "controller", "stop")
    assert stopped.returncode == 1
    assert f"{pair.primary.address}: down" in stopped.stderr
    assert "Traceback" not in stopped.stderr
