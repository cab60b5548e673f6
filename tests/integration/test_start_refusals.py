"""A server refuses to start on a config that could split the pair, in one line, no traceback.

Each case is a real ``amqha start`` process: it must exit with status 1 and say
``bad configuration: FILE: KEY: PROBLEM`` (or ``bad epoch file: ...``) before it ever listens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from failover.epoch import EPOCH_FILE
from tests.pairs import PAIR_SECRET
from tests.support import free_port, start_to_exit

USERS = "users:\n  - {name: peering, password: peering, tags: [peering]}\n"


def pair_file(role: str, extra: str = "", secret: bool = True) -> str:
    return (
        f"server: {{name: {role}, listen: '127.0.0.1:{free_port()}'}}\n{USERS}"
        f"failover:\n  role: {role}\n  peer: '127.0.0.1:{free_port()}'\n"
        + (f"  secret: {PAIR_SECRET}\n" if secret else "")
        + extra
    )


CASES = {
    "backup without a peer": (
        f"server: {{name: b}}\n{USERS}failover:\n  role: backup\n",
        (),
        "failover.peer: missing",
    ),
    "primary without a peer": (
        f"{USERS}failover: {{role: primary, secret: {PAIR_SECRET}}}\n",
        (),
        "failover.peer: missing",
    ),
    "role on the command line without a peer": (USERS, ("--role", "backup"), "failover.peer"),
    "timeout nan": (
        pair_file("backup", "  timeout: .nan\n"),
        (),
        "failover.timeout: expected a finite",
    ),
    "heartbeat inf": (
        pair_file("primary", "  heartbeat: .inf\n"),
        (),
        "failover.heartbeat: expected a finite",
    ),
    "duplicate key": (
        pair_file("backup") + "failover:\n  role: primary\n",
        (),
        "failover: given twice",
    ),
    "--role hides a bad role": (
        pair_file("primray"),
        ("--role", "primary"),
        "failover.role: expected 'primary' or 'backup', got 'primray'",
    ),
    "--role contradicts the file": (
        pair_file("primary"),
        ("--role", "backup"),
        "failover.role: the file says 'primary' but the command line says --role backup",
    ),
    "empty file": ("", (), "users: missing"),
    "a pair without a secret": (pair_file("primary", secret=False), (), "failover.secret: missing"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_at_start(tmp_path: Path, case: str) -> None:
    text, args, expected = CASES[case]
    config = tmp_path / "server.yaml"
    config.write_text(text)
    result = start_to_exit(config, *args)
    assert result.returncode == 1, result.stderr
    assert "listening" not in result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: bad configuration: {config}: "), lines
    assert expected in lines[0], lines


@pytest.mark.parametrize("content", [b"seven\n", b"\xff\xfe", b"-3\n"])
def test_a_corrupt_epoch_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / EPOCH_FILE).write_bytes(content)
    config = tmp_path / "server.yaml"
    config.write_text(pair_file("primary").replace("{name: primary,", f"{{data_dir: '{data_dir}',"))
    result = start_to_exit(config)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if "listening" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: bad epoch file: {data_dir / EPOCH_FILE}: corrupt")
    assert "the peer's data dir" in lines[0]
