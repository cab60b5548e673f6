"""The names a federation depends on, and the path a message or binding carries (pure).

Owns: what a server or pair name may be, the global name and federation id of a server,
the proof a link gives of its place's name (a claim key per upstream, and the token an
upstream keeps of it), the names of a link's buffer queue (upstream) and hidden forward
queue (downstream), and the ``x-amqha-path`` rule that stops loops and enforces
``max_hops`` (docs/federation.md, "Names", "Loops and hops"; docs/security.md,
"Federation names").

Must not know: sockets, the broker, clocks.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAME_RULE = "letters, digits, '_' and '-' only, 1 to 64 characters"
PATH_HEADER = "x-amqha-path"
BUFFER_PREFIX = "federation: "
# Queue names use only what AMQP 0-9-1's queue-name domain allows, as clients check it
# (pamqp: letters, digits and "-_.:@#,/+ "): no ">", so "to" rather than an arrow.
ID_LABEL = b"amqha federation id"


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a server or pair name, or None if it can."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        return f"{name!r} is not a valid name: {NAME_RULE}"
    return None


def global_name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a global name: a server or pair name, or a pair's default
    name (its two servers' names joined by '+'); None if it can."""
    parts = value.split("+")
    if len(parts) == 2 and all(name_problem(part) is None for part in parts):
        return None
    problem = name_problem(value)
    return None if problem is None else f"{problem} (or two such names joined by '+')"


def default_pair_name(server: str, peer: str) -> str:
    """The pair's name when the config gives none: both servers compute the same one."""
    return "+".join(sorted((server, peer)))


CLAIM_LABEL = b"amqha federation claim\x00"


def federation_id(secret: bytes) -> str:
    """A pair's federation id: the same on both of its servers, unlike anyone else's. It is
    the place's secret for its names (``claim_key``): never sent, never shown."""
    return hmac.new(secret, ID_LABEL, hashlib.sha256).hexdigest()[:32]


def claim_key(federation_id: str, upstream: str) -> str:
    """What a link sends in its hello to upstream ``upstream`` (by the global name that
    upstream gives at Connection.Start): proof that it speaks for its place. One per
    upstream, so an upstream cannot reuse what it was sent to claim the name elsewhere."""
    return hmac.new(federation_id.encode(), CLAIM_LABEL + upstream.encode(), "sha256").hexdigest()


def claim_token(key: str) -> str:
    """What an upstream keeps of a claim key and compares: a hash (showing it proves
    nothing; only the key's holder can claim the name)."""
    return hashlib.sha256(b"amqha claim token\x00" + key.encode()).hexdigest()


def parse_buffer_queue(name: str) -> tuple[str, str, str] | None:
    """(exchange, upstream, downstream) of a buffer queue's name, or None if ``name`` is
    not one (exchange names have no spaces, nor do global names)."""
    if not name.startswith(BUFFER_PREFIX):
        return None
    parts = name[len(BUFFER_PREFIX) :].split(" ")
    if len(parts) != 4 or parts[2] != "to" or not all(parts):
        return None
    return parts[0], parts[1], parts[3]


def generated_queue_name(global_name: str, token: str) -> str:
    """A server-named queue: the global name makes it unique across a federation."""
    return f"amq.gen-{global_name}-{token}"


def buffer_queue_name(exchange: str, upstream: str, downstream: str) -> str:
    """The upstream queue a link consumes: derived from the two sides and the exchange, so a
    restarted link, or the downstream pair's other server, finds the same one. Only
    characters every AMQP client library accepts in a queue name (pamqp refuses ``>``)."""
    return f"{BUFFER_PREFIX}{exchange} {upstream} to {downstream}"


def forward_queue_name(exchange: str, upstream: str) -> str:
    """The hidden downstream queue of the messages a link forwards upstream."""
    return f"{BUFFER_PREFIX}{exchange} to {upstream}"


def path_of(headers: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The global names a message or binding crossed, in order (empty if none)."""
    if not headers:
        return ()
    value = headers.get(PATH_HEADER)
    if isinstance(value, (list, tuple)):
        return tuple(str(item.decode() if isinstance(item, bytes) else item) for item in value)
    return ()


def crossing(path: Iterable[str], into: str, max_hops: int) -> str | None:
    """Why a message or binding may not arrive at ``into``, or None if it may.

    ``path`` is every global name it has left, the one it is leaving now included (a
    message published on U and taken down to D arrives with ``[U]``: one hop). ``loop``:
    it left ``into`` before; ``max_hops``: it has crossed more links than allowed."""
    path = tuple(path)
    if into in path:
        return "loop"
    if len(path) > max_hops:
        return "max_hops"
    return None


def extended(path: Iterable[str], name: str) -> list[str]:
    """The path once it leaves ``name``."""
    return [*path, name]
