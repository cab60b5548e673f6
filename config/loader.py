"""Load and validate a server's YAML configuration.

Owns: the configuration schema (keys, types, defaults, ranges) and error messages
that name the file, the key and the problem. Returns plain frozen dataclasses. A file
that could split a pair or open the broker to anyone is refused, not patched up: a role
without a peer (or the reverse), a role the command line contradicts, a non-finite
duration, a key given twice, no users at all, a pair without its shared secret, a
shipped secret or password on a server that listens beyond loopback.

Must not know: the broker, sockets, the event loop.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import yaml

from amqha.core import names

from . import tls as tls_check
from .passwords import BadHash, parse_hash
from .schema import (
    CLIENT_CERTS,
    DEMO_SECRET,
    MIN_SECRET_LENGTH,
    ROLES,
    SHIPPED_PASSWORDS,
    USER_TAGS,
    AuthConfig,
    ConfigError,
    FailoverConfig,
    FederatedExchange,
    FederationConfig,
    FederationUpstream,
    Limits,
    ManagementConfig,
    PeerTls,
    ReplicationConfig,
    ServerConfig,
    StoreConfig,
    TlsListener,
    User,
    UserLimits,
    VHostLimits,
    format_host_port,
)
from .vhostnames import vhost_name_problem


def _listen_addresses(path: str, value: Any) -> tuple[tuple[str, int], ...]:
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


def parse_host_port(path: str, key: str, value: Any) -> tuple[str, int]:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(path, key, f"expected 'host:port', got {value!r}")
    host, _, port_text = value.rpartition(":")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ConfigError(
            path, key, f"an IPv6 address needs brackets, as in '[::1]:5672', got {value!r}"
        )
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(path, key, f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(path, key, f"port {port} is out of range 0..65535")
    if not host:
        raise ConfigError(path, key, "host is empty")
    return host, port


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}


class _Section:
    """Reads one mapping, remembering which keys were used so unknown ones are reported."""

    def __init__(self, path: str, prefix: str, data: Any) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                path, prefix or "(top level)", f"expected a mapping, got {type(data).__name__}"
            )
        self.path, self.prefix, self.data = path, prefix, data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        value = self.data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind is not bool:
            raise ConfigError(
                self.path, self.key(name), f"expected {_kind_name(kind)}, got a boolean"
            )
        if not isinstance(value, kind):
            raise ConfigError(
                self.path, self.key(name), f"expected {_kind_name(kind)}, got {value!r}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(self.path, self.key(name), f"expected a finite number, got {value}")
        return value

    def positive(self, name: str, kind: type, default: Any, minimum: float = 0) -> Any:
        value = self.get(name, kind, default)
        if value <= minimum:
            raise ConfigError(
                self.path, self.key(name), f"must be greater than {minimum}, got {value}"
            )
        return value

    def size(self, name: str, default: int) -> int:
        self.used.add(name)
        value = self.data.get(name, default)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        if isinstance(value, str):
            text = value.strip().lower().replace(" ", "")
            number = text.rstrip("kmgib")
            unit = text[len(number) :]
            if unit in _SIZE_UNITS:
                try:
                    parsed = int(float(number) * _SIZE_UNITS[unit])
                except (ValueError, OverflowError):
                    parsed = 0
                if parsed > 0:
                    return parsed
        raise ConfigError(
            self.path, self.key(name), f"expected a size like 1048576 or '512MiB', got {value!r}"
        )

    def count(self, name: str, default: int, minimum: int = 0) -> int:
        value = self.get(name, int, default)
        if value < minimum:
            raise ConfigError(self.path, self.key(name), f"must be {minimum} or more, got {value}")
        return value

    def section(self, name: str) -> _Section:
        self.used.add(name)
        return _Section(self.path, self.key(name), self.data.get(name))

    def check_unknown(self) -> None:
        unknown = sorted(set(map(str, self.data)) - self.used)
        if unknown:
            raise ConfigError(self.path, self.key(unknown[0]), "unknown key")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "a list",
        dict: "a mapping",
    }
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def _check_name(path: str, key: str, value: str | None) -> None:
    """A server or pair name ends up in queue names and headers (docs/federation.md)."""
    if value is not None:
        problem = names.name_problem(value)
        if problem is not None:
            raise ConfigError(path, key, problem)


def _users(path: str, value: Any) -> tuple[User, ...]:
    if value is None:
        # No default guest/guest: a server started from an empty file would let anyone in.
        raise ConfigError(
            path, "users", "missing: list at least one user (name, password or password_hash)"
        )
    if not isinstance(value, list) or not value:
        raise ConfigError(path, "users", "expected a non-empty list of users")
    users: list[User] = []
    for index, item in enumerate(value):
        section = _Section(path, f"users[{index}]", item)
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
            password = _text_file(path, f"users[{index}].password_file", password_file)
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


def _vhost_limits(section: _Section) -> VHostLimits:
    defaults = VHostLimits()
    limits = VHostLimits(
        max_connections=section.count("max_connections", defaults.max_connections),
        max_queues=section.count("max_queues", defaults.max_queues),
    )
    section.check_unknown()
    return limits


def _user_limits(section: _Section) -> UserLimits:
    defaults = UserLimits()
    limits = UserLimits(
        max_connections=section.count("max_connections", defaults.max_connections),
        max_channels=section.count("max_channels", defaults.max_channels),
    )
    section.check_unknown()
    return limits


def _read_yaml(path: str, text: str) -> Any:
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
        if document is not None:
            _refuse_duplicate_keys(path, document, "")
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        raise ConfigError(
            path, where, f"not valid YAML: {getattr(error, 'problem', error)}"
        ) from None


def _override(path: str, data: Any, key: str, value: Any) -> Any:
    """``data`` with the dotted ``key`` set to ``value`` (sections made as needed)."""
    names = key.split(".")
    if not all(names):
        raise ConfigError(path, key, "an override needs a dotted key such as server.listen")
    top = {} if data is None else data
    section = top
    for index, name in enumerate(names[:-1]):
        if not isinstance(section, dict):
            break
        section = section.setdefault(name, {})
        if not isinstance(section, dict):
            where = ".".join(names[: index + 1])
            raise ConfigError(path, where, f"is not a section, so {key} cannot be set")
    if not isinstance(section, dict):
        raise ConfigError(path, key, "the file is not a mapping of sections")
    section[names[-1]] = value
    return top


def _refuse_duplicate_keys(path: str, node: yaml.Node, prefix: str) -> None:
    """PyYAML keeps the last of two equal keys; a file that says two things is refused."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            name = f"{prefix}.{key}" if prefix else str(key)
            if key is not None and key != "<<":
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(path, name, f"given twice (lines {seen[key]} and {line})")
                seen[key] = line
            _refuse_duplicate_keys(path, value_node, name)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(path, item, f"{prefix}[{index}]")


def _file_path(path: str, key: str, value: str) -> str:
    """A path from the config, relative to the config file's folder; it must be readable."""
    resolved = Path(path).resolve().parent / Path(value).expanduser()
    try:
        with open(resolved, "rb"):
            pass
    except OSError as error:
        raise ConfigError(path, key, f"cannot read {str(resolved)!r}: {error.strerror}") from None
    return str(resolved)


def _text_file(path: str, key: str, value: str) -> str:
    """The text of a file the config names (a secret, a password), trailing newline dropped."""
    if value.startswith("local/") and not (Path(path).resolve().parent / value).exists():
        raise ConfigError(
            path,
            key,
            f"{value} does not exist yet: `make run` (amqha pair --config-dir"
            f" {Path(path).parent}) makes this install's own on its first run",
        )
    resolved = _file_path(path, key, value)
    try:
        return Path(resolved).read_text(encoding="utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(path, key, f"{resolved!r} is not UTF-8 text") from None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (IPv4-mapped loopback too) or ``localhost``; any other name or
    address, ``0.0.0.0`` and ``::`` included, may be reached from elsewhere."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _weak_credentials(
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


def _metrics(path: str, metrics: _Section) -> tuple[tuple[str, int] | None, tuple[str, str] | None]:
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
        password = _text_file(path, "metrics.password_file", password_file)
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


def _management(path: str, section: _Section, tls: TlsListener | None) -> ManagementConfig | None:
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


def _secret(path: str, failover: _Section) -> bytes:
    secret = failover.get("secret", str, None)
    secret_file = failover.get("secret_file", str, None)
    if secret is not None and secret_file is not None:
        raise ConfigError(path, "failover.secret_file", "give either secret or secret_file")
    key = "failover.secret"
    if secret_file is not None:
        key = "failover.secret_file"
        secret = _text_file(path, key, secret_file)
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


def _tls_listener(path: str, section: _Section) -> TlsListener | None:
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
        files[name] = _file_path(path, f"tls.{name}", value)
    ca = section.get("ca", str, None)
    ca_path = None if ca is None else _file_path(path, "tls.ca", ca)
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


def _peer_tls(path: str, section: _Section, whom: str = "the peer") -> PeerTls | None:
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
        _file_path(path, section.key("ca"), ca),
        None if cert is None else _file_path(path, section.key("cert"), cert),
        None if key is None else _file_path(path, section.key("key"), key),
        server_name,
    )
    tls_check.client_context(peer_tls, path, section.prefix)
    return peer_tls


def _auth(path: str, section: _Section) -> AuthConfig:
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


FEDERATION_SCHEMES = ("amqp", "amqps")
FEDERATION_DELIVERY = ("confirm", "drop")
FEDERATION_NAME_RULE = "letters, digits, '_' and '-' only, 1 to 64 characters"


def _federation_name_problem(name: str) -> str | None:
    # The names module's rule (amqha.core.names.NAME), kept here as config/ does
    # not import the broker.
    ok = 1 <= len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    return None if ok else f"{name!r} is not a valid name: {FEDERATION_NAME_RULE}"


def _federation_url(path: str, key: str, value: Any, password: str | None) -> str:
    """One upstream URL: amqp(s)://USER[:PASSWORD]@HOST:PORT[/], the password from
    ``password_file`` when given (then the URL must not carry one)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(
            path, key, f"expected a URL such as 'amqp://user@host:5672/', got {value!r}"
        )
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as error:
        raise ConfigError(path, key, f"not a valid URL: {error}") from None
    if parts.scheme not in FEDERATION_SCHEMES:
        raise ConfigError(
            path, key, f"expected an amqp:// or amqps:// URL, got scheme {parts.scheme!r}"
        )
    if not parts.hostname:
        raise ConfigError(path, key, "the URL names no host")
    if not parts.username:
        raise ConfigError(path, key, "the URL names no user (amqp://USER@HOST:PORT/)")
    if parts.path not in ("", "/"):
        raise ConfigError(
            path,
            key,
            f"the URL names vhost {unquote(parts.path[1:])!r}: a link uses its exchange's "
            "vhost (federation.exchanges[].vhost) on both sides",
        )
    if parts.query or parts.fragment:
        raise ConfigError(path, key, "the URL takes no query or fragment")
    if password is not None:
        if parts.password is not None:
            raise ConfigError(path, key, "the URL has a password and password_file is given too")
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc = f"{parts.username}:{quote(password, safe='')}@{host}"
        if port is not None:
            netloc += f":{port}"
        value = urlunsplit((parts.scheme, netloc, "/", "", ""))
    elif parts.password is None:
        raise ConfigError(path, key, "the URL has no password: add one or give password_file")
    return value


def federation_upstream(
    path: str, key: str, name: Any, urls: Any, password: str | None = None, urls_key: str = ""
) -> FederationUpstream:
    """One upstream: its name (``key`` names it in errors) and its server URLs
    (``urls_key``, ``KEY.urls`` by default), checked as the ``federation.upstreams`` section
    and the console's ``federation add`` both need (docs/federation.md)."""
    problem = _federation_name_problem(name) if isinstance(name, str) else "not a name"
    if problem is not None:
        raise ConfigError(path, key, problem)
    urls_key = urls_key or f"{key}.urls"
    if not isinstance(urls, list | tuple):
        raise ConfigError(path, urls_key, f"expected a list of URLs, got {urls!r}")
    if not urls:
        raise ConfigError(path, urls_key, "missing: the upstream's server URLs (1 or 2)")
    checked: list[str] = []
    for index, url in enumerate(urls):
        full = _federation_url(path, f"{urls_key}[{index}]", url, password)
        if full in checked:
            raise ConfigError(path, f"{urls_key}[{index}]", "listed twice")
        checked.append(full)
    return FederationUpstream(name, tuple(checked))


def federated_exchange(
    path: str,
    prefix: str,
    item: Any,
    upstreams: Iterable[str],
    taken: Iterable[FederatedExchange] = (),
) -> FederatedExchange:
    """One link (a ``federation.exchanges`` item, or the console's ``federation add``):
    ``item`` a mapping read with its keys prefixed by ``prefix`` in errors; its upstream
    one of ``upstreams``; refused if ``taken`` links the same exchange, vhost and upstream."""
    entry = _Section(path, prefix, item)
    exchange = entry.get("exchange", str, None)
    if not exchange:
        raise ConfigError(path, entry.key("exchange"), "missing: the exchange to federate")
    if exchange.startswith("amq."):
        raise ConfigError(
            path, entry.key("exchange"), f"{exchange!r}: the amq. exchanges are not federated"
        )
    upstream_name = entry.get("upstream", str, None)
    if upstream_name is None:
        raise ConfigError(path, entry.key("upstream"), "missing: a name in federation.upstreams")
    known = list(upstreams)
    if upstream_name not in known:
        raise ConfigError(
            path,
            entry.key("upstream"),
            f"no upstream {upstream_name!r} in federation.upstreams "
            f"(known: {', '.join(known) or 'none'})",
        )
    vhost = entry.get("vhost", str, "/")
    if not vhost:
        raise ConfigError(path, entry.key("vhost"), "is empty")
    delivery = entry.get("delivery", str, "confirm")
    if delivery not in FEDERATION_DELIVERY:
        raise ConfigError(
            path, entry.key("delivery"), f"expected 'confirm' or 'drop', got {delivery!r}"
        )
    link = FederatedExchange(
        exchange,
        upstream_name,
        vhost,
        bindings=entry.get("bindings", bool, True),
        forward=entry.get("forward", bool, False),
        max_hops=entry.count("max_hops", 1, 1),
        delivery=delivery,
    )
    entry.check_unknown()
    if any((e.exchange, e.vhost, e.upstream) == (exchange, vhost, upstream_name) for e in taken):
        raise ConfigError(
            path,
            entry.key("exchange"),
            f"exchange {exchange!r} of vhost {vhost!r} is linked to {upstream_name!r} twice",
        )
    return link


def _federation(path: str, section: _Section) -> FederationConfig:
    """The ``federation`` section (docs/federation.md, "Config")."""
    defaults = FederationConfig()
    upstreams_section = section.section("upstreams")
    upstreams: list[FederationUpstream] = []
    for name in upstreams_section.data:
        key = upstreams_section.key(str(name))
        if not isinstance(name, str) or _federation_name_problem(name) is not None:
            federation_upstream(path, key, name, [])  # raises: the name is refused
        upstream = upstreams_section.section(name)
        password_file = upstream.get("password_file", str, None)
        password = None
        if password_file is not None:
            password = _text_file(path, f"{key}.password_file", password_file)
            if not password:
                raise ConfigError(path, f"{key}.password_file", "the file is empty")
        urls = upstream.get("urls", list, None)
        made = federation_upstream(path, key, name, urls or [], password)
        tls = _peer_tls(path, upstream.section("tls"), f"upstream {name!r}")
        upstreams.append(dataclasses.replace(made, tls=tls) if tls is not None else made)
        upstream.check_unknown()
    upstreams_section.check_unknown()
    items = section.get("exchanges", list, [])
    exchanges: list[FederatedExchange] = []
    for index, item in enumerate(items):
        exchanges.append(
            federated_exchange(
                path,
                f"federation.exchanges[{index}]",
                item,
                [u.name for u in upstreams],
                exchanges,
            )
        )
    reconcile = section.positive("reconcile", float, defaults.reconcile)
    probe = section.positive("probe", float, defaults.probe)
    prefetch = section.count("prefetch", defaults.prefetch, 1)
    if prefetch > 65535:
        raise ConfigError(path, "federation.prefetch", f"must be 65535 or less, got {prefetch}")
    section.check_unknown()
    return FederationConfig(tuple(upstreams), tuple(exchanges), reconcile, probe, prefetch)


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
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(path, "(file)", f"cannot read: {error.strerror}") from None
    data = _read_yaml(path, text)
    for key, value in (overrides or {}).items():
        data = _override(path, data, key, value)
    top = _Section(path, "", data)
    server = top.section("server")
    name = server.get("name", str, "amqha")
    _check_name(path, "server.name", name)
    listen_addresses = _listen_addresses(path, server.get("listen", (str, list), "127.0.0.1:5672"))
    host, port = listen_addresses[0]
    advertise = server.get("advertise", str, None)
    if advertise is not None:
        parse_host_port(path, "server.advertise", advertise)
    data_dir = server.get("data_dir", str, f"var/{name}")
    # `server.pair` is the older spelling of `failover.pair`.
    pair = server.get("pair", str, None)
    _check_name(path, "server.pair", pair)
    server.check_unknown()
    users = _users(path, top.data.get("users"))
    top.used.add("users")

    failover = top.section("failover")
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
    role = role or configured_role
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
    heartbeat = failover.positive("heartbeat", float, 0.2)
    timeout = failover.positive("timeout", float, 0.6)
    if timeout <= heartbeat:
        raise ConfigError(
            path,
            "failover.timeout",
            f"must be greater than failover.heartbeat ({heartbeat}), got {timeout}",
        )
    peer_user = failover.get("peer_user", str, "peering")
    secret = b""
    peer_tls = None
    if peer is not None:
        user = next((u for u in users if u.name == peer_user), None)
        if user is None:
            raise ConfigError(path, "failover.peer_user", f"no user {peer_user!r} in users")
        if "peering" not in user.tags:
            raise ConfigError(
                path, "failover.peer_user", f"user {peer_user!r} needs the tag 'peering'"
            )
        if user.password is None:
            raise ConfigError(
                path,
                "failover.peer_user",
                f"user {peer_user!r} has only a password_hash: this server logs in to its "
                "peer as that user, so it needs the password itself",
            )
        secret = _secret(path, failover)
        peer_tls = _peer_tls(path, failover.section("peer_tls"))
    else:
        for key in ("secret", "secret_file", "peer_tls"):
            failover.used.add(key)
    peer_name = failover.get("peer_name", str, None)
    _check_name(path, "failover.peer_name", peer_name)
    pair_name = failover.get("pair", str, None)
    _check_name(path, "failover.pair", pair_name)
    if pair_name is not None and pair is not None and pair_name != pair:
        raise ConfigError(
            path,
            "failover.pair",
            f"{pair_name!r}, but server.pair (its older spelling) says {pair!r}: give one",
        )
    pair = pair_name or pair
    takeover_unsynced = failover.get("takeover_unsynced", bool, False)
    if pair is None and peer_name is not None:
        pair = names.default_pair_name(name, peer_name)
    peer_listen = failover.get("peer_listen", list, [])
    for index, address in enumerate(peer_listen):
        parse_host_port(path, f"failover.peer_listen[{index}]", address)
    if peer is not None and not peer_listen:
        peer_listen = [peer]
    witness_list = failover.get("witness", list, [])
    witness = tuple(
        parse_host_port(path, f"failover.witness[{index}]", address)
        for index, address in enumerate(witness_list)
    )
    if witness and peer is None:
        raise ConfigError(path, "failover.witness", "a witness serves a pair: set failover.peer")
    if len(set(witness)) != len(witness):
        raise ConfigError(path, "failover.witness", "a witness is named twice")
    link_heartbeat = failover.get("link_heartbeat", int, 5)
    if not 1 <= link_heartbeat <= 600:
        raise ConfigError(
            path, "failover.link_heartbeat", f"must be between 1 and 600 s, got {link_heartbeat}"
        )
    failover.check_unknown()

    tls = _tls_listener(path, top.section("tls"))
    auth = _auth(path, top.section("auth"))

    events = top.section("events")
    events_path = events.get("path", str, None)
    events.check_unknown()

    limits_section = top.section("limits")
    defaults = Limits()
    frame_max = limits_section.get("frame_max", int, defaults.frame_max)
    if not 4096 <= frame_max <= 1024 * 1024 * 16:
        raise ConfigError(
            path, "limits.frame_max", f"must be between 4096 and 16777216, got {frame_max}"
        )
    channel_max = limits_section.get("channel_max", int, defaults.channel_max)
    if not 1 <= channel_max <= 65535:
        raise ConfigError(
            path, "limits.channel_max", f"must be between 1 and 65535, got {channel_max}"
        )
    heartbeat_s = limits_section.get("heartbeat", int, defaults.heartbeat)
    if not 0 <= heartbeat_s <= 65535:
        raise ConfigError(
            path, "limits.heartbeat", f"must be between 0 and 65535, got {heartbeat_s}"
        )
    limits = Limits(
        frame_max=frame_max,
        channel_max=channel_max,
        heartbeat=heartbeat_s,
        max_message_size=limits_section.size("max_message_size", defaults.max_message_size),
        memory_high_watermark=limits_section.size(
            "memory_high_watermark", defaults.memory_high_watermark
        ),
        max_connections=limits_section.count("max_connections", defaults.max_connections, 1),
        max_consumers_per_channel=limits_section.count(
            "max_consumers_per_channel", defaults.max_consumers_per_channel
        ),
        max_header_size=limits_section.size("max_header_size", defaults.max_header_size),
        max_arguments_size=limits_section.size("max_arguments_size", defaults.max_arguments_size),
        output_buffer=limits_section.size("output_buffer", defaults.output_buffer),
        vhost=_vhost_limits(limits_section.section("vhost")),
        user=_user_limits(limits_section.section("user")),
    )
    if limits.output_buffer < 4096:
        raise ConfigError(
            path, "limits.output_buffer", f"must be 4096 bytes or more, got {limits.output_buffer}"
        )
    limits_section.check_unknown()
    metrics = top.section("metrics")
    metrics_listen, metrics_auth = _metrics(path, metrics)
    metrics.check_unknown()
    management = _management(path, top.section("management"), tls)
    store_section = top.section("store")
    store = StoreConfig(
        enabled=store_section.get("enabled", bool, True),
        path=store_section.get("path", str, None),
        max_bytes=(
            store_section.size("max_bytes", 0) if store_section.data.get("max_bytes") else None
        ),
    )
    if store.max_bytes is not None and store.max_bytes < 1024 * 1024:
        raise ConfigError(
            path, "store.max_bytes", f"must be 1MiB (1048576 bytes) or more, got {store.max_bytes}"
        )
    store_section.check_unknown()
    replication_section = top.section("replication")
    replication = ReplicationConfig(
        enabled=replication_section.get("enabled", bool, True),
        default=replication_section.get("default", bool, True),
    )
    replication_section.check_unknown()
    federation = _federation(path, top.section("federation"))
    top.check_unknown()
    secret_key = "failover.secret_file" if failover.data.get("secret_file") else "failover.secret"
    weak = _weak_credentials(users, secret, secret_key, auth.loopback_users)
    listeners = [
        *listen_addresses,
        *([] if tls is None else [(tls.host, tls.port)]),
        *([] if metrics_listen is None else [metrics_listen]),
        *([] if management is None else [(management.host, management.port)]),
    ]
    exposed = [format_host_port(*address) for address in listeners if not is_loopback(address[0])]
    if weak and exposed:
        key, problem = weak[0]
        raise ConfigError(
            path,
            key,
            f"{problem}, and this server listens on {exposed[0]}, which is not a loopback "
            "address: give it one of your own (docs/security.md, 'Shipped credentials')",
        )
    return ServerConfig(
        name=name,
        host=host,
        port=port,
        advertise=advertise,
        data_dir=data_dir,
        events_path=events_path,
        pair=pair,
        users=users,
        failover=FailoverConfig(
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
        ),
        limits=limits,
        source=path,
        listen_addresses=listen_addresses,
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
