"""The management API's routes for users, vhosts and permissions made at run time, as
RabbitMQ's (what ``rabbitmqadmin declare user|vhost|permission`` drives).

Owns: ``PUT`` and ``DELETE`` of ``/api/users/N``, ``/api/vhosts/N`` and
``/api/permissions/V/U`` (201 made, 204 changed or there already, 404 unknown), ``GET`` of
one user and of one permission. Each change is a ``core.access`` change
the broker applies and logs (``record_access``): the reply waits until it is safe (on the
store, and on an in-sync PASSIVE), so a user the API made logs in on the other server
after a failover. Administrators only, on a serving server. The config files' users and
the vhosts they name are read-only here (400, naming the file's key); the pair's own
login, the ``peering`` and ``federation`` tags cannot be made, given or changed (403).
Deleting a user, a permission or a vhost closes the connections it allowed
(docs/security.md, "Users at run time").

Must not know: the listener, its sockets and logins (``api``), how logins are checked
(``auth``), the store.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from config import User
from config.passwords import BadHash, hash_password, parse_hash
from config.vhostnames import vhost_name_problem

from ..core.access import INTERNAL_TAG
from ..core.changes import (
    PermissionDeleted,
    PermissionSet,
    UserDeleted,
    UserSet,
    VhostDeleted,
    VhostSet,
)
from ..logtext import escaped
from . import access, definitions
from .replies import ApiError, json_body, json_reply, need, not_found

if TYPE_CHECKING:
    from .objects import ObjectRoutes

log = logging.getLogger("amqha.management")

# Tags never given at run time: the pair's own login's, and the one that lets a login
# read federation buffers of other pairs (docs/federation.md).
UNGRANTED_TAGS = frozenset({INTERNAL_TAG, "federation"})
# Hashing algorithms a password_hash may name (RabbitMQ's two, amqha's scrypt).
HASHING = {value: key for key, value in definitions.ALGORITHMS.items()}


def config_vhosts(config: Any) -> set[str]:
    return {v for u in config.users for v in u.vhosts}


class AccessRoutes:
    """The user, vhost and permission routes; ``ManagementEndpoint`` adds them."""

    def __init__(self, objects: ObjectRoutes) -> None:
        self.objects = objects
        self.broker = objects.broker

    # -- reading --------------------------------------------------------------------------

    async def user(self, request: web.Request) -> web.StreamResponse:
        need(access.is_admin(request["user"]))
        user = self.broker.auth.lookup(request.match_info["name"])[0]
        if user is None or access.is_internal_user(user):
            raise not_found()
        return json_reply(self.user_shape(user))

    def user_shape(self, user: Any) -> dict[str, Any]:
        configured = any(u.name == user.name for u in self.broker.config.users)
        return {
            "name": user.name,
            "tags": list(user.tags),
            "hashing_algorithm": definitions.hashing_algorithm(user),
            "limits": {},
            "amqha": {"made": "config file" if configured else "run time"},
        }

    async def permission(self, request: web.Request) -> web.StreamResponse:
        need(access.is_admin(request["user"]))
        vhost, name = request.match_info["vhost"], request.match_info["user"]
        user = self.broker.auth.lookup(name)[0]
        if user is None or access.is_internal_user(user) or vhost not in user.vhosts:
            raise not_found()
        return json_reply(_permission_shape(vhost, name))

    # -- users ----------------------------------------------------------------------------

    async def put_user(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "name")
        self._not_configured(name)
        body = await json_body(request)
        tags = _tags(body.get("tags", ""))
        if tags & UNGRANTED_TAGS:
            raise ApiError(
                403,
                "access_refused",
                f"user '{name}': the tags {sorted(tags & UNGRANTED_TAGS)} are not given at run "
                "time (the pair's own login and federation are configured in the config files)",
            )
        password_hash = await _password_hash(name, body)
        existed = name in self.broker.access.users
        await self._record(UserSet(name, password_hash, tuple(sorted(tags))))
        self._logged(request, f"user '{name}' {'changed' if existed else 'made'}")
        return web.Response(status=204 if existed else 201)

    async def delete_user(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "name")
        self._not_configured(name)
        if name not in self.broker.access.users:
            raise not_found()
        await self._record(UserDeleted(name))
        closed = self._close(lambda c: c.user.name == name, f"user '{name}' was deleted")
        self._logged(request, f"user '{name}' deleted ({closed} connections closed)")
        return web.Response(status=204)

    # -- vhosts ---------------------------------------------------------------------------

    async def put_vhost(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "vhost")
        problem = vhost_name_problem(name)
        if problem is not None:
            raise ApiError(400, "bad_request", f"vhost '{name}': {problem}")
        await json_body(request)  # a description or tags: read and checked, not kept
        broker = self.broker
        existed = name in broker.vhosts
        if name not in config_vhosts(broker.config) and name not in broker.access.vhosts:
            await self._record(VhostSet(name))
            self._logged(request, f"vhost '{name}' made")
        return web.Response(status=204 if existed else 201)

    async def delete_vhost(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "vhost")
        broker = self.broker
        if name in config_vhosts(broker.config):
            raise ApiError(
                400,
                "bad_request",
                f"vhost '{name}' is named by users[].vhosts of the config files: it is removed "
                "there, not at run time",
            )
        vhost = broker.vhosts.get(name)
        if name not in broker.access.vhosts or vhost is None:
            raise not_found()
        closed = self._close(lambda c: c.vhost is vhost, f"vhost '{name}' was deleted")
        for queue in list(vhost.queues.values()):
            owner = queue.exclusive_owner
            vhost.remove_queue(queue)
            if owner is not None:
                owner.exclusive_queues.pop(queue.name, None)
        for exchange in list(vhost.exchanges.values()):
            if exchange.name and not exchange.control and not exchange.name.startswith("amq."):
                vhost.remove_exchange(exchange)
        await self._record(VhostDeleted(name))
        self._logged(request, f"vhost '{name}' deleted ({closed} connections closed)")
        return web.Response(status=204)

    # -- permissions ----------------------------------------------------------------------

    async def put_permission(self, request: web.Request) -> web.StreamResponse:
        self._changing(request, "vhost")
        vhost, name = request.match_info["vhost"], request.match_info["user"]
        user = self._user_to_grant(name)
        body = await json_body(request)
        for key in ("configure", "write", "read"):
            if body.get(key, definitions.FULL) != definitions.FULL:
                raise ApiError(
                    400,
                    "bad_request",
                    f"{key} '{body.get(key)}': amqha gives a user full rights on its vhosts, "
                    f"no narrower (configure, write and read '{definitions.FULL}')",
                )
        if vhost not in self.broker.vhosts:
            raise ApiError(400, "bad_request", f"vhost '{vhost}' does not exist")
        if vhost in user.vhosts:
            return web.Response(status=204)
        await self._record(PermissionSet(vhost, name))
        self._logged(request, f"user '{name}' given vhost '{vhost}'")
        return web.Response(status=201)

    async def delete_permission(self, request: web.Request) -> web.StreamResponse:
        self._changing(request, "vhost")
        vhost, name = request.match_info["vhost"], request.match_info["user"]
        self._user_to_grant(name)
        if (vhost, name) not in self.broker.access.permissions:
            configured = next((u for u in self.broker.config.users if u.name == name), None)
            if configured is not None and vhost in configured.vhosts:
                raise ApiError(
                    400,
                    "bad_request",
                    f"user '{name}' has vhost '{vhost}' in the config files (users[].vhosts): "
                    "it is removed there, not at run time",
                )
            raise not_found()
        await self._record(PermissionDeleted(vhost, name))
        closed = self._close(
            lambda c: c.user.name == name and getattr(c.vhost, "name", None) == vhost,
            f"user '{name}' may no longer use vhost '{vhost}'",
        )
        self._logged(request, f"user '{name}' lost vhost '{vhost}' ({closed} connections closed)")
        return web.Response(status=204)

    # -- the way of a change --------------------------------------------------------------

    def _changing(self, request: web.Request, key: str) -> str:
        """The name the route gives, once the login is an administrator's on a serving
        server."""
        need(access.is_admin(request["user"]))
        self.objects._serving()
        return request.match_info[key]

    def _not_configured(self, name: str) -> None:
        user = next((u for u in self.broker.config.users if u.name == name), None)
        internal = name == self.broker.config.failover.peer_user
        if internal or (user is not None and access.is_internal_user(user)):
            raise ApiError(
                403, "access_refused", f"user '{name}' is the pair's own login: not changed here"
            )
        if user is not None:
            raise ApiError(
                400,
                "bad_request",
                f"user '{name}' is in the config files (users[]): it is changed there, on both "
                "servers, not at run time",
            )
        if not name or len(name.encode("utf-8", "surrogateescape")) > 255:
            raise ApiError(400, "bad_request", "a user name is 1 to 255 bytes")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
            raise ApiError(400, "bad_request", "a user name has no control characters")

    def _user_to_grant(self, name: str) -> User:
        user = self.broker.auth.lookup(name)[0]
        if name == self.broker.config.failover.peer_user or (
            user is not None and access.is_internal_user(user)
        ):
            raise ApiError(
                403, "access_refused", f"user '{name}' is the pair's own login: not changed here"
            )
        if user is None:
            raise ApiError(400, "bad_request", f"user '{name}' does not exist")
        return user

    async def _record(self, change: Any) -> None:
        """Apply and log ``change``; return once it is safe (``ObjectRoutes.safe``)."""
        self.broker.record_access(change)
        await self.objects.safe()

    def _close(self, which: Any, reason: str) -> int:
        """Close the client connections ``which`` picks, with 320 CONNECTION_FORCED."""
        closing = [c for c in self.broker.client_connections() if which(c)]
        for connection in closing:
            connection.close_forced(f"CONNECTION_FORCED - {reason}")
        return len(closing)

    def _logged(self, request: web.Request, what: str) -> None:
        log.info("%s by %s (management)", escaped(what), escaped(request["user"].name))


def _permission_shape(vhost: str, user: str) -> dict[str, str]:
    full = definitions.FULL
    return {"user": user, "vhost": vhost, "configure": full, "write": full, "read": full}


def _tags(value: Any) -> set[str]:
    """RabbitMQ's tags: a comma-separated string or a list of strings."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list) and all(isinstance(t, str) for t in value):
        items = value
    else:
        raise ApiError(400, "bad_request", "tags: a comma-separated string or a list of strings")
    tags = {t.strip() for t in items if t.strip()}
    if any(len(t.encode()) > 255 or not t.isprintable() for t in tags) or len(tags) > 32:
        raise ApiError(400, "bad_request", "tags: at most 32, each 1 to 255 printable bytes")
    return tags


async def _password_hash(name: str, body: dict[str, Any]) -> str:
    """The user's hash: ``password_hash`` as given (checked), or a new scrypt hash of
    ``password`` (made off the event loop: about 0.1 s of CPU)."""
    given = body.get("password_hash")
    if given not in (None, ""):
        algorithm = body.get("hashing_algorithm")
        if algorithm is not None and algorithm not in HASHING:
            raise ApiError(
                400,
                "bad_request",
                f"user '{name}': hashing_algorithm {algorithm!r} is not accepted "
                f"(one of {sorted(HASHING)})",
            )
        try:
            verifier = parse_hash(str(given))
        except BadHash as error:
            raise ApiError(400, "bad_request", f"user '{name}': password_hash: {error}") from None
        if algorithm is not None and HASHING[algorithm] != verifier.scheme:
            raise ApiError(
                400,
                "bad_request",
                f"user '{name}': the password_hash is not a {algorithm} hash",
            )
        return str(given)
    password = body.get("password")
    if not isinstance(password, str) or not password:
        raise ApiError(
            400, "bad_request", f"user '{name}': a password or a password_hash is needed"
        )
    if len(password.encode("utf-8", "surrogateescape")) > 4096:
        raise ApiError(400, "bad_request", f"user '{name}': the password is over 4096 bytes")
    return await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
