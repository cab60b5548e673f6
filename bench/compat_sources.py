"""Where ``bench.compat``'s client suites come from and what they run with.

kombu's sdist from PyPI (``pip download``); pika's, amqplib's and aio-pika's source trees,
which their packages do not ship (``PIKA_SOURCE``, ``AMQPLIB_SOURCE``, ``AIOPIKA_SOURCE`` if
set, else a ``git clone`` of the tag named here); the test library amqplib's tests need
(npm); and a virtualenv of a suite's own with what it needs (``suite_python``: never the
project's). Everything lands under var/compat, once; what cannot be had raises
``SuiteUnavailable``, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support import ROOT

WORK = ROOT / "var" / "compat"
KOMBU_VERSION = "5.7.0"
PIKA_TAG = os.environ.get("PIKA_TAG", "1.4.4")
PIKA_REPOSITORY = "https://github.com/pika/pika"
PIKA_CHECK_FILE = "tests/acceptance/async_adapter_tests.py"
PIKA_EXTRAS = ("pytest", "pytest-timeout", "tornado", "gevent", "twisted")
AIOPIKA_TAG = os.environ.get("AIOPIKA_TAG", "9.6.0")
AIOPIKA_REPOSITORY = "https://github.com/mosquito/aio-pika"
# What aio-pika's tests import beyond its own tree (its pyproject's dependencies and dev
# group); the released package of the same version too, for its metadata (aio_pika reads
# its own version from it), while the code imported is the tree's.
AIOPIKA_PACKAGES = (
    f"aio-pika=={AIOPIKA_TAG}",
    "aiormq>=6.8,<7",
    "yarl",
    "aiomisc>=18.0",
    "aiomisc-pytest",
    "shortuuid",
    "pytest",
    "pytest-timeout",
)
AMQPLIB_TAG = os.environ.get("AMQPLIB_TAG", "v2.0.1")
AMQPLIB_REPOSITORY = "https://github.com/amqp-node/amqplib"


class SuiteUnavailable(Exception):
    """A suite's sources could not be obtained; the text says why."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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


# -- pika -------------------------------------------------------------------------------


def pika_source() -> Path:
    given = os.environ.get("PIKA_SOURCE")
    if given:
        source = Path(given)
        if not (source / PIKA_CHECK_FILE).exists():
            raise SuiteUnavailable(f"PIKA_SOURCE={given} has no {PIKA_CHECK_FILE}")
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


# -- amqplib ------------------------------------------------------------------------------


def amqplib_source() -> Path:
    given = os.environ.get("AMQPLIB_SOURCE")
    if given:
        source = Path(given)
        if not (source / "test" / "channel_api.test.js").exists():
            raise SuiteUnavailable(f"AMQPLIB_SOURCE={given} has no test/channel_api.test.js")
        return source
    target = WORK / f"amqplib-{AMQPLIB_TAG}"
    if not target.exists():
        say(
            f"amqplib's tests are not in its npm package: cloning {AMQPLIB_REPOSITORY} {AMQPLIB_TAG}"
        )
        done = subprocess.run(
            [
                "git",
                "clone",
                "--quiet",
                "--depth",
                "1",
                "--branch",
                AMQPLIB_TAG,
                AMQPLIB_REPOSITORY,
                str(target),
            ],
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            raise SuiteUnavailable(
                f"cannot clone {AMQPLIB_REPOSITORY} (tag {AMQPLIB_TAG}); set AMQPLIB_SOURCE to "
                "an amqplib source tree that has test/"
            )
    return target


def amqplib_modules(source: Path) -> Path:
    """The test-only library amqplib's tests require, at the version its package.json names."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise SuiteUnavailable("node and npm are needed for amqplib's tests")
    version = json.loads((source / "package.json").read_text())["devDependencies"]["claire"]
    prefix = WORK / "amqplib-deps"
    modules = prefix / "node_modules"
    if not (modules / "claire" / "package.json").exists():
        say(f"installing claire@{version} (amqplib's test library) with npm")
        done = subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(prefix),
                "--no-save",
                "--no-package-lock",
                f"claire@{version}",
            ],
            check=False,
            timeout=600,
            stdout=sys.stderr,
        )
        if done.returncode != 0:
            raise SuiteUnavailable(f"npm could not install claire@{version}")
    return modules


# -- aio-pika -----------------------------------------------------------------------------


def aio_pika_source() -> Path:
    given = os.environ.get("AIOPIKA_SOURCE")
    if given:
        source = Path(given)
        if not (source / "tests" / "conftest.py").exists() or not (source / "aio_pika").exists():
            raise SuiteUnavailable(f"AIOPIKA_SOURCE={given} has no aio_pika/ and tests/conftest.py")
        return source
    target = WORK / f"aio-pika-{AIOPIKA_TAG}"
    if not target.exists():
        say(f"aio-pika's tests: cloning {AIOPIKA_REPOSITORY} {AIOPIKA_TAG}")
        done = subprocess.run(
            [
                "git",
                "clone",
                "--quiet",
                "--depth",
                "1",
                "--branch",
                AIOPIKA_TAG,
                AIOPIKA_REPOSITORY,
                str(target),
            ],
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            raise SuiteUnavailable(
                f"cannot clone {AIOPIKA_REPOSITORY} (tag {AIOPIKA_TAG}); set AIOPIKA_SOURCE to "
                "an aio-pika source tree"
            )
    return target


# -- a suite's own virtualenv -------------------------------------------------------------


def suite_python(name: str, packages: tuple[str, ...]) -> Path:
    """A virtualenv of a suite's own, with what it needs (never the project's)."""
    venv = WORK / f"{name}-venv"
    python = venv / "bin" / "python"
    ready = venv / ".installed"
    wanted = "\n".join(packages) + "\n"
    if not ready.exists() or ready.read_text() != wanted:
        say(f"installing {', '.join(packages)} into a virtualenv for {name}")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *packages], check=False, timeout=900
        )
        if done.returncode != 0:
            raise SuiteUnavailable(f"pip could not install {', '.join(packages)} for {name}")
        ready.write_text(wanted)
    return python
