"""The compiled hot path (amqha/compiled.py): used only when its build matches the
sources, and the interpreted modules still pass their tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from amqha import compiled
from tests.support import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
# The tests of the compiled modules (compiled.MODULES), run again on their sources.
TESTED_BOTH_WAYS = (
    "tests/unit/test_wire.py",  # amqha/wire.py
    "tests/unit/test_changes.py",  # amqha/core/codec.py and core/changes.py
    "tests/unit/test_store.py",  # amqha/store_write.py, and the codec under it
    "tests/unit/test_store_passive.py",
    "tests/unit/test_queue.py",  # amqha/core/queue.py and core/message.py
    "tests/unit/test_priority.py",  # amqha/core/priority.py
    "tests/unit/test_quorum.py",
    "tests/unit/test_confirms.py",  # amqha/core/confirms.py
    "tests/unit/test_vhost.py",  # amqha/core/vhost.py
    "tests/unit/test_dedup.py",  # amqha/core/dedup.py
    "tests/unit/test_release.py",  # a purge and a discard in amqha/core/queue.py
    # amqha/connection.py, channel.py and its parts, in process (tests/memory_peer.py)
    "tests/unit/test_protocol_memory.py",
    "tests/unit/test_confirm_pipeline_memory.py",
)
BUILT = (compiled.BUILD / compiled.STAMP).is_file()
needs_build = pytest.mark.skipif(
    not BUILT,
    reason="no compiled build (`make compiled` needs a C compiler; the modules run interpreted)",
)


def python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != compiled.DISABLE} | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@needs_build
def test_a_build_that_matches_the_sources_is_what_a_server_loads() -> None:
    origin = python(
        "import amqha.wire as w, amqha.compiled as c; print(w.__file__, c.active(), c.describe())"
    )
    assert "build/compiled/lib/amqha/wire." in origin and "['amqha.wire']" in origin
    assert origin.endswith(" compiled (amqha.wire)")


@needs_build
def test_a_server_says_at_its_start_how_it_runs_the_hot_path(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "hot").start()
    try:
        said = server.own_output().decode()
    finally:
        server.stop()
    assert f"amqha hot: hot path compiled ({', '.join(compiled.NAMES)})" in said


def test_with_amqha_interpreted_set_every_module_runs_from_its_source() -> None:
    origin = python(
        "import amqha.wire as w, amqha.compiled as c; print(w.__file__, c.active(), c.describe())",
        AMQHA_INTERPRETED="1",
    )
    assert origin == f"{ROOT}/amqha/wire.py [] interpreted (AMQHA_INTERPRETED is set)"


@needs_build
def test_a_build_of_other_sources_is_not_used(tmp_path: Path) -> None:
    """A source edited since the build: its interpreted self runs, never the older build."""
    shutil.copytree(compiled.BUILD, tmp_path / "compiled")
    stamp_file = tmp_path / "compiled" / compiled.STAMP
    stamp = json.loads(stamp_file.read_text())
    stamp["sources"]["amqha/wire.py"] = "0" * 64
    stamp_file.write_text(json.dumps(stamp))
    code = (
        "import os; import amqha.compiled as c; del os.environ['AMQHA_INTERPRETED'];"
        f"c.BUILD = __import__('pathlib').Path({str(tmp_path / 'compiled')!r});"
        "print(c.install()); import amqha.wire as w; print(w.__file__)"
    )
    assert python(code, AMQHA_INTERPRETED="1").split() == ["False", f"{ROOT}/amqha/wire.py"]
    # The same copy with its true stamp is taken: what made the difference is the stamp.
    shutil.copy(compiled.BUILD / compiled.STAMP, stamp_file)
    loaded = python(code, AMQHA_INTERPRETED="1").split()
    assert loaded[0] == "True" and loaded[1].startswith(str(tmp_path / "compiled" / "lib"))


@needs_build
def test_the_compiled_modules_tests_pass_on_the_interpreted_modules_too() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-x",
            *TESTED_BOTH_WAYS,
        ],
        cwd=ROOT,
        env=os.environ | {compiled.DISABLE: "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout
