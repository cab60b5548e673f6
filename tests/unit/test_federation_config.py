"""The ``federation`` section of a server's config (docs/federation.md, "Config")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from config import load_config
from config.schema import FederatedExchange, FederationConfig

from .test_config import assert_error, write

BASE: dict[str, Any] = {
    "server": {"name": "london", "listen": "127.0.0.1:5999", "data_dir": "/tmp/london"},
    "users": [{"name": "guest", "password": "guest"}],
}
FEDERATION: dict[str, Any] = {
    "upstreams": {
        "central": {"urls": ["amqp://efa:pw@10.0.0.1:5672/", "amqp://efa:pw@10.0.0.2:5672"]}
    },
    "exchanges": [{"exchange": "market", "upstream": "central"}],
}


def with_federation(**changes: Any) -> dict[str, Any]:
    federation = yaml.safe_load(yaml.safe_dump(FEDERATION))
    federation.update(changes)
    return {**BASE, "federation": federation}


def with_exchange(**changes: Any) -> dict[str, Any]:
    return with_federation(exchanges=[{"exchange": "market", "upstream": "central", **changes}])


def test_no_federation_section_federates_nothing(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, BASE)).federation == FederationConfig()


def test_a_federation_section_with_its_defaults(tmp_path: Path) -> None:
    federation = load_config(write(tmp_path, with_federation())).federation
    assert federation.exchanges == (FederatedExchange("market", "central"),)
    assert federation.exchanges[0].delivery == "confirm" and federation.exchanges[0].max_hops == 1
    assert federation.upstream("central").urls == (
        "amqp://efa:pw@10.0.0.1:5672/",
        "amqp://efa:pw@10.0.0.2:5672",
    )
    assert (federation.reconcile, federation.probe, federation.prefetch) == (5.0, 5.0, 1000)


def test_every_key_given(tmp_path: Path) -> None:
    data = with_federation(reconcile=2, probe=0.5, prefetch=10)
    data["federation"]["exchanges"] = [
        {
            "exchange": "rpc",
            "upstream": "central",
            "vhost": "other",
            "bindings": False,
            "forward": True,
            "max_hops": 3,
            "delivery": "drop",
        }
    ]
    federation = load_config(write(tmp_path, data)).federation
    assert federation.exchanges == (
        FederatedExchange("rpc", "central", "other", False, True, 3, "drop"),
    )
    assert (federation.reconcile, federation.probe, federation.prefetch) == (2.0, 0.5, 10)


def test_the_password_file_fills_in_each_url(tmp_path: Path) -> None:
    (tmp_path / "efa.password").write_text("s3cret/:@x\n")
    data = with_federation(
        upstreams={
            "central": {
                "urls": ["amqp://efa@10.0.0.1:5672/", "amqps://efa@[::1]:5671"],
                "password_file": "efa.password",
            }
        }
    )
    urls = load_config(write(tmp_path, data)).federation.upstream("central").urls
    assert urls == (
        "amqp://efa:s3cret%2F%3A%40x@10.0.0.1:5672/",
        "amqps://efa:s3cret%2F%3A%40x@[::1]:5671/",
    )


def test_the_password_is_not_in_the_repr(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, with_federation()))
    assert "pw@" not in repr(config)


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ({**BASE, "federation": []}, "federation", "expected a mapping"),
        (with_federation(colour=1), "federation.colour", "unknown key"),
        (
            with_federation(upstreams={"lon don": {"urls": ["amqp://a:b@h:1/"]}}),
            "federation.upstreams.lon don",
            "not a valid name",
        ),
        (with_federation(upstreams={"c": {}}), "federation.upstreams.c.urls", "missing"),
        (
            with_federation(upstreams={"c": {"urls": "amqp://a:b@h/"}}),
            "federation.upstreams.c.urls",
            "expected a list",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["http://a:b@h/"]}}),
            "federation.upstreams.c.urls[0]",
            "amqp://",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["amqp://a:b@h:99999/"]}}),
            "federation.upstreams.c.urls[0]",
            "not a valid URL",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["amqp://h:1/"]}}),
            "federation.upstreams.c.urls[0]",
            "no user",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["amqp://a@h:1/"]}}),
            "federation.upstreams.c.urls[0]",
            "no password",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["amqp://a:b@h:1/v"]}}),
            "federation.upstreams.c.urls[0]",
            "vhost 'v'",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["amqp://a:b@h:1/", "amqp://a:b@h:1/"]}}),
            "federation.upstreams.c.urls[1]",
            "listed twice",
        ),
        (
            with_federation(upstreams={"c": {"urls": ["amqp://a:b@h:1/"], "user": "x"}}),
            "federation.upstreams.c.user",
            "unknown key",
        ),
        (
            with_federation(
                upstreams={"c": {"urls": ["amqp://a:b@h:1/"], "password_file": "nope"}}
            ),
            "federation.upstreams.c.password_file",
            "cannot read",
        ),
        (with_federation(exchanges={"market": 1}), "federation.exchanges", "expected a list"),
        (with_federation(exchanges=["market"]), "federation.exchanges[0]", "expected a mapping"),
        (
            with_federation(exchanges=[{"upstream": "central"}]),
            "federation.exchanges[0].exchange",
            "missing",
        ),
        (with_exchange(exchange="amq.topic"), "federation.exchanges[0].exchange", "amq."),
        (
            with_federation(exchanges=[{"exchange": "m"}]),
            "federation.exchanges[0].upstream",
            "missing",
        ),
        (
            with_exchange(upstream="paris"),
            "federation.exchanges[0].upstream",
            "no upstream 'paris'",
        ),
        (
            with_exchange(delivery="maybe"),
            "federation.exchanges[0].delivery",
            "'confirm' or 'drop'",
        ),
        (with_exchange(max_hops=0), "federation.exchanges[0].max_hops", "1 or more"),
        (with_exchange(max_hops="2"), "federation.exchanges[0].max_hops", "an integer"),
        (with_exchange(forward="yes"), "federation.exchanges[0].forward", "true or false"),
        (with_exchange(bindings=1), "federation.exchanges[0].bindings", "true or false"),
        (with_exchange(vhost=""), "federation.exchanges[0].vhost", "is empty"),
        (with_exchange(colour="red"), "federation.exchanges[0].colour", "unknown key"),
        (
            with_federation(
                exchanges=[
                    {"exchange": "m", "upstream": "central"},
                    {"exchange": "m", "upstream": "central"},
                ]
            ),
            "federation.exchanges[1].exchange",
            "twice",
        ),
        (with_federation(reconcile=0), "federation.reconcile", "greater than 0"),
        (with_federation(probe=-1), "federation.probe", "greater than 0"),
        (with_federation(probe=".inf"), "federation.probe", "a number"),
        (with_federation(prefetch=0), "federation.prefetch", "1 or more"),
        (with_federation(prefetch=70000), "federation.prefetch", "65535 or less"),
    ],
)
def test_a_bad_federation_section_is_refused(
    tmp_path: Path, data: Any, key: str, problem: str
) -> None:
    assert_error(tmp_path, data, key, problem)


def test_a_password_in_the_url_and_a_password_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "efa.password").write_text("pw")
    data = with_federation(
        upstreams={"c": {"urls": ["amqp://a:b@h:1/"], "password_file": "efa.password"}}
    )
    assert_error(tmp_path, data, "federation.upstreams.c.urls[0]", "password_file is given too")


def test_an_upstreams_own_tls_is_read_and_its_errors_name_its_keys(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    data = with_federation()
    data["federation"]["upstreams"]["central"]["tls"] = {"server_name": "central"}
    assert_error(tmp_path, data, "federation.upstreams.central.tls.ca", "missing", "central")
    data["federation"]["upstreams"]["central"]["tls"] = {"ca": "ca.pem"}
    assert_error(tmp_path, data, "federation.upstreams.central.tls.ca", "not a CA certificate")
    data["federation"]["upstreams"]["central"]["tls"] = {"ca": "ca.pem", "cert": "c.pem"}
    assert_error(tmp_path, data, "federation.upstreams.central.tls.key", "give cert and key")
    data["federation"]["upstreams"]["central"]["tls"] = {"ca": "ca.pem", "colour": "red"}
    assert_error(tmp_path, data, "federation.upstreams.central.tls.colour")
