"""Users, vhosts and permissions made at run time through the management API
(amqha/management/users.py, amqha/core/access.py) on a real server and a real pair:
RabbitMQ's answers, logins over AMQP and HTTP that follow them at once, kept across a
restart, replicated (a user made on the ACTIVE logs in on the new one after a kill -9, and
a PASSIVE that rejoins by a snapshot has it), connections closed by a deletion; every
route tried by every login that may not, and the config files' users, the pair's own
login and its tags refused to the administrator too."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import aio_pika
import aiormq
import pytest

from tests.integration.protocol_support import unique
from tests.integration.test_management import Api, managed, managed_pair
from tests.pairs import ADMIN, MakePair, client_vote
from tests.pairs import url_of as pairs_url_of
from tests.support import ROOT, wait_for_port

JSON = {"Content-Type": "application/json"}


async def call(api: Api, method: str, path: str, body: Any = None, user: str = "admin") -> int:
    data = None if body is None else json.dumps(body)
    status, answer = await api.call(method, path, user, data=data, headers=JSON)
    return status


async def explain(api: Api, method: str, path: str, body: Any = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body)
    status, answer = await api.call(method, path, data=data, headers=JSON)
    return status, (answer or {}).get("reason", "")


def url_of(port: int, user: str, password: str, vhost: str) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{port}/{vhost.replace('/', '%2F')}"


async def round_trip(url: str, queue: str, count: int = 1) -> list[bytes]:
    """Publish ``count`` confirmed persistent messages to durable ``queue`` and return the
    bodies confirmed."""
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        bodies = [unique("m").encode() for _ in range(count)]
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=2), routing_key=queue
            )
        return bodies


async def refused(url: str) -> bool:
    """Whether the server refuses a login with ``url`` (its user, password or vhost)."""
    try:
        connection = await aio_pika.connect(url, timeout=10)
    except aiormq.exceptions.AMQPError:  # a refused login, or Connection.Close at Open
        return True
    await connection.close()
    return False


def restart(server: Any, api: Api) -> None:
    server.stop()
    server.start()
    wait_for_port(int(api.base.rsplit(":", 1)[1]))


def rabbit_hash(password: str) -> str:
    """A RabbitMQ SHA-256 password hash, as rabbitmqctl hash_password gives."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


async def test_users_vhosts_and_permissions_at_run_time_as_rabbitmq_answers(make_server) -> None:
    server, api = managed(make_server)
    vhost, name = unique("rt-v"), unique("alice")
    path_v, path_u = f"/api/vhosts/{vhost}", f"/api/users/{name}"
    path_p = f"/api/permissions/{vhost}/{name}"
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert await call(api, "PUT", path_v, {}) == 201
    assert await call(api, "PUT", path_v, {"description": "again"}) == 204
    assert vhost in [v["name"] for v in await api.get("/api/vhosts")]
    assert await call(api, "PUT", path_u, {"password": "alice-pw", "tags": "management"}) == 201
    assert await call(api, "PUT", path_p, full) == 201
    assert await call(api, "PUT", path_p, full) == 204
    status, reason = await explain(api, "PUT", path_p, {**full, "write": "^x"})
    assert status == 400 and "full rights" in reason, reason
    shown = await api.get(path_u)
    assert shown["tags"] == ["management"] and shown["amqha"]["made"] == "run time", shown
    assert {"user": name, "vhost": vhost, **full} in await api.get("/api/permissions")
    # The user logs in at once: over AMQP in its vhost (not in another), and to the API.
    alice = url_of(server.port, name, "alice-pw", vhost)
    queue = unique("q")
    assert len(await round_trip(alice, queue, 3)) == 3
    assert await refused(url_of(server.port, name, "alice-pw", "/"))
    assert await refused(url_of(server.port, name, "wrong", vhost))
    status, me = await api.call("GET", "/api/whoami", name, "alice-pw")
    assert status == 200 and me["name"] == name, me
    # A RabbitMQ hash, as an export of RabbitMQ carries it; tags as a list.
    bob = unique("bob")
    body = {
        "password_hash": rabbit_hash("bob-pw"),
        "hashing_algorithm": "rabbit_password_hashing_sha256",
        "tags": [],
    }
    assert await call(api, "PUT", f"/api/users/{bob}", body) == 201
    assert await call(api, "PUT", f"/api/permissions/%2F/{bob}", full) == 201
    assert len(await round_trip(url_of(server.port, bob, "bob-pw", "/"), unique("q"))) == 1
    for bad, word in (
        ({"password_hash": "x" * 10}, "password_hash"),
        ({"password_hash": rabbit_hash("p"), "hashing_algorithm": "rabbit_password_hashing_md5"}, "md5"),
        ({"tags": "management"}, "password"),
        ({"password": "p", "tags": 7}, "tags"),
    ):  # fmt: skip
        status, reason = await explain(api, "PUT", f"/api/users/{unique('bad')}", bad)
        assert status == 400 and word in reason, (bad, status, reason)

    # Kept across a restart (the store's access table).
    restart(server, api)
    assert len(await round_trip(alice, queue)) == 1
    assert (await api.get(f"/api/queues/{vhost}/{queue}"))["messages"] == 4

    # A permission taken away closes the connections it allowed; then the login is refused.
    connection = await aio_pika.connect(alice, timeout=10)
    closed = asyncio.Event()
    connection.close_callbacks.add(lambda *_: closed.set())
    assert await call(api, "DELETE", path_p) == 204
    await asyncio.wait_for(closed.wait(), 15)
    assert await refused(alice)
    assert await call(api, "DELETE", path_p) == 404
    # A user deleted: gone from the list, its logins refused, by HTTP too.
    assert await call(api, "PUT", path_p, full) == 201
    assert await call(api, "DELETE", path_u) == 204
    assert await call(api, "DELETE", path_u) == 404
    assert name not in [u["name"] for u in await api.get("/api/users")]
    assert await refused(alice)
    assert (await api.call("GET", "/api/whoami", name, "alice-pw"))[0] == 401
    # A vhost deleted with what it held.
    assert await call(api, "DELETE", path_v) == 204
    assert await call(api, "DELETE", path_v) == 404
    assert vhost not in [v["name"] for v in await api.get("/api/vhosts")]
    assert (await api.call("GET", f"/api/queues/{vhost}/{queue}"))[0] == 404
    restart(server, api)
    assert vhost not in [v["name"] for v in await api.get("/api/vhosts")]
    assert bob in [u["name"] for u in await api.get("/api/users")]


async def test_no_login_but_an_administrator_makes_users_and_nobody_the_pairs_own(
    make_server,
) -> None:
    """Every user, vhost and permission route tried by every login that is not an
    administrator's (no tags, the pair's own, management, monitoring): nothing changes.
    Then, as an administrator: the config files' users and vhosts are read-only, the pair's
    own login and the peering and federation tags cannot be made, given or changed."""
    server, api = managed(make_server)
    vhost, name = unique("v"), unique("u")
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert await call(api, "PUT", f"/api/vhosts/{vhost}", {}) == 201
    assert await call(api, "PUT", f"/api/users/{name}", {"password": "pw-u"}) == 201
    writes = [
        ("PUT", f"/api/users/{unique('new')}", {"password": "x", "tags": "administrator"}),
        ("PUT", f"/api/users/{name}", {"password": "x", "tags": "administrator"}),
        ("DELETE", f"/api/users/{name}", None),
        ("PUT", f"/api/vhosts/{unique('nv')}", {}),
        ("DELETE", f"/api/vhosts/{vhost}", None),
        ("PUT", f"/api/permissions/{vhost}/{name}", full),
        ("PUT", f"/api/permissions/{vhost}/mgmt", full),
        ("PUT", f"/api/permissions/{vhost}/guest", full),
        ("DELETE", f"/api/permissions/%2F/{name}", None),
    ]
    for user in ("guest", "limited", "peering", "watcher", "mgmt"):
        for method, path, body in writes:
            status = await call(api, method, path, body, user)
            assert status in (401, 403), (user, method, path, status)
    assert await refused(url_of(server.port, name, "x", "/"))  # the password did not change
    assert await refused(url_of(server.port, "guest", "guest", vhost))
    assert await refused(url_of(server.port, "mgmt", "mgmt-pw-x1", vhost))
    assert vhost in [v["name"] for v in await api.get("/api/vhosts")]
    users = {u["name"]: u["tags"] for u in await api.get("/api/users")}
    assert users[name] == [] and len(users) == len({*users}), users

    refusals = [
        ("PUT", "/api/users/admin", {"password": "x"}, 400, "config files"),
        ("DELETE", "/api/users/guest", None, 400, "config files"),
        ("PUT", "/api/users/peering", {"password": "x"}, 403, "own login"),
        ("DELETE", "/api/users/peering", None, 403, "own login"),
        ("PUT", f"/api/users/{unique('p')}", {"password": "x", "tags": "peering"}, 403, "peering"),
        ("PUT", f"/api/users/{name}", {"password": "x", "tags": ["federation"]}, 403, "federation"),
        ("PUT", f"/api/permissions/{vhost}/peering", full, 403, "own login"),
        ("PUT", f"/api/permissions/{vhost}/nobody-{unique('n')}", full, 400, "does not exist"),
        ("PUT", f"/api/permissions/{unique('none')}/{name}", full, 400, "does not exist"),
        ("DELETE", "/api/permissions/%2F/admin", None, 400, "config files"),
        ("DELETE", "/api/vhosts/%2F", None, 400, "config files"),
        ("PUT", "/api/vhosts/bad%01name", {}, 400, "control"),
    ]  # fmt: skip
    for method, path, body, expected, word in refusals:
        status, reason = await explain(api, method, path, body)
        assert status == expected and word in reason, (method, path, status, reason)
    users = {u["name"]: u["tags"] for u in await api.get("/api/users")}
    assert users[name] == [] and "peering" not in users, users
    assert not any("peering" in tags or "federation" in tags for tags in users.values())


@pytest.mark.slow
async def test_a_user_made_on_the_active_logs_in_on_the_new_one_after_a_kill(
    make_pair: MakePair,
) -> None:
    """A vhost, a user and its permission made through the ACTIVE's API (refused on the
    PASSIVE, naming the ACTIVE): after a kill -9 of the ACTIVE the user logs in on the new
    one, where every message it had confirmed is; the old ACTIVE, back as PASSIVE by a
    snapshot, has the user too."""
    pair, (primary_api, backup_api) = managed_pair(make_pair)
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    await pair.wait_in_sync(pair.backup, timeout=30)
    vhost, name = unique("pair-v"), unique("carol")
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    assert await call(primary_api, "PUT", f"/api/vhosts/{vhost}", {}) == 201
    body = {"password": "carol-pw", "tags": "management"}
    assert await call(primary_api, "PUT", f"/api/users/{name}", body) == 201
    assert await call(primary_api, "PUT", f"/api/permissions/{vhost}/{name}", full) == 201
    status, reason = await explain(backup_api, "PUT", f"/api/users/{unique('no')}", body)
    assert status == 503 and str(pair.primary.port) in reason, reason
    queue = unique("q")
    confirmed = await round_trip(url_of(pair.primary.port, name, "carol-pw", vhost), queue, 20)
    pair.kill(pair.primary)
    await client_vote([pair.backup], retry_for=30)
    await pair.wait_states(None, "ACTIVE", timeout=30)
    carol = url_of(pair.backup.port, name, "carol-pw", vhost)
    connection = await aio_pika.connect(carol, timeout=10)
    async with connection:
        channel = await connection.channel()
        kept = await channel.declare_queue(queue, durable=True, passive=True)
        got = []
        for _ in range(len(confirmed) + 1):
            message = await kept.get(fail=False, timeout=5)
            if message is None:
                break
            got.append(message.body)
            await message.ack()
    assert sorted(got) == sorted(confirmed), (len(got), len(confirmed))
    status, me = await backup_api.call("GET", "/api/whoami", name, "carol-pw")
    assert status == 200 and me["name"] == name
    # The old ACTIVE rejoins by a snapshot, which carries the user.
    pair.primary.start()
    await pair.wait_states("PASSIVE", "ACTIVE", timeout=30)
    await pair.wait_in_sync(pair.primary, timeout=60)
    assert name in [u["name"] for u in await primary_api.get("/api/users")]
    assert vhost in [v["name"] for v in await primary_api.get("/api/vhosts")]


async def test_a_definitions_file_makes_its_users_vhosts_and_permissions_and_exports_them(
    make_server,
) -> None:
    """A RabbitMQ export's users the config does not have are made at run time with their
    hashes, its vhosts and permissions too; they log in, and an export gives them back."""
    server, api = managed(make_server)
    vhost, name = unique("imp-v"), unique("dave")
    digest = rabbit_hash("dave-pw")
    body = {
        "rabbit_version": "3.10.8",
        "users": [
            {
                "name": name,
                "password_hash": digest,
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["monitoring"],
                "limits": {},
            }
        ],
        "vhosts": [{"name": vhost, "limits": [], "metadata": {"description": "", "tags": []}}],
        "permissions": [
            {"user": name, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "admin", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"},
        ],
        "queues": [{"name": "orders", "vhost": vhost, "durable": True, "arguments": {}}],
    }
    status, answer = await api.call("POST", "/api/definitions", data=json.dumps(body), headers=JSON)
    assert status == 204, answer
    assert len(await round_trip(url_of(server.port, name, "dave-pw", vhost), "orders", 2)) == 2
    assert len(await round_trip(url_of(server.port, "admin", "admin", vhost), "orders")) == 1
    exported = await api.get("/api/definitions")
    (user,) = [u for u in exported["users"] if u["name"] == name]
    assert user["password_hash"] == digest and user["tags"] == ["monitoring"], user
    assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert {"user": name, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"} in (
        exported["permissions"]
    )
    assert vhost in [v["name"] for v in exported["vhosts"]]
    # The same file again changes nothing; one that gives a run-time user the pair's tag
    # is refused whole.
    status, _ = await api.call("POST", "/api/definitions", data=json.dumps(body), headers=JSON)
    assert status == 204
    forged = {**body, "users": [{**body["users"][0], "tags": ["peering"]}]}
    status, answer = await api.call(
        "POST", "/api/definitions", data=json.dumps(forged), headers=JSON
    )
    assert status == 403, answer
    assert (await api.get(f"/api/users/{name}"))["tags"] == ["monitoring"]


async def test_the_console_makes_users_vhosts_and_permissions_on_the_active(
    make_pair: MakePair,
) -> None:
    """``amqha console user|vhost|permission`` as an operator runs it against both
    servers: each change goes to the ACTIVE (the PASSIVE alone refuses, naming it), the
    password from standard input; ``users`` lists them; the config's users, the pair's
    tag and a login that is not an administrator's are refused with their exit status."""
    from tests.integration.test_console import console

    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    vhost, name = unique("cv"), unique("erin")
    for words, stdin in (
        (("vhost", "add", vhost), None),
        (("user", "add", name, "--tags", "management"), "erin-pw\n"),
        (("permission", "set", vhost, name), None),
    ):
        done = await asyncio.to_thread(console, pair, *words, stdin=stdin)
        assert done.returncode == 0, (words, done.stdout, done.stderr)
        assert f"on {pair.primary.address}" in done.stdout, done.stdout
    assert len(await round_trip(url_of(pair.primary.port, name, "erin-pw", vhost), "q")) == 1
    listed = await asyncio.to_thread(console, pair, "--json", "users")
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows[name] == {"name": name, "made": "run time", "tags": "management", "vhosts": vhost}
    assert rows["admin"]["made"] == "config file" and "peering" not in rows
    for words, status, word in (
        (("user", "add", "admin", "--password-hash", rabbit_hash("x")), 1, "config files"),
        (("user", "add", unique("p"), "--tags", "peering", "--password-hash", rabbit_hash("x")), 5, "peering"),
        (("permission", "set", vhost, "peering"), 5, "own login"),
        (("user", "add", "x"), 2, "empty password"),
    ):  # fmt: skip
        done = await asyncio.to_thread(console, pair, *words, stdin="")
        assert (done.returncode, word in done.stderr) == (status, True), (words, done.stderr)
    guest = await asyncio.to_thread(
        console, pair, "vhost", "add", unique("no"), user=("guest", "guest")
    )
    assert guest.returncode in (5, 6), guest.stderr
    passive = await asyncio.to_thread(
        lambda: subprocess.run(
            [sys.executable, "-m", "amqha", "console", "--server", pairs_url_of(pair.backup, ADMIN),
             "vhost", "add", unique("no")],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )
    )  # fmt: skip
    assert passive.returncode == 1 and pair.primary.address in passive.stderr, passive.stderr
    for words in (
        ("permission", "clear", vhost, name),
        ("user", "delete", name),
        ("vhost", "delete", vhost),
    ):
        done = await asyncio.to_thread(console, pair, *words)
        assert done.returncode == 0, (words, done.stderr)
    assert await refused(url_of(pair.primary.port, name, "erin-pw", vhost))
