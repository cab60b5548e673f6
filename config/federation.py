"""The ``federation`` section of a server's configuration (docs/federation.md, "Config").

Owns: the checks of an upstream (its name, its server URLs, a password from a file, its
TLS settings) and of a federated exchange (its upstream, vhost, delivery, each link once),
which the console's ``federation add`` shares (docs/federation.md, "At run time"). Each
problem is a ``ConfigError`` naming the file, the key and the problem.

Must not know: the links themselves (``amqha/federation/``), the broker, sockets, the
event loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from .reading import Section, text_file
from .schema import ConfigError, FederatedExchange, FederationConfig, FederationUpstream
from .sections import read_peer_tls

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
    entry = Section(path, prefix, item)
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


def read_federation(path: str, section: Section) -> FederationConfig:
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
            password = text_file(path, f"{key}.password_file", password_file)
            if not password:
                raise ConfigError(path, f"{key}.password_file", "the file is empty")
        urls = upstream.get("urls", list, None)
        made = federation_upstream(path, key, name, urls or [], password)
        tls = read_peer_tls(path, upstream.section("tls"), f"upstream {name!r}")
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
