"""``amqha console`` as an admin uses it: the real command line against a real pair."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from amqha.console import ConsoleClient
from tests.pairs import ADMIN, MakePair, url_of
from tests.support import ROOT, ServerProcess


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
    queues = console(pair, "queues")
    assert queues.returncode == 0, queues.stderr
    assert f"({pair.backup.address})" in queues.stderr
    # The events of both servers: the survivor's, and a word that the other's are missing.
    events = console(pair, "events")
    assert events.returncode == 0, events.stderr
    assert "backup [" in events.stdout
    down = f"({pair.primary.address}: down: connection refused (nothing listens there);"
    assert down in events.stderr
    # A command that acts is never moved to another server: the first one named, or an error.
    stopped = console(pair, "controller", "stop")
    assert stopped.returncode == 3  # down
    assert f"{pair.primary.address}: down: connection refused" in stopped.stderr
    assert "Traceback" not in stopped.stderr


@pytest.mark.parametrize(
    ("request_body", "error"),
    [
        ({"command": "events", "args": [1]}, "'args' must be a JSON object, not list"),
        ({"command": "promote", "args": "force"}, "'args' must be a JSON object, not str"),
        ({"command": "events", "args": {"offset": 1e400}}, "OverflowError"),
        ({"command": ["status"]}, "unhashable"),
    ],
    ids=["args-list", "args-string", "offset-inf", "command-list"],
)
async def test_malformed_requests_are_answered_and_the_service_goes_on(
    broker: ServerProcess, request_body: dict, error: str
) -> None:
    url = f"amqp://admin:admin@127.0.0.1:{broker.port}/"
    async with asyncio.timeout(30), ConsoleClient(url) as client:
        answer = await client.request(json.dumps(request_body).encode())
        assert answer["ok"] is False and answer["error"].startswith("bad request: ")
        assert error in answer["error"]
        assert (await client.call("status"))["control_received"]
    assert broker.alive, broker.log()
