"""What the report's driver JVM starts with (spark/jvm.py), decided before any JVM starts:
whether a run marks its cache directory, writes the class archive, starts from it or does
without it; and what a run that wrote one keeps. tests/spark/test_end_to_end.py runs the
JVMs that write and use it."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import jvm

pytestmark = pytest.mark.skipif(jvm._java() is None, reason="no Java runtime to fingerprint")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(jvm.ARCHIVE_ENV, raising=False)
    return tmp_path / "amqha"


def test_the_first_run_marks_the_second_writes_and_later_ones_start_from_the_archive(
    cache: Path,
) -> None:
    assert jvm.class_archive() is None  # the first run: a mark, no archive
    (mark,) = cache.iterdir()
    assert mark.name.endswith(".jsa.seen")

    writing = jvm.class_archive()
    assert writing is not None and writing.creating is not None
    assert writing.option == f"-XX:ArchiveClassesAtExit={writing.creating}"
    assert writing.path == str(mark)[: -len(".seen")]
    assert writing.option in jvm.driver_options([], writing).split()

    Path(writing.creating).write_bytes(b"classes")  # what the JVM writes as it exits
    writing.finish(exited=True)
    assert sorted(p.name for p in cache.iterdir()) == [Path(writing.path).name]

    using = jvm.class_archive()
    assert using == jvm.ClassArchive(writing.path)
    assert using.option == f"-XX:SharedArchiveFile={writing.path}"


def test_an_archive_from_a_jvm_that_did_not_exit_cleanly_is_not_kept(cache: Path) -> None:
    jvm.class_archive()
    writing = jvm.class_archive()
    assert writing is not None and writing.creating is not None
    Path(writing.creating).write_bytes(b"half")
    writing.finish(exited=False)
    assert not Path(writing.path).exists() and not Path(writing.creating).exists()
    assert Path(f"{writing.path}.seen").exists()  # the next run tries again
    empty = jvm.class_archive()
    assert empty is not None and empty.creating is not None
    Path(empty.creating).write_bytes(b"")
    empty.finish(exited=True)
    assert not Path(empty.path).exists()


@pytest.mark.parametrize("value", ["off", "0", "no", "FALSE"])
def test_no_archive_and_no_mark_when_turned_off(
    cache: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(jvm.ARCHIVE_ENV, value)
    for _ in range(3):
        assert jvm.class_archive() is None
    assert not cache.exists()
    assert not any("Archive" in option for option in jvm.driver_options([], None).split())


def test_a_cache_directory_that_cannot_be_written_means_no_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.delenv(jvm.ARCHIVE_ENV, raising=False)
    assert jvm.class_archive() is None
