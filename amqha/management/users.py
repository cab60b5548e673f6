"""The management API's routes for users, vhosts and permissions made at run time, as
RabbitMQ's (what ``rabbitmqadmin declare user|vhost|permission`` drives).

Owns: ``PUT`` and ``DELETE`` of ``/api/users/N``, ``/api/vhosts/N`` and
``/api/permissions/V/U`` (201 made, 204 changed or there already, 404 unknown), ``GET`` of
one user and of one permission; an administrator's, on a serving server. Each change is
``access_admin``'s (its rules, its record, the wait until it is safe, the connections a
deletion closes), as the console's are (docs/security.md, "Users at run time").

Must not know: the listener, its sockets and logins (``api``), how logins are checked
(``auth``), the store.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .. import access_admin
from ..logtext import escaped
from . import access, definitions
from .replies import ApiError, json_body, json_reply, need, not_found

if TYPE_CHECKING:
    from .objects import ObjectRoutes

log = logging.getLogger("amqha.management")


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
        configured = any(u.name == user.name for u in self.broker.config.users)
        return json_reply(
            {
                "name": user.name,
                "tags": list(user.tags),
                "hashing_algorithm": definitions.hashing_algorithm(user),
                "limits": {},
                "amqha": {"made": "config file" if configured else "run time"},
            }
        )

    async def permission(self, request: web.Request) -> web.StreamResponse:
        need(access.is_admin(request["user"]))
        vhost, name = request.match_info["vhost"], request.match_info["user"]
        user = self.broker.auth.lookup(name)[0]
        if user is None or access.is_internal_user(user) or vhost not in user.vhosts:
            raise not_found()
        full = access_admin.FULL
        return json_reply(
            {"user": name, "vhost": vhost, "configure": full, "write": full, "read": full}
        )

    # -- changes --------------------------------------------------------------------------

    async def put_user(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "name")
        fields = await json_body(request)
        existed = await _done(access_admin.put_user(self.broker, name, fields))
        self._logged(request, f"user '{name}' {'changed' if existed else 'made'}")
        return web.Response(status=204 if existed else 201)

    async def delete_user(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "name")
        closed = await _done(access_admin.delete_user(self.broker, name))
        self._logged(request, f"user '{name}' deleted ({closed} connections closed)")
        return web.Response(status=204)

    async def put_vhost(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "vhost")
        await json_body(request)  # a description or tags: read and checked, not kept
        existed = await _done(access_admin.put_vhost(self.broker, name))
        if not existed:
            self._logged(request, f"vhost '{name}' made")
        return web.Response(status=204 if existed else 201)

    async def delete_vhost(self, request: web.Request) -> web.StreamResponse:
        name = self._changing(request, "vhost")
        closed = await _done(access_admin.delete_vhost(self.broker, name))
        self._logged(request, f"vhost '{name}' deleted ({closed} connections closed)")
        return web.Response(status=204)

    async def put_permission(self, request: web.Request) -> web.StreamResponse:
        vhost = self._changing(request, "vhost")
        name = request.match_info["user"]
        rights = await json_body(request)
        had = await _done(access_admin.put_permission(self.broker, vhost, name, rights))
        if not had:
            self._logged(request, f"user '{name}' given vhost '{vhost}'")
        return web.Response(status=204 if had else 201)

    async def delete_permission(self, request: web.Request) -> web.StreamResponse:
        vhost = self._changing(request, "vhost")
        name = request.match_info["user"]
        closed = await _done(access_admin.delete_permission(self.broker, vhost, name))
        self._logged(request, f"user '{name}' lost vhost '{vhost}' ({closed} connections closed)")
        return web.Response(status=204)

    def _changing(self, request: web.Request, key: str) -> str:
        """The name the route gives, once the login is an administrator's on a serving
        server."""
        need(access.is_admin(request["user"]))
        self.objects._serving()
        return request.match_info[key]

    def _logged(self, request: web.Request, what: str) -> None:
        log.info("%s by %s (management)", escaped(what), escaped(request["user"].name))


async def _done(change: Awaitable[Any]) -> Any:
    """The change's result, or its refusal as RabbitMQ's JSON."""
    try:
        return await change
    except access_admin.Refused as refused:
        raise ApiError(refused.status, refused.word, str(refused)) from None
