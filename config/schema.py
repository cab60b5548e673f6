"""A server's configuration as values: the schema's frozen dataclasses, its constants,
and ``ConfigError``, the one error every check raises (``FILE: KEY: PROBLEM``).

Owns: what a loaded configuration is, and the few facts derived from it (addresses,
paths, the global name and federation id). ``loader.py`` reads and checks a YAML file
into these values (with ``reading.py``, ``sections.py``, ``federation.py``); ``tls.py``
turns their TLS parts into contexts.

Must not know: YAML, sockets, the event loop, the broker.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from amqha.core import names

from .passwords import Verifier, parse_hash, plain

ROLES = ("primary", "backup")
# RabbitMQ's management tags (management, policymaker, monitoring, administrator), the
# pair's own (peering): docs/operations.md, "Management API"; and federation, the links
# of other places to this one (amq.federation: docs/federation.md).
USER_TAGS = (
    "administrator",
    "peering",
    "monitoring",
    "management",
    "policymaker",
    "federation",
)
# Where a standalone server keeps its federation id (docs/federation.md, "Names").
FEDERATION_ID_FILE = "federation.id"
CLIENT_CERTS = ("none", "optional", "required")
MIN_SECRET_LENGTH = 16
# What the config files used to ship (and the tests still use): refused with a listener
# that is not loopback, warned about on loopback (docs/security.md, "Shipped credentials").
DEMO_SECRET = "change-me-loopback-demo-secret"
SHIPPED_PASSWORDS = frozenset({"guest", "admin", "peering"})


class ConfigError(Exception):
    """A configuration problem, worded as ``FILE: KEY: PROBLEM``."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}")
        self.path, self.key, self.problem = path, key, problem


@dataclass(frozen=True)
class User:
    name: str
    password: str | None  # in plain text; None when only ``password_hash`` is given
    vhosts: tuple[str, ...] = ("/",)
    tags: tuple[str, ...] = ()
    password_hash: str | None = None

    @property
    def verifier(self) -> Verifier:
        if self.password_hash is not None:
            return parse_hash(self.password_hash)
        assert self.password is not None
        return plain(self.password)


@dataclass(frozen=True)
class TlsListener:
    """The amqps listener. Paths are absolute (resolved against the config file's folder)."""

    host: str
    port: int
    cert: str
    key: str
    ca: str | None = None
    client_certs: str = "none"  # "none", "optional" or "required" (checked against ca)

    @property
    def listen(self) -> str:
        return format_host_port(self.host, self.port)


@dataclass(frozen=True)
class PeerTls:
    """TLS on the link to the peer: whom to trust, what to present, which name to check."""

    ca: str
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None  # defaults to the host of failover.peer


@dataclass(frozen=True)
class FailoverConfig:
    role: str | None = None
    peer: str | None = None  # host:port of the other server, as this server reaches it
    heartbeat: float = 0.2
    timeout: float = 0.6
    peer_user: str = "peering"
    # The pair's shared secret: state messages are signed with it (docs/security.md);
    # empty when standalone.
    secret: bytes = field(default=b"", repr=False)
    peer_name: str | None = None  # the peer's server.name; any other name is refused
    # Addresses the peer may announce to clients; a redirect never points elsewhere.
    peer_listen: tuple[str, ...] = ()
    peer_tls: PeerTls | None = None
    # A PASSIVE not in sync with the ACTIVE may still take over by client vote (losing
    # what it has not caught up): docs/durability.md.
    takeover_unsynced: bool = False
    # Witnesses (host, port), UDP: a third party that tells a dead peer from a cut link
    # (docs/failover.md, "The witness"); none: the pair decides alone.
    witness: tuple[tuple[str, int], ...] = ()
    # The AMQP heartbeat (whole seconds) of the pair's own links (state and replication):
    # a link with no frame for three of them is dropped and reconnected.
    link_heartbeat: int = 5


@dataclass(frozen=True)
class AuthConfig:
    # As RabbitMQ's loopback_users: these may log in only from a loopback address.
    loopback_users: tuple[str, ...] = ("guest",)
    # A refused login is answered this long after its Start-Ok, never sooner.
    failed_login_delay: float = 1.0


@dataclass(frozen=True)
class VHostLimits:
    """What each vhost may hold; 0 means no limit."""

    max_connections: int = 0
    max_queues: int = 100_000


@dataclass(frozen=True)
class UserLimits:
    """What each user may hold, over all its connections; 0 means no limit."""

    max_connections: int = 0
    max_channels: int = 0


@dataclass(frozen=True)
class Limits:
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024
    memory_high_watermark: int = 2 * 1024 * 1024 * 1024
    max_connections: int = 10_000
    max_consumers_per_channel: int = 0
    max_header_size: int = 64 * 1024
    # The arguments of one declare or bind, as core.routing.arguments_size counts them.
    max_arguments_size: int = 16 * 1024
    output_buffer: int = 1024 * 1024
    vhost: VHostLimits = field(default_factory=VHostLimits)
    user: UserLimits = field(default_factory=UserLimits)


@dataclass(frozen=True)
class ManagementConfig:
    """The management HTTP API and web page (docs/operations.md, "Management API")."""

    host: str
    port: int
    # Served over TLS with the amqps listener's certificate and key (the ``tls`` section).
    tls: bool = False
    # The peer's management listener (host, port), asked for its event log by the page's
    # merged log; None: the page shows this server's log only.
    peer: tuple[str, int] | None = None

    @property
    def listen(self) -> str:
        return format_host_port(self.host, self.port)


@dataclass(frozen=True)
class StoreConfig:
    """The message store (docs/durability.md): durable wiring and persistent messages on
    durable queues, on disk before their confirm."""

    enabled: bool = True
    path: str | None = None  # default: DATA_DIR/store.sqlite
    max_bytes: int | None = None  # the store's disk budget; past it publishes are nacked


@dataclass(frozen=True)
class ReplicationConfig:
    """Replication to the PASSIVE (docs/durability.md, section 5)."""

    enabled: bool = True
    default: bool = True  # durable queues without x-amqha-replicate are replicated
    # With no in-sync PASSIVE, the ACTIVE confirms on its own disk ("confirm") or its
    # confirms wait until a PASSIVE is in sync again ("hold"): docs/durability.md.
    when_alone: str = "confirm"


@dataclass(frozen=True)
class FederationUpstream:
    """One upstream of ``federation.upstreams``: its servers' URLs, password filled in."""

    name: str
    urls: tuple[str, ...] = field(repr=False)
    # For amqps URLs: whom to trust (and what to present); else failover.peer_tls's.
    tls: PeerTls | None = None


@dataclass(frozen=True)
class FederatedExchange:
    """One ``federation.exchanges`` item: a link (docs/federation.md, "Config")."""

    exchange: str
    upstream: str
    vhost: str = "/"
    bindings: bool = True
    forward: bool = False
    max_hops: int = 1
    delivery: str = "confirm"  # "confirm" or "drop"


@dataclass(frozen=True)
class FederationConfig:
    """The ``federation`` section; empty: this server federates nothing."""

    upstreams: tuple[FederationUpstream, ...] = ()
    exchanges: tuple[FederatedExchange, ...] = ()
    reconcile: float = 5.0
    probe: float = 5.0
    prefetch: int = 1000

    def upstream(self, name: str) -> FederationUpstream:
        return next(u for u in self.upstreams if u.name == name)


@dataclass(frozen=True)
class ServerConfig:
    name: str = "amqha"
    host: str = "127.0.0.1"
    port: int = 5672
    advertise: str | None = None  # host:port clients should be sent to; defaults to listen
    data_dir: str = "var/amqha"
    events_path: str | None = None
    # The HA pair this server belongs to (failover.pair), written as `pair` in its event
    # records. By default the two servers' names ("backup+primary") when
    # failover.peer_name gives the peer's; None without it (the report then names the pair
    # the same way from the logs).
    pair: str | None = None
    users: tuple[User, ...] = ()
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    limits: Limits = field(default_factory=Limits)
    source: str = "<defaults>"
    # Every address clients may connect to (server.listen as a list); the first is
    # host:port. Empty means host:port alone.
    listen_addresses: tuple[tuple[str, int], ...] = ()
    # Where the Prometheus endpoint listens (metrics.listen); None: no endpoint.
    metrics_listen: tuple[str, int] | None = None
    # (username, password) a scrape must give with HTTP basic auth; None: none asked.
    metrics_auth: tuple[str, str] | None = field(default=None, repr=False)
    # The management API and web page (management.listen); None: off.
    management: ManagementConfig | None = None
    tls: TlsListener | None = None
    auth: AuthConfig = field(default_factory=AuthConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    # One line per shipped credential this server accepts (only ever on loopback
    # listeners: elsewhere the file is refused); ``amqha start`` prints each.
    weak_credentials: tuple[str, ...] = ()
    # Exchange federation (docs/federation.md); empty: none.
    federation: FederationConfig = field(default_factory=FederationConfig)

    @property
    def listen(self) -> str:
        return format_host_port(self.host, self.port)

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        return self.listen_addresses or ((self.host, self.port),)

    @property
    def public_address(self) -> str:
        return self.advertise or self.listen

    @property
    def event_log_path(self) -> str:
        return self.events_path or os.path.join(self.data_dir, "events.jsonl")

    @property
    def store_path(self) -> str:
        return self.store.path or os.path.join(self.data_dir, "store.sqlite")

    def user(self, name: str) -> User | None:
        return next((u for u in self.users if u.name == name), None)

    @property
    def global_name(self) -> str:
        """The name other places know this server by: its pair's name in a pair (both
        servers share it), its own when standalone, or in a pair that names neither
        ``failover.pair`` nor ``failover.peer_name`` (docs/federation.md, "Names")."""
        if self.failover.role is not None and self.pair is not None:
            return self.pair
        return self.name

    @functools.cached_property
    def federation_id(self) -> str:
        """What tells this place from another with the same name: in a pair, derived from
        the pair's secret (the same on both servers); standalone, a random id kept in
        ``data_dir/federation.id``, made the first time it is asked for."""
        if self.failover.role is not None and self.failover.secret:
            return names.federation_id(self.failover.secret)
        return standalone_federation_id(self.data_dir)


def standalone_federation_id(data_dir: str) -> str:
    """``data_dir/federation.id``: read, or made whole (written beside it, synced, linked
    into place: never replaced) with 16 random hex digits. ConfigError if it holds
    anything else, or cannot be read or made."""
    path = os.path.join(data_dir, FEDERATION_ID_FILE)
    try:
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            os.makedirs(data_dir, mode=0o700, exist_ok=True)
            making = f"{path}.new"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(making)
            descriptor = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(descriptor, f"{secrets.token_hex(8)}\n".encode())
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            try:
                with contextlib.suppress(FileExistsError):  # another made it meanwhile
                    os.link(making, path)
            finally:
                os.unlink(making)
            text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            path, "(file)", f"cannot read or make the federation id: {error}"
        ) from None
    if not re.fullmatch(r"[0-9a-f]{16}", text):
        raise ConfigError(
            path, "(file)", "corrupt: expected 16 hex digits; delete it to make a new id"
        )
    return text


def format_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets as it is written in the config."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
