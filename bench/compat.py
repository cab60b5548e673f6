"""Real clients' own test suites against amqha (alone and as the pair it ships as) and
against RabbitMQ, tallied side by side.

Brokers (``--broker``, default all three): ``amqha``, one server; ``amqha-pair``, the pair
as it ships, the suites on the primary (ACTIVE) while the backup (PASSIVE), in sync before
the suite starts, replicates everything they do; ``rabbitmq``, Debian's rabbitmq-server as
a private node (``bench.rabbitmq``). Each also serves amqps on a port of its own, with a
certificate made for the run (aio-pika's amqps tests connect there).

Suites (``make compat``; downloads, so not part of ``make test``):

- kombu 5.7.0's ``t/integration/test_py_amqp.py``, from kombu's sdist on PyPI
  (``pip download``); it reads the broker's address from RABBITMQ_HOST/RABBITMQ_5672_TCP.
- pika's acceptance tests (``tests/acceptance``), which are not in pika's sdist: taken from
  a pika source tree, ``PIKA_SOURCE`` if set, else ``git clone`` of pika's tag PIKA_TAG from
  GitHub; without either the suite fails with the reason. The whole directory runs, every
  adapter included (tornado, gevent and Twisted are installed, with pytest, into a
  virtualenv of the suite's own). They hard-code 127.0.0.1:5672, so each broker runs for
  them inside a private network namespace (``unshare -n``) with its own loopback (both
  127.0.0.1 and [::1]), leaving whatever listens on the host's 5672 alone.
- amqplib's own tests (Node.js, ``node --test``), which are not in its npm package either:
  from ``AMQPLIB_SOURCE`` if set, else ``git clone`` of tag AMQPLIB_TAG; the one library
  they need beyond Node (``claire``, at the version their package.json names) is installed
  with npm into a directory of its own. They hard-code ``amqp://localhost``, so they run in
  a private network namespace like pika's, one ``node --test`` per test file (a file that
  hangs is stopped after FILE_TIMEOUT and counts as one more failure; its tests that never
  reported are missing from the tally).
- aio-pika's own tests (``tests/``, in its source tree, not its wheel): ``AIOPIKA_SOURCE``
  if set, else ``git clone`` of tag AIOPIKA_TAG, run with that tree's aio_pika and the
  libraries its tests need in a virtualenv of the suite's own. Its fixtures start RabbitMQ
  in a Docker container; a small pytest plugin (AIO_PIKA_BROKER, loaded with ``-p``) hands
  them the broker under test instead, its amqps port included.
- a Celery worker end to end: a worker process and a client in their own virtualenv
  (Celery is installed there, not in the project's), tasks sent and their results read
  back through the rpc:// result backend.
- the management API's tools (``management-tools``: rabbitmqadmin, pyrabbit2, Celery
  Flower's broker page; ``bench.management_compat``), amqha alone beside RabbitMQ with its
  management plugin, each call counted as a test;
- the same Celery worker through a failover (``celery-failover``, on the pair only): worker
  and client are given both servers' URLs, and the ACTIVE is killed -9 once half of the
  tasks' results are back; the other half is sent after the kill.

Every test that passes on RabbitMQ and not on an amqha column is listed by name.
Everything runs on loopback; every process started here is stopped here, by pid. Here: each
suite's run and how its outcomes are read, the tally and the table; the brokers are in
``bench.compat_brokers``, where the suites come from and what they run with in
``bench.compat_sources``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.compat_brokers import BROKERS
from bench.compat_sources import (
    AIOPIKA_PACKAGES,
    PIKA_EXTRAS,
    WORK,
    SuiteUnavailable,
    aio_pika_source,
    amqplib_modules,
    amqplib_source,
    kombu_source,
    pika_source,
    say,
    suite_python,
)
from tests.support import ROOT

# The whole acceptance directory: the blocking adapter, every asynchronous adapter (select,
# asyncio, tornado, gevent) and the Twisted adapter, which need their own libraries.
PIKA_FILES = ("tests/acceptance",)

# amqplib's package.json gives each test 1 s; on a busy machine that measures the machine.
AMQPLIB_TEST_TIMEOUT_MS = 30000
FILE_TIMEOUT = 300
SUITE_TIMEOUT = 1800
CELERY_TASKS = 200

# What each amqha column is compared with.
REFERENCE = "rabbitmq"


# -- running a pytest suite and reading its outcome ---------------------------------------


def run_pytest(
    files: list[str],
    cwd: Path,
    env: dict[str, str],
    report: Path,
    python: Path | None = None,
    options: tuple[str, ...] = (),
) -> dict[str, str]:
    command = [
        str(python or sys.executable),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--timeout=120",
        f"--junitxml={report}",
        *options,
        *files,
    ]
    subprocess.run(command, cwd=cwd, env=env, timeout=SUITE_TIMEOUT, stdout=sys.stderr, check=False)
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    """Each test's outcome (passed, failed, error, skipped) from a JUnit XML report."""
    if not report.exists():
        return {}
    results = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        results[name] = outcome
    return results


# -- kombu ------------------------------------------------------------------------------


def kombu_suite(broker: str) -> dict[str, str]:
    source = kombu_source()
    with BROKERS[broker]() as under_test:
        env = dict(
            os.environ,
            RABBITMQ_HOST=under_test.host,
            RABBITMQ_5672_TCP=str(under_test.port),
            PYTHONPATH=str(source),
        )
        return run_pytest(
            ["t/integration/test_py_amqp.py"], source, env, WORK / f"kombu-{broker}.xml"
        )


# -- pika -------------------------------------------------------------------------------


def pika_suite(broker: str) -> dict[str, str]:
    """In a private network namespace: the suite hard-codes 127.0.0.1:5672."""
    source = pika_source()
    suite_python("pika", PIKA_EXTRAS)  # installed here, where the network is
    return in_namespace("pika-acceptance", broker, source)


def in_namespace(suite: str, broker: str, source: Path) -> dict[str, str]:
    """Run ``suite`` against ``broker`` on 127.0.0.1:5672 of a private network namespace."""
    # pytest writes JUnit XML; the amqplib runner, which reads node's reports, writes JSON.
    report = WORK / f"{suite}-{broker}.{'json' if suite == 'amqplib' else 'xml'}"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            "-m",
            "bench.compat",
            "--inside-namespace",
            suite,
            broker,
            str(source),
            str(report),
        ],
        cwd=ROOT,
        check=False,
        timeout=SUITE_TIMEOUT + 120,
    )
    if done.returncode != 0 and not report.exists():
        raise SuiteUnavailable(f"the {suite} suite could not run in a network namespace ({broker})")
    if report.suffix == ".json":
        return json.loads(report.read_text())  # type: ignore[no-any-return]
    return outcomes(report)


def inside_namespace(suite: str, broker: str, source: Path, report: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # Both loopbacks, as a broker listening on every interface would be reached.
    with BROKERS[broker](port=5672, ipv6=True):
        if suite == "amqplib":
            report.write_text(json.dumps(amqplib_run(source)))
            return
        env = dict(os.environ, PYTHONPATH=str(source))
        run_pytest(list(PIKA_FILES), source, env, report, suite_python("pika", PIKA_EXTRAS))


# -- amqplib ------------------------------------------------------------------------------


def amqplib_suite(broker: str) -> dict[str, str]:
    source = amqplib_source()
    amqplib_modules(source)
    return in_namespace("amqplib", broker, source)


def amqplib_run(source: Path) -> dict[str, str]:
    """Each test file in its own ``node --test``, with a JUnit report read back per file."""
    env = dict(
        os.environ, NODE_PATH=str(WORK / "amqplib-deps" / "node_modules"), URL="amqp://localhost"
    )
    results: dict[str, str] = {}
    for test_file in sorted((source / "test").glob("*.test.js")):
        report = WORK / f"amqplib-{test_file.stem}.xml"
        report.unlink(missing_ok=True)
        command = [
            "node",
            "--test",
            f"--test-timeout={AMQPLIB_TEST_TIMEOUT_MS}",
            "--test-reporter=spec",
            "--test-reporter-destination=stderr",
            "--test-reporter=junit",
            f"--test-reporter-destination={report}",
            str(test_file.relative_to(source)),
        ]
        process = subprocess.Popen(command, cwd=source, env=env, stdout=sys.stderr)
        try:
            process.wait(timeout=FILE_TIMEOUT)
            hung = False
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
            hung = True
        found = node_outcomes(report, test_file.name)
        if hung:
            say(f"{test_file.name} did not finish in {FILE_TIMEOUT} s: stopped")
            found[f"{test_file.name}::(file did not finish)"] = "failed"
        results.update(found)
    return results


def node_outcomes(report: Path, prefix: str) -> dict[str, str]:
    """Each test's outcome from node's JUnit report: suites nest, names are their path."""
    if not report.exists() or not report.stat().st_size:
        return {}
    try:
        root = ElementTree.parse(report).getroot()
    except ElementTree.ParseError:
        return {}
    results: dict[str, str] = {}

    def walk(element: ElementTree.Element, path: str) -> None:
        for child in element:
            if child.tag == "testsuite":
                walk(child, f"{path} > {child.get('name')}")
            elif child.tag == "testcase":
                name = f"{path} > {child.get('name')}"
                outcome = "passed"
                for mark in child:
                    if mark.tag in ("failure", "error"):
                        outcome = "failed"
                    elif mark.tag == "skipped" and outcome == "passed":
                        outcome = "skipped"
                number = 2
                unique = name
                while unique in results:
                    unique = f"{name} #{number}"
                    number += 1
                results[unique] = outcome

    walk(root, prefix)
    return results


# -- aio-pika -----------------------------------------------------------------------------

AIO_PIKA_BROKER = textwrap.dedent(
    """
    \"\"\"pytest plugin: aio-pika's fixtures get the broker under test, not a container.\"\"\"
    import os

    import tests.docker_client as docker_client

    PORT = int(os.environ["COMPAT_AMQP_PORT"])
    TLS_PORT = int(os.environ["COMPAT_AMQPS_PORT"])


    class BrokerUnderTest:
        def __init__(self, *args, **kwargs):
            pass

        def run(self, image, ports, environment=None):
            return docker_client.ContainerInfo(
                id="compat", ports={"5672/tcp": PORT, "5671/tcp": TLS_PORT}, host="127.0.0.1"
            )

        def kill(self, container_id):
            pass

        def remove(self, container_id):
            pass


    docker_client.check_docker_available = lambda: docker_client.DockerHostInfo(is_tcp=False)
    docker_client.DockerClient = BrokerUnderTest
    """
)


def aio_pika_suite(broker: str) -> dict[str, str]:
    source = aio_pika_source()
    python = suite_python("aio-pika", AIOPIKA_PACKAGES)
    plugin_dir = WORK / "aio-pika-plugin"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / "compat_broker.py").write_text(AIO_PIKA_BROKER)
    with BROKERS[broker]() as under_test:
        env = dict(
            os.environ,
            COMPAT_AMQP_PORT=str(under_test.port),
            COMPAT_AMQPS_PORT=str(under_test.tls_port),
            PYTHONPATH=os.pathsep.join((str(source), str(plugin_dir))),
        )
        return run_pytest(
            ["tests"],
            source,
            env,
            WORK / f"aio-pika-{broker}.xml",
            python,
            ("-p", "compat_broker", "-p", "no:asyncio", "-o", "log_cli=false"),
        )


# -- Celery -------------------------------------------------------------------------------

CELERY_APP = textwrap.dedent(
    """
    import os
    from celery import Celery

    # BROKER_URL: one URL, or several separated by ";" (kombu tries them in turn).
    app = Celery("compat", broker=os.environ["BROKER_URL"], backend="rpc://")
    app.conf.task_acks_late = True
    app.conf.worker_prefetch_multiplier = 4
    # Task messages are persistent and their publishes confirmed: sent means kept.
    app.conf.broker_transport_options = {"confirm_publish": True}
    app.conf.task_publish_retry_policy = {"max_retries": 30, "interval_start": 0.5}
    app.conf.broker_connection_retry_on_startup = True

    @app.task
    def add(x, y):
        return x + y
    """
)

CELERY_CLIENT = textwrap.dedent(
    """
    import json
    import sys
    from compat_app import add

    tasks, failover = int(sys.argv[1]), sys.argv[2] == "failover"
    results = {}

    def collect(pending):
        for i, result in pending:
            try:
                outcome = "passed" if result.get(timeout=120) == 2 * i else "failed"
            except Exception:
                outcome = "failed"
            results[f"add({i},{i})"] = outcome

    half = tasks // 2 if failover else tasks
    collect([(i, add.delay(i, i)) for i in range(half)])
    if failover:
        # The harness kills -9 the ACTIVE on this line and answers once it has.
        print("kill now", flush=True)
        sys.stdin.readline()
        collect([(i, add.delay(i, i)) for i in range(half, tasks)])
    print(json.dumps(results), flush=True)
    """
)


def celery_run(broker: str, failover: bool) -> dict[str, str]:
    """A Celery worker and a client sending CELERY_TASKS tasks and reading their results
    (rpc://). Through a failover: both are given every server of the pair, and the
    ACTIVE is killed -9 after the first half of the results came back."""
    python = suite_python("celery", ("celery",))
    app_dir = WORK / "celery-app"
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "compat_app.py").write_text(CELERY_APP)
    (app_dir / "compat_client.py").write_text(CELERY_CLIENT)
    with BROKERS[broker]() as under_test:
        if failover and under_test.kill_active is None:
            raise SuiteUnavailable(f"{broker} has no second server to fail over to")
        addresses = under_test.servers if failover else (f"{under_test.host}:{under_test.port}",)
        url = ";".join(f"amqp://guest:guest@{address}//" for address in addresses)
        env = dict(os.environ, BROKER_URL=url, PYTHONPATH=str(app_dir))
        worker = subprocess.Popen(
            [
                str(python),
                "-m",
                "celery",
                "-A",
                "compat_app",
                "worker",
                "--pool=solo",
                "--loglevel=WARNING",
                "--without-mingle",
                "--without-gossip",
            ],
            cwd=app_dir,
            env=env,
            stdout=sys.stderr,  # its banner is not the table's
        )
        client = subprocess.Popen(
            [str(python), "compat_client.py", str(CELERY_TASKS), "failover" if failover else "-"],
            cwd=app_dir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert client.stdin is not None and client.stdout is not None
            last = ""
            for line in client.stdout:  # ends when the client exits (bounded by its gets)
                last = line.strip() or last
                if last == "kill now" and under_test.kill_active is not None:
                    say(f"celery: kill -9 of the ACTIVE ({under_test.kill_active()})")
                    client.stdin.write("killed\n")
                    client.stdin.flush()
            client.wait(timeout=60)
            if client.returncode != 0 or not last.startswith("{"):
                return {"celery client": "failed"}
            return json.loads(last)  # type: ignore[no-any-return]
        finally:
            for process in (client, worker):
                if process.poll() is None:
                    process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)


def celery_suite(broker: str) -> dict[str, str]:
    return celery_run(broker, failover=False)


def celery_failover_suite(broker: str) -> dict[str, str]:
    return celery_run(broker, failover=True)


_MANAGEMENT: dict[str, Any] = {}


def management_suite(broker: str) -> dict[str, str]:
    """The management API's tools (rabbitmqadmin, pyrabbit2, Celery Flower's broker page,
    purge/delete/close/import), one run of ``bench.management_compat`` for both columns:
    each call a test."""
    if broker == "amqha-pair":
        raise SuiteUnavailable("run on one amqha server (tests/integration covers the pair)")
    if not _MANAGEMENT:
        from bench import management_compat

        try:
            _MANAGEMENT.update(management_compat.run())
        except RuntimeError as error:
            raise SuiteUnavailable(str(error)) from error
    from bench.management_compat import outcomes as call_outcomes

    return call_outcomes(_MANAGEMENT, broker)


SUITES: dict[str, Callable[[str], dict[str, str]]] = {
    "kombu-py-amqp": kombu_suite,
    "pika-acceptance": pika_suite,
    "amqplib": amqplib_suite,
    "aio-pika": aio_pika_suite,
    "celery-worker": celery_suite,
    "celery-failover": celery_failover_suite,
    "management-tools": management_suite,
}
# Suites that need a second server to fail over to: run on the pair only.
FAILOVER_SUITES = {"celery-failover"}
# Suites that compare amqha alone with RabbitMQ (one run serves both columns).
SINGLE_SERVER_SUITES = {"management-tools"}


# -- the tally ----------------------------------------------------------------------------


def tally(results: dict[str, str]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome in results.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def brokers_for(suite: str, brokers: list[str]) -> list[str]:
    if suite in SINGLE_SERVER_SUITES:
        return [b for b in brokers if b != "amqha-pair"]
    return [b for b in brokers if suite not in FAILOVER_SUITES or b == "amqha-pair"]


def compare(suites: list[str], brokers: list[str]) -> dict[str, Any]:
    """Each suite on each broker; for each amqha column, the tests that pass on RabbitMQ
    and not there (and the reverse), by name."""
    figures: dict[str, Any] = {}
    for suite in suites:
        entry: dict[str, Any] = {}
        results: dict[str, dict[str, str]] = {}
        for broker in brokers_for(suite, brokers):
            say(f"== {suite} on {broker}")
            try:
                results[broker] = SUITES[suite](broker)
                entry[broker] = tally(results[broker])
            except SuiteUnavailable as error:
                entry[broker] = {"unavailable": str(error)}
        reference = results.get(REFERENCE)
        for broker, outcomes_ in results.items():
            if broker == REFERENCE or reference is None:
                continue
            entry[f"pass_on_rabbitmq_only:{broker}"] = sorted(
                name
                for name, outcome in reference.items()
                if outcome == "passed" and outcomes_.get(name) != "passed"
            )
            entry[f"pass_on_{broker}_only"] = sorted(
                name
                for name, outcome in outcomes_.items()
                if outcome == "passed" and reference.get(name) != "passed"
            )
        figures[suite] = entry
    return figures


def print_table(figures: dict[str, Any], brokers: list[str]) -> None:
    """One table: a suite per row, a broker per column (``-`` where a suite does not apply)."""
    titles = {"amqha": "amqha", "amqha-pair": "amqha pair", "rabbitmq": "RabbitMQ"}
    print(f"{'suite':<18}" + "".join(f" {titles.get(b, b):>28}" for b in brokers))
    for suite, entry in figures.items():
        cells = []
        for broker in brokers:
            counts = entry.get(broker)
            if counts is None:
                cells.append("-")
            elif "unavailable" in counts:
                cells.append("unavailable")
            else:
                run = sum(counts.values()) - counts.get("skipped", 0)
                cells.append(
                    f"{counts.get('passed', 0)}/{run} passed, {counts.get('skipped', 0)} skipped"
                )
        print(f"{suite:<18}" + "".join(f" {cell:>28}" for cell in cells))
        for key, names in entry.items():
            if key.startswith("pass_on_rabbitmq_only:"):
                for name in names:
                    print(f"    passes on RabbitMQ, not on {key.split(':', 1)[1]}: {name}")
        for broker in brokers:
            if "unavailable" in entry.get(broker, {}):
                print(f"    {broker}: {entry[broker]['unavailable']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", action="append", choices=sorted(SUITES))
    parser.add_argument(
        "--broker", action="append", choices=sorted(BROKERS), help="default: every broker"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--inside-namespace", nargs=4, metavar=("SUITE", "BROKER", "SOURCE", "REPORT")
    )
    options = parser.parse_args()
    if options.inside_namespace:
        suite, broker, source, report = options.inside_namespace
        inside_namespace(suite, broker, Path(source), Path(report))
        return
    brokers = options.broker or list(BROKERS)
    figures = compare(options.suite or list(SUITES), brokers)
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2))
    print_table(figures, brokers)


if __name__ == "__main__":
    main()
