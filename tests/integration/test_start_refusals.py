"""A server refuses to start on a config that could split the pair, in one line, no traceback.

Each case is a real ``amqha start`` process: it must exit with status 1 and say
``bad configuration: FILE: KEY: PROBLEM`` (or ``bad epoch file: ...``) before it ever listens.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from config.schema import DEMO_SECRET
from failover.epoch import EPOCH_FILE
from failover.maintenance import MAINTENANCE_FILE
from tests.pairs import PAIR_SECRET, failover_section
from tests.support import free_port, start_to_exit

USERS = "users:\n  - {name: peering, password: test-peering-password, tags: [peering]}\n"


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


def test_a_corrupt_maintenance_file_is_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / MAINTENANCE_FILE).write_text('{"on": "primary"}')
    config = tmp_path / "server.yaml"
    config.write_text(pair_file("primary").replace("{name: primary,", f"{{data_dir: '{data_dir}',"))
    result = start_to_exit(config)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if "listening" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: bad maintenance file: {data_dir / MAINTENANCE_FILE}:")
    assert "delete it" in lines[0]


def test_the_demo_secret_is_refused_on_a_listener_beyond_loopback(tmp_path: Path) -> None:
    """Shipped with config/ until it was made per install: anyone who read it could move
    the service. 0.0.0.0 is refused before anything is bound."""
    port = free_port()
    config = tmp_path / "server.yaml"
    config.write_text(
        f"server: {{name: primary, listen: '0.0.0.0:{port}'}}\n{USERS}"
        f"failover:\n  role: primary\n  peer: '127.0.0.1:{free_port()}'\n"
        f"  secret: {DEMO_SECRET}\n"
    )
    result = start_to_exit(config)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"Error: bad configuration: {config}: failover.secret: "), lines
    assert "the demo secret shipped with amqha" in lines[0]
    assert ", which is not a loopback address" in lines[0]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_shipped_credentials_on_loopback_start_with_a_warning_each(make_server: Any) -> None:
    server = make_server(
        "primary",
        failover={**failover_section("primary", free_port(), 0.1, 0.4), "secret": DEMO_SECRET},
    )
    server.start()
    warnings = [line for line in server.log().splitlines() if line.startswith("amqha: WARNING: ")]
    weak = ["failover.secret: the demo secret"] + [
        f"users[{index}].password: user '{user['name']}' has a shipped password"
        for index, user in enumerate(server.config["users"])
        if user["name"] != "guest"  # loopback-only
    ]
    assert len(warnings) == len(weak), warnings
    for line, expected in zip(warnings, weak, strict=True):
        assert f"{server.config_path}: {expected}" in line
        assert line.endswith("accepted only because every listener is loopback")
