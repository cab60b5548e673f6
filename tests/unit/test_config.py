"""config.loader: a valid file loads; every bad one names the file, the key and the problem."""

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

ROOT = Path(__file__).resolve().parents[2]

VALID: dict[str, Any] = {
    "server": {"name": "alpha", "listen": "127.0.0.1:5999", "data_dir": "/tmp/alpha"},
    "users": [
        {"name": "guest", "password": "guest", "vhosts": ["/", "other"]},
        {"name": "peer", "password": "secret", "tags": ["peering"]},
        {"name": "root", "password": "root", "tags": ["administrator", "monitoring"]},
    ],
    "failover": {
        "role": "primary",
        "peer": "127.0.0.1:6000",
        "heartbeat": 0.5,
        "timeout": 2,
        "peer_user": "peer",
        "secret": "correct horse battery staple",
    },
    "events": {"path": "/tmp/alpha/events.jsonl"},
    "limits": {
        "frame_max": 8192,
        "channel_max": 100,
        "heartbeat": 10,
        "max_message_size": "16MiB",
        "memory_high_watermark": "1.5GB",
    },
}


def write(tmp_path: Path, data: Any, name: str = "server.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_change(section: str, key: str, value: Any) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    data.setdefault(section, {})[key] = value
    return data


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


def assert_error(tmp_path: Path, data: Any, key: str, *problem: str) -> ConfigError:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    error = caught.value
    message = str(error)
    assert message.startswith(f"{path}: {key}: "), message
    assert error.path == str(path) and error.key == key
    for fragment in problem:
        assert fragment in error.problem, message
    return error


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


# -- refusals of a file that could split the pair or open the broker -----------------------


def without(section: str, key: str) -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    del data[section][key]
    return data


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


# -- users with hashed passwords ----------------------------------------------------------


def test_password_hash_accepted(tmp_path: Path) -> None:
    from config.passwords import hash_password

    data = yaml.safe_load(yaml.safe_dump(VALID))
    data["users"][0] = {"name": "guest", "password_hash": hash_password("pw", "rabbitmq-sha256")}
    user = load_config(write(tmp_path, data)).user("guest")
    assert user is not None and user.password is None
    assert user.verifier.check("pw") and not user.verifier.check("pW")


@pytest.mark.parametrize(
    ("entry", "key", "problem"),
    [
        (
            {"name": "a", "password_hash": "not a hash!"},
            "users[0].password_hash",
            "not a password hash",
        ),
        (
            {"name": "a", "password_hash": "$scrypt$ln=15$x$y"},
            "users[0].password_hash",
            "expected '$scrypt$",
        ),
        (
            {
                "name": "a",
                "password_hash": "$scrypt$ln=40,r=8,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA",
            },
            "users[0].password_hash",
            "out of range",
        ),
        (
            {
                "name": "a",
                "password_hash": "$scrypt$ln=20,r=64,p=1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA",
            },
            "users[0].password_hash",
            "MiB per login",
        ),
        ({"name": "a", "password_hash": "YWJj"}, "users[0].password_hash", "3 bytes"),
        (
            {"name": "a", "password": "b", "password_hash": "YWJj"},
            "users[0].password_hash",
            "either",
        ),
        ({"name": "a"}, "users[0].password", "missing (or give password_hash or password_file)"),
    ],
)
def test_bad_password_hash(tmp_path: Path, entry: dict, key: str, problem: str) -> None:
    assert_error(
        tmp_path, {**without("failover", "role"), "failover": {}, "users": [entry]}, key, problem
    )


def test_the_peering_user_needs_its_password(tmp_path: Path) -> None:
    from config.passwords import hash_password

    data = yaml.safe_load(yaml.safe_dump(VALID))
    data["users"][1] = {
        "name": "peer",
        "password_hash": hash_password("x", "rabbitmq-sha256"),
        "tags": ["peering"],
    }
    assert_error(tmp_path, data, "failover.peer_user", "only a password_hash")


# -- auth -----------------------------------------------------------------------------------


def test_auth_section(tmp_path: Path) -> None:
    data = {**VALID, "auth": {"loopback_users": ["guest", "root"], "failed_login_delay": 0}}
    auth = load_config(write(tmp_path, data)).auth
    assert auth.loopback_users == ("guest", "root") and auth.failed_login_delay == 0.0
    assert (
        load_config(write(tmp_path, {**VALID, "auth": {"loopback_users": []}})).auth.loopback_users
        == ()
    )


@pytest.mark.parametrize(
    ("auth", "key", "problem"),
    [
        ({"loopback_users": "guest"}, "auth.loopback_users", "expected a list"),
        ({"loopback_users": [1]}, "auth.loopback_users[0]", "expected a user name"),
        ({"failed_login_delay": 60}, "auth.failed_login_delay", "between 0 and 10"),
        ({"failed_login_delay": -1}, "auth.failed_login_delay", "between 0 and 10"),
        ({"loopback": ["guest"]}, "auth.loopback", "unknown key"),
    ],
)
def test_bad_auth(tmp_path: Path, auth: dict, key: str, problem: str) -> None:
    assert_error(tmp_path, {**VALID, "auth": auth}, key, problem)


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    from tests.certs import Pki

    return Pki(tmp_path_factory.mktemp("pki"))


def test_tls_listener_paths_relative_to_the_config_file(tmp_path: Path, pki) -> None:
    folder = Path(pki.ca).parent
    tls = {"listen": "127.0.0.1:5671", "cert": Path(pki.server_cert).name, "key": pki.server_key}
    config = load_config(write(folder, {**VALID, "tls": tls}, "tls.yaml"))
    assert config.tls is not None and config.tls.cert == pki.server_cert
    assert (config.tls.host, config.tls.port, config.tls.client_certs) == (
        "127.0.0.1",
        5671,
        "none",
    )
    assert config.tls.listen == "127.0.0.1:5671"


def test_bad_tls(tmp_path: Path, pki) -> None:
    files = {"cert": pki.server_cert, "key": pki.server_key}
    listen = {"listen": "127.0.0.1:5671"}
    cases = [
        (files, "tls.listen", "missing"),
        ({**listen, "key": pki.server_key}, "tls.cert", "missing"),
        ({**listen, **files, "client_certs": "required"}, "tls.ca", "missing"),
        ({**listen, **files, "client_certs": "yes"}, "tls.client_certs", "expected one of"),
        ({**listen, **files, "ciphers": "ALL"}, "tls.ciphers", "unknown key"),
    ]
    for tls, key, problem in cases:
        assert_error(tmp_path, {**VALID, "tls": tls}, key, problem)


def test_peer_tls(tmp_path: Path, pki) -> None:
    data = with_change("failover", "peer_tls", {"ca": pki.ca, "server_name": "localhost"})
    peer_tls = load_config(write(tmp_path, data)).failover.peer_tls
    assert peer_tls is not None and (peer_tls.ca, peer_tls.cert) == (pki.ca, None)
    assert peer_tls.server_name == "localhost"


def test_bad_peer_tls(tmp_path: Path, pki) -> None:
    cases = [
        ({"server_name": "x"}, "failover.peer_tls.ca", "missing"),
        ({"ca": "absent.pem"}, "failover.peer_tls.ca", "cannot read"),
        ({"ca": pki.ca, "cert": pki.client_cert}, "failover.peer_tls.key", "give cert and key"),
        ({"ca": pki.server_key}, "failover.peer_tls.ca", "not a CA certificate file"),
        (
            {"ca": pki.ca, "cert": pki.client_cert, "key": pki.server_key},
            "failover.peer_tls.key",
            "is not the key of",
        ),
    ]
    for peer_tls, key, problem in cases:
        assert_error(tmp_path, with_change("failover", "peer_tls", peer_tls), key, problem)


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


def test_management_listener(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, with_change("management", "listen", "127.0.0.1:15672")))
    assert config.management is not None
    assert (config.management.host, config.management.port) == ("127.0.0.1", 15672)
    assert config.management.tls is False and config.management.peer is None
    assert load_config(write(tmp_path, VALID)).management is None  # off when absent


@pytest.mark.parametrize(
    ("management", "key", "problem"),
    [
        ({"listen": "localhost"}, "management.listen", "expected 'host:port'"),
        ({"listen": "127.0.0.1:99999"}, "management.listen", "out of range"),
        ({"listen": 15672}, "management.listen", "expected a string"),
        ({"tls": True}, "management.listen", "missing"),
        ({"listen": "127.0.0.1:1", "tls": True}, "management.tls", "needs the tls section"),
        ({"listen": "127.0.0.1:1", "tls": "yes"}, "management.tls", "expected true or false"),
        ({"listen": "127.0.0.1:1", "peer": "x"}, "management.peer", "expected 'host:port'"),
        ({"listen": "127.0.0.1:1", "port": 1}, "management.port", "unknown key"),
    ],
)
def test_bad_management_section(tmp_path: Path, management: Any, key: str, problem: str) -> None:
    data = yaml.safe_load(yaml.safe_dump(VALID))
    data["management"] = management
    assert_error(tmp_path, data, key, problem)


def test_management_beyond_loopback_refuses_shipped_credentials(tmp_path: Path) -> None:
    data = with_change("management", "listen", "0.0.0.0:15672")
    data["users"][0]["name"] = "app"
    data["users"][0]["password"] = "app"
    assert_error(tmp_path, data, "users[0].password", "0.0.0.0:15672, which is not a loopback")


def test_the_shipped_configs_serve_the_management_api_on_loopback() -> None:
    for name, port, peer in (("primary", 15672, 15673), ("backup", 15673, 15672)):
        data = yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())
        assert data["management"] == {
            "listen": f"127.0.0.1:{port}",
            "peer": f"127.0.0.1:{peer}",
        }


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
