"""The federations added at run time (the console's ``federation add``), kept on disk.

Owns: ``data_dir/federations.json``: the links added and the upstreams they named, and
the buffer queues still to delete upstream (a link removed while its upstream was
unreachable); reading it back at start with the config loader's own checks, and writing
it whole (a temporary file, synced, renamed over the old one, the folder synced)
(docs/federation.md, "At run time").

Must not know: links, sockets, the console.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from config.federation import federated_exchange, federation_upstream
from config.schema import ConfigError, FederatedExchange, FederationUpstream

from ..core import names

FILE = "federations.json"
VERSION = 1


@dataclass(frozen=True)
class PendingDeletion:
    """A buffer queue to delete upstream once the upstream answers."""

    exchange: str
    upstream: str
    vhost: str
    queue: str
    urls: tuple[str, ...] = field(repr=False)

    @property
    def spec(self) -> FederatedExchange:
        return FederatedExchange(self.exchange, self.upstream, self.vhost)


@dataclass
class Runtime:
    """What ``federations.json`` holds."""

    upstreams: dict[str, FederationUpstream] = field(default_factory=dict)
    exchanges: list[FederatedExchange] = field(default_factory=list)
    pending: list[PendingDeletion] = field(default_factory=list)
    # The config file's links that have run here, with their buffer queues: one gone from
    # the config at a restart has its buffer queue deleted upstream (a pending deletion).
    known: list[PendingDeletion] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "upstreams": {name: {"urls": list(u.urls)} for name, u in self.upstreams.items()},
            "exchanges": [asdict(e) for e in self.exchanges],
            "pending_deletions": [{**asdict(p), "urls": list(p.urls)} for p in self.pending],
            "config_links": [{**asdict(p), "urls": list(p.urls)} for p in self.known],
        }


def path_of(data_dir: str) -> Path:
    return Path(data_dir) / FILE


def load(data_dir: str, config_upstreams: list[str]) -> Runtime:
    """The file's federations (none if there is no file); ConfigError naming the file,
    the key and the problem if it cannot be read. Upstreams are named from the config's
    (``config_upstreams``) or the file's own."""
    path = path_of(data_dir)
    where = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Runtime()
    except OSError as error:
        raise ConfigError(where, "(file)", f"cannot read: {error}") from None
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ConfigError(where, "(file)", f"not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ConfigError(where, "version", f"expected {VERSION}")
    runtime = Runtime()
    upstreams = data.get("upstreams") or {}
    if not isinstance(upstreams, dict):
        raise ConfigError(where, "upstreams", "expected a mapping")
    for name, item in upstreams.items():
        urls = item.get("urls") if isinstance(item, dict) else None
        runtime.upstreams[name] = federation_upstream(where, f"upstreams.{name}", name, urls)
    known = [*config_upstreams, *runtime.upstreams]
    items = data.get("exchanges") or []
    if not isinstance(items, list):
        raise ConfigError(where, "exchanges", "expected a list")
    for index, item in enumerate(items):
        runtime.exchanges.append(
            federated_exchange(where, f"exchanges[{index}]", item, known, runtime.exchanges)
        )
    runtime.pending = _queue_records(where, data, "pending_deletions")
    runtime.known = _queue_records(where, data, "config_links")
    return runtime


def _queue_records(where: str, data: dict[str, Any], name: str) -> list[PendingDeletion]:
    """A list of (exchange, upstream, vhost, buffer queue, URLs) records of the file."""
    found: list[PendingDeletion] = []
    items = data.get(name) or []
    if not isinstance(items, list):
        raise ConfigError(where, name, "expected a list")
    for index, item in enumerate(items):
        key = f"{name}[{index}]"
        if not isinstance(item, dict):
            raise ConfigError(where, key, "expected a mapping")
        queue = item.get("queue")
        if not isinstance(queue, str) or not queue.startswith(names.BUFFER_PREFIX):
            raise ConfigError(where, f"{key}.queue", f"not a buffer queue name: {queue!r}")
        upstream = federation_upstream(
            where, f"{key}.upstream", item.get("upstream"), item.get("urls")
        )
        exchange, vhost = item.get("exchange"), item.get("vhost")
        if not isinstance(exchange, str) or not isinstance(vhost, str) or not vhost:
            raise ConfigError(where, key, "expected an exchange and a vhost")
        found.append(PendingDeletion(exchange, upstream.name, vhost, queue, upstream.urls))
    return found


def save(data_dir: str, runtime: Runtime) -> None:
    """Write the file whole: a reader (or a restart) finds the old one or the new one.
    Readable by this server's user only: the URLs hold the upstream's password."""
    path = path_of(data_dir)
    temporary = path.with_name(f"{FILE}.tmp")
    body = json.dumps(runtime.as_json(), indent=2).encode()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(body)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
