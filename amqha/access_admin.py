"""Making and deleting users, vhosts and permissions at run time, whoever asks (the
management API's routes, the console): the rules and the way of each change.

Owns: each change an administrator asks for, checked (the config files' users and the
vhosts they name are read-only, the pair's own login and the ``peering`` and ``federation``
tags are never made or given, names and hashes as RabbitMQ takes them), applied and logged
on the broker (``record_access``: a ``core.access`` change, replicated), the connections a
deletion closes, and ``safe``: the wait until every change logged is on the store and on
an in-sync PASSIVE, after which an answer may say it is done (docs/operations.md, "Users,
vhosts and permissions at run time"; docs/security.md).

Must not know: HTTP, the console's wire, who asks (its caller checks the login's tags and
that this server serves).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from config.passwords import BadHash, hash_password, parse_hash
from config.vhostnames import vhost_name_problem

from .core.access import INTERNAL_TAG
from .core.changes import (
    PermissionDeleted,
    PermissionSet,
    UserDeleted,
    UserSet,
    VhostDeleted,
    VhostSet,
)

log = logging.getLogger("amqha.access")

# Tags never given at run time: the pair's own login's, and the one that lets a login
# read federation buffers of other pairs (docs/federation.md).
UNGRANTED_TAGS = frozenset({INTERNAL_TAG, "federation"})
# Each hash format and RabbitMQ's name for its algorithm (``hashing_algorithm``: what an
# export says and a password_hash may come with; scrypt is amqha's own).
ALGORITHMS = {
    "rabbitmq-sha256": "rabbit_password_hashing_sha256",
    "rabbitmq-sha512": "rabbit_password_hashing_sha512",
    "scrypt": "amqha_scrypt",
}
FULL = ".*"  # the only rights amqha gives: all of them, on a vhost
SAFE_WAIT = 30.0  # seconds a change's answer waits for the change to be safe


class Refused(Exception):
    """A change refused: ``status`` as HTTP says it (400, 403, 404, 503), ``word`` as
    RabbitMQ's API names it, the text an operator reads."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.word = _WORDS.get(status, "bad_request")


_WORDS = {403: "access_refused", 404: "not_found", 503: "not_safe"}


def config_vhosts(config: Any) -> set[str]:
    return {v for u in config.users for v in u.vhosts}


async def safe(broker: Any) -> None:
    """Return once every change this server logged so far is safe: on its store and on
    an in-sync PASSIVE. A change's answer is a promise, as a publisher confirm is: what
    it said was made is there after a failover. Refused (503) if that cannot be said
    within ``SAFE_WAIT`` seconds (the store failing, this server no longer leading)."""
    lsn = broker.last_lsn()
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    broker.when_safe(lsn, lambda ok: done.done() or done.set_result(ok))
    try:
        ok = await asyncio.wait_for(done, SAFE_WAIT)
    except TimeoutError:
        ok = False
    if not ok:
        raise Refused(
            503,
            "the change was made here but is not known to be on disk and on the PASSIVE "
            "(the store failing, or this server no longer leading): check before relying on it",
        )


# -- users --------------------------------------------------------------------------------


def known_users(broker: Any) -> list[Any]:
    """Every user a login may be: the config files' (with the vhosts given at run time
    too), then the run-time ones, each as the login sees it."""
    configured = [u.name for u in broker.config.users]
    known = set(configured)
    names = configured + [n for n in broker.access.users if n not in known]
    found = (broker.auth.lookup(name)[0] for name in names)
    return [user for user in found if user is not None]


async def put_user(broker: Any, name: str, fields: dict[str, Any]) -> bool:
    """Make or change run-time user ``name`` from RabbitMQ's fields (``password`` or
    ``password_hash`` with its ``hashing_algorithm``, ``tags``); whether it existed."""
    _not_configured(broker, name)
    tags = _tags(fields.get("tags", ""))
    ungranted(name, tags)
    password_hash = await _password_hash(name, fields)
    existed = name in broker.access.users
    broker.record_access(UserSet(name, password_hash, tuple(sorted(tags))))
    await safe(broker)
    log.info("user '%s' %s", name, "changed" if existed else "made")
    return existed


async def delete_user(broker: Any, name: str) -> int:
    """Delete run-time user ``name``; the connections closed."""
    _not_configured(broker, name)
    if name not in broker.access.users:
        raise Refused(404, f"no user '{name}' made at run time")
    broker.record_access(UserDeleted(name))
    await safe(broker)
    return _close(broker, lambda c: c.user.name == name, f"user '{name}' was deleted")


# -- vhosts -------------------------------------------------------------------------------


async def put_vhost(broker: Any, name: str) -> bool:
    """Make vhost ``name``; whether it existed."""
    problem = vhost_name_problem(name)
    if problem is not None:
        raise Refused(400, f"vhost '{name}': {problem}")
    existed = name in broker.vhosts
    if name not in config_vhosts(broker.config) and name not in broker.access.vhosts:
        broker.record_access(VhostSet(name))
        await safe(broker)
    return existed


async def delete_vhost(broker: Any, name: str) -> int:
    """Delete run-time vhost ``name`` with its queues and exchanges; the connections
    closed."""
    if name in config_vhosts(broker.config):
        raise Refused(
            400,
            f"vhost '{name}' is named by users[].vhosts of the config files: it is removed "
            "there, not at run time",
        )
    vhost = broker.vhosts.get(name)
    if name not in broker.access.vhosts or vhost is None:
        raise Refused(404, f"no vhost '{name}' made at run time")
    closed = _close(broker, lambda c: c.vhost is vhost, f"vhost '{name}' was deleted")
    for queue in list(vhost.queues.values()):
        owner = queue.exclusive_owner
        vhost.remove_queue(queue)
        if owner is not None:
            owner.exclusive_queues.pop(queue.name, None)
    for exchange in list(vhost.exchanges.values()):
        if exchange.name and not exchange.control and not exchange.name.startswith("amq."):
            vhost.remove_exchange(exchange)
    broker.record_access(VhostDeleted(name))
    await safe(broker)
    return closed


# -- permissions --------------------------------------------------------------------------


async def put_permission(broker: Any, vhost: str, name: str, rights: dict[str, Any]) -> bool:
    """Give user ``name`` vhost ``vhost`` (full rights); whether it had it."""
    user = _user_to_grant(broker, name)
    for key in ("configure", "write", "read"):
        if rights.get(key, FULL) != FULL:
            raise Refused(
                400,
                f"{key} '{rights.get(key)}': amqha gives a user full rights on its vhosts, "
                f"no narrower (configure, write and read '{FULL}')",
            )
    if vhost not in broker.vhosts:
        raise Refused(400, f"vhost '{vhost}' does not exist")
    if vhost in user.vhosts:
        return True
    broker.record_access(PermissionSet(vhost, name))
    await safe(broker)
    return False


async def delete_permission(broker: Any, vhost: str, name: str) -> int:
    """Take vhost ``vhost`` from user ``name``; the connections closed."""
    _user_to_grant(broker, name)
    if (vhost, name) not in broker.access.permissions:
        configured = next((u for u in broker.config.users if u.name == name), None)
        if configured is not None and vhost in configured.vhosts:
            raise Refused(
                400,
                f"user '{name}' has vhost '{vhost}' in the config files (users[].vhosts): "
                "it is removed there, not at run time",
            )
        raise Refused(404, f"user '{name}' was not given vhost '{vhost}' at run time")
    broker.record_access(PermissionDeleted(vhost, name))
    await safe(broker)
    return _close(
        broker,
        lambda c: c.user.name == name and getattr(c.vhost, "name", None) == vhost,
        f"user '{name}' may no longer use vhost '{vhost}'",
    )


# -- the rules ----------------------------------------------------------------------------


def is_internal(broker: Any, name: str) -> bool:
    """The pair's own login: ``failover.peer_user`` or a config user tagged ``peering``."""
    user = next((u for u in broker.config.users if u.name == name), None)
    return name == broker.config.failover.peer_user or (
        user is not None and INTERNAL_TAG in user.tags
    )


def _not_configured(broker: Any, name: str) -> None:
    if is_internal(broker, name):
        raise Refused(403, f"user '{name}' is the pair's own login: not changed here")
    if any(u.name == name for u in broker.config.users):
        raise Refused(
            400,
            f"user '{name}' is in the config files (users[]): it is changed there, on both "
            "servers, not at run time",
        )
    checked_name(name)


def _user_to_grant(broker: Any, name: str) -> Any:
    if is_internal(broker, name):
        raise Refused(403, f"user '{name}' is the pair's own login: not changed here")
    user = broker.auth.lookup(name)[0]
    if user is None:
        raise Refused(400, f"user '{name}' does not exist")
    return user


def _close(broker: Any, which: Any, reason: str) -> int:
    """Close the client connections ``which`` picks, with 320 CONNECTION_FORCED."""
    closing = [c for c in broker.client_connections() if which(c)]
    for connection in closing:
        connection.close_forced(f"CONNECTION_FORCED - {reason}")
    return len(closing)


def _tags(value: Any) -> set[str]:
    """RabbitMQ's tags: a comma-separated string or a list of strings."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list) and all(isinstance(t, str) for t in value):
        items = value
    else:
        raise Refused(400, "tags: a comma-separated string or a list of strings")
    tags = {t.strip() for t in items if t.strip()}
    if any(len(t.encode()) > 255 or not t.isprintable() for t in tags) or len(tags) > 32:
        raise Refused(400, "tags: at most 32, each 1 to 255 printable bytes")
    return tags


def checked_hash(name: str, given: Any, algorithm: Any = None) -> str:
    """User ``name``'s ``password_hash`` as given, once it reads as a hash (and, with a
    ``hashing_algorithm``, as that one's)."""
    if not isinstance(given, str) or not given:
        raise Refused(400, f"user '{name}' has no password_hash")
    if algorithm is not None and algorithm not in ALGORITHMS.values():
        raise Refused(
            400,
            f"user '{name}': hashing_algorithm {algorithm!r} is not accepted "
            f"(one of {sorted(ALGORITHMS.values())})",
        )
    try:
        verifier = parse_hash(given)
    except BadHash as error:
        raise Refused(400, f"user '{name}': its password_hash is refused: {error}") from None
    if algorithm is not None and ALGORITHMS.get(verifier.scheme) != algorithm:
        raise Refused(400, f"user '{name}': the password_hash is not a {algorithm} hash")
    return given


def checked_name(name: str) -> None:
    if not name or len(name.encode("utf-8", "surrogateescape")) > 255:
        raise Refused(400, "a user name is 1 to 255 bytes")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise Refused(400, "a user name has no control characters")


def ungranted(name: str, tags: set[str]) -> None:
    if tags & UNGRANTED_TAGS:
        raise Refused(
            403,
            f"user '{name}': the tags {sorted(tags & UNGRANTED_TAGS)} are not given at run "
            "time (the pair's own login and federation are configured in the config files)",
        )


async def _password_hash(name: str, fields: dict[str, Any]) -> str:
    """The user's hash: ``password_hash`` as given (checked), or a new scrypt hash of
    ``password`` (made off the event loop: about 0.1 s of CPU)."""
    given = fields.get("password_hash")
    if given not in (None, ""):
        return checked_hash(name, given, fields.get("hashing_algorithm"))
    password = fields.get("password")
    if not isinstance(password, str) or not password:
        raise Refused(400, f"user '{name}': a password or a password_hash is needed")
    if len(password.encode("utf-8", "surrogateescape")) > 4096:
        raise Refused(400, f"user '{name}': the password is over 4096 bytes")
    return await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
