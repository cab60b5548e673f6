"""Attacks on the management listener and the logins, against real server processes:
keep-alive sockets that never log in, a flood of wrong passwords, a form on another origin,
an import whose password hashes cost scrypt, and bad input (malformed requests, deep JSON,
files that would stop part way, control characters in vhost names, an application queue
named like the aliveness check's, unknown routes). Each test reproduces the attack and
checks what an operator or another client still gets (docs/security.md)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest
from aiohttp import web
from pamqp import commands, frame

from amqha.console import ConsoleClient
from tests.browser import Browser, chromium
from tests.integration.protocol_support import PROTOCOL_HEADER, unique
from tests.integration.test_management import MGMT_USERS, Api, _auth, managed
from tests.support import free_port

# -- helpers -------------------------------------------------------------------------------


def _port(api: Any) -> int:
    return int(api.base.rsplit(":", 1)[1])


async def _http(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    local: str | None = None,
) -> tuple[int, str]:
    """One request on its own connection (from ``local`` if given): status and body."""
    connector = aiohttp.TCPConnector(
        force_close=True, local_addr=(local, 0) if local is not None else None
    )
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        session.request(
            method, f"http://127.0.0.1:{port}{path}", headers=headers or {}, data=body
        ) as answer,
    ):
        return answer.status, await answer.text()


async def _read_frame(reader: asyncio.StreamReader, timeout: float) -> Any:
    head = await asyncio.wait_for(reader.readexactly(7), timeout)
    size = int.from_bytes(head[3:7], "big")
    rest = await asyncio.wait_for(reader.readexactly(size + 1), timeout)
    return frame.unmarshal(head + rest)[2]


async def amqp_login(
    port: int, user: str, password: str, local: str | None = None, timeout: float = 30.0
) -> str:
    """An AMQP handshake up to the login's answer: 'ok' (Connection.Tune) or the reply
    text of the Connection.Close that refused it."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            "127.0.0.1", port, local_addr=(local, 0) if local is not None else None
        ),
        timeout,
    )
    try:
        writer.write(PROTOCOL_HEADER)
        start = await _read_frame(reader, timeout)
        assert isinstance(start, commands.Connection.Start), start
        writer.write(
            frame.marshal(
                commands.Connection.StartOk(
                    client_properties={"product": "attack"},
                    mechanism="PLAIN",
                    response=f"\0{user}\0{password}",
                    locale="en_US",
                ),
                0,
            )
        )
        answer = await _read_frame(reader, timeout)
        if isinstance(answer, commands.Connection.Tune):
            return "ok"
        assert isinstance(answer, commands.Connection.Close), answer
        return str(answer.reply_text)
    finally:
        writer.close()


class Attack:
    """``count`` workers running ``step`` over and over until stopped (each step bounded
    by its own timeouts; a failed step waits a little and goes again)."""

    def __init__(self, count: int, step: Any) -> None:
        self.stopping = asyncio.Event()
        self.steps = 0
        self.tasks = [asyncio.create_task(self._run(step, index)) for index in range(count)]

    async def pause(self, seconds: float) -> None:
        """An attacker's pause between two steps, cut short when the attack stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _run(self, step: Any, index: int) -> None:
        state: dict[str, Any] = {"pause": self.pause}
        while not self.stopping.is_set():
            try:
                await step(index, state)
                self.steps += 1
            except (OSError, asyncio.IncompleteReadError, TimeoutError, AssertionError):
                await asyncio.sleep(0.2)

    async def stop(self) -> None:
        self.stopping.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def until_async(predicate: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"not true after {timeout} s: {what}")
        await asyncio.sleep(0.1)


def _log(server: Any) -> str:
    return Path(server.log_path).read_text(errors="replace")


# -- sockets -------------------------------------------------------------------------------


async def test_keep_alive_sockets_without_a_login_keep_no_operator_out(make_server) -> None:
    """256 keep-alive sockets that never log in, each asking every second (the audit: every
    5 s; 10 of 10 operators were refused): every operator gets in."""
    from amqha.management.sockets import MAX_CONNECTIONS

    _, api = managed(make_server)
    port = _port(api)
    request = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"

    async def ask(index: int, state: dict[str, Any]) -> None:
        if "writer" not in state:
            state["reader"], state["writer"] = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), 10
            )
        reader, writer = state["reader"], state["writer"]
        try:
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            found = re.search(rb"(?i)content-length: *(\d+)", head)
            await asyncio.wait_for(reader.readexactly(int(found.group(1)) if found else 0), 10)
        except BaseException:
            state.pop("writer").close()
            raise
        if b"connection: close" in head.lower():
            state.pop("writer").close()
        await state["pause"](1.0)

    attack = Attack(MAX_CONNECTIONS, ask)
    try:
        await until_async(lambda: attack.steps >= 2 * MAX_CONNECTIONS, 120, "the attack runs")
        # The operator is a process of its own, as one is: in this process its requests
        # would wait behind the attackers' own event loop to be sent.
        operator = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            OPERATOR,
            str(port),
            _auth("admin")["Authorization"],
            "10",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(operator.communicate(), 600)
        before = attack.steps
        await until_async(lambda: attack.steps > before + 50, 60, "the attack still runs")
    finally:
        await attack.stop()
    answers = out.decode().split()
    assert answers == ["200:admin"] * 10, answers


# An operator asking GET /api/whoami on a connection of its own, N times, one after another;
# prints "status:name" (or "dropped:" and what the client raised) for each.
OPERATOR = """
import http.client, json, sys
port, authorization, times = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for _ in range(times):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/api/whoami", headers={"Authorization": authorization})
        answer = connection.getresponse()
        print(f"{answer.status}:{json.loads(answer.read()).get('name')}", flush=True)
    except (OSError, http.client.HTTPException, ValueError) as error:
        print(f"dropped:{type(error).__name__}", flush=True)
    finally:
        connection.close()
"""


async def test_an_operator_is_not_dropped_for_being_newer_than_sockets_being_answered(
    make_server,
) -> None:
    """Every place of the operator's own address held by a wrong password waiting out its
    delay (older, being answered); the operator connects and sends its login, and sockets
    that send nothing connect right behind it, while the server is stopped so that it
    takes them all in one pass: the operator gets in, each round. Its socket was
    the one not being answered, so the first newcomer took its place (a loaded machine
    makes such passes by itself)."""
    from amqha.management.sockets import PER_ADDRESS

    server, api = managed(make_server, auth={"failed_login_delay": 10})
    port = _port(api)
    wrong = "Basic " + base64.b64encode(b"admin:wrong").decode()
    good = _auth("admin")["Authorization"]

    def request(authorization: str) -> bytes:
        return (
            f"GET /api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}\r\n\r\n"
        ).encode()

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)

    for _ in range(2):  # two rounds: their wrong passwords are within auth.PER_SOURCE
        # Readers are kept with their writers: a stream whose reader is collected closes.
        sockets: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(PER_ADDRESS):
                sockets.append(await connect())
                sockets[-1][1].write(request(wrong))
            # A login from another address, answered: the server has read those requests
            # (they were in before it connected), so each is waiting out its delay.
            status, _ = await _http(port, "GET", "/api/whoami", _auth("admin"), "127.0.0.2")
            assert status == 200
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                sockets.append(await connect())  # the kernel takes it in, and the request
                reader, writer = sockets[-1]
                writer.write(request(good))
                for _ in range(PER_ADDRESS // 2):
                    sockets.append(await connect())
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            except asyncio.IncompleteReadError:
                pytest.fail("the operator's socket was closed to make room for a newcomer")
            assert head.startswith(b"HTTP/1.1 200"), head
            found = re.search(rb"(?i)content-length: *(\d+)", head)
            assert found, head
            body = await asyncio.wait_for(reader.readexactly(int(found.group(1))), 30)
            assert json.loads(body)["name"] == "admin"
        finally:
            for _, writer in sockets:
                writer.close()


# -- logins --------------------------------------------------------------------------------


async def test_a_flood_of_wrong_passwords_refuses_no_other_address(make_server) -> None:
    """320 concurrent wrong-password AMQP logins from one address (the audit: 17 of 19
    good AMQP logins and 16 of 19 HTTP logins refused): every good login from other
    addresses gets in, AMQP and HTTP."""
    server, api = managed(make_server, auth={"failed_login_delay": 3})
    port = _port(api)

    async def wrong(index: int, state: dict[str, Any]) -> None:
        await amqp_login(server.port, "guest", f"wrong-{index}")
        await state["pause"](0.5)  # and again: about 320 attempts under way at any time

    attack = Attack(320, wrong)
    try:
        # Every attacker has had a refusal: the pending bound is as full as they make it.
        await until_async(lambda: attack.steps >= 640, 120, "the flood runs")
        amqp = await asyncio.gather(
            *(amqp_login(server.port, "guest", "guest", f"127.0.0.{2 + i}") for i in range(19))
        )
        http = await asyncio.gather(
            *(
                _http(port, "GET", "/api/whoami", _auth("admin"), local=f"127.0.0.{2 + i}")
                for i in range(19)
            )
        )
    finally:
        await attack.stop()
    assert amqp == ["ok"] * 19
    assert [status for status, _ in http] == [200] * 19


# -- forged requests -----------------------------------------------------------------------


async def test_a_form_on_another_origin_cannot_import_definitions(make_server) -> None:
    """What a form on another site makes a browser send, with the admin's basic auth the
    browser has cached (the audit: a durable queue bound to amq.fanout was made): refused,
    nothing made. The same file as JSON from the listener's own origin, or from a tool
    that sends no Origin, is imported."""
    _, api = managed(make_server)
    port = _port(api)
    queue = unique("forged")
    payload = {
        "queues": [{"name": queue, "vhost": "/", "durable": True}],
        "bindings": [
            {
                "source": "amq.fanout",
                "vhost": "/",
                "destination": queue,
                "destination_type": "queue",
                "routing_key": "",
            }
        ],
    }
    # enctype=text/plain: name={"queues":...,"x":" value=" -> a JSON body.
    text_plain = (json.dumps(payload)[:-1] + ',"x":"=' + '"}').encode()
    evil = {"Origin": "http://evil.example:8080", "Referer": "http://evil.example:8080/x"}
    attempts = [
        ({**evil, "Content-Type": "text/plain"}, text_plain, 403),
        ({**evil, "Content-Type": "application/x-www-form-urlencoded"}, b"a=b", 403),
        ({**evil, "Content-Type": "multipart/form-data; boundary=x"}, b"--x--", 403),
        ({**evil, "Content-Type": "application/json"}, json.dumps(payload).encode(), 403),
        ({"Referer": "http://evil.example/", "Content-Type": "application/json"}, b"{}", 403),
        ({"Origin": "null", "Content-Type": "application/json"}, b"{}", 403),
        # Older browsers send no Origin on a form: its type gives it away.
        ({"Content-Type": "text/plain"}, text_plain, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"a=b", 415),
    ]
    for headers, body, expected in attempts:
        status, text = await _http(
            port, "POST", "/api/definitions", {**_auth("admin"), **headers}, body
        )
        assert status == expected, (headers, status, text)
        assert set(json.loads(text)) == {"error", "reason"}
    assert (await api.call("GET", f"/api/queues/%2F/{queue}"))[0] == 404
    # A DELETE from another origin is refused too.
    status, _ = await _http(port, "DELETE", "/api/queues/%2F/anything", {**_auth("admin"), **evil})
    assert status == 403
    # The listener's own origin, and tools that send no Origin (curl, rabbitmqadmin).
    own = {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json"}
    status, text = await _http(
        port, "POST", "/api/definitions", {**_auth("admin"), **own}, json.dumps(payload).encode()
    )
    assert status == 204, text
    assert (await api.get(f"/api/queues/%2F/{queue}"))["durable"] is True
    status, text = await api.call("POST", "/api/definitions", json=payload)
    assert status == 204, text


async def test_a_form_on_another_origin_in_chromium_makes_nothing(
    make_server, tmp_path: Path
) -> None:
    """In a real headless Chromium that holds the administrator's basic auth, a page of
    another origin posts a form to /api/definitions (the audit: it made a durable queue
    bound to amq.fanout): nothing is made, though the browser sent the login."""
    if chromium() is None:
        pytest.skip("chromium is not installed (Debian's chromium package)")
    _, api = managed(make_server)
    port = _port(api)
    queue = unique("csrf")
    body = json.dumps(
        {
            "queues": [{"name": queue, "vhost": "/", "durable": True}],
            "bindings": [
                {"source": "amq.fanout", "vhost": "/", "destination": queue, "routing_key": ""}
            ],
        }
    )
    # enctype=text/plain sends name=value: the name is the file but its last brace, the
    # value closes a string field and the object.
    field_name, field_value = body[:-1] + ',"x":"', '"}'
    page = f"""<!doctype html><html><body>
<form method="POST" action="http://127.0.0.1:{port}/api/definitions" enctype="text/plain">
<input type="hidden" name='{field_name}' value='{field_value}'></form>
<script>document.forms[0].submit()</script></body></html>"""
    app = web.Application()
    seen: list[str] = []

    async def evil(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(text=page, content_type="text/html")

    app.router.add_get("/", evil)
    runner = web.AppRunner(app)
    await runner.setup()
    evil_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", evil_port).start()
    browser = await Browser(tmp_path).start()
    try:
        # The browser holds the login: a page of the listener asked with it.
        await browser.navigate(f"http://admin:admin@127.0.0.1:{port}/api/whoami")
        await browser.wait_for(
            "document.body && document.body.innerText.includes('administrator')", 30, "whoami"
        )
        await browser.navigate(f"http://localhost:{evil_port}/")
        # The form is posted: the browser ends on the listener's answer (a 403 page), or
        # the import was made (a 204 leaves the browser where it was).
        made = answer = None
        for _ in range(300):
            made = (await api.call("GET", f"/api/queues/%2F/{queue}"))[0] == 200
            with contextlib.suppress(RuntimeError):
                answer = await browser.evaluate(
                    f"location.port === '{port}' && document.readyState === 'complete' && "
                    "document.body && document.body.innerText"
                )
            if made or answer:
                break
            await asyncio.sleep(0.1)
    finally:
        await browser.stop()
        await runner.cleanup()
    assert seen == ["/"]
    assert not made, "a form on another origin made a queue"
    assert answer and "forbidden" in answer and "origin" in answer, answer
    assert (await api.call("GET", f"/api/queues/%2F/{queue}"))[0] == 404


# -- costly imports ------------------------------------------------------------------------


def scrypt_hash(password: str, ln: int, r: int, p: int) -> str:
    salt = os.urandom(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=1 << ln, r=r, p=p, maxmem=300 << 20, dklen=32
    )

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode().rstrip("=")

    return f"$scrypt$ln={ln},r={r},p={p}${b64(salt)}${b64(digest)}"


async def test_an_import_of_costly_hashes_leaves_clients_served(make_server) -> None:
    """Three users whose hashes cost the most scrypt accepted (the audit: every client of
    the ACTIVE held 35.9 s): clients' round trips go on while the import is checked; a
    costlier hash is refused, naming the cap."""
    users = [
        *MGMT_USERS,
        *({"name": f"costly{i}", "password": f"pw{i}", "vhosts": ["/"]} for i in range(3)),
    ]
    port = free_port()
    server = make_server("solo", users=users, management={"listen": f"127.0.0.1:{port}"})
    server.start()
    api = Api(port)
    # The most work accepted: n*r*p = 4 times the default's (config.passwords).
    hashes = await asyncio.gather(
        *(asyncio.to_thread(scrypt_hash, f"pw{i}", 17, 8, 1) for i in range(3))
    )
    body = {
        "users": [{"name": f"costly{i}", "password_hash": hashes[i], "tags": []} for i in range(3)]
    }
    name = unique("served")
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(name)
        importing = asyncio.create_task(api.call("POST", "/api/definitions", json=body))
        round_trips = 0
        while not importing.done() and round_trips < 1000:
            await channel.default_exchange.publish(aio_pika.Message(b"ping"), routing_key=name)
            got = await queue.get(timeout=60)
            assert got.body == b"ping"
            await got.ack()
            round_trips += 1
        status, answer = await importing
        assert status == 204, answer
        # Round trips went on while the hashes were checked (on the loop, none could).
        assert round_trips >= 3
    costly = scrypt_hash("pw0", 15, 8, 16)
    status, answer = await api.call(
        "POST",
        "/api/definitions",
        json={"users": [{"name": "costly0", "password_hash": costly, "tags": []}]},
    )
    assert status == 400
    assert "n*r*p" in answer["reason"], answer


# -- bad input -----------------------------------------------------------------------------


async def test_malformed_requests_cost_one_short_line_each_at_most(make_server) -> None:
    """200 malformed requests (the audit: an ERROR with a traceback each, 15.5 MB in 10 s):
    a 400 each, at most a few log lines, no traceback; deep JSON is a 400 too."""
    from amqha.management.sockets import LOG_BURST

    server, api = managed(make_server)
    port = _port(api)
    before = len(_log(server))
    answers = []
    for index in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /api/overview HTTP/1.1\r\nHost: x\r\nBad Header\x01: " + b"%d\r\n\r\n" % index
        )
        await writer.drain()
        answers.append(await asyncio.wait_for(reader.read(), 30))
        writer.close()
    assert all(re.match(rb"HTTP/1.[01] 400", a) for a in answers), answers[0]
    # Nested 10,000 deep, then 100 deep (within what json reads): 400, never a 500.
    for depth in (10_000, 100):
        deep = b"[" * depth + b"]" * depth
        status, text = await _http(
            port,
            "POST",
            "/api/definitions",
            {**_auth("admin"), "Content-Type": "application/json"},
            deep,
        )
        assert status == 400 and "nested deeper" in json.loads(text)["reason"], text
    log = _log(server)[before:]
    assert "Traceback" not in log and "ERROR" not in log
    assert log.count("could not be parsed") <= LOG_BURST


async def test_an_import_that_would_stop_part_way_changes_nothing(make_server) -> None:
    """A file whose last entry the broker would refuse (an inequivalent redeclare, a
    binding to the control plane, a queue limit, a vhost name with a control character):
    refused whole, naming why; nothing of it is made."""
    server, api = managed(make_server, limits={"vhost": {"max_queues": 20}})
    existing = unique("existing")
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(existing, durable=True, arguments={"x-max-length": 5})
    first = unique("first")

    def file(*queues: dict[str, Any], **more: Any) -> dict[str, Any]:
        return {"queues": [{"name": first, "vhost": "/", "durable": True}, *queues], **more}

    cases = [
        (400, "x-max-length", file({"name": existing, "vhost": "/", "durable": True})),
        (
            403,
            "control plane",
            file(
                bindings=[
                    {
                        "source": "amq.federation",
                        "vhost": "/",
                        "destination": first,
                        "destination_type": "queue",
                    }
                ]
            ),
        ),
        (
            400,
            "no exchange",
            file(bindings=[{"source": "nowhere", "vhost": "/", "destination": first}]),
        ),
        (
            400,
            "limits.vhost.max_queues: 20",
            file(*({"name": f"{first}-{i}", "vhost": "/"} for i in range(30))),
        ),
        (400, "U+0000", file(vhosts=[{"name": "bad\x00name"}])),
        (400, "U+000A", file({"name": unique("q"), "vhost": "line\nbreak"})),
        (400, "listed twice", file(users=[{"name": "guest", "tags": []}] * 2)),
    ]
    for status, words, body in cases:
        got, answer = await api.call("POST", "/api/definitions", json=body)
        assert got == status and words in answer["reason"], (words, got, answer)
        assert (await api.call("GET", f"/api/queues/%2F/{first}"))[0] == 404, words
    names = {v["name"] for v in await api.get("/api/vhosts")}
    assert not any("\x00" in n or "\n" in n for n in names)
    assert len(await api.get("/api/queues/%2F")) == 1


async def test_the_console_works_at_the_vhost_queue_limit(make_server) -> None:
    """A vhost at its queue limit (the audit: the console's reply queue counted, so the
    console stopped working): the console still answers; no queue was added."""
    server, api = managed(make_server, limits={"vhost": {"max_queues": 3}})
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel()
        for _ in range(3):
            await channel.declare_queue(unique("fill"))
        url = f"amqp://admin:admin@127.0.0.1:{server.port}/"
        async with ConsoleClient(url) as console:
            status = await console.call("status")
        assert status["queues"] == 3
        assert len(await api.get("/api/queues/%2F")) == 3


async def test_the_aliveness_check_leaves_an_application_queue_alone(make_server) -> None:
    """An application queue named aliveness-test (the audit: the check consumed and lost
    its messages): the check passes and every message stays."""
    server, api = managed(make_server)
    connection = await aio_pika.connect(server.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue("aliveness-test", durable=True)
        for index in range(3):
            await channel.default_exchange.publish(
                aio_pika.Message(b"app-%d" % index, delivery_mode=2), routing_key="aliveness-test"
            )
        for _ in range(3):
            assert await api.get("/api/aliveness-test/%2F") == {"status": "ok"}
        queue = await channel.declare_queue("aliveness-test", durable=True, passive=True)
        got = [await queue.get(timeout=5) for _ in range(3)]
        assert [m.body for m in got] == [b"app-0", b"app-1", b"app-2"]


async def test_unknown_routes_and_methods_answer_json(make_server) -> None:
    """RabbitMQ answers errors as JSON ``{error, reason}`` (the audit: plain text, and
    rabbitmqadmin ended in a traceback): an unknown route, a method a route does not take;
    a change amqha does not make (parameters, topic permissions, policies) is a 400, whose
    reason rabbitmqadmin prints; a declare of something that is not there, a 404."""
    _, api = managed(make_server)
    port = _port(api)
    for method, path, expected in (
        ("GET", "/api/nothing-here", 404),
        ("GET", "/nothing-here", 404),
        ("POST", "/api/overview", 400),
        ("PUT", "/api/parameters/federation-upstream/%2F/up", 400),
        ("PUT", "/api/topic-permissions/%2F/someone", 400),
        ("PUT", "/api/user-limits/someone/max-connections", 400),
        ("PUT", "/api/queues/nowhere/q", 404),
        ("DELETE", "/api/exchanges/%2F/x", 404),
        ("POST", "/", 405),
    ):
        status, text = await _http(
            port, method, path, {**_auth("admin"), "Content-Type": "application/json"}, b"{}"
        )
        assert status == expected, (method, path, status, text)
        answer = json.loads(text)
        assert set(answer) == {"error", "reason"}, text
        if expected == 400:
            assert "does not take" in answer["reason"], answer
