"""Where the loopback pair listens: ``amqha pair --ports`` and ports that are taken.

Owns: finding every listener of a server's config (any ``listen`` key, at any depth:
``server.listen``, ``tls.listen``, ``metrics.listen``, ``management.listen``...), the
plan that moves them (the two AMQP ports given on the command line, the others derived
from them; or, with no ports given, each taken one replaced by a free one), and the
overrides that carry the plan to ``amqha start --set`` (each server's listeners and the
address its peer reaches it at), and the error of a metrics listener whose port is taken
(here, so that ``amqha start`` catches it without importing the endpoint). See
docs/operations.md, "Running the pair".

Must not know: the broker, what a listener serves. It binds sockets only to ask whether
an address is free.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

ROLES = ("primary", "backup")
# Where `amqha pair` writes the servers' addresses for `amqha console`.
PAIR_FILE = "var/pair.json"
MAIN = "server.listen"  # the AMQP listener: the one --ports names
PAGE = "management.listen"  # the web page's and the management API's: --page-ports
# Where a server names its peer's listeners: they follow the peer's moves.
PEER_KEYS = (("failover", ("peer", "peer_listen")), ("management", ("peer",)))


class MetricsListenError(Exception):
    """``metrics.listen`` cannot be listened on (a port taken: another server's metrics)."""

    def __init__(self, address: str, error: OSError) -> None:
        # asyncio's bind error repeats the address in its text: the errno's own words.
        reason = os.strerror(error.errno) if error.errno else str(error)
        super().__init__(f"cannot listen on {address}: {reason}")
        self.address = address


@dataclass(frozen=True)
class Listener:
    """One ``listen`` address of one server's config: ``key`` is the dotted key of the
    value it sits in, ``index`` its place when that value is a list."""

    role: str
    key: str
    index: int | None
    host: str
    port: int

    @property
    def address(self) -> str:
        return join(self.host, self.port)

    @property
    def name(self) -> str:
        return self.key if self.index is None else f"{self.key}[{self.index}]"


@dataclass
class Plan:
    """What to change: per role, dotted key -> new value; and a line per moved port."""

    overrides: dict[str, dict[str, Any]] = field(default_factory=lambda: {r: {} for r in ROLES})
    notes: list[str] = field(default_factory=list)
    main: dict[str, str] = field(default_factory=dict)  # role -> its AMQP address


def split(address: str) -> tuple[str, int] | None:
    """'host:port' or '[v6]:port' as (host, port); None if it is not one."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listeners(role: str, data: Any, prefix: str = "") -> Iterator[Listener]:
    """Every ``listen`` address in a config's data, the AMQP one (server.listen) first.
    ``failover`` names the peer's addresses, not this server's: it is not searched."""
    if not isinstance(data, dict):
        return
    keys = sorted(data, key=lambda k: f"{prefix}{k}" != MAIN)
    for key in keys:
        value, dotted = data[key], f"{prefix}{key}"
        if dotted == "failover":
            continue
        if key == "listen":
            values = [value] if isinstance(value, str) else value
            if isinstance(values, list):
                for index, item in enumerate(values):
                    parsed = split(item) if isinstance(item, str) else None
                    if parsed is not None:
                        where = None if isinstance(value, str) else index
                        yield Listener(role, dotted, where, parsed[0], parsed[1])
        elif isinstance(value, dict):
            yield from listeners(role, value, f"{dotted}.")


def bindable(host: str, port: int) -> bool:
    """Whether ``host:port`` is free: False only when something holds it (in use); an
    address that cannot be bound for another reason is left to the server to report."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind((host, port))
        except OSError as error:
            return error.errno != errno.EADDRINUSE
    return True


def free_port(host: str) -> int:
    """A port the kernel has free on ``host`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def plan(
    configs: dict[str, Any],
    ports: tuple[int, int] | None = None,
    free: Callable[[str, int], bool] = bindable,
    pick: Callable[[str], int] = free_port,
    chosen: dict[str, tuple[int, int]] | None = None,
) -> Plan:
    """Move the pair's listeners: with ``ports``, the primary's and the backup's AMQP
    ports to them and every other listener by the same offset (or to a free port, when
    that one is out of range or taken); without, only the listeners whose port is
    taken, each to a free port. ``chosen``: a listen key's two ports as given (the web
    page's, ``management.listen``), whatever the offset. No two listeners of the pair are
    left on one port."""
    chosen = chosen or {}
    result = Plan()
    found = {role: list(listeners(role, configs.get(role))) for role in ROLES}
    moves: dict[str, dict[int, int]] = {role: {} for role in ROLES}  # role: old -> new port
    used: set[int] = set(ports or ()) | {port for pair in chosen.values() for port in pair}
    for number, role in enumerate(ROLES):
        mains = [item for item in found[role] if item.key == MAIN]
        shift = 0 if ports is None or not mains else ports[number] - mains[0].port
        for item in found[role]:
            if item.port == 0:
                continue
            if ports is not None and item is mains[0]:
                port = ports[number]  # as given: a server that cannot take it says why
            elif item.key in chosen and item.index is None:
                port = chosen[item.key][number]  # as given, as the AMQP ports are
            else:
                port = item.port + shift
                if not 0 < port < 65536 or port in used or not free(item.host, port):
                    port = _free(item.host, used, pick)
                    taken = (
                        f"{item.address} ({item.role}'s {item.name}) is taken"
                        if shift == 0
                        else f"{item.role}'s {item.name} cannot follow --ports to"
                        f" {item.port + shift}"
                    )
                    result.notes.append(f"{taken}: using {join(item.host, port)} instead")
            used.add(port)
            if port != item.port:
                moves[role][item.port] = port
                _set(result.overrides[role], configs[role], item, port)
        if mains:
            main = mains[0]
            host = "127.0.0.1" if main.host in ("0.0.0.0", "") else main.host
            host = "::1" if host == "::" else host
            result.main[role] = join(host, moves[role].get(main.port, main.port))
    # Each server reaches its peer at the peer's (moved) addresses.
    for role, peer in zip(ROLES, reversed(ROLES), strict=True):
        if not moves[peer]:
            continue
        for section_name, keys in PEER_KEYS:
            section = (configs.get(role) or {}).get(section_name)
            if not isinstance(section, dict):
                continue
            for key in keys:
                value = section.get(key)
                moved = _moved(value, moves[peer])
                if moved != value:
                    result.overrides[role][f"{section_name}.{key}"] = moved
    return result


def _free(host: str, used: set[int], pick: Callable[[str], int]) -> int:
    for _ in range(100):
        port = pick(host)
        if port not in used:
            return port
    raise RuntimeError(f"no free port on {host} after 100 tries")


def _set(overrides: dict[str, Any], data: dict[str, Any], item: Listener, port: int) -> None:
    if item.index is None:
        overrides[item.key] = join(item.host, port)
        return
    if item.key not in overrides:
        section: Any = data
        for name in item.key.split("."):
            section = section[name]
        overrides[item.key] = list(section)
    overrides[item.key][item.index] = join(item.host, port)


def _moved(value: Any, moves: dict[int, int]) -> Any:
    if isinstance(value, list):
        return [_moved(item, moves) for item in value]
    parsed = split(value) if isinstance(value, str) else None
    if parsed is None or parsed[1] not in moves:
        return value
    return join(parsed[0], moves[parsed[1]])


def parse_ports(text: str) -> tuple[int, int]:
    """``--ports PRIMARY,BACKUP``: two different ports from 1 to 65535."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"expected PRIMARY,BACKUP as two port numbers, got {text!r}")
    first, second = int(parts[0]), int(parts[1])
    for port in (first, second):
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range 1..65535")
    if first == second:
        raise ValueError(f"the two servers need two ports, got {first} twice")
    return first, second


def set_arguments(overrides: dict[str, Any]) -> list[str]:
    """``amqha start`` options carrying ``overrides``: ``--set KEY=JSON`` each (JSON is
    YAML, and keeps '[::1]:5672' a string)."""
    return [
        part for key, value in overrides.items() for part in ("--set", f"{key}={json.dumps(value)}")
    ]
