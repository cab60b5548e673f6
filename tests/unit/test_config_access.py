"""config.loader, who may get in: users with hashed passwords, the auth section, TLS for
clients and for the peer link (one set of certificates for the module), and the management
API's listener and the credentials it refuses beyond loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from config import load_config
from tests.unit.config_support import ROOT, VALID, assert_error, with_change, without, write

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


# -- the management API -------------------------------------------------------------------------


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
