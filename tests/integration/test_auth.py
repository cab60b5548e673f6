"""Logins on a real broker: hashed passwords, guest on loopback, failed logins slowed and logged.

Users with a ``password_hash`` made by ``amqha passwd`` log in with aio-pika, pika and
py-amqp. A refused login's Close 403 comes no sooner than ``auth.failed_login_delay``
after its Start-Ok, and while refusals wait, a good login goes through.

The loopback-only rule is seen here only from its allowing side (guest on 127.0.0.1 and
::1): these tests reach the broker over loopback only, so the refusal of a remote
address is tested on the rule itself in tests/unit/test_auth.py.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import amqp
import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.protocol_support import RawClient
from tests.support import ROOT, ServerProcess, start_to_exit, wait_until


def passwd(password: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "amqha", "passwd", "--stdin", *args],
        input=f"{password}\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


@pytest.fixture(scope="module")
def hashed(tmp_path_factory: pytest.TempPathFactory):
    users = [
        {"name": "guest", "password": "guest"},
        {"name": "app", "password_hash": passwd("app secret ü")},
        {"name": "legacy", "password_hash": passwd("legacy-pw", "--scheme", "rabbitmq-sha256")},
    ]
    server = ServerProcess(
        tmp_path_factory.mktemp("auth"), "auth", users=users, auth={"failed_login_delay": 0.3}
    )
    server.start()
    yield server
    server.stop()


def test_passwd_writes_a_scrypt_hash() -> None:
    assert passwd("x").startswith("$scrypt$ln=15,r=8,p=1$")


async def test_hashed_users_log_in_with_aio_pika(hashed: ServerProcess) -> None:
    for user, password in (("app", "app%20secret%20%C3%BC"), ("legacy", "legacy-pw")):
        connection = await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{hashed.port}/")
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"hi"), queue.name)
            message = await queue.get(timeout=5)
            assert message.body == b"hi"


def test_hashed_users_log_in_with_pika_and_py_amqp(hashed: ServerProcess) -> None:
    parameters = pika.ConnectionParameters(
        "127.0.0.1", hashed.port, credentials=pika.PlainCredentials("app", "app secret ü")
    )
    connection = pika.BlockingConnection(parameters)
    assert connection.channel().queue_declare("", exclusive=True).method.queue
    connection.close()
    client = amqp.Connection(
        f"127.0.0.1:{hashed.port}", userid="legacy", password="legacy-pw", login_method="AMQPLAIN"
    )
    client.connect()
    client.close()


def test_a_wrong_password_for_a_hashed_user_is_403_after_the_delay(hashed: ServerProcess) -> None:
    with RawClient(hashed.port) as raw:
        raw.start()
        sent = time.monotonic()
        raw.start_ok("app", "app secret u")
        close = raw.expect_connection_close(403)
        waited = time.monotonic() - sent
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"
    )
    assert waited >= 0.3
    # An unknown user is answered the same way, after the same delay.
    with RawClient(hashed.port) as raw:
        raw.start()
        sent = time.monotonic()
        raw.start_ok("nobody", "app secret ü")
        assert raw.expect_connection_close(403).reply_text == close.reply_text
        assert time.monotonic() - sent >= 0.3
    log = wait_until(
        lambda: "login refused: user 'nobody'" in hashed.log() and hashed.log(),
        what="the refused logins in the log",
    )
    assert "login refused: user 'app' from 127.0.0.1 (PLAIN, wrong password)" in log
    assert "login refused: user 'nobody' from 127.0.0.1 (PLAIN, no such user)" in log


def test_pika_reports_the_refusal(hashed: ServerProcess) -> None:
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        hashed.port,
        credentials=pika.PlainCredentials("legacy", "wrong"),
        connection_attempts=1,
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="403"):
        pika.BlockingConnection(parameters)


@pytest.mark.parametrize("together", [True, False], ids=["one write", "two writes"])
def test_pipelined_handshake_waits_for_the_password_check(
    hashed: ServerProcess, together: bool
) -> None:
    """Tune-Ok and Open sent right behind Start-Ok are handled once the scrypt check is done."""
    rest = [
        commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0),
        commands.Connection.Open(virtual_host="/"),
    ]
    start_ok = commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0app\0app secret ü", locale="en_US"
    )
    with RawClient(hashed.port) as raw:
        raw.start()
        if together:
            raw.send(0, start_ok, *rest)
        else:
            raw.send(0, start_ok)
            raw.send(0, *rest)
        raw.expect(commands.Connection.Tune, 0)
        raw.expect(commands.Connection.OpenOk, 0)
        raw.open_channel(1)


def test_refusals_waiting_do_not_hold_up_a_good_login(make_server) -> None:
    server = make_server("slow", auth={"failed_login_delay": 10}).start()
    with contextlib.ExitStack() as stack:
        waiting = []
        for index in range(30):
            raw = stack.enter_context(RawClient(server.port))
            raw.start()
            raw.start_ok("guest", f"wrong {index}")
            waiting.append(raw)
        with RawClient(server.port) as good:
            good.handshake()
            good.open_channel(1)
        for raw in waiting:
            raw.sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                raw.sock.recv(1)  # no Close yet: their refusals are still waiting


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_guest_logs_in_over_loopback_by_default(make_server, host: str) -> None:
    listen = f"[{host}]" if ":" in host else host
    server = make_server(f"loop{host.count(':')}")
    server.config["server"]["listen"] = f"{listen}:{server.port}"
    server.start(wait=False)
    banner = f"listening on {listen}:{server.port}"
    wait_until(lambda: banner in server.log(), timeout=15, what=banner)
    parameters = pika.ConnectionParameters(host, server.port, connection_attempts=3)
    connection = pika.BlockingConnection(parameters)
    connection.close()
    assert "login refused" not in server.log()


def test_a_file_without_users_no_longer_starts_with_guest(tmp_path: Path) -> None:
    config = tmp_path / "empty.yaml"
    config.write_text("")
    result = start_to_exit(config)
    assert result.returncode == 1
    assert f"{config}: users: missing" in result.stderr
