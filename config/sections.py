"""The sections of a server's configuration, each read into its values.

Owns: the checks of ``server.listen``, ``users``, ``failover``'s secret, ``tls`` and a
client's TLS settings, ``auth``, ``limits``, ``metrics``, ``management``, ``store`` and
``replication``; and which credentials anyone can look up (the demo secret, a shipped
password: docs/security.md, "Shipped credentials"). Each problem is a ``ConfigError``
naming the file, the key and the problem.

Must not know: how the sections depend on each other (``loader.py``), federation
(``federation.py``), the broker, sockets, the event loop.
"""

from __future__ import annotations

from typing import Any

from . import tls as tls_check
from .passwords import BadHash, parse_hash
from .reading import Section, file_path, is_loopback, parse_host_port, text_file
from .schema import (
    CLIENT_CERTS,
    DEMO_SECRET,
    MIN_SECRET_LENGTH,
    SHIPPED_PASSWORDS,
    USER_TAGS,
    AuthConfig,
    ConfigError,
    Limits,
    ManagementConfig,
    PeerTls,
    ReplicationConfig,
    StoreConfig,
    TlsListener,
    User,
    UserLimits,
    VHostLimits,
)
from .vhostnames import vhost_name_problem


def listen_addresses(path: str, value: Any) -> tuple[tuple[str, int], ...]:
    """server.listen: one 'host:port' or a non-empty list of them, each once."""
    if isinstance(value, str):
        return (parse_host_port(path, "server.listen", value),)
    if not value:
        raise ConfigError(path, "server.listen", "expected at least one 'host:port'")
    addresses: list[tuple[str, int]] = []
    for index, item in enumerate(value):
        address = parse_host_port(path, f"server.listen[{index}]", item)
        if address in addresses:
            raise ConfigError(path, f"server.listen[{index}]", f"{item!r} is listed twice")
        addresses.append(address)
    return tuple(addresses)


def read_users(path: str, value: Any) -> tuple[User, ...]:
    if value is None:
        # No default guest/guest: a server started from an empty file would let anyone in.
        raise ConfigError(
            path, "users", "missing: list at least one user (name, password or password_hash)"
        )
    if not isinstance(value, list) or not value:
        raise ConfigError(path, "users", "expected a non-empty list of users")
    users: list[User] = []
    for index, item in enumerate(value):
        section = Section(path, f"users[{index}]", item)
        name = section.get("name", str, None)
        if not name:
            raise ConfigError(path, f"users[{index}].name", "missing")
        password = section.get("password", str, None)
        password_hash = section.get("password_hash", str, None)
        password_file = section.get("password_file", str, None)
        given = [
            key
            for key, value in (
                ("password", password),
                ("password_hash", password_hash),
                ("password_file", password_file),
            )
            if value is not None
        ]
        if not given:
            raise ConfigError(
                path, f"users[{index}].password", "missing (or give password_hash or password_file)"
            )
        if len(given) > 1:
            raise ConfigError(
                path,
                f"users[{index}].{given[1]}",
                "give either password, password_hash or password_file",
            )
        if password_file is not None:
            password = text_file(path, f"users[{index}].password_file", password_file)
            if not password:
                raise ConfigError(path, f"users[{index}].password_file", "the file is empty")
        if password_hash is not None:
            try:
                parse_hash(password_hash)
            except BadHash as error:
                raise ConfigError(path, f"users[{index}].password_hash", str(error)) from None
        vhosts = section.get("vhosts", list, ["/"])
        for vhost in vhosts:
            problem = vhost_name_problem(vhost)
            if problem is not None:
                raise ConfigError(path, f"users[{index}].vhosts", problem)
        tags = section.get("tags", list, [])
        for tag in tags:
            if tag not in USER_TAGS:
                raise ConfigError(
                    path,
                    f"users[{index}].tags",
                    f"unknown tag {tag!r} (known: {', '.join(USER_TAGS)})",
                )
        if any(u.name == name for u in users):
            raise ConfigError(path, f"users[{index}].name", f"duplicate user {name!r}")
        section.check_unknown()
        users.append(
            User(name, password, tuple(map(str, vhosts)), tuple(tags), password_hash=password_hash)
        )
    return tuple(users)


def _vhost_limits(section: Section) -> VHostLimits:
    defaults = VHostLimits()
    limits = VHostLimits(
        max_connections=section.count("max_connections", defaults.max_connections),
        max_queues=section.count("max_queues", defaults.max_queues),
    )
    section.check_unknown()
    return limits


def _user_limits(section: Section) -> UserLimits:
    defaults = UserLimits()
    limits = UserLimits(
        max_connections=section.count("max_connections", defaults.max_connections),
        max_channels=section.count("max_channels", defaults.max_channels),
    )
    section.check_unknown()
    return limits


def weak_credentials(
    users: tuple[User, ...], secret: bytes, secret_key: str, loopback_users: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(key, problem) for each credential anyone can look up: the demo secret, a shipped
    password. A user in auth.loopback_users is left out: it can only log in from this
    machine whatever its password (RabbitMQ's guest/guest)."""
    weak = []
    if secret == DEMO_SECRET.encode():
        weak.append(
            (secret_key, "the demo secret shipped with amqha (anyone can move the service)")
        )
    for index, user in enumerate(users):
        if user.name in loopback_users or user.password is None:
            continue
        if user.password in SHIPPED_PASSWORDS or user.password == user.name:
            weak.append(
                (
                    f"users[{index}].password",
                    f"user {user.name!r} has a shipped password (as in {user.name}/"
                    f"{user.name}: anyone can log in as it)",
                )
            )
    return weak


def read_metrics(
    path: str, metrics: Section
) -> tuple[tuple[str, int] | None, tuple[str, str] | None]:
    """metrics.listen and the basic-auth credentials; the endpoint names every queue of
    every vhost, so off loopback it must ask for them."""
    listen_value = metrics.get("listen", str, None)
    listen = None if listen_value is None else parse_host_port(path, "metrics.listen", listen_value)
    username = metrics.get("username", str, None)
    password = metrics.get("password", str, None)
    password_file = metrics.get("password_file", str, None)
    if password is not None and password_file is not None:
        raise ConfigError(path, "metrics.password_file", "give either password or password_file")
    if password_file is not None:
        password = text_file(path, "metrics.password_file", password_file)
    if (username is None) != (password is None):
        missing = "metrics.username" if username is None else "metrics.password"
        raise ConfigError(path, missing, "missing: basic auth needs both a username and a password")
    if username is not None and (not username or ":" in username):
        raise ConfigError(path, "metrics.username", "must be non-empty, without ':'")
    if password is not None and not password:
        raise ConfigError(path, "metrics.password", "is empty")
    auth = None if username is None or password is None else (username, password)
    if listen is not None and auth is None and not is_loopback(listen[0]):
        raise ConfigError(
            path,
            "metrics.listen",
            f"{listen_value!r} is not a loopback address: give metrics.username and "
            "metrics.password (or password_file), since the endpoint names every queue",
        )
    return listen, auth


def read_management(
    path: str, section: Section, tls: TlsListener | None
) -> ManagementConfig | None:
    """management.listen (off when absent), management.tls (the amqps listener's
    certificate and key), management.peer (the peer's management listener)."""
    listen_value = section.get("listen", str, None)
    use_tls = section.get("tls", bool, False)
    peer_value = section.get("peer", str, None)
    section.check_unknown()
    if listen_value is None:
        if use_tls or peer_value is not None:
            raise ConfigError(path, "management.listen", "missing: where the API listens")
        return None
    host, port = parse_host_port(path, "management.listen", listen_value)
    if use_tls and tls is None:
        raise ConfigError(
            path,
            "management.tls",
            "true needs the tls section: the API is served with its cert and key",
        )
    peer = None if peer_value is None else parse_host_port(path, "management.peer", peer_value)
    return ManagementConfig(host, port, use_tls, peer)


def read_secret(path: str, failover: Section) -> bytes:
    secret = failover.get("secret", str, None)
    secret_file = failover.get("secret_file", str, None)
    if secret is not None and secret_file is not None:
        raise ConfigError(path, "failover.secret_file", "give either secret or secret_file")
    key = "failover.secret"
    if secret_file is not None:
        key = "failover.secret_file"
        secret = text_file(path, key, secret_file)
    if secret is None:
        raise ConfigError(
            path,
            "failover.secret",
            "missing: a pair needs a shared secret (failover.secret or failover.secret_file, "
            "the same on both servers)",
        )
    if len(secret) < MIN_SECRET_LENGTH:
        # The secret itself is never echoed: only its length.
        raise ConfigError(
            path, key, f"too short: at least {MIN_SECRET_LENGTH} characters, got {len(secret)}"
        )
    return secret.encode("utf-8")


def read_tls_listener(path: str, section: Section) -> TlsListener | None:
    if not section.data:
        section.check_unknown()
        return None
    listen = section.get("listen", str, None)
    if listen is None:
        raise ConfigError(path, "tls.listen", "missing: where the amqps listener binds")
    host, port = parse_host_port(path, "tls.listen", listen)
    files = {}
    for name in ("cert", "key"):
        value = section.get(name, str, None)
        if value is None:
            raise ConfigError(path, f"tls.{name}", "missing")
        files[name] = file_path(path, f"tls.{name}", value)
    ca = section.get("ca", str, None)
    ca_path = None if ca is None else file_path(path, "tls.ca", ca)
    client_certs = section.get("client_certs", str, "none")
    if client_certs not in CLIENT_CERTS:
        raise ConfigError(
            path,
            "tls.client_certs",
            f"expected one of {', '.join(CLIENT_CERTS)}, got {client_certs!r}",
        )
    if client_certs != "none" and ca_path is None:
        raise ConfigError(path, "tls.ca", f"missing: client_certs is {client_certs!r}")
    section.check_unknown()
    listener = TlsListener(host, port, files["cert"], files["key"], ca_path, client_certs)
    tls_check.server_context(listener, path)
    return listener


def read_peer_tls(path: str, section: Section, whom: str = "the peer") -> PeerTls | None:
    """A client's TLS settings (``failover.peer_tls``, a federation upstream's ``tls``):
    whom to trust, the certificate to present if asked, the name to check."""
    if not section.data:
        section.check_unknown()
        return None
    ca = section.get("ca", str, None)
    if ca is None:
        raise ConfigError(path, section.key("ca"), f"missing: whom to trust for {whom}")
    cert = section.get("cert", str, None)
    key = section.get("key", str, None)
    if (cert is None) != (key is None):
        missing = "key" if key is None else "cert"
        raise ConfigError(path, section.key(missing), "missing: give cert and key")
    server_name = section.get("server_name", str, None)
    section.check_unknown()
    peer_tls = PeerTls(
        file_path(path, section.key("ca"), ca),
        None if cert is None else file_path(path, section.key("cert"), cert),
        None if key is None else file_path(path, section.key("key"), key),
        server_name,
    )
    tls_check.client_context(peer_tls, path, section.prefix)
    return peer_tls


def read_auth(path: str, section: Section) -> AuthConfig:
    defaults = AuthConfig()
    loopback_users = section.get("loopback_users", list, list(defaults.loopback_users))
    for index, name in enumerate(loopback_users):
        if not isinstance(name, str):
            raise ConfigError(
                path, f"auth.loopback_users[{index}]", f"expected a user name, got {name!r}"
            )
    delay = section.get("failed_login_delay", float, defaults.failed_login_delay)
    if not 0 <= delay <= 10:
        raise ConfigError(
            path, "auth.failed_login_delay", f"must be between 0 and 10 seconds, got {delay}"
        )
    section.check_unknown()
    return AuthConfig(tuple(loopback_users), delay)


def read_limits(path: str, section: Section) -> Limits:
    """The ``limits`` section: the protocol's limits, sizes, counts (docs/limits.md)."""
    defaults = Limits()
    frame_max = section.get("frame_max", int, defaults.frame_max)
    if not 4096 <= frame_max <= 1024 * 1024 * 16:
        raise ConfigError(
            path, "limits.frame_max", f"must be between 4096 and 16777216, got {frame_max}"
        )
    channel_max = section.get("channel_max", int, defaults.channel_max)
    if not 1 <= channel_max <= 65535:
        raise ConfigError(
            path, "limits.channel_max", f"must be between 1 and 65535, got {channel_max}"
        )
    heartbeat = section.get("heartbeat", int, defaults.heartbeat)
    if not 0 <= heartbeat <= 65535:
        raise ConfigError(path, "limits.heartbeat", f"must be between 0 and 65535, got {heartbeat}")
    limits = Limits(
        frame_max=frame_max,
        channel_max=channel_max,
        heartbeat=heartbeat,
        max_message_size=section.size("max_message_size", defaults.max_message_size),
        memory_high_watermark=section.size("memory_high_watermark", defaults.memory_high_watermark),
        max_connections=section.count("max_connections", defaults.max_connections, 1),
        max_consumers_per_channel=section.count(
            "max_consumers_per_channel", defaults.max_consumers_per_channel
        ),
        max_header_size=section.size("max_header_size", defaults.max_header_size),
        max_arguments_size=section.size("max_arguments_size", defaults.max_arguments_size),
        output_buffer=section.size("output_buffer", defaults.output_buffer),
        vhost=_vhost_limits(section.section("vhost")),
        user=_user_limits(section.section("user")),
    )
    if limits.output_buffer < 4096:
        raise ConfigError(
            path, "limits.output_buffer", f"must be 4096 bytes or more, got {limits.output_buffer}"
        )
    section.check_unknown()
    return limits


def read_store(path: str, section: Section) -> StoreConfig:
    """The ``store`` section: whether and where messages are kept on disk, its size limit."""
    store = StoreConfig(
        enabled=section.get("enabled", bool, True),
        path=section.get("path", str, None),
        max_bytes=(section.size("max_bytes", 0) if section.data.get("max_bytes") else None),
    )
    if store.max_bytes is not None and store.max_bytes < 1024 * 1024:
        raise ConfigError(
            path, "store.max_bytes", f"must be 1MiB (1048576 bytes) or more, got {store.max_bytes}"
        )
    section.check_unknown()
    return store


def read_replication(section: Section) -> ReplicationConfig:
    """The ``replication`` section: on or off, and whether queues are replicated by default."""
    when_alone = section.get("when_alone", str, "confirm")
    if when_alone not in WHEN_ALONE:
        raise ConfigError(
            section.path,
            section.key("when_alone"),
            f"must be one of {', '.join(WHEN_ALONE)}, got {when_alone!r}",
        )
    replication = ReplicationConfig(
        enabled=section.get("enabled", bool, True),
        default=section.get("default", bool, True),
        when_alone=when_alone,
    )
    section.check_unknown()
    return replication


# What an ACTIVE with no in-sync PASSIVE does with a confirm (docs/durability.md).
WHEN_ALONE = ("confirm", "hold")
