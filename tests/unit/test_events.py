"""The failover event log (JSON Lines, schema v1) and the durable epoch store."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from failover.epoch import EPOCH_FILE, EpochFileError, load_epoch, store_epoch
from failover.events import EventLog, RecordThrottle, read_events, record
from failover.fsm import Event, Role, State
from tests.support import ROOT


class FakeWallClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "nested" / "events.jsonl"


@pytest.fixture
def log(log_path: Path) -> Iterator[EventLog]:
    with EventLog(log_path, "alpha", "primary", clock=FakeWallClock()) as event_log:
        yield event_log


# --- records -------------------------------------------------------------------------------


def test_record_puts_the_envelope_first_then_the_event_fields() -> None:
    entry = record(12.5, "alpha", "primary", 3, "ACTIVE", "redirect", client="1.2.3.4:5", to=None)
    assert list(entry) == [
        "v",
        "ts",
        "node",
        "role",
        "epoch",
        "state",
        "event",
        "client",
        "to",
    ]
    assert entry == {
        "v": 1,
        "ts": 12.5,
        "node": "alpha",
        "role": "primary",
        "epoch": 3,
        "state": "ACTIVE",
        "event": "redirect",
        "client": "1.2.3.4:5",
        "to": None,
    }


def test_record_refuses_fields_that_would_overwrite_the_envelope(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['node', 'ts'\]"):
        record(1.0, "alpha", "primary", 1, "ACTIVE", "console", ts=2.0, node="beta")

    with (
        EventLog(tmp_path / "events.jsonl", "alpha", "primary") as log,
        pytest.raises(ValueError, match=r"\['epoch', 'v'\]"),
    ):
        log.write("console", "ACTIVE", 1, v=2, epoch=3)


# --- the writer ----------------------------------------------------------------------------


def test_each_write_is_one_json_line_on_disk_before_close(log: EventLog, log_path: Path) -> None:
    log.write("started", "PRIMARY", 0, listen="127.0.0.1:5672", peer="127.0.0.1:5673")
    log.write(
        "transition",
        State.ACTIVE,
        1,
        **{"from": State.PRIMARY, "to": State.ACTIVE},
        trigger=Event.PEER_BACKUP,
        reason="the peer is a fresh backup: we lead",
    )
    lines = log_path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "v": 1,
            "ts": 1_700_000_000.25,
            "node": "alpha",
            "role": "primary",
            "epoch": 0,
            "state": "PRIMARY",
            "event": "started",
            "listen": "127.0.0.1:5672",
            "peer": "127.0.0.1:5673",
        },
        {
            "v": 1,
            "ts": 1_700_000_000.5,
            "node": "alpha",
            "role": "primary",
            "epoch": 1,
            "state": "ACTIVE",
            "event": "transition",
            "from": "PRIMARY",
            "to": "ACTIVE",
            "trigger": "PEER_BACKUP",
            "reason": "the peer is a fresh backup: we lead",
        },
    ]


def test_write_returns_the_record_it_wrote(log: EventLog, log_path: Path) -> None:
    written = log.write("peer_lost", "PASSIVE", 2, peer="beta", peer_state="ACTIVE", last_seen=9.0)
    assert read_events(log_path) == [written]
    assert written["event"] == "peer_lost" and written["node"] == "alpha"


def test_the_log_appends_across_reopening(log_path: Path) -> None:
    clock = FakeWallClock()
    with EventLog(log_path, "beta", Role.BACKUP, clock=clock) as first:
        first.write("started", "BACKUP", 0, listen="b:5673", peer="a:5672")
    with EventLog(log_path, "beta", Role.BACKUP, clock=clock) as second:
        second.write("stopped", "PASSIVE", 1, listen="b:5673", peer="a:5672")
    events = read_events(log_path)
    assert [(e["event"], e["role"]) for e in events] == [
        ("started", "backup"),
        ("stopped", "backup"),
    ]


def test_a_line_torn_by_a_crash_does_not_swallow_the_next_record(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True)
    log_path.write_text('{"v":1,"ts":1.0,"event":"started"}\n{"v":1,"ts":2.0,"ev', "utf-8")
    with EventLog(log_path, "alpha", "primary", clock=lambda: 3.0) as log:
        log.write("started", "PRIMARY", 0, listen="a:5672", peer="b:5673")
    assert [(e["ts"], e["event"]) for e in read_events(log_path)] == [
        (1.0, "started"),
        (3.0, "started"),
    ]


def test_a_value_json_cannot_carry_is_refused_and_nothing_is_written(
    log: EventLog, log_path: Path
) -> None:
    with pytest.raises(ValueError):
        log.write("peer_up", "ACTIVE", 1, peer="beta", peer_state="PASSIVE", last_seen=float("nan"))
    with pytest.raises(TypeError):
        log.write("console", "ACTIVE", 1, user="admin", command=object(), result="ok")
    assert log_path.read_text(encoding="utf-8") == ""


def test_close_fsyncs_once_and_is_idempotent(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    log = EventLog(log_path, "alpha", "primary")
    log.write("stopped", "ACTIVE", 4, listen="a:5672", peer="b:5673")
    assert synced == []  # flushed per record, not fsynced
    log.close()
    log.close()
    assert len(synced) == 1
    with pytest.raises(ValueError):
        log.write("stopped", "ACTIVE", 4, listen="a:5672", peer="b:5673")


def test_the_default_clock_is_wall_time_in_seconds(log_path: Path) -> None:
    with EventLog(log_path, "alpha", "primary") as log:
        entry = log.write("started", "PRIMARY", 0, listen="a:5672", peer="b:5673")
    assert 1_600_000_000 < entry["ts"] < 4_000_000_000


# --- the reader ----------------------------------------------------------------------------


def test_read_events_skips_torn_blank_garbage_and_non_object_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"v":1,"event":"started"}\n'
        b"\n"
        b"not json at all\n"
        b"[1, 2, 3]\n"
        b'"a string"\n'
        b"\xff\xfe broken bytes\n"
        b'{"v":1,"event":"transition"}\n'
        b'{"v":1,"event":"tor'
    )
    assert read_events(path) == [
        {"v": 1, "event": "started"},
        {"v": 1, "event": "transition"},
    ]


def test_read_events_of_a_missing_log_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_events(tmp_path / "absent.jsonl")


# --- the epoch store -----------------------------------------------------------------------


def test_no_stored_epoch_is_epoch_zero(tmp_path: Path) -> None:
    assert load_epoch(tmp_path / "never-created") == 0


def test_a_stored_epoch_is_loaded_back_and_replaced(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store_epoch(data_dir, 3)
    assert load_epoch(data_dir) == 3
    store_epoch(data_dir, 12)
    assert load_epoch(data_dir) == 12
    assert sorted(p.name for p in data_dir.iterdir()) == [EPOCH_FILE]  # no temp file left


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        (b"", "expected one integer"),
        (b"three\n", "expected one integer"),
        (b"4 5\n", "expected one integer"),
        (b"-2\n", "must not be negative"),
        (b"\xff\xfe\n", "non-ASCII"),
    ],
)
def test_a_corrupt_epoch_file_is_an_error_naming_the_file(
    tmp_path: Path, content: bytes, complaint: str
) -> None:
    path = tmp_path / EPOCH_FILE
    path.write_bytes(content)
    with pytest.raises(EpochFileError, match=complaint) as error:
        load_epoch(tmp_path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("bad", [-1, True, 2.0, "3"])
def test_only_a_non_negative_integer_is_stored(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        store_epoch(tmp_path, bad)  # type: ignore[arg-type]
    assert not (tmp_path / EPOCH_FILE).exists()


def test_a_failed_store_keeps_the_old_epoch_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_epoch(tmp_path, 5)

    def crash(*args: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        store_epoch(tmp_path, 6)
    assert load_epoch(tmp_path) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == [EPOCH_FILE]


def test_store_fsyncs_the_file_and_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store_epoch(tmp_path, 1)
    assert len(synced) == 2
    assert Path(synced[0]).parent == tmp_path and Path(synced[0]).name.endswith(".tmp")
    assert synced[1] == str(tmp_path)


def test_a_named_pair_is_in_every_record_after_the_envelope(log_path: Path) -> None:
    with EventLog(log_path, "alpha", "primary", clock=FakeWallClock(), pair="eu-1") as named:
        named.write("started", "PRIMARY", 0, listen="127.0.0.1:5672")
        named.write("redirect", "PASSIVE", 1, client="1.2.3.4:5", to=None)
        with pytest.raises(ValueError, match=r"\['pair'\]"):
            named.write("console", "ACTIVE", 1, pair="other")
    entries = read_events(log_path)
    assert [e["pair"] for e in entries] == ["eu-1", "eu-1"]
    assert list(entries[0])[:8] == ["v", "ts", "node", "role", "epoch", "state", "event", "pair"]
    assert "pair" not in record(1.0, "alpha", "primary", 1, "ACTIVE", "console")


# -- the throttle of records a peer or a client can cause ----------------------------------


def test_throttle_records_one_per_kind_per_interval_and_counts_the_rest() -> None:
    throttle = RecordThrottle(1.0)
    assert throttle.admit("redirect", 10.0) == 0
    assert [throttle.admit("redirect", 10.0 + i / 10) for i in range(1, 10)] == [None] * 9
    # Another kind has its own turn.
    assert throttle.admit("refuse", 10.5) == 0
    # The next record of the kind says how many were left out before it.
    assert throttle.admit("redirect", 11.0) == 9
    assert throttle.admit("redirect", 12.5) == 0


def test_a_flood_of_100000_in_15_seconds_is_15_records_that_count_it_all() -> None:
    throttle = RecordThrottle(1.0)
    results = [throttle.admit("refuse", i * 15.0 / 100_000) for i in range(100_000)]
    recorded = [held for held in results if held is not None]
    assert len(recorded) == 15
    last = throttle.admit("refuse", 16.0)
    assert last is not None
    assert len(recorded) + sum(recorded) + last == 100_000


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate is not installed")
def test_logrotate_with_the_shipped_rule_loses_no_record(tmp_path: Path) -> None:
    """deploy/logrotate/amqha, run by logrotate itself on a log being written: the server's
    log follows the rename at its next record (a new file at the path); every record is
    in one of the files, in order."""
    data = tmp_path / "primary"
    log = EventLog(data / "events.jsonl", "primary", "primary")
    log.write("started", "PRIMARY", 0)
    rule = (ROOT / "deploy" / "logrotate" / "amqha").read_text()
    rule = rule.replace("/var/lib/amqha/*/events.jsonl", str(tmp_path / "*" / "events.jsonl"))
    rule = rule.replace("create 0600 amqha amqha", "create 0600")
    (tmp_path / "rule").write_text(rule)
    for number in range(3):
        done = subprocess.run(
            ["logrotate", "--force", "--state", str(tmp_path / "state"), str(tmp_path / "rule")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        log.write("transition", "ACTIVE", number + 1)
    log.close()
    files = sorted(data.iterdir())
    assert [f.name for f in files] == [
        "events.jsonl",
        "events.jsonl.1",
        "events.jsonl.2.gz",
        "events.jsonl.3.gz",
    ]
    epochs = []
    for path in reversed(files):  # oldest first
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        epochs += [json.loads(line)["epoch"] for line in raw.decode().splitlines()]
    assert epochs == [0, 1, 2, 3]
    assert stat.S_IMODE(os.stat(data / "events.jsonl").st_mode) == 0o600
