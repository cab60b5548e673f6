"""Real clients' own test suites against amqha and against RabbitMQ, tallied side by side.

Suites (``make compat``; downloads, so not part of ``make test``):

- kombu 5.7.0's ``t/integration/test_py_amqp.py``, from kombu's sdist on PyPI
  (``pip download``); it reads the broker's address from RABBITMQ_HOST/RABBITMQ_5672_TCP.
- pika's acceptance tests (``tests/acceptance``), which are not in pika's sdist: taken from
  a pika source tree, ``PIKA_SOURCE`` if set, else ``git clone`` of pika's tag PIKA_TAG from
  GitHub; without either the suite fails with the reason. They hard-code 127.0.0.1:5672, so
  each broker runs for them inside a private network namespace (``unshare -n``) with its
  own loopback, leaving whatever listens on the host's 5672 alone.
- a Celery worker end to end: a worker process and a client in their own virtualenv
  (Celery is installed there, not in the project's), tasks sent and their results read
  back through the rpc:// result backend.

RabbitMQ is Debian's rabbitmq-server, run as a private node (``bench.rabbitmq``). Every
test that passes on RabbitMQ and not on amqha is listed by name. Everything runs on
loopback; every process started here is stopped here, by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import ROOT, ServerProcess

WORK = ROOT / "var" / "compat"
KOMBU_VERSION = "5.7.0"
PIKA_TAG = os.environ.get("PIKA_TAG", "1.4.4")
PIKA_REPOSITORY = "https://github.com/pika/pika"
PIKA_FILES = (
    "tests/acceptance/blocking_adapter_test.py",
    "tests/acceptance/async_adapter_tests.py",
)
SUITE_TIMEOUT = 1800
CELERY_TASKS = 200


class SuiteUnavailable(Exception):
    """A suite's sources could not be obtained; the text says why."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- brokers ----------------------------------------------------------------------------


@contextmanager
def amqha_broker(port: int | None = None) -> Iterator[tuple[str, int]]:
    with tempfile.TemporaryDirectory(prefix="amqha-compat-") as tmp:
        server = ServerProcess(Path(tmp), "compat", port=port).start()
        try:
            yield "127.0.0.1", server.port
        finally:
            server.stop()


@contextmanager
def rabbitmq_broker(port: int | None = None) -> Iterator[tuple[str, int]]:
    from bench.rabbitmq import RabbitNode, ensure_installed

    installed, how = ensure_installed()
    if not installed:
        raise SuiteUnavailable(f"RabbitMQ is not available: {how}")
    node = RabbitNode(port=port)
    node.start()
    try:
        yield "127.0.0.1", node.port
    finally:
        node.stop()


BROKERS: dict[str, Callable[..., Any]] = {"amqha": amqha_broker, "rabbitmq": rabbitmq_broker}


# -- running a pytest suite and reading its outcome ---------------------------------------


def run_pytest(files: list[str], cwd: Path, env: dict[str, str], report: Path) -> dict[str, str]:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--timeout=120",
        f"--junitxml={report}",
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


def kombu_source() -> Path:
    target = WORK / f"kombu-{KOMBU_VERSION}"
    if not target.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        say(f"downloading kombu {KOMBU_VERSION}'s sdist from PyPI")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"kombu=={KOMBU_VERSION}",
                "-d",
                str(WORK),
            ],
            check=False,
            timeout=600,
        )
        archive = WORK / f"kombu-{KOMBU_VERSION}.tar.gz"
        if done.returncode != 0 or not archive.exists():
            raise SuiteUnavailable(f"pip could not download kombu {KOMBU_VERSION}'s sdist")
        with tarfile.open(archive) as tar:
            tar.extractall(WORK, filter="data")
    return target


def kombu_suite(broker: str) -> dict[str, str]:
    source = kombu_source()
    with BROKERS[broker]() as (host, port):
        env = dict(
            os.environ,
            RABBITMQ_HOST=host,
            RABBITMQ_5672_TCP=str(port),
            PYTHONPATH=str(source),
        )
        return run_pytest(
            ["t/integration/test_py_amqp.py"], source, env, WORK / f"kombu-{broker}.xml"
        )


# -- pika -------------------------------------------------------------------------------


def pika_source() -> Path:
    given = os.environ.get("PIKA_SOURCE")
    if given:
        source = Path(given)
        if not all((source / name).exists() for name in PIKA_FILES):
            raise SuiteUnavailable(f"PIKA_SOURCE={given} has no {PIKA_FILES[0]}")
        return source
    target = WORK / f"pika-{PIKA_TAG}"
    if not target.exists():
        say(f"pika's acceptance tests are not in its sdist: cloning {PIKA_REPOSITORY} {PIKA_TAG}")
        done = subprocess.run(
            [
                "git",
                "clone",
                "--quiet",
                "--depth",
                "1",
                "--branch",
                PIKA_TAG,
                PIKA_REPOSITORY,
                str(target),
            ],
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            raise SuiteUnavailable(
                f"cannot clone {PIKA_REPOSITORY} (tag {PIKA_TAG}); set PIKA_SOURCE to a pika "
                "source tree that has tests/acceptance"
            )
    return target


def pika_suite(broker: str) -> dict[str, str]:
    """In a private network namespace: the suite hard-codes 127.0.0.1:5672."""
    source = pika_source()
    report = WORK / f"pika-{broker}.xml"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            "-m",
            "bench.compat",
            "--inside-namespace",
            broker,
            str(source),
            str(report),
        ],
        cwd=ROOT,
        check=False,
        timeout=SUITE_TIMEOUT + 120,
    )
    if done.returncode != 0 and not report.exists():
        raise SuiteUnavailable(f"the pika suite could not run in a network namespace ({broker})")
    return outcomes(report)


def inside_namespace(broker: str, source: Path, report: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with BROKERS[broker](port=5672):
        env = dict(os.environ, PYTHONPATH=str(source))
        run_pytest(list(PIKA_FILES), source, env, report)


# -- Celery -------------------------------------------------------------------------------

CELERY_APP = textwrap.dedent(
    """
    import os
    from celery import Celery

    app = Celery("compat", broker=os.environ["BROKER_URL"], backend="rpc://")
    app.conf.task_acks_late = True
    app.conf.worker_prefetch_multiplier = 4

    @app.task
    def add(x, y):
        return x + y
    """
)


def celery_python() -> Path:
    venv = WORK / "celery-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        say("installing Celery into its own virtualenv")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "celery"], check=False, timeout=900
        )
        if done.returncode != 0:
            raise SuiteUnavailable("pip could not install celery")
    return python


def celery_suite(broker: str) -> dict[str, str]:
    python = celery_python()
    app_dir = WORK / "celery-app"
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "compat_app.py").write_text(CELERY_APP)
    with BROKERS[broker]() as (host, port):
        env = dict(
            os.environ, BROKER_URL=f"amqp://guest:guest@{host}:{port}//", PYTHONPATH=str(app_dir)
        )
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
        )
        try:
            client = textwrap.dedent(
                f"""
                import json
                from compat_app import add
                results = {{}}
                pending = [(i, add.delay(i, i)) for i in range({CELERY_TASKS})]
                for i, result in pending:
                    try:
                        results[f"add({{i}},{{i}})"] = (
                            "passed" if result.get(timeout=60) == 2 * i else "failed"
                        )
                    except Exception as error:
                        results[f"add({{i}},{{i}})"] = "failed"
                print(json.dumps(results))
                """
            )
            done = subprocess.run(
                [str(python), "-c", client],
                cwd=app_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                say(done.stderr[-2000:])
                return {"celery client": "failed"}
            return json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)


SUITES: dict[str, Callable[[str], dict[str, str]]] = {
    "kombu-py-amqp": kombu_suite,
    "pika-acceptance": pika_suite,
    "celery-worker": celery_suite,
}


# -- the tally ----------------------------------------------------------------------------


def tally(results: dict[str, str]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome in results.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def compare(suites: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for suite in suites:
        entry: dict[str, Any] = {}
        results: dict[str, dict[str, str]] = {}
        for broker in BROKERS:
            say(f"== {suite} on {broker}")
            try:
                results[broker] = SUITES[suite](broker)
                entry[broker] = tally(results[broker])
            except SuiteUnavailable as error:
                entry[broker] = {"unavailable": str(error)}
        if len(results) == 2:
            entry["pass_on_rabbitmq_only"] = sorted(
                name
                for name, outcome in results["rabbitmq"].items()
                if outcome == "passed" and results["amqha"].get(name) != "passed"
            )
            entry["pass_on_amqha_only"] = sorted(
                name
                for name, outcome in results["amqha"].items()
                if outcome == "passed" and results["rabbitmq"].get(name) != "passed"
            )
        figures[suite] = entry
    return figures


def print_table(figures: dict[str, Any]) -> None:
    print(f"{'suite':<18} {'amqha':>28} {'RabbitMQ':>28}")
    for suite, entry in figures.items():
        cells = []
        for broker in BROKERS:
            counts = entry.get(broker, {})
            if "unavailable" in counts:
                cells.append("unavailable")
            else:
                run = sum(counts.values()) - counts.get("skipped", 0)
                cells.append(
                    f"{counts.get('passed', 0)}/{run} passed, {counts.get('skipped', 0)} skipped"
                )
        print(f"{suite:<18} {cells[0]:>28} {cells[1]:>28}")
        for name in entry.get("pass_on_rabbitmq_only", []):
            print(f"    passes on RabbitMQ only: {name}")
        for broker in BROKERS:
            if "unavailable" in entry.get(broker, {}):
                print(f"    {broker}: {entry[broker]['unavailable']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", action="append", choices=sorted(SUITES))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--inside-namespace", nargs=3, metavar=("BROKER", "SOURCE", "REPORT"))
    options = parser.parse_args()
    if options.inside_namespace:
        broker, source, report = options.inside_namespace
        inside_namespace(broker, Path(source), Path(report))
        return
    figures = compare(options.suite or list(SUITES))
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2))
    print_table(figures)


if __name__ == "__main__":
    main()
