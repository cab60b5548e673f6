"""config.loader, the keys that hold a pair together: refusals of a file that could split
the pair (a role without a peer or a peer without a role, non-finite durations, keys given
twice), the pair's secret, its name and witnesses, and the names and federation id
(docs/federation.md, "Names")."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from config import ConfigError, load_config
from tests.unit.config_support import VALID, assert_error, with_change, without, write

# -- refusals of a file that could split the pair or open the broker -----------------------


@pytest.mark.parametrize("role", ["primary", "backup"])
def test_a_role_without_a_peer_is_refused(tmp_path: Path, role: str) -> None:
    # It used to start standalone, and so ACTIVE: a second active server beside the pair.
    data = with_change("failover", "role", role)
    del data["failover"]["peer"]
    assert_error(tmp_path, data, "failover.peer", "missing", f"a {role} without its peer")


def test_a_role_from_the_command_line_without_a_peer_is_refused(tmp_path: Path) -> None:
    data = without("failover", "peer")
    del data["failover"]["role"]
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_config(path, role="backup")
    assert caught.value.key == "failover.peer"


def test_a_peer_without_a_role_is_refused(tmp_path: Path) -> None:
    assert_error(tmp_path, without("failover", "role"), "failover.role", "missing")


@pytest.mark.parametrize(
    ("key", "text"),
    [("timeout", ".nan"), ("timeout", ".inf"), ("heartbeat", ".inf"), ("heartbeat", ".NaN")],
)
def test_non_finite_durations_are_refused(tmp_path: Path, key: str, text: str) -> None:
    data = yaml.safe_dump(VALID).replace(f"  {key}: ", f"  {key}: {text} #", 1)
    assert_error(tmp_path, data, f"failover.{key}", "expected a finite number")


def test_a_negative_infinite_timeout_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_dump(VALID).replace("  timeout: ", "  timeout: -.inf #", 1)
    assert_error(tmp_path, data, "failover.timeout", "expected a finite number")


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        (
            "users: [{name: a, password: b}]\nserver:\n  listen: 127.0.0.1:1\n  listen: 127.0.0.1:2\n",
            "server.listen",
            "lines 3 and 4",
        ),
        (
            "users: [{name: a, password: b}]\nlimits: {heartbeat: 1}\nlimits: {heartbeat: 2}\n",
            "limits",
            "lines 2 and 3",
        ),
        ("users:\n  - {name: a, password: b, password: c}\n", "users[0].password", "lines 2 and 2"),
    ],
    ids=["nested", "top", "in a list"],
)
def test_duplicate_keys_are_refused(tmp_path: Path, text: str, key: str, lines: str) -> None:
    assert_error(tmp_path, text, key, "given twice", lines)


def test_a_pair_needs_a_secret(tmp_path: Path) -> None:
    assert_error(tmp_path, without("failover", "secret"), "failover.secret", "missing")


def test_a_short_secret_is_refused_without_being_echoed(tmp_path: Path) -> None:
    error = assert_error(
        tmp_path,
        with_change("failover", "secret", "hunter2-hunter2"),
        "failover.secret",
        "at least 16 characters, got 15",
    )
    assert "hunter2" not in str(error)


def test_the_secret_is_bytes(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, VALID)).failover.secret == b"correct horse battery staple"
    assert "correct horse" not in repr(load_config(write(tmp_path, VALID)))


def test_secret_file_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "pair.secret").write_text("s3cret-from-a-file-0123\n")
    data = without("failover", "secret")
    data["failover"]["secret_file"] = "pair.secret"
    config = load_config(write(tmp_path / "conf", data))
    assert config.failover.secret == b"s3cret-from-a-file-0123"


def test_secret_file_problems(tmp_path: Path) -> None:
    data = without("failover", "secret")
    data["failover"]["secret_file"] = "absent.secret"
    assert_error(tmp_path, data, "failover.secret_file", "cannot read", "absent.secret")
    (tmp_path / "short.secret").write_text("short\n")
    data["failover"]["secret_file"] = "short.secret"
    assert_error(tmp_path, data, "failover.secret_file", "too short")
    both = with_change("failover", "secret_file", "short.secret")
    assert_error(tmp_path, both, "failover.secret_file", "either secret or secret_file")


def test_no_secret_needed_standalone(tmp_path: Path) -> None:
    data = without("failover", "secret")
    del data["failover"]["role"], data["failover"]["peer"]
    assert load_config(write(tmp_path, data)).failover.secret == b""


# -- the pair's name and its witnesses ----------------------------------------------------------


def test_server_pair_is_checked_and_defaults_to_the_two_names(tmp_path: Path) -> None:
    named = with_change("failover", "peer_name", "beta")
    assert load_config(write(tmp_path, named)).pair == "alpha+beta"
    unnamed = yaml.safe_load(yaml.safe_dump(VALID))
    unnamed["failover"].pop("peer_name", None)
    assert load_config(write(tmp_path, unnamed)).pair is None
    assert load_config(write(tmp_path, with_change("server", "pair", "eu-1"))).pair == "eu-1"
    for bad in ("", "a/b", " eu-1"):
        with pytest.raises(ConfigError) as error:
            load_config(write(tmp_path, with_change("server", "pair", bad)))
        assert error.value.key == "server.pair" and str(tmp_path) in str(error.value)


def test_witnesses_load_as_host_port_pairs(tmp_path: Path) -> None:
    data = with_change("failover", "witness", ["10.0.0.9:7000", "[::1]:7001"])
    config = load_config(write(tmp_path, data))
    assert config.failover.witness == (("10.0.0.9", 7000), ("::1", 7001))
    assert load_config(write(tmp_path, VALID)).failover.witness == ()


@pytest.mark.parametrize(
    ("witness", "key", "problem"),
    [
        (["nowhere"], "failover.witness[0]", "expected 'host:port'"),
        (["10.0.0.9:7000", "10.0.0.9:99999"], "failover.witness[1]", "out of range"),
        (["10.0.0.9:7000", "10.0.0.9:7000"], "failover.witness", "named twice"),
        ("10.0.0.9:7000", "failover.witness", "list"),
    ],
)
def test_a_bad_witness_is_named_with_its_key(
    tmp_path: Path, witness: Any, key: str, problem: str
) -> None:
    assert_error(tmp_path, with_change("failover", "witness", witness), key, problem)


# -- names and the federation id (docs/federation.md, "Names") ------------------------------


@pytest.mark.parametrize(
    ("section", "key"),
    [("server", "name"), ("failover", "peer_name"), ("failover", "pair"), ("server", "pair")],
)
@pytest.mark.parametrize("bad", ["", "eu.1", "eu 1", "a+b", "x" * 65, "名前"])
def test_server_and_pair_names_are_letters_digits_and_dashes(
    tmp_path: Path, section: str, key: str, bad: str
) -> None:
    assert_error(tmp_path, with_change(section, key, bad), f"{section}.{key}", "not a valid name")


def test_failover_pair_names_the_pair_and_defaults_to_the_two_names(tmp_path: Path) -> None:
    named = with_change("failover", "peer_name", "beta")
    config = load_config(write(tmp_path, named))
    assert config.pair == config.global_name == "alpha+beta"
    named["failover"]["pair"] = "eu_1"
    assert load_config(write(tmp_path, named)).global_name == "eu_1"
    named["server"]["pair"] = "eu_1"  # the older spelling, saying the same
    assert load_config(write(tmp_path, named)).pair == "eu_1"
    named["server"]["pair"] = "eu_2"
    assert_error(tmp_path, named, "failover.pair", "'eu_1'", "server.pair", "'eu_2'")


def test_the_global_name_is_the_servers_own_when_standalone(tmp_path: Path) -> None:
    alone = yaml.safe_load(yaml.safe_dump(VALID))
    del alone["failover"]
    alone["server"]["pair"] = "ignored-alone"
    assert load_config(write(tmp_path, alone)).global_name == "alpha"
    unnamed = yaml.safe_load(yaml.safe_dump(VALID))  # a pair that names neither
    assert load_config(write(tmp_path, unnamed)).global_name == "alpha"


def test_a_pairs_federation_id_comes_from_its_secret(tmp_path: Path) -> None:
    primary = load_config(write(tmp_path, with_change("failover", "peer_name", "beta")))
    backup_data = with_change("failover", "role", "backup")
    backup_data["server"]["name"] = "beta"
    backup = load_config(write(tmp_path, backup_data, "beta.yaml"))
    other = load_config(
        write(tmp_path, with_change("failover", "secret", "another secret, 16+ chars"), "o.yaml")
    )
    assert primary.federation_id == backup.federation_id != other.federation_id
    assert len(primary.federation_id) == 32 and int(primary.federation_id, 16) >= 0
    assert not (tmp_path / "federation.id").exists()


def test_a_standalone_federation_id_is_made_once_and_kept(tmp_path: Path) -> None:
    alone = yaml.safe_load(yaml.safe_dump(VALID))
    del alone["failover"]
    alone["server"]["data_dir"] = str(tmp_path / "data")
    path = write(tmp_path, alone)
    first = load_config(path).federation_id
    kept = tmp_path / "data" / "federation.id"
    assert kept.read_text().strip() == first and len(first) == 16
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert load_config(path).federation_id == first
    kept.write_text("not an id\n")
    with pytest.raises(ConfigError) as caught:
        _ = load_config(path).federation_id
    assert caught.value.path == str(kept) and "16 hex digits" in caught.value.problem


def test_the_federation_tag_is_known(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    data["users"].append({"name": "efa", "password": "efa-pw-123", "tags": ["federation"]})
    user = load_config(write(tmp_path, data)).user("efa")
    assert user is not None and user.tags == ("federation",)


def test_replication_when_alone_is_confirm_or_hold(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, VALID)).replication.when_alone == "confirm"
    held = with_change("replication", "when_alone", "hold")
    assert load_config(write(tmp_path, held)).replication.when_alone == "hold"
    assert_error(
        tmp_path,
        with_change("replication", "when_alone", "sometimes"),
        "replication.when_alone",
        "confirm, hold",
        "'sometimes'",
    )
