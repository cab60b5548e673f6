"""``amqha console`` as an admin uses it: the real command line against a real pair."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time

import aio_pika
import pytest

from amqha.client import connect
from amqha.console import ConsoleClient
from tests.pairs import ADMIN, MakePair, url_of
from tests.support import ROOT, ServerProcess, console_in_process


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
    assert (
        "status | recover | switchover [--wait WAIT] | maintenance on|off SERVER | promote [--force]"
        " | connections" in out
    )
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


# -- bad input: a clear error, its exit status, never a traceback ------------------------


def run_console(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amqha", "console", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def bad_inputs(port: int, closed: int) -> list[tuple[list[str], int, str, str]]:
    """(arguments, exit status, JSON code, what the message says) for one server on
    ``port``; ``closed``: a port nothing listens on."""
    at = f"127.0.0.1:{port}"
    return [
        (
            ["--server", f"amqp://admin:wrong@{at}/", "status"],
            6,
            "auth_failed",
            "auth failed: the login of 'admin' was refused (wrong user name or password)",
        ),
        (
            ["--server", f"amqp://nobody:x@{at}/", "queues"],
            6,
            "auth_failed",
            "the login of 'nobody' was refused",
        ),
        (
            ["--server", f"amqp://guest:guest@{at}/", "queues"],
            5,
            "not_authorised",
            "refused: ACCESS_REFUSED - publishing to 'amq.console' needs a user tagged"
            " 'administrator'",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/novhost", "queues"],
            5,
            "access_refused",
            "refused: 'admin' may not open vhost 'novhost' (there is no such vhost",
        ),
        (
            ["--server", f"amqp://admin:admin@127.0.0.1:{closed}/", "queues"],
            3,
            "connection_refused",
            "down: connection refused (nothing listens there)",
        ),
        (
            ["--server", "amqp://admin:admin@no-such-host.invalid:5672/", "queues"],
            3,
            "name_not_resolved",
            "down: the name no-such-host.invalid does not resolve",
        ),
        (["--server", f"amqps://admin:admin@{at}/", "queues"], 3, "tls_error", "down: TLS error:"),
        (
            ["--server", f"http://{at}/", "status"],
            2,
            "usage",
            "--server: scheme 'http' is not amqp or amqps",
        ),
        (
            ["--server", "amqp://admin:admin@127.0.0.1:99999/", "status"],
            2,
            "usage",
            "Port out of range 0-65535",
        ),
        (["--server", "amqp://admin:admin@:5672/", "status"], 2, "usage", "no host"),
        (
            ["--server", "127.0.0.1:http", "status"],
            2,
            "usage",
            "the port must be a number from 1 to 65535",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "frobnicate"],
            2,
            "usage",
            "unknown command 'frobnicate'; commands: status, recover",
        ),
        (["--server", f"amqp://admin:admin@{at}/", "purge"], 2, "usage", "usage: purge QUEUE"),
        (
            ["--server", f"amqp://admin:admin@{at}/", "delete", "q", "--bogus"],
            2,
            "usage",
            "delete: unknown option '--bogus'; usage: delete QUEUE [--vhost VHOST]",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "events", "--limit", "x"],
            2,
            "usage",
            "events: --limit takes a number from 1 to 1000",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "controller", "pause"],
            2,
            "usage",
            "usage: controller stop|start",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "--timeout", "abc", "status"],
            2,
            "usage",
            "'abc' is not a valid float",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "purge", "no-such-queue"],
            1,
            "not_found",
            "NOT_FOUND - no queue 'no-such-queue' in vhost '/'",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "delete", "no-such-queue"],
            1,
            "not_found",
            "NOT_FOUND - no queue 'no-such-queue' in vhost '/'",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "close-connection", "1.2.3.4:5"],
            1,
            "not_found",
            "no connection '1.2.3.4:5'",
        ),
        (
            ["--server", f"amqp://admin:admin@{at}/", "promote"],
            1,
            "refused",
            "promote: this server runs standalone, it has no peer",
        ),
    ]


def test_every_bad_input_is_a_clear_error_with_its_exit_status_text_and_json(
    broker: ServerProcess,
) -> None:
    # A port held bound and not listening: connections to it are refused, and no other
    # process can take it meanwhile.
    # And one that listens and never answers: the console's wait is bounded.
    with socket.socket() as held, socket.socket() as silent:
        held.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        mute = silent.getsockname()[1]
        waits = [
            (
                ["--timeout", "1", "--server", f"amqp://admin:admin@127.0.0.1:{mute}/", "queues"],
                3,
                "timeout",
                "down: no answer within 1 s (timeout)",
            )
        ]
        check_bad_inputs(bad_inputs(broker.port, held.getsockname()[1]) + waits)
    assert broker.alive, broker.log()


def check_bad_inputs(cases: list[tuple[list[str], int, str, str]]) -> None:
    for number, (args, status, code, text) in enumerate(cases):
        # The first cases as an operator runs them, in a process of their own; the rest
        # in this one (the same command and output, without a Python start each).
        run = run_console if number < 3 else console_in_process
        plain = run(*args)
        assert "Traceback" not in plain.stderr + plain.stdout, (args, plain.stderr)
        assert plain.returncode == status, (args, plain.returncode, plain.stderr)
        # status prints its table, the failure in it; other commands the error alone.
        said = plain.stdout if args[-1] == "status" and status != 2 else plain.stderr
        assert text in said, (args, plain.stdout, plain.stderr)
        answer = run("--json", *args)
        assert answer.returncode == status, (args, answer.stdout, answer.stderr)
        error = json.loads(answer.stdout)
        if "health" in error:  # status: the servers and the pair's health
            error = {"ok": False, "error": error["health"]}
        assert error["ok"] is False and error["error"]["code"] == code, (args, error)
        assert text in error["error"]["message"], (args, error)


def test_host_port_is_a_shorthand_for_admin_with_the_made_password(
    broker: ServerProcess, tmp_path
) -> None:
    """HOST:PORT logs in as admin with the password under the pair's config folder (named
    in the pair file `amqha pair` writes), as the console does by default."""
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "admin.password").write_text("admin\n")
    pair_file = tmp_path / "pair.json"
    pair_file.write_text(json.dumps({"servers": [broker.address], "config_dir": str(tmp_path)}))
    name = f"shorthand-{time.monotonic_ns()}"

    async def queue(delete: bool) -> None:
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            if delete:
                await channel.queue_delete(name)
            else:
                await channel.declare_queue(name)

    asyncio.run(queue(False))  # a queue to list (the console itself makes none)
    shorthand = run_console("--pair-file", str(pair_file), "--server", broker.address, "queues")
    asyncio.run(queue(True))
    assert shorthand.returncode == 0, shorthand.stderr
    assert shorthand.stdout.splitlines()[0].split() == [
        "vhost",
        "name",
        "messages",
        "unacked",
        "consumers",
        "durable",
        "exclusive",
    ]
    # No --server: the servers in the pair file.
    default = run_console("--pair-file", str(pair_file), "status")
    assert default.returncode == 0, default.stderr
    assert f"{broker.address:24} solo       standalone ACTIVE" in default.stdout
    assert "pair: healthy" in default.stdout
    # The shorthand with no password to read says where it looked.
    (tmp_path / "local" / "admin.password").unlink()
    missing = run_console("--pair-file", str(pair_file), "--server", broker.address, "queues")
    assert missing.returncode == 2
    assert f"no {tmp_path / 'local' / 'admin.password'}" in missing.stderr


# -- a pair through a failover, as the console shows it ------------------------------------


async def admin_status(server: ServerProcess) -> dict:
    async with asyncio.timeout(30), ConsoleClient(url_of(server, ADMIN)) as client:
        return await client.call("status")


async def until_status(server: ServerProcess, check, what: str) -> dict:
    """The server's status once ``check(status)`` holds, polled at most 60 s."""
    deadline = time.monotonic() + 60
    while True:
        status = await admin_status(server)
        if check(status):
            return status
        assert time.monotonic() < deadline, f"{what}: status is {status}"
        await asyncio.sleep(0.1)


ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


async def test_status_says_a_takeover_waits_for_a_client_and_events_merge_both_logs(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    # Confirmed messages on a replicated queue: none may be missing after the kill.
    bodies = {f"m{i}".encode() for i in range(20)}
    connection = await connect([pair.primary.url], retry_for=30)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("kept", durable=True)
        for body in sorted(bodies):
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="kept",
            )
    await until_status(
        pair.primary,
        lambda s: s["replication"]["feed"]["state"] == "in_sync",
        "the primary's feed in sync",
    )
    healthy = console(pair, "status")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.splitlines()[-1] == "pair: healthy: one ACTIVE, its PASSIVE in sync"

    pair.kill(pair.primary)
    await until_status(pair.backup, lambda s: s.get("takeover"), "the backup waiting for a vote")
    waiting = console(pair, "status")
    assert waiting.returncode == 3, waiting.stdout  # down
    lines = waiting.stdout.splitlines()
    assert f"{pair.primary.address:24} down: connection refused (nothing listens there)" in lines
    backup_row = next(line for line in lines if line.startswith(pair.backup.address))
    assert backup_row.split()[1:5] == ["backup", "backup", "PASSIVE", "1"]
    assert "primary ACTIVE (lost)" in backup_row
    assert (
        f"{'':24} backup: takeover waits for a client: the peer is lost, and the next client to"
        " connect votes this server ACTIVE (the client vote)"
    ) in lines
    as_json = json.loads(console(pair, "--json", "status").stdout)
    backup = next(s for s in as_json["servers"] if s["server"] == pair.backup.address)
    assert backup["takeover"].startswith("takeover waits for a client")
    assert as_json["health"]["code"] == "connection_refused"

    # A client's vote: the backup takes over, with every confirmed message.
    connection = await connect([pair.backup.url], retry_for=30)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("kept", durable=True, passive=True)
        got = set()
        for _ in range(len(bodies)):
            message = await queue.get(no_ack=True, fail=False, timeout=30)
            if message is None:
                break
            got.add(message.body)
    assert got == bodies, f"missing after the takeover: {sorted(bodies - got)}"
    taken = console(pair, "status")
    backup_row = next(
        line for line in taken.stdout.splitlines() if line.startswith(pair.backup.address)
    )
    assert backup_row.split()[3:5] == ["ACTIVE", "2"]
    assert "takeover waits" not in taken.stdout

    # The restarted primary comes back PASSIVE; events show both logs, in time order.
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=60)
    events = console(pair, "events", "--limit", "200")
    assert events.returncode == 0, events.stderr
    lines = events.stdout.splitlines()
    assert lines and all(ISO.match(line) for line in lines), lines
    assert [line[:24] for line in lines] == sorted(line[:24] for line in lines)
    assert "None" not in events.stdout
    takeover = [
        line for line in lines if " backup [ACTIVE e2] transition from=PASSIVE to=ACTIVE" in line
    ]
    restarted = [
        line for line in lines if " primary [PASSIVE e2] transition from=PRIMARY to=PASSIVE" in line
    ]
    assert takeover and restarted, events.stdout
    assert lines.index(takeover[0]) < lines.index(restarted[-1])
    assert any(line.split()[1] == "primary" for line in lines[: lines.index(takeover[0])])


# -- the privileged commands: administrators only, on the control plane only ---------------


def as_user(
    pair, user: tuple[str, str], *words: str, vhost: str = ""
) -> subprocess.CompletedProcess:
    urls = [f"amqp://{user[0]}:{user[1]}@{s.address}/{vhost}" for s in pair.servers]
    return run_console(*(a for url in urls for a in ("--server", url)), *words)


async def queue_depth(server: ServerProcess, name: str) -> int | None:
    """Messages ready in queue ``name`` as the server's console lists it (None: no queue)."""
    async with asyncio.timeout(30), ConsoleClient(url_of(server, ADMIN)) as client:
        rows = await client.call("queues")
    return next((row["messages"] for row in rows if row["name"] == name), None)


async def test_only_administrators_purge_delete_and_close_and_only_through_the_console(
    make_pair: MakePair,
) -> None:
    pair = make_pair(proxied=False).start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    client = await connect([pair.primary.url], retry_for=30)
    closed = asyncio.get_running_loop().create_future()

    async def on_close(_: object, error: BaseException | None) -> None:
        if not closed.done():
            closed.set_result(error)

    async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        return None

    client.close_callbacks.add(on_close)
    channel = await client.channel(publisher_confirms=True)
    queue = await channel.declare_queue("work", durable=True)
    await queue.bind("amq.direct", "jobs")
    for index in range(3):
        await channel.default_exchange.publish(
            aio_pika.Message(b"job %d" % index, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="work",
        )
    rows = json.loads(console(pair, "--json", "connections").stdout)
    name = next(row["name"] for row in rows if row["user"] == "guest")

    # guest, an ordinary user of another vhost, and the pair's own peering login: refused
    # by the channel before any request reaches the console (403 on amq.console).
    others = [
        (("guest", "guest"), ""),
        (("limited", "limited"), "other"),
        (("peering", "peering"), ""),
    ]
    for user, vhost in others:
        for words in (["purge", "work"], ["delete", "work"], ["close-connection", name]):
            refused = as_user(pair, user, *words, vhost=vhost)
            assert refused.returncode == 5, (user, words, refused.stderr)
            assert (
                "refused: ACCESS_REFUSED - publishing to 'amq.console' needs a user tagged"
                " 'administrator'"
            ) in refused.stderr, refused.stderr
    assert await queue_depth(pair.primary, "work") == 3
    assert not closed.done()
    status = await admin_status(pair.primary)
    assert set(status["control_received"]["amq.console"]) == {"admin"}

    # The listings an administrator reads.
    exchanges = console(pair, "exchanges")
    assert exchanges.returncode == 0, exchanges.stderr
    assert any(
        line.split()[:3] == ["/", "amq.direct", "direct"] for line in exchanges.stdout.splitlines()
    )
    # The pair's own control exchanges are not the user's objects.
    names = {line.split()[1] for line in exchanges.stdout.splitlines()[1:] if line.split()}
    assert not names & {"amq.peer", "amq.console"}, names
    bindings = console(pair, "bindings")
    assert bindings.stdout.splitlines()[0].split() == [
        "vhost",
        "source",
        "destination",
        "destination_type",
        "routing_key",
        "arguments",
    ]
    assert ["/", "amq.direct", "work", "queue", "jobs"] in [
        line.split() for line in bindings.stdout.splitlines()
    ]

    # Queues change on the ACTIVE only: the PASSIVE named alone refuses.
    passive = run_console("--server", url_of(pair.backup, ADMIN), "purge", "work")
    assert passive.returncode == 1
    assert (
        "error: purge refused: this server is PASSIVE; ask the ACTIVE one (the ACTIVE: "
        f"{pair.primary.address})" in passive.stderr
    ), passive.stderr
    purged = console(pair, "purge", "work")
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout == f"purged 3 messages from queue 'work' on {pair.primary.address}\n"
    deadline = time.monotonic() + 60
    while await queue_depth(pair.backup, "work") != 0:  # replicated like a client's purge
        assert time.monotonic() < deadline, "the backup's copy of 'work' was not purged"
        await asyncio.sleep(0.1)
    in_use = await channel.declare_queue("busy", durable=True)
    await in_use.consume(ignore)
    busy = console(pair, "delete", "busy", "--if-unused")
    assert busy.returncode == 1
    assert "error: PRECONDITION_FAILED - queue 'busy' in use" in busy.stderr
    deleted = console(pair, "--json", "delete", "work", "--if-empty")
    assert deleted.returncode == 0, deleted.stdout
    assert json.loads(deleted.stdout)["result"] == {
        "queue": "work",
        "vhost": "/",
        "deleted": True,
        "messages": 0,
    }
    assert await queue_depth(pair.primary, "work") is None

    closing = console(pair, "close-connection", name, "--reason", "maintenance window")
    assert closing.returncode == 0, closing.stderr
    assert closing.stdout == f"closed connection {name} on {pair.primary.address}\n"
    async with asyncio.timeout(30):
        error = await closed
    assert "CONNECTION_FORCED - maintenance window" in str(error)
    # The pair's own link is never closed from the console.
    rows = json.loads(console(pair, "--json", "connections").stdout)
    link = next(row["name"] for row in rows if row["user"] == "peering")
    kept = console(pair, "close-connection", link)
    assert kept.returncode == 1
    assert f"'{link}' is the pair's own peering link" in kept.stderr
    assert pair.primary.alive and pair.backup.alive
