"""Load and validate a server's YAML configuration.

Owns: ``load_config``, the order the sections are read in, and the checks that span
sections: the ``server`` and ``failover`` sections (a role, its peer, the peer's login,
the pair's name, witnesses) and the exposure rule. Returns plain frozen dataclasses. A
file that could split a pair or open the broker to anyone is refused, not patched up: a
role without a peer (or the reverse), a role the command line contradicts, a non-finite
duration, a key given twice, no users at all, a pair without its shared secret, a
shipped secret or password on a server that listens beyond loopback. The sections alone
are read by ``sections.py`` and ``federation.py``, the file and its values by
``reading.py``.

Must not know: the broker, sockets, the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from amqha.core import names

from .federation import read_federation
from .reading import Section, check_name, is_loopback, override, parse_host_port, read_yaml
from .schema import (
    ROLES,
    ConfigError,
    FailoverConfig,
    PeerTls,
    ServerConfig,
    User,
    format_host_port,
)
from .sections import (
    listen_addresses,
    read_auth,
    read_limits,
    read_management,
    read_metrics,
    read_peer_tls,
    read_replication,
    read_secret,
    read_store,
    read_tls_listener,
    read_users,
    weak_credentials,
)


class _Server(NamedTuple):
    """The ``server`` section's values."""

    name: str
    listen_addresses: tuple[tuple[str, int], ...]
    advertise: str | None
    data_dir: str
    pair: str | None  # `server.pair`, the older spelling of `failover.pair`


def _server(path: str, server: Section) -> _Server:
    name = server.get("name", str, "amqha")
    check_name(path, "server.name", name)
    addresses = listen_addresses(path, server.get("listen", (str, list), "127.0.0.1:5672"))
    advertise = server.get("advertise", str, None)
    if advertise is not None:
        parse_host_port(path, "server.advertise", advertise)
    data_dir = server.get("data_dir", str, f"var/{name}")
    pair = server.get("pair", str, None)
    check_name(path, "server.pair", pair)
    server.check_unknown()
    return _Server(name, addresses, advertise, data_dir, pair)


def _role(path: str, failover: Section, role: str | None) -> str | None:
    """``failover.role``, filled in (never contradicted) by the command line's ``--role``."""
    configured_role = failover.get("role", str, None)
    if configured_role is not None and configured_role not in ROLES:
        raise ConfigError(
            path, "failover.role", f"expected 'primary' or 'backup', got {configured_role!r}"
        )
    if role is not None and role not in ROLES:
        raise ConfigError(path, "--role", f"expected 'primary' or 'backup', got {role!r}")
    if role is not None and configured_role is not None and role != configured_role:
        raise ConfigError(
            path,
            "failover.role",
            f"the file says {configured_role!r} but the command line says --role {role}",
        )
    return role or configured_role


def _peer(path: str, failover: Section, role: str | None) -> str | None:
    """``failover.peer``: a role needs its peer, a peer needs a role."""
    peer = failover.get("peer", str, None)
    if peer is not None:
        parse_host_port(path, "failover.peer", peer)
    if role is not None and peer is None:
        raise ConfigError(
            path,
            "failover.peer",
            f"missing: a {role} without its peer would serve alone, as a second active server",
        )
    if peer is not None and role is None:
        raise ConfigError(
            path, "failover.role", "missing: failover.peer is set; say 'primary' or 'backup'"
        )
    return peer


def _timers(path: str, failover: Section) -> tuple[float, float]:
    """``failover.heartbeat`` and ``failover.timeout``, the timeout the longer."""
    heartbeat = failover.positive("heartbeat", float, 0.2)
    timeout = failover.positive("timeout", float, 0.6)
    if timeout <= heartbeat:
        raise ConfigError(
            path,
            "failover.timeout",
            f"must be greater than failover.heartbeat ({heartbeat}), got {timeout}",
        )
    return heartbeat, timeout


def _peer_login(
    path: str, failover: Section, users: tuple[User, ...], peer_user: str
) -> tuple[bytes, PeerTls | None]:
    """The shared secret and the peer's TLS settings of a server with a peer; the user it
    logs in to its peer as must be one of ``users``, tagged, with its password."""
    user = next((u for u in users if u.name == peer_user), None)
    if user is None:
        raise ConfigError(path, "failover.peer_user", f"no user {peer_user!r} in users")
    if "peering" not in user.tags:
        raise ConfigError(path, "failover.peer_user", f"user {peer_user!r} needs the tag 'peering'")
    if user.password is None:
        raise ConfigError(
            path,
            "failover.peer_user",
            f"user {peer_user!r} has only a password_hash: this server logs in to its "
            "peer as that user, so it needs the password itself",
        )
    secret = read_secret(path, failover)
    return secret, read_peer_tls(path, failover.section("peer_tls"))


def _pair_names(path: str, failover: Section, pair: str | None) -> tuple[str | None, str | None]:
    """``failover.peer_name`` and the pair's name (``failover.pair``, or ``server.pair``
    as ``pair``: one of them, not two that differ)."""
    peer_name = failover.get("peer_name", str, None)
    check_name(path, "failover.peer_name", peer_name)
    pair_name = failover.get("pair", str, None)
    check_name(path, "failover.pair", pair_name)
    if pair_name is not None and pair is not None and pair_name != pair:
        raise ConfigError(
            path,
            "failover.pair",
            f"{pair_name!r}, but server.pair (its older spelling) says {pair!r}: give one",
        )
    return peer_name, pair_name or pair


def _witnesses(path: str, failover: Section, peer: str | None) -> tuple[tuple[str, int], ...]:
    """``failover.witness``: the witnesses of a pair, each named once."""
    witness_list = failover.get("witness", list, [])
    witness = tuple(
        parse_host_port(path, f"failover.witness[{index}]", address)
        for index, address in enumerate(witness_list)
    )
    if witness and peer is None:
        raise ConfigError(path, "failover.witness", "a witness serves a pair: set failover.peer")
    if len(set(witness)) != len(witness):
        raise ConfigError(path, "failover.witness", "a witness is named twice")
    return witness


def _failover(
    path: str, failover: Section, role: str | None, users: tuple[User, ...], server: _Server
) -> tuple[FailoverConfig, str | None]:
    """The ``failover`` section, and the pair's name (a default made of both servers'
    names when only ``peer_name`` is given)."""
    role = _role(path, failover, role)
    peer = _peer(path, failover, role)
    heartbeat, timeout = _timers(path, failover)
    peer_user = failover.get("peer_user", str, "peering")
    secret: bytes = b""
    peer_tls = None
    if peer is not None:
        secret, peer_tls = _peer_login(path, failover, users, peer_user)
    else:
        for key in ("secret", "secret_file", "peer_tls"):
            failover.used.add(key)
    peer_name, pair = _pair_names(path, failover, server.pair)
    takeover_unsynced = failover.get("takeover_unsynced", bool, False)
    if pair is None and peer_name is not None:
        pair = names.default_pair_name(server.name, peer_name)
    peer_listen = failover.get("peer_listen", list, [])
    for index, address in enumerate(peer_listen):
        parse_host_port(path, f"failover.peer_listen[{index}]", address)
    if peer is not None and not peer_listen:
        peer_listen = [peer]
    witness = _witnesses(path, failover, peer)
    link_heartbeat = failover.get("link_heartbeat", int, 5)
    if not 1 <= link_heartbeat <= 600:
        raise ConfigError(
            path, "failover.link_heartbeat", f"must be between 1 and 600 s, got {link_heartbeat}"
        )
    failover.check_unknown()
    config = FailoverConfig(
        role,
        peer,
        heartbeat,
        timeout,
        peer_user,
        secret=secret,
        peer_name=peer_name,
        peer_listen=tuple(peer_listen),
        peer_tls=peer_tls,
        takeover_unsynced=takeover_unsynced,
        witness=witness,
        link_heartbeat=link_heartbeat,
    )
    return config, pair


def _refuse_exposed(
    path: str, weak: list[tuple[str, str]], listeners: list[tuple[str, int]]
) -> None:
    """A credential anyone can look up, on a server that listens beyond loopback, is
    refused (docs/security.md, "Shipped credentials")."""
    exposed = [format_host_port(*address) for address in listeners if not is_loopback(address[0])]
    if weak and exposed:
        key, problem = weak[0]
        raise ConfigError(
            path,
            key,
            f"{problem}, and this server listens on {exposed[0]}, which is not a loopback "
            "address: give it one of your own (docs/security.md, 'Shipped credentials')",
        )


def _document(path: str, overrides: Mapping[str, Any] | None) -> Any:
    """The file's YAML with ``overrides`` set in it."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(path, "(file)", f"cannot read: {error.strerror}") from None
    data = read_yaml(path, text)
    for key, value in (overrides or {}).items():
        data = override(path, data, key, value)
    return data


def load_config(
    path: str | os.PathLike[str],
    role: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ServerConfig:
    """Read and validate ``path``.

    ``role`` (from the command line) may fill in a missing failover.role, never contradict it.
    ``overrides`` ({"server.listen": "127.0.0.1:6000", ...}: ``amqha start --set``, which
    ``amqha pair`` uses to move a pair's ports) replace keys of the file before it is
    validated, so a bad value is named as the file's key would be.
    """
    path = str(path)
    top = Section(path, "", _document(path, overrides))
    server = _server(path, top.section("server"))
    users = read_users(path, top.data.get("users"))
    top.used.add("users")
    failover_section = top.section("failover")
    failover, pair = _failover(path, failover_section, role, users, server)
    tls = read_tls_listener(path, top.section("tls"))
    auth = read_auth(path, top.section("auth"))
    events = top.section("events")
    events_path = events.get("path", str, None)
    events.check_unknown()
    limits = read_limits(path, top.section("limits"))
    metrics = top.section("metrics")
    metrics_listen, metrics_auth = read_metrics(path, metrics)
    metrics.check_unknown()
    management = read_management(path, top.section("management"), tls)
    store = read_store(path, top.section("store"))
    replication = read_replication(top.section("replication"))
    federation = read_federation(path, top.section("federation"))
    top.check_unknown()
    secret_key = (
        "failover.secret_file" if failover_section.data.get("secret_file") else "failover.secret"
    )
    weak = weak_credentials(users, failover.secret, secret_key, auth.loopback_users)
    _refuse_exposed(
        path,
        weak,
        [
            *server.listen_addresses,
            *([] if tls is None else [(tls.host, tls.port)]),
            *([] if metrics_listen is None else [metrics_listen]),
            *([] if management is None else [(management.host, management.port)]),
        ],
    )
    host, port = server.listen_addresses[0]
    return ServerConfig(
        name=server.name,
        host=host,
        port=port,
        advertise=server.advertise,
        data_dir=server.data_dir,
        events_path=events_path,
        pair=pair,
        users=users,
        failover=failover,
        limits=limits,
        source=path,
        listen_addresses=server.listen_addresses,
        metrics_listen=metrics_listen,
        metrics_auth=metrics_auth,
        management=management,
        tls=tls,
        auth=auth,
        store=store,
        replication=replication,
        weak_credentials=tuple(f"{path}: {key}: {problem}" for key, problem in weak),
        federation=federation,
    )
