"""The settings the two servers of a pair must share, and their digests (docs/operations.md,
"Configs that must match").

Owns: ``shared_settings``: each setting a failover must not change, by key, as text a
person can read, secrets never in it (a password, or its hash, is a keyed digest: the
pair's secret is needed to test a guess against it); ``digests``: the same keys, each
with a short digest of its text (what each server sends its peer in its state messages);
``drifted``: the keys whose digests differ, or that one side has and the other not.

Keys: ``users.NAME`` (tags, vhosts, the password's digest), ``auth`` (the loopback users),
``limits`` (every limit, per vhost and per user too), ``replication``,
``federation.upstreams.NAME`` (its URLs without their passwords), ``federation.exchanges``,
``federation.timings``. Nothing that is the server's own: its name, addresses, data
directory, certificates, event log.

Must not know: sockets, the pair, the loop. Pure: a config in, values out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
from typing import Any

from .schema import ServerConfig

# A digest is this many hex digits of SHA-256 (collisions between two configs are not a
# threat here: the digests only say that two servers differ).
DIGEST_HEX = 16
# At most this many keys are sent and compared (a config with more users sends its
# users' digests folded into buckets: ``users.#N``).
MAX_KEYS = 500
_URL_PASSWORD = re.compile(r"(//[^:/@]+:)[^@]*@")


def _secret_digest(key: bytes, value: str) -> str:
    return "hmac:" + hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:DIGEST_HEX]


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def shared_settings(config: ServerConfig) -> dict[str, str]:
    """Key -> the setting's value as canonical text (no secret in it)."""
    key = hashlib.sha256(b"amqha config digest\x00" + config.failover.secret).digest()
    settings: dict[str, Any] = {}
    for user in config.users:
        password = (
            f"hash {user.password_hash}"
            if user.password_hash is not None
            else f"plain {user.password}"
        )
        settings[f"users.{user.name}"] = {
            "tags": sorted(user.tags),
            "vhosts": sorted(user.vhosts),
            "password": _secret_digest(key, password),
        }
    settings["auth"] = {"loopback_users": sorted(config.auth.loopback_users)}
    settings["limits"] = dataclasses.asdict(config.limits)
    settings["replication"] = dataclasses.asdict(config.replication)
    federation = config.federation
    for upstream in federation.upstreams:
        settings[f"federation.upstreams.{upstream.name}"] = {
            "urls": sorted(_URL_PASSWORD.sub(r"\1***@", url) for url in upstream.urls),
        }
    settings["federation.exchanges"] = sorted(
        _text(dataclasses.asdict(each)) for each in federation.exchanges
    )
    settings["federation.timings"] = {
        "reconcile": federation.reconcile,
        "probe": federation.probe,
        "prefetch": federation.prefetch,
    }
    return {name: _text(value) for name, value in sorted(settings.items())}


def digests(config: ServerConfig) -> dict[str, str]:
    """Key -> a short digest of the setting's text; at most MAX_KEYS keys."""
    found = {
        name: hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]
        for name, text in shared_settings(config).items()
    }
    if len(found) <= MAX_KEYS:
        return found
    # Many users: folded by name into buckets, so the message stays bounded.
    folded: dict[str, list[str]] = {}
    for name, digest in found.items():
        if name.startswith("users."):
            bucket = f"users.#{int(hashlib.sha256(name.encode()).hexdigest(), 16) % 100}"
            folded.setdefault(bucket, []).append(name + "=" + digest)
        else:
            folded[name] = [digest]
    return {
        name: hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:DIGEST_HEX]
        for name, parts in folded.items()
    }


def drifted(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The keys set differently on the two sides, or set on one only, in order."""
    return sorted(
        name for name in ours.keys() | theirs.keys() if ours.get(name) != theirs.get(name)
    )
