"""The management API's policy routes, as RabbitMQ's (what ``rabbitmqadmin declare
policy`` and a definitions file's ``policies`` drive).

Owns: ``GET``, ``PUT`` and ``DELETE`` of ``/api/policies[/V[/N]]`` and
``/api/operator-policies[/V[/N]]`` (201 made, 204 changed, 404 unknown, 400 a definition
RabbitMQ would refuse, 403 one that names the control plane). A policy is a change of its
vhost (``core.policies.change``): logged, so the PASSIVE and the store have it, the reply
waits until it is safe, and the queues it matches take its limits at once. Policies: a
``policymaker`` in its own vhosts, or an administrator; operator policies: an
administrator. Only on a serving server (docs/operations.md, "Policies").

Must not know: the listener, its sockets and logins (``api``), how a policy merges with a
queue's arguments (``core.policies``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..core import policies
from ..core.changes import PolicyDeleted, PolicySet
from ..logtext import escaped
from . import access, shapes
from .replies import ApiError, json_body, json_reply, need, not_found

if TYPE_CHECKING:
    from .objects import ObjectRoutes

log = logging.getLogger("amqha.management")


class PolicyRoutes:
    """The policy routes; ``ManagementEndpoint`` adds them to its app."""

    def __init__(self, objects: ObjectRoutes) -> None:
        self.objects = objects

    # -- reading --------------------------------------------------------------------------

    async def listing(self, request: web.Request) -> web.StreamResponse:
        operator = _operator(request)
        if operator:
            need(access.is_admin(request["user"]))
        found = []
        for vhost in self.objects._vhosts(request):
            table = vhost.policies.operator if operator else vhost.policies.user
            found += [shapes.policy_shape(table[name]) for name in sorted(table)]
        return json_reply(found)

    async def one(self, request: web.Request) -> web.StreamResponse:
        operator = _operator(request)
        if operator:
            need(access.is_admin(request["user"]))
        vhost = self.objects._vhost(request)
        table = vhost.policies.operator if operator else vhost.policies.user
        policy = table.get(request.match_info["name"])
        if policy is None:
            raise not_found()
        return json_reply(shapes.policy_shape(policy))

    # -- changes --------------------------------------------------------------------------

    async def put(self, request: web.Request) -> web.StreamResponse:
        vhost, name, operator = self._changing(request)
        body = await json_body(request)
        pattern, definition = body.get("pattern"), body.get("definition")
        if not isinstance(pattern, str):
            raise ApiError(400, "bad_request", f"policy '{name}': pattern must be a string")
        if not isinstance(definition, dict):
            raise ApiError(400, "bad_request", f"policy '{name}': definition must be an object")
        priority = body.get("priority", 0)
        if isinstance(priority, str) and priority.lstrip("-").isdigit():
            priority = int(priority)  # as rabbitmqadmin may send it
        apply_to = body.get("apply-to", "all")
        if not isinstance(apply_to, str):
            raise ApiError(400, "bad_request", f"policy '{name}': apply-to must be a string")
        change = PolicySet(vhost.name, name, pattern, apply_to, priority, definition, operator)
        try:
            warnings = policies.check(change)
        except policies.PolicyError as error:
            raise ApiError(error.status, _ERRORS[error.status], str(error)) from None
        table = vhost.policies.operator if operator else vhost.policies.user
        existed = name in table
        policies.change(vhost, change, serving=True)
        for warning in warnings:
            log.warning("%s", escaped(warning))
        self._logged(request, f"{_kind(operator)} '{name}' in vhost '{vhost.name}' set")
        await self.objects.safe()
        return web.Response(status=204 if existed else 201)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        vhost, name, operator = self._changing(request)
        table = vhost.policies.operator if operator else vhost.policies.user
        if name not in table:
            raise not_found()
        policies.change(vhost, PolicyDeleted(vhost.name, name, operator), serving=True)
        self._logged(request, f"{_kind(operator)} '{name}' in vhost '{vhost.name}' deleted")
        await self.objects.safe()
        return web.Response(status=204)

    def _changing(self, request: web.Request) -> tuple[Any, str, bool]:
        operator = _operator(request)
        vhost = self.objects._vhost(request)
        user = request["user"]
        if operator:
            need(access.is_admin(user))
        else:
            need(access.may_set_policy(user, vhost.name))
        self.objects._serving()
        return vhost, request.match_info["name"], operator

    def _logged(self, request: web.Request, what: str) -> None:
        log.info("%s by %s (management)", escaped(what), escaped(request["user"].name))


_ERRORS = {400: "bad_request", 403: "access_refused"}


def _operator(request: web.Request) -> bool:
    return request.path.startswith("/api/operator-policies")


def _kind(operator: bool) -> str:
    return "operator policy" if operator else "policy"
