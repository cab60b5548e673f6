"""config.loader: a valid file loads; every bad one names the file, the key and the problem.

Here: defaults, the shipped configs and this install's own credentials, loopback, types,
shapes, sizes, addresses, limits, YAML's errors, the metrics listener and command-line
overrides. The keys that hold a pair together: test_config_pair.py; who may get in (hashed
passwords, auth, TLS, the management API): test_config_access.py."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from amqha.console import ConsoleError, admin_password, default_servers, parse_server
from config import ConfigError, load_config
from config.loader import is_loopback
from config.local import ADMIN_PASSWORD, FILES, LOCAL, SECRET, ensure_credentials, named_in
from config.schema import DEMO_SECRET, Limits
from tests.unit.config_support import ROOT, VALID, assert_error, with_change, write


def test_valid_file_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, VALID))
    assert (config.name, config.host, config.port) == ("alpha", "127.0.0.1", 5999)
    assert config.listen == "127.0.0.1:5999" and config.public_address == "127.0.0.1:5999"
    assert config.data_dir == "/tmp/alpha"
    assert [u.name for u in config.users] == ["guest", "peer", "root"]
    assert config.user("guest").vhosts == ("/", "other")  # type: ignore[union-attr]
    assert config.user("root").tags == ("administrator", "monitoring")  # type: ignore[union-attr]
    assert config.user("nobody") is None
    failover = config.failover
    assert (failover.role, failover.peer, failover.heartbeat, failover.timeout) == (
        "primary",
        "127.0.0.1:6000",
        0.5,
        2.0,
    )
    assert isinstance(failover.timeout, float)
    assert config.event_log_path == "/tmp/alpha/events.jsonl"
    assert config.limits == Limits(8192, 100, 10, 16 * 1024 * 1024, 1_500_000_000)
    assert config.source == str(tmp_path / "server.yaml")


def test_role_from_the_command_line_fills_a_missing_one(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    del data["failover"]["role"]
    assert load_config(write(tmp_path, data), role="backup").failover.role == "backup"
    assert load_config(write(tmp_path, VALID), role="primary").failover.role == "primary"


def test_role_from_the_command_line_cannot_contradict_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    with pytest.raises(ConfigError) as caught:
        load_config(path, role="backup")
    assert str(caught.value) == (
        f"{path}: failover.role: the file says 'primary' but the command line says --role backup"
    )


def test_role_from_the_command_line_does_not_hide_a_bad_one(tmp_path: Path) -> None:
    path = write(tmp_path, with_change("failover", "role", "primray"))
    with pytest.raises(ConfigError) as caught:
        load_config(path, role="primary")
    assert caught.value.key == "failover.role" and "'primray'" in caught.value.problem


def test_minimal_standalone_file_gives_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"users": [{"name": "app", "password": "pw"}]}))
    assert config.listen == "127.0.0.1:5672"
    assert config.limits == Limits()
    assert [u.name for u in config.users] == ["app"]
    assert config.failover.role is None and config.failover.secret == b""
    assert config.event_log_path == "var/amqha/events.jsonl"
    assert config.tls is None
    assert config.auth.loopback_users == ("guest",) and config.auth.failed_login_delay == 1.0


@pytest.mark.parametrize("text", ["", "server: {name: x}\n", "users:\n"])
def test_a_file_without_users_is_refused(tmp_path: Path, text: str) -> None:
    # An empty file once started a server that took guest/guest.
    assert_error(tmp_path, text, "users", "missing")


def test_shipped_pair_configs_load_with_this_installs_own_credentials(tmp_path: Path) -> None:
    """The shipped files hold no secret and no password but guest's (loopback-only): they
    read this install's own from local/, which ``ensure_credentials`` makes (``make run``
    calls it through ``amqha pair``)."""
    configs = [tmp_path / "primary.yaml", tmp_path / "backup.yaml"]
    for config in configs:
        config.write_text((ROOT / "config" / config.name).read_text())
    assert named_in(configs) == list(FILES)
    assert ensure_credentials(tmp_path, named_in(configs))
    primary = load_config(tmp_path / "primary.yaml")
    backup = load_config(tmp_path / "backup.yaml")
    for config, role in ((primary, "primary"), (backup, "backup")):
        assert config.failover.role == role and config.failover.peer is not None
        assert config.weak_credentials == ()
        assert config.failover.secret == (tmp_path / "local" / SECRET).read_bytes().strip()
    assert primary.failover.secret == backup.failover.secret
    # Metrics on by default in the shipped pair, on loopback, one port each: both servers
    # of `make run` share a host (RabbitMQ's 15692, and the next one).
    assert primary.metrics_listen == ("127.0.0.1", 15692)
    assert backup.metrics_listen == ("127.0.0.1", 15693)
    assert primary.user("admin") == backup.user("admin")
    assert primary.user("admin").password != primary.user("peering").password  # type: ignore[union-attr]
    for name in ("primary.yaml", "backup.yaml"):
        text = (ROOT / "config" / name).read_text()
        assert DEMO_SECRET not in text and "password: admin" not in text
        assert "password: peering" not in text


def test_the_shipped_configs_before_the_first_make_run_say_what_makes_their_files(
    tmp_path: Path,
) -> None:
    config = tmp_path / "primary.yaml"
    config.write_text((ROOT / "config" / "primary.yaml").read_text())
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert caught.value.key == "users[1].password_file"
    assert caught.value.problem == (
        f"local/admin.password does not exist yet: `make run` (amqha pair --config-dir"
        f" {tmp_path}) makes this install's own on its first run"
    )


def test_credentials_are_made_once_private_random_and_kept_out_of_git(tmp_path: Path) -> None:
    made = ensure_credentials(tmp_path)
    assert sorted(path.name for path in made) == sorted(FILES)
    assert stat.S_IMODE((tmp_path / "local").stat().st_mode) == 0o700
    values = {}
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        values[path.name] = path.read_text()
        assert len(values[path.name].strip()) >= 32 and values[path.name].endswith("\n")
    assert len(set(values.values())) == len(FILES)
    assert ensure_credentials(tmp_path) == []  # a second run keeps every value
    assert {path.name: path.read_text() for path in made} == values
    assert not [path for path in (tmp_path / "local").iterdir() if path.name not in FILES]
    # A config of one's own that names no file under local/: nothing is made for it.
    other = tmp_path / "other"
    other.mkdir()
    (other / "primary.yaml").write_text(yaml.safe_dump(VALID))
    assert named_in([other / "primary.yaml"]) == []
    assert ensure_credentials(other, []) == [] and not (other / LOCAL).exists()
    for name in FILES:
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", f"config/{LOCAL}/{name}"], cwd=ROOT, check=False
        )
        assert ignored.returncode == 0, f"config/{LOCAL}/{name} is not in .gitignore"


def test_the_console_logs_in_to_the_loopback_pair_with_the_made_admin_password(
    tmp_path: Path,
) -> None:
    password = admin_password(tmp_path)
    with pytest.raises(ConsoleError) as missing:
        parse_server("127.0.0.1:5672", password)
    assert missing.value.exit_code == 2
    assert f"no {tmp_path / LOCAL / ADMIN_PASSWORD}" in missing.value.message
    ensure_credentials(tmp_path)
    secret = (tmp_path / LOCAL / ADMIN_PASSWORD).read_text().strip()
    # No pair file (`amqha pair` writes one): the shipped ports.
    addresses = default_servers(tmp_path / "no-pair.json")
    assert [parse_server(a, password).url for a in addresses] == [
        f"amqp://admin:{secret}@127.0.0.1:5672/",
        f"amqp://admin:{secret}@127.0.0.1:5673/",
    ]


def test_password_file_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "root.password").write_text("a-password-from-a-file\n")
    data = yaml.safe_load(yaml.safe_dump(VALID))
    data["users"][2] = {"name": "root", "password_file": "root.password"}
    config = load_config(write(tmp_path, data))
    assert config.user("root").password == "a-password-from-a-file"  # type: ignore[union-attr]
    data["users"][2]["password"] = "root"
    assert_error(tmp_path, data, "users[2].password_file", "give either password")
    (tmp_path / "root.password").write_text("\n")
    del data["users"][2]["password"]
    assert_error(tmp_path, data, "users[2].password_file", "the file is empty")


EXPOSED = [
    ("server", "listen", "0.0.0.0:5999"),
    ("server", "listen", ["127.0.0.1:5999", "[::]:5999"]),
    ("server", "listen", "10.1.2.3:5999"),
    ("server", "listen", "amqha.example.org:5999"),
    ("metrics", "listen", "0.0.0.0:15692"),
]


@pytest.mark.parametrize(("section", "key", "value"), EXPOSED)
def test_the_demo_secret_is_refused_beyond_loopback(
    tmp_path: Path, section: str, key: str, value: Any
) -> None:
    data = with_change(section, key, value)
    if section == "metrics":  # off loopback, the endpoint needs basic auth first
        data["metrics"].update(username="scraper", password="a-scrape-password")
    data["users"][2]["password"] = "not-a-shipped-one"
    data["failover"]["secret"] = DEMO_SECRET
    assert_error(tmp_path, data, "failover.secret", "the demo secret", "not a loopback address")
    del data["failover"]["secret"]
    (tmp_path / "pair.secret").write_text(DEMO_SECRET + "\n")
    data["failover"]["secret_file"] = "pair.secret"
    assert_error(tmp_path, data, "failover.secret_file", "the demo secret")


@pytest.mark.parametrize("password", ["admin", "peering", "guest", "root"])
def test_a_shipped_password_is_refused_beyond_loopback(tmp_path: Path, password: str) -> None:
    data = with_change("server", "listen", "0.0.0.0:5999")
    data["users"][2]["password"] = password
    error = assert_error(tmp_path, data, "users[2].password", "'root' has a shipped password")
    assert "0.0.0.0:5999, which is not a loopback address" in error.problem


def test_guest_guest_is_refused_beyond_loopback_only_when_guest_may_log_in_from_anywhere(
    tmp_path: Path,
) -> None:
    data = with_change("server", "listen", "0.0.0.0:5999")
    data["users"][2]["password"] = "not-a-shipped-one"
    assert load_config(write(tmp_path, data)).weak_credentials == ()  # guest: loopback only
    data["auth"] = {"loopback_users": []}
    assert_error(tmp_path, data, "users[0].password", "'guest' has a shipped password")


@pytest.mark.parametrize("listen", ["127.0.0.1:5999", "127.8.9.10:5999", "[::1]:5999"])
def test_on_loopback_shipped_credentials_start_with_one_line_each(
    tmp_path: Path, listen: str
) -> None:
    data = with_change("server", "listen", listen)
    data["failover"]["secret"] = DEMO_SECRET
    path = write(tmp_path, data)
    assert load_config(path).weak_credentials == (
        f"{path}: failover.secret: the demo secret shipped with amqha (anyone can move the"
        " service)",
        f"{path}: users[2].password: user 'root' has a shipped password (as in root/root:"
        " anyone can log in as it)",
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.255.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.1", False),
        ("amqha.example.org", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1048576, 1048576),
        ("512", 512),
        ("1kb", 1000),
        ("2 KiB", 2048),
        ("3MB", 3_000_000),
        ("1.5MiB", 1572864),
        ("2GiB", 2 * 1024**3),
        ("7b", 7),
    ],
)
def test_size_strings(tmp_path: Path, size: Any, expected: int) -> None:
    config = load_config(write(tmp_path, with_change("limits", "max_message_size", size)))
    assert config.limits.max_message_size == expected


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({**VALID, "extra": 1}, "extra", "unknown key"),
        (with_change("server", "colour", "red"), "server.colour", "unknown key"),
        (with_change("failover", "hearbeat", 1), "failover.hearbeat", "unknown key"),
        (with_change("limits", "frame-max", 1), "limits.frame-max", "unknown key"),
        (with_change("events", "file", "x"), "events.file", "unknown key"),
        (
            {**VALID, "users": [{"name": "a", "password": "b", "role": "x"}]},
            "users[0].role",
            "unknown key",
        ),
    ],
    ids=["top", "server", "failover", "limits", "events", "user"],
)
def test_unknown_key(tmp_path: Path, data: dict, key: str, problem: str) -> None:
    assert_error(tmp_path, data, key, problem)


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        (with_change("server", "name", 5), "server.name", "expected a string, got 5"),
        (with_change("limits", "frame_max", "big"), "limits.frame_max", "expected an integer"),
        (with_change("limits", "frame_max", 8192.0), "limits.frame_max", "expected an integer"),
        (with_change("limits", "channel_max", True), "limits.channel_max", "got a boolean"),
        (with_change("failover", "heartbeat", "fast"), "failover.heartbeat", "expected a number"),
        (with_change("failover", "timeout", False), "failover.timeout", "got a boolean"),
        ({**VALID, "server": ["not", "a", "mapping"]}, "server", "expected a mapping, got list"),
        ({**VALID, "users": {"name": "x"}}, "users", "non-empty list"),
        ({**VALID, "users": []}, "users", "non-empty list"),
        ({**VALID, "users": ["guest"]}, "users[0]", "expected a mapping"),
        (
            {**VALID, "users": [{"name": "a", "password": 1234}]},
            "users[0].password",
            "expected a string, got 1234",
        ),
        (
            {**VALID, "users": [{"name": "a", "password": "b", "vhosts": "/"}]},
            "users[0].vhosts",
            "expected a list",
        ),
        ({**VALID, "users": [{"password": "b"}]}, "users[0].name", "missing"),
        ({**VALID, "users": [{"name": "a"}]}, "users[0].password", "missing"),
        (
            {**VALID, "users": [{"name": "a", "password": "b", "tags": ["root"]}]},
            "users[0].tags",
            "unknown tag 'root'",
        ),
        (
            {**VALID, "users": [{"name": "a", "password": "b"}, {"name": "a", "password": "c"}]},
            "users[1].name",
            "duplicate user 'a'",
        ),
        (["a", "list"], "(top level)", "expected a mapping"),
    ],
)
def test_wrong_type_or_shape(tmp_path: Path, data: Any, key: str, problem: str) -> None:
    assert_error(tmp_path, data, key, problem)


@pytest.mark.parametrize(
    ("section", "key", "value", "problem"),
    [
        ("server", "listen", "localhost", "expected 'host:port'"),
        ("server", "listen", 5672, "expected a string"),
        ("server", "listen", "127.0.0.1:http", "is not a number"),
        ("server", "listen", "127.0.0.1:70000", "out of range"),
        ("server", "listen", ":5672", "host is empty"),
        ("server", "listen", "::1", "brackets"),
        ("server", "advertise", "example.org", "expected 'host:port'"),
        ("failover", "peer", "127.0.0.1:", "is not a number"),
        ("failover", "peer", "[::1]:-1", "out of range"),
    ],
)
def test_bad_host_port(tmp_path: Path, section: str, key: str, value: Any, problem: str) -> None:
    assert_error(tmp_path, with_change(section, key, value), f"{section}.{key}", problem)


def test_bracketed_ipv6_listen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, with_change("server", "listen", "[::1]:5999")))
    assert (config.host, config.port) == ("::1", 5999)


@pytest.mark.parametrize(
    ("heartbeat", "timeout", "key", "problem"),
    [
        (1.0, 1.0, "failover.timeout", "must be greater than failover.heartbeat (1.0)"),
        (1.0, 0.5, "failover.timeout", "must be greater than failover.heartbeat"),
        (0, 1.0, "failover.heartbeat", "must be greater than 0"),
        (-1, 1.0, "failover.heartbeat", "must be greater than 0"),
        (0.2, 0, "failover.timeout", "must be greater than 0"),
    ],
)
def test_failover_timing(
    tmp_path: Path, heartbeat: float, timeout: float, key: str, problem: str
) -> None:
    data = with_change("failover", "heartbeat", heartbeat)
    data["failover"]["timeout"] = timeout
    assert_error(tmp_path, data, key, problem)


def test_failover_role_must_be_known(tmp_path: Path) -> None:
    assert_error(
        tmp_path,
        with_change("failover", "role", "leader"),
        "failover.role",
        "expected 'primary' or 'backup'",
        "'leader'",
    )


def test_peer_user_missing(tmp_path: Path) -> None:
    assert_error(
        tmp_path,
        with_change("failover", "peer_user", "ghost"),
        "failover.peer_user",
        "no user 'ghost'",
    )


def test_peer_user_without_the_peering_tag(tmp_path: Path) -> None:
    assert_error(
        tmp_path,
        with_change("failover", "peer_user", "guest"),
        "failover.peer_user",
        "user 'guest' needs the tag 'peering'",
    )


def test_peer_user_is_not_checked_without_a_peer(tmp_path: Path) -> None:
    data = with_change("failover", "peer_user", "ghost")
    del data["failover"]["peer"], data["failover"]["role"]
    assert load_config(write(tmp_path, data)).failover.peer_user == "ghost"


@pytest.mark.parametrize(
    "size",
    ["lots", "12 parsecs", "-5", "0", 0, -1, "MiB", "1.5.5MB", "nan", "inf", "1e999GB", True, [1]],
)
def test_bad_size(tmp_path: Path, size: Any) -> None:
    assert_error(
        tmp_path,
        with_change("limits", "memory_high_watermark", size),
        "limits.memory_high_watermark",
        "expected a size like",
        repr(size),
    )


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("frame_max", 4095, "between 4096 and 16777216, got 4095"),
        ("frame_max", 16777217, "between 4096 and 16777216"),
        ("channel_max", 0, "between 1 and 65535, got 0"),
        ("channel_max", 65536, "between 1 and 65535"),
        ("heartbeat", -1, "between 0 and 65535"),
        ("heartbeat", 65536, "between 0 and 65535"),
    ],
)
def test_limits_ranges(tmp_path: Path, key: str, value: int, problem: str) -> None:
    assert_error(tmp_path, with_change("limits", key, value), f"limits.{key}", problem)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    text = "server:\n  name: alpha\n  listen: [127.0.0.1:5999\nusers: []\n"
    error = assert_error(tmp_path, text, "line 4", "not valid YAML")
    assert "line 4" in str(error)


def test_yaml_bad_indentation_names_the_line(tmp_path: Path) -> None:
    text = "server:\n  name: alpha\n listen: 127.0.0.1:1\n"
    assert_error(tmp_path, text, "line 3", "not valid YAML")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: (file): cannot read: No such file or directory"


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r": \(file\): cannot read"):
        load_config(tmp_path)


def test_listen_takes_a_list_of_addresses(tmp_path: Path) -> None:
    addresses = ["127.0.0.1:5999", "[::1]:5999", "[::]:6000"]
    data = with_change("server", "listen", addresses)
    data["users"][2]["password"] = "not-a-shipped-one"  # [::] is not loopback
    config = load_config(write(tmp_path, data))
    assert config.addresses == (("127.0.0.1", 5999), ("::1", 5999), ("::", 6000))
    assert (config.host, config.port) == ("127.0.0.1", 5999)
    assert load_config(write(tmp_path, with_change("server", "listen", "[::1]:5"))).listen == (
        "[::1]:5"
    )


@pytest.mark.parametrize(
    ("value", "key", "problem"),
    [
        ([], "server.listen", "at least one"),
        (["127.0.0.1:1", "::1"], "server.listen[1]", "brackets"),
        (["127.0.0.1:1", "127.0.0.1:1"], "server.listen[1]", "listed twice"),
        ([5672], "server.listen[0]", "expected 'host:port'"),
    ],
)
def test_bad_listen_lists(tmp_path: Path, value: Any, key: str, problem: str) -> None:
    assert_error(tmp_path, with_change("server", "listen", value), key, problem)


def test_metrics_listen_is_off_by_default_and_checked(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, with_change("server", "name", "m"))).metrics_listen is None
    config = load_config(write(tmp_path, with_change("metrics", "listen", "127.0.0.1:15692")))
    assert config.metrics_listen == ("127.0.0.1", 15692)
    assert_error(
        tmp_path, with_change("metrics", "listen", "nowhere"), "metrics.listen", "host:port"
    )
    assert_error(tmp_path, with_change("metrics", "port", 1), "metrics.port", "unknown key")


def metrics_section(tmp_path: Path, **values: Any) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    data["metrics"] = values
    # Off loopback the shipped-credential rule would speak first: a password of its own.
    data["users"][2]["password"] = "not-a-shipped-one"
    return data


def test_metrics_off_loopback_needs_basic_auth(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "[::]", "10.1.2.3", "metrics.example"):
        assert_error(
            tmp_path,
            metrics_section(tmp_path, listen=f"{host}:15692"),
            "metrics.listen",
            "not a loopback address",
            "metrics.username",
        )
    for host in ("127.0.0.1", "127.9.9.9", "[::1]", "localhost"):
        config = load_config(write(tmp_path, metrics_section(tmp_path, listen=f"{host}:15692")))
        assert config.metrics_auth is None
    config = load_config(
        write(
            tmp_path,
            metrics_section(tmp_path, listen="0.0.0.0:15692", username="prom", password="s3cret"),
        )
    )
    assert config.metrics_listen == ("0.0.0.0", 15692)
    assert config.metrics_auth == ("prom", "s3cret")
    assert "s3cret" not in repr(config)


def test_metrics_password_file_and_bad_credentials(tmp_path: Path) -> None:
    (tmp_path / "metrics.pw").write_text("from-a-file\n")
    config = load_config(
        write(
            tmp_path,
            metrics_section(
                tmp_path, listen="0.0.0.0:1", username="prom", password_file="metrics.pw"
            ),
        )
    )
    assert config.metrics_auth == ("prom", "from-a-file")
    for values, key, problem in (
        ({"username": "prom"}, "metrics.password", "missing"),
        ({"password": "x"}, "metrics.username", "missing"),
        ({"username": "a:b", "password": "x"}, "metrics.username", "without ':'"),
        ({"username": "prom", "password": ""}, "metrics.password", "is empty"),
        (
            {"username": "prom", "password": "x", "password_file": "metrics.pw"},
            "metrics.password_file",
            "either",
        ),
        ({"username": "prom", "password_file": "absent.pw"}, "metrics.password_file", "cannot"),
    ):
        assert_error(
            tmp_path, metrics_section(tmp_path, listen="127.0.0.1:1", **values), key, problem
        )


def test_bounds_limits_load_with_their_defaults(tmp_path: Path) -> None:
    data = with_change("limits", "vhost", {"max_queues": 10})
    data["limits"].update(
        {
            "user": {"max_connections": 5, "max_channels": 50},
            "max_connections": 100,
            "max_consumers_per_channel": 3,
            "max_header_size": "16KiB",
            "output_buffer": "256KiB",
            "max_arguments_size": "4KiB",
        }
    )
    limits = load_config(write(tmp_path, data)).limits
    assert limits.max_arguments_size == 4096
    assert (limits.vhost.max_queues, limits.vhost.max_connections) == (10, 0)
    assert (limits.user.max_connections, limits.user.max_channels) == (5, 50)
    assert (limits.max_connections, limits.max_consumers_per_channel) == (100, 3)
    assert (limits.max_header_size, limits.output_buffer) == (16 * 1024, 256 * 1024)
    defaults = load_config(write(tmp_path, VALID)).limits
    assert (defaults.max_connections, defaults.vhost.max_queues) == (10_000, 100_000)
    assert (defaults.max_header_size, defaults.output_buffer) == (64 * 1024, 1024 * 1024)
    assert defaults.max_arguments_size == 16 * 1024


@pytest.mark.parametrize(
    ("key", "value", "where", "problem"),
    [
        ("max_connections", 0, "limits.max_connections", "must be 1 or more, got 0"),
        ("max_consumers_per_channel", -1, "limits.max_consumers_per_channel", "0 or more"),
        ("output_buffer", 100, "limits.output_buffer", "must be 4096 bytes or more"),
        ("max_header_size", "lots", "limits.max_header_size", "expected a size"),
        ("vhost", {"max_queues": -2}, "limits.vhost.max_queues", "must be 0 or more"),
        ("vhost", {"queues": 2}, "limits.vhost.queues", "unknown key"),
        ("user", {"max_channels": "many"}, "limits.user.max_channels", "expected an integer"),
        ("user", [1], "limits.user", "expected a mapping"),
    ],
)
def test_bad_bounds_limits(tmp_path: Path, key: str, value: Any, where: str, problem: str) -> None:
    assert_error(tmp_path, with_change("limits", key, value), where, problem)


def test_overrides_replace_keys_before_validation_and_are_named_as_the_files_keys(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, VALID)
    config = load_config(
        path, overrides={"server.listen": "127.0.0.1:6100", "failover.peer": "127.0.0.1:6101"}
    )
    assert (config.host, config.port, config.failover.peer) == ("127.0.0.1", 6100, "127.0.0.1:6101")
    with pytest.raises(ConfigError) as bad:
        load_config(path, overrides={"server.listen": "127.0.0.1:http"})
    assert str(bad.value) == f"{path}: server.listen: port 'http' is not a number"
    with pytest.raises(ConfigError) as not_a_section:
        load_config(path, overrides={"server.name.first": "x"})
    assert str(not_a_section.value) == (
        f"{path}: server.name: is not a section, so server.name.first cannot be set"
    )
