"""The management API side by side: the same calls against amqha and RabbitMQ.

``python -m bench.management_compat`` starts Debian's RabbitMQ (``bench.rabbitmq``, with
the management plugin) and one amqha server with ``management.listen``, both on loopback,
both with guest/guest as an administrator. It makes the same AMQP traffic on each (a
durable queue with ready and unacknowledged messages, a topic exchange and a binding, a
consumer), then runs the same calls against each management API:

- ``rabbitmqadmin`` (Debian's, from the rabbitmq-server package): list, show, export,
  declare and delete (queues, exchanges, bindings, vhosts, users, permissions),
  import, purge, delete, close;
- ``pyrabbit2`` (PyPI);
- Celery Flower's broker page, with a Celery worker on the broker and the management API
  as Flower's ``--broker_api`` (Celery and Flower in a virtualenv of their own);
- plain HTTP for the routes the tools do not cover (health checks).

It prints JSON: per call, the status or exit code on each side, the fields RabbitMQ's
answer has that amqha's lacks, and the core figures where they must agree. A difference is
reported, not hidden; docs/operations.md ("Management API") lists them. Every process
started here is stopped here, by pid.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pika

from bench.rabbitmq import RabbitNode, ensure_installed
from tests.support import ServerProcess, free_port, wait_for_port

QUEUE = "cmp.queue"
EXCHANGE = "cmp.exchange"
CONSUMED = "cmp.consumed"
RABBITMQADMIN = "rabbitmqadmin"


def traffic(port: int) -> pika.BlockingConnection:
    """The same objects and messages on either broker; the connection stays open (with a
    consumer) for the connection, channel and consumer listings."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")
        )
    )
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(QUEUE, durable=True)
    channel.queue_declare(CONSUMED, durable=False)
    channel.exchange_declare(EXCHANGE, "topic", durable=True)
    channel.queue_bind(QUEUE, EXCHANGE, "cmp.#")
    for index in range(5):
        channel.basic_publish(
            EXCHANGE, "cmp.x", str(index).encode(), pika.BasicProperties(delivery_mode=2)
        )
    method, _, _ = channel.basic_get(QUEUE)
    channel.basic_ack(method.delivery_tag)
    channel.basic_get(QUEUE)  # delivered, not acked
    other = connection.channel()
    other.basic_qos(prefetch_count=3)
    other.basic_consume(CONSUMED, lambda *args: None, consumer_tag="cmp-consumer")
    connection.process_data_events(0.2)
    return connection


def http(port: int, path: str, method: str = "GET") -> tuple[int, Any]:
    token = base64.b64encode(b"guest:guest").decode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, headers={"Authorization": f"Basic {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            text = answer.read().decode()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read().decode()
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, text[:200]


def admin(port: int, *words: str) -> tuple[int, str]:
    done = subprocess.run(
        [RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", "guest", "-p", "guest", *words],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def keys(value: Any) -> set[str]:
    """Every key path of a JSON value (lists: their first item's)."""
    found: set[str] = set()

    def walk(item: Any, prefix: str) -> None:
        if isinstance(item, dict):
            for key, inner in item.items():
                path = f"{prefix}.{key}" if prefix else key
                found.add(path)
                walk(inner, path)
        elif isinstance(item, list) and item and isinstance(item[0], dict):
            walk(item[0], prefix + "[]")

    walk(value, "")
    return found


def missing(theirs: set[str], ours: set[str]) -> list[str]:
    """Key paths RabbitMQ has and amqha lacks, each named once: not those under a key
    already missing."""
    gone = sorted(theirs - ours)
    return [
        path
        for path in gone
        if not any(
            path.startswith(other + ".") or path.startswith(other + "[]")
            for other in gone
            if other != path
        )
    ]


def pyrabbit_calls(port: int) -> dict[str, Any]:
    from pyrabbit2.api import Client

    client = Client(f"127.0.0.1:{port}", "guest", "guest", timeout=20)
    results: dict[str, Any] = {}
    for name, call in (
        ("get_overview", client.get_overview),
        ("get_whoami", client.get_whoami),
        ("get_all_vhosts", client.get_all_vhosts),
        ("get_queues", lambda: client.get_queues("/")),
        ("get_queue", lambda: client.get_queue("/", QUEUE)),
        ("get_queue_depth", lambda: client.get_queue_depth("/", QUEUE)),
        ("get_exchanges", lambda: client.get_exchanges("/")),
        ("get_exchange", lambda: client.get_exchange("/", EXCHANGE)),
        ("get_bindings", client.get_bindings),
        ("get_connections", client.get_connections),
        ("get_channels", client.get_channels),
        ("get_nodes", client.get_nodes),
        ("get_users", client.get_users),
        ("get_definitions", client.get_definitions),
        ("is_alive", client.is_alive),
        # Changes, in an order that leaves each step something to act on.
        ("create_vhost", lambda: client.create_vhost("py.v")),
        ("create_user", lambda: client.create_user("py.u", "py-pw", tags="management")),
        ("set_vhost_permissions", lambda: client.set_vhost_permissions("py.v", "py.u", ".*", ".*", ".*")),
        ("get_permission", lambda: client.get_permission("py.v", "py.u")),
        ("create_policy", lambda: client.create_policy("py.v", "py.p", pattern="^py", definition={"max-length": 3}, **{"apply-to": "queues"})),
        ("get_policy", lambda: client.get_policy("py.v", "py.p")),
        ("create_exchange", lambda: client.create_exchange("py.v", "py.x", "direct")),
        ("create_queue", lambda: client.create_queue("py.v", "py.q", durable=True)),
        ("create_binding", lambda: client.create_binding("py.v", "py.x", "py.q", "k")),
        ("delete_binding", lambda: client.delete_binding("py.v", "py.x", "py.q", "k")),
        ("delete_queue", lambda: client.delete_queue("py.v", "py.q")),
        ("delete_exchange", lambda: client.delete_exchange("py.v", "py.x")),
        ("delete_policy", lambda: client.delete_policy("py.v", "py.p")),
        ("delete_permission", lambda: client.delete_permission("py.v", "py.u")),
        ("delete_user", lambda: client.delete_user("py.u")),
        ("delete_vhost", lambda: client.delete_vhost("py.v")),
    ):  # fmt: skip
        try:
            results[name] = {"ok": True, "value": call()}
        except Exception as error:
            results[name] = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:160]}"}
    return results


def rabbitmqadmin_calls(port: int, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for words in (
        ("-f", "raw_json", "show", "overview"),
        ("-f", "raw_json", "list", "queues"),
        ("-f", "raw_json", "list", "exchanges"),
        ("-f", "raw_json", "list", "bindings"),
        ("-f", "raw_json", "list", "connections"),
        ("-f", "raw_json", "list", "channels"),
        ("-f", "raw_json", "list", "consumers"),
        ("-f", "raw_json", "list", "vhosts"),
        ("-f", "raw_json", "list", "users"),
        ("-f", "raw_json", "list", "nodes"),
        ("-f", "raw_json", "list", "permissions"),
        ("-f", "raw_json", "list", "policies"),
        ("list", "queues", "name", "messages", "messages_ready", "messages_unacknowledged"),
        ("export", str(workdir / "exported.json")),
    ):
        code, text = admin(port, *words)
        entry: dict[str, Any] = {"exit": code}
        if "raw_json" in words and code == 0:
            try:
                entry["value"] = json.loads(text)
            except ValueError:
                entry["text"] = text[:300]
        else:
            entry["text"] = text[:300]
        shown = [w for w in words if w not in ("-f", "raw_json")]
        results[" ".join(Path(w).name if "/" in w else w for w in shown)] = entry
    return results


def changes(port: int, workdir: Path, connection_name: str) -> dict[str, Any]:
    """What changes things, in an order that leaves each step something to act on."""
    results: dict[str, Any] = {}
    # A file RabbitMQ and amqha both accept: objects only (users come from amqha's config).
    (workdir / "import.json").write_text(
        json.dumps(
            {
                "queues": [
                    {
                        "name": "cmp.imported",
                        "vhost": "/",
                        "durable": True,
                        "auto_delete": False,
                        "arguments": {},
                    }
                ],
                "exchanges": [],
                "bindings": [],
            }
        )
    )
    for words in (
        ("declare", "queue", "name=cmp.declared", "durable=true"),
        ("declare", "exchange", "name=cmp.x", "type=direct"),
        ("declare", "binding", "source=cmp.x", "destination=cmp.declared", "routing_key=k"),
        (
            "delete",
            "binding",
            "source=cmp.x",
            "destination=cmp.declared",
            "destination_type=queue",
            "properties_key=k",
        ),
        ("delete", "exchange", "name=cmp.x"),
        ("delete", "queue", "name=cmp.declared"),
        ("declare", "vhost", "name=cmp.v"),
        ("declare", "user", "name=cmp.u", "password=cmp-pw", "tags=management"),
        (
            "declare",
            "permission",
            "vhost=cmp.v",
            "user=cmp.u",
            "configure=.*",
            "write=.*",
            "read=.*",
        ),
        ("delete", "permission", "vhost=cmp.v", "user=cmp.u"),
        ("delete", "user", "name=cmp.u"),
        ("delete", "vhost", "name=cmp.v"),
        ("import", str(workdir / "import.json")),
        ("purge", "queue", f"name={QUEUE}"),
        ("delete", "queue", "name=cmp.imported"),
        ("close", "connection", f"name={connection_name}"),
    ):
        code, text = admin(port, *words)
        # The call, and what it names where two calls would read alike ("declare queue
        # name=cmp.declared"); a file by its name; a connection not (each side's differs).
        named = words[:2] if words[0] in ("close", "import", "purge") else words[:3]
        results[" ".join(Path(w).name if "/" in w else w for w in named)] = {
            "exit": code,
            "text": text[:300],
        }
    for path in (
        "/api/health/checks/alarms",
        "/api/health/checks/local-alarms",
        "/api/health/checks/amqha-active-in-sync",
        "/api/aliveness-test/%2F",
    ):
        status, body = http(port, path)
        results[path] = {"status": status, "body": body}
    return results


FLOWER_TIMEOUT = 90.0


def flower_calls(amqp_port: int, http_port: int, workdir: Path) -> dict[str, Any]:
    """Celery Flower's broker page (``/broker``) with this broker's management API as its
    ``--broker_api``: a Celery worker on the broker, Flower beside it; the page's queue
    rows, and whatever Flower logged about the API."""
    import re
    import signal

    from bench.compat import CELERY_APP
    from bench.compat_sources import suite_python

    python = suite_python("celery-flower", ("celery", "flower"))
    app_dir = workdir / "flower-app"
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "compat_app.py").write_text(CELERY_APP)
    env = dict(
        os.environ,
        BROKER_URL=f"amqp://guest:guest@127.0.0.1:{amqp_port}//",
        PYTHONPATH=str(app_dir),
    )
    flower_port = free_port()
    celery = [str(python), "-m", "celery", "-A", "compat_app"]
    worker_log = open(app_dir / "worker.log", "wb")  # noqa: SIM115 - handed to the child
    flower_log = open(app_dir / "flower.log", "wb")  # noqa: SIM115 - handed to the child
    worker = subprocess.Popen(
        # -E: the worker's events, by which Flower learns of it after its first inspect.
        [*celery, "worker", "--pool=solo", "--loglevel=INFO", "-E"],
        cwd=app_dir,
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    worker_log.close()
    deadline = time.monotonic() + FLOWER_TIMEOUT
    while time.monotonic() < deadline and worker.poll() is None:
        if " ready." in (app_dir / "worker.log").read_text(errors="replace"):
            break
        time.sleep(0.5)
    flower = subprocess.Popen(
        [
            *celery,
            "flower",
            f"--port={flower_port}",
            "--address=127.0.0.1",
            f"--broker_api=http://guest:guest@127.0.0.1:{http_port}/api/",
        ],
        cwd=app_dir,
        env=env,
        stdout=flower_log,
        stderr=subprocess.STDOUT,
    )
    flower_log.close()
    page, rows = "", []
    try:
        deadline = time.monotonic() + FLOWER_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{flower_port}/broker", timeout=5
                ) as answer:
                    page = answer.read().decode()
            except (OSError, urllib.error.URLError):
                page = ""
            # A row per queue the workers consume from, once Flower has seen a worker and
            # the broker API answered: <tr id="celery"><td>celery</td> and the figures.
            rows = [
                [
                    re.sub(r"<[^>]+>", "", cell).strip()
                    for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
                ]
                for row in re.findall(r"<tr id=[^>]*>(.*?)</tr>", page, re.S)
            ]
            if any(row and row[0] == "celery" for row in rows):
                break
            time.sleep(1.0)
    finally:
        for process in (flower, worker):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    (app_dir / "broker.html").write_text(page)
    logged = (app_dir / "flower.log").read_text(errors="replace")
    return {
        "broker_page": {
            "ok": any(row and row[0] == "celery" for row in rows),
            # name: messages, unacked, ready, consumers, idle since (Flower's columns)
            "queues": {row[0]: row[1:] for row in rows if row},
            "api_errors": [
                line for line in logged.splitlines() if "management API call failed" in line
            ],
        }
    }


def figures(queues: Any) -> dict[str, Any]:
    queue = next((q for q in queues if q.get("name") == QUEUE), {})
    return {
        key: queue.get(key)
        for key in ("messages", "messages_ready", "messages_unacknowledged", "consumers", "durable")
    }


def run_side(name: str, amqp_port: int, http_port: int, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    connection = traffic(amqp_port)
    try:
        # Statistics in RabbitMQ arrive every few seconds: wait for the connection and the
        # queue's figures to be there.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, queues = http(http_port, "/api/queues/%2F")
            status2, connections = http(http_port, "/api/connections")
            if (
                status == 200
                and figures(queues).get("messages") == 4
                and status2 == 200
                and connections
            ):
                break
            connection.process_data_events(0.5)
        result = {
            "rabbitmqadmin": rabbitmqadmin_calls(http_port, workdir),
            "pyrabbit2": pyrabbit_calls(http_port),
            "flower": flower_calls(amqp_port, http_port, workdir),
            "figures": figures(http(http_port, "/api/queues/%2F")[1]),
        }
        connection_name = connections[0]["name"] if connections else ""
        result["changes"] = changes(http_port, workdir, connection_name)
        result["policies"] = policy_semantics(amqp_port, http_port)
    finally:
        if connection.is_open:
            with contextlib.suppress(Exception):  # closed by the test's own close call
                connection.close()
    return result


# What a policy makes of a queue, on either broker: (case, the queue, its own
# arguments, whether it exists before the policies, messages published).
POLICY_CASES = (
    ("policy alone", "cmp.pol.a", {}, False, 5),
    ("the policy's lower max-length wins", "cmp.pol.b", {"x-max-length": 4}, False, 5),
    ("the queue's lower max-length wins", "cmp.pol.c", {"x-max-length": 1}, False, 5),
    ("a policy trims a queue it finds", "cmp.pol.pre", {}, True, 5),
    ("an operator policy caps the policy", "cmp.op", {}, False, 5),
    ("the policy's lower TTL wins", "cmp.ttl", {"x-message-ttl": 600000}, False, 3),
)
POLICY_CALLS = (
    ("declare", "policy", "name=cmp.len", "pattern=^cmp\\.pol\\.", "apply-to=queues",
     'definition={"max-length":2}'),
    ("declare", "policy", "name=cmp.len-op", "pattern=^cmp\\.op$", "apply-to=queues",
     'definition={"max-length":4}'),
    ("declare", "operator_policy", "name=cmp.cap", "pattern=^cmp\\.op$", "apply-to=queues",
     'definition={"max-length":1}'),
    ("declare", "policy", "name=cmp.ttl", "pattern=^cmp\\.ttl$", "apply-to=queues",
     'definition={"message-ttl":300}'),
)  # fmt: skip


def policy_semantics(amqp_port: int, http_port: int) -> dict[str, Any]:
    """The messages each policy case leaves in its queue (a passive declare's count, which
    RabbitMQ gives at once, unlike its statistics), and the policy calls' exits."""
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", amqp_port, credentials=pika.PlainCredentials("guest", "guest")
        )
    )
    result: dict[str, Any] = {}
    try:
        channel = connection.channel()
        channel.confirm_delivery()

        def fill(queue: str, arguments: dict[str, Any], count: int) -> None:
            channel.queue_declare(queue, durable=True, arguments=arguments or None)
            for index in range(count):
                channel.basic_publish(
                    "", queue, b"%d" % index, pika.BasicProperties(delivery_mode=2)
                )

        for _, queue, arguments, before, count in POLICY_CASES:
            if before:
                fill(queue, arguments, count)
        for words in POLICY_CALLS:
            code, text = admin(http_port, *words)
            result[" ".join(words[:3])] = {"exit": code, "text": text[:300]}
        for _, queue, arguments, before, count in POLICY_CASES:
            if not before:
                fill(queue, arguments, count)
        time.sleep(1.5)  # past the 300 ms TTL
        for case, queue, arguments, _, _ in POLICY_CASES:
            declared = channel.queue_declare(
                queue, durable=True, arguments=arguments or None, passive=True
            )
            result[case] = {"messages": declared.method.message_count}
            channel.queue_delete(queue)
        for name in ("cmp.len", "cmp.len-op", "cmp.ttl"):
            admin(http_port, "delete", "policy", f"name={name}")
        admin(http_port, "delete", "operator_policy", "name=cmp.cap")
    finally:
        connection.close()
    return result


def compare(rabbit: dict[str, Any], amqha: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {"figures": {"rabbitmq": rabbit["figures"], "amqha": amqha["figures"]}}
    report["policies"] = {
        case: {
            key: {"rabbitmq": theirs.get(key), "amqha": amqha["policies"].get(case, {}).get(key)}
            for key in ("exit", "messages")
            if key in theirs
        }
        for case, theirs in rabbit["policies"].items()
    }
    for row in report["policies"].values():
        if "messages" in row:
            row["ok"] = {
                side: row["messages"]["rabbitmq"] == row["messages"]["amqha"]
                for side in ("rabbitmq", "amqha")
            }
    for tool in ("rabbitmqadmin", "pyrabbit2", "flower", "changes"):
        rows = {}
        for call, theirs in rabbit[tool].items():
            ours = amqha[tool].get(call, {})
            row: dict[str, Any] = {}
            for key in ("exit", "status", "ok"):
                if key in theirs:
                    row[key] = {"rabbitmq": theirs[key], "amqha": ours.get(key)}
            if "value" in theirs and "value" in ours:
                row["missing_in_amqha"] = missing(keys(theirs["value"]), keys(ours["value"]))
            for key in ("queues", "api_errors"):
                if key in theirs:
                    row[key] = {"rabbitmq": theirs[key], "amqha": ours.get(key)}
            if "error" in ours:
                row["amqha_error"] = ours["error"]
            if "error" in theirs:
                row["rabbitmq_error"] = theirs["error"]
            if ours.get("exit") not in (None, 0) or ours.get("status") not in (None, 200, 204):
                row["amqha_said"] = ours.get("text") or ours.get("body")
            rows[call] = row
        report[tool] = rows
    return report


# What a migrating user's RabbitMQ holds beyond queues: a vhost, a user with a password
# hash and tags, its permission, a policy, a queue and a binding there.
MIGRATED = (
    ("declare", "vhost", "name=mig.v"),
    ("declare", "user", "name=mig.u", "password=mig-pw", "tags=monitoring"),
    ("declare", "permission", "vhost=mig.v", "user=mig.u", "configure=.*", "write=.*", "read=.*"),
    ("-V", "mig.v", "declare", "policy", "name=mig.p", "pattern=^mig", "apply-to=queues",
     'definition={"max-length":7,"message-ttl":60000}', "priority=2"),
    ("-V", "mig.v", "declare", "queue", "name=mig.q", "durable=true"),
    ("-V", "mig.v", "declare", "exchange", "name=mig.x", "type=topic"),
    ("-V", "mig.v", "declare", "binding", "source=mig.x", "destination=mig.q", "routing_key=k.#"),
)  # fmt: skip


def carried(rabbit_http: int, amqha_http: int, workdir: Path) -> dict[str, Any]:
    """RabbitMQ's export with those imported into amqha, and amqha's export of them: each
    section's entries for them, equal or not."""
    for words in MIGRATED:
        code, text = admin(rabbit_http, *words)
        if code != 0:
            return {"setup_failed": " ".join(words), "text": text[:300]}
    theirs, ours = workdir / "rabbit-migration.json", workdir / "amqha-migration.json"
    admin(rabbit_http, "export", str(theirs))
    code, text = admin(amqha_http, "import", str(theirs))
    admin(amqha_http, "export", str(ours))
    exported = [json.loads(path.read_text()) for path in (theirs, ours)]

    def mine(section: str, document: dict[str, Any]) -> list[Any]:
        keep = ("name", "vhost", "user")
        rows = [
            {k: v for k, v in row.items() if k not in ("limits", "metadata")}
            for row in document.get(section, [])
            if any(str(row.get(k, "")).startswith("mig.") for k in keep)
        ]
        return sorted(rows, key=json.dumps)

    result: dict[str, Any] = {"import": {"exit": code, "text": text[:300]}}
    for section in (
        "users",
        "vhosts",
        "permissions",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    ):
        rabbit_rows, amqha_rows = (mine(section, document) for document in exported)
        result[section] = {"equal": rabbit_rows == amqha_rows}
        if rabbit_rows != amqha_rows:
            result[section].update(rabbitmq=rabbit_rows, amqha=amqha_rows)
    return result


def run() -> dict[str, Any]:
    """Both brokers, every call; the report (raises RuntimeError without RabbitMQ)."""
    available, how = ensure_installed()
    if not available:
        raise RuntimeError(f"RabbitMQ is not available: {how}")
    workdir = Path(tempfile.mkdtemp(prefix="amqha-mgmt-compat-"))
    rabbit_http = free_port()
    node = RabbitNode()
    (node.dir / "enabled_plugins").write_text("[rabbitmq_management].\n")
    with open(node.dir / "rabbitmq.conf", "a") as conf:
        conf.write(f"management.tcp.port = {rabbit_http}\nmanagement.tcp.ip = 127.0.0.1\n")
    amqha_http = free_port()
    server = ServerProcess(
        workdir / "amqha",
        "solo",
        users=[{"name": "guest", "password": "guest", "vhosts": ["/"], "tags": ["administrator"]}],
        management={"listen": f"127.0.0.1:{amqha_http}"},
    )
    try:
        node.start()
        wait_for_port(rabbit_http, timeout=60)
        server.start()
        rabbit = run_side("rabbitmq", node.port, rabbit_http, workdir / "rabbitmq-side")
        ours = run_side("amqha", server.port, amqha_http, workdir / "amqha-side")
        # A RabbitMQ user's migration: RabbitMQ's own export, imported into amqha as it is.
        code, text = admin(amqha_http, "import", str(workdir / "rabbitmq-side" / "exported.json"))
        migration = {"exit": code, "text": text[:300]}
        status, imported = http(amqha_http, f"/api/queues/%2F/{QUEUE}")
        migration["queue_after_import"] = status
        migration["carried"] = carried(rabbit_http, amqha_http, workdir)
    finally:
        server.stop()
        node.stop()
    return {
        "rabbitmq_version": node.version,
        **compare(rabbit, ours),
        "migration": migration,
    }


def outcomes(report: dict[str, Any], side: str) -> dict[str, str]:
    """Each call's outcome on one side, as ``bench.compat`` tallies a suite's tests: a
    tool's call passed if it exited 0 or answered 2xx, Flower's page if it showed the
    worker's queue with figures from the API."""
    results = {}
    for tool in ("rabbitmqadmin", "pyrabbit2", "flower", "changes", "policies"):
        for call, row in report.get(tool, {}).items():
            if call.endswith("amqha-active-in-sync"):
                continue  # amqha's own check: RabbitMQ has no such route
            said = {key: row[key][side] for key in ("exit", "status", "ok") if key in row}
            good = all(
                value in (0, True) or (isinstance(value, int) and 200 <= value < 300)
                for value in said.values()
            )
            if tool == "flower":
                good = good and not row.get("api_errors", {}).get(side)
            results[f"{tool} {call}"] = "passed" if said and good else "failed"
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args()
    try:
        report = run()
    except RuntimeError as error:
        print(json.dumps({"rabbitmq": str(error)}), flush=True)
        return 1
    text = json.dumps(report, indent=1, default=str)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
