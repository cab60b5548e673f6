"""The management API's declare and delete routes for queues, exchanges and bindings, as
RabbitMQ's (what ``rabbitmqadmin declare``, Terraform's and Ansible's modules drive).

Owns: ``PUT /api/queues/V/N`` and ``PUT /api/exchanges/V/N`` (201 made, 204 there already
and equivalent, 400 not equivalent), ``DELETE /api/exchanges/V/N`` (``if-unused``),
``POST /api/bindings/V/e/S/q/D`` and ``/e/S/e/D`` (201, the new binding's URL in
``Location``), their ``GET`` (the bindings between the two), and ``DELETE`` of one of them
by its properties key. A declare takes the way of a definitions import of that one object
(``definitions``: the control plane refused, arguments checked, then the model's own
declare), so the API may declare exactly what an import may, and a durable object reaches
the store and the PASSIVE as any declare does. Only on a server that serves (503 on the
PASSIVE, naming the ACTIVE), by a user who may change that vhost (``access``: an
administrator, or a management user in its own vhosts), docs/operations.md
("Management API").

Must not know: the listener, its sockets and logins (``api``), how the model routes.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pamqp import exceptions

from ..logtext import escaped
from . import definitions, shapes
from .replies import ApiError, json_body, json_reply, not_found

if TYPE_CHECKING:
    from .objects import ObjectRoutes

log = logging.getLogger("amqha.management")


class WriteRoutes:
    """The declare and delete routes; ``ManagementEndpoint`` adds them to its app."""

    def __init__(self, objects: ObjectRoutes) -> None:
        self.objects = objects
        self.broker = objects.broker

    # -- queues, exchanges ----------------------------------------------------------------

    async def put_queue(self, request: web.Request) -> web.StreamResponse:
        vhost, name = self._target(request)
        body = await json_body(request)
        if vhost.hidden_queue(name) is not None:
            raise ApiError(403, "access_refused", f"queue '{name}' belongs to the server")
        item = {
            "name": name,
            "vhost": vhost.name,
            "durable": _flag(body, "durable", True),
            "auto_delete": _flag(body, "auto_delete", False),
            "arguments": body.get("arguments") or {},
        }
        return await self._declare(request, "queues", item, f"queue '{name}'", name in vhost.queues)

    async def put_exchange(self, request: web.Request) -> web.StreamResponse:
        vhost, name = self._target(request)
        body = await json_body(request)
        if "type" not in body:
            raise ApiError(400, "bad_request", f"exchange '{name}': type is missing")
        item = {
            "name": name,
            "vhost": vhost.name,
            "type": body["type"],
            "durable": _flag(body, "durable", True),
            "auto_delete": _flag(body, "auto_delete", False),
            "internal": _flag(body, "internal", False),
            "arguments": body.get("arguments") or {},
        }
        existed = name in vhost.exchanges
        return await self._declare(request, "exchanges", item, f"exchange '{name}'", existed)

    async def delete_exchange(self, request: web.Request) -> web.StreamResponse:
        vhost, name = self._target(request)
        exchange = vhost.exchanges.get(name)
        if exchange is None or exchange.control:
            raise not_found()
        try:
            vhost.delete_exchange(name, if_unused=request.query.get("if-unused") == "true")
        except exceptions.AMQPError as error:
            raise _refusal(error) from None
        self._logged(request, f"exchange '{name}' in vhost '{vhost.name}' deleted")
        await self.objects.safe()
        return web.Response(status=204)

    # -- bindings -------------------------------------------------------------------------

    async def bindings_between(self, request: web.Request) -> web.StreamResponse:
        vhost = self.objects._vhost(request)
        return json_reply(_between(vhost, request.match_info))

    async def post_binding(self, request: web.Request) -> web.StreamResponse:
        vhost, _ = self._target(request, "source")
        info = request.match_info
        source, destination = info["source"], info["destination"]
        kind = "queue" if info["kind"] == "q" else "exchange"
        if source in ("", DEFAULT_ALIAS):
            raise ApiError(
                403,
                "access_refused",
                "ACCESS_REFUSED - operation not permitted on the default exchange",
            )
        body = await json_body(request)
        routing_key = body.get("routing_key", "")
        arguments = body.get("arguments") or {}
        item = {
            "vhost": vhost.name,
            "source": source,
            "destination": destination,
            "destination_type": kind,
            "routing_key": routing_key,
            "arguments": arguments,
        }
        where = f"binding of {kind} '{destination}' to exchange '{source}'"
        await self._declare(request, "bindings", item, where, False)
        key = shapes.properties_key(routing_key, arguments) if isinstance(arguments, dict) else ""
        location = "/".join(
            urllib.parse.quote(part, safe="")
            for part in (vhost.name, "e", source, info["kind"], destination)
        )
        return web.Response(status=201, headers={"Location": f"/api/bindings/{location}/{key}"})

    async def delete_binding(self, request: web.Request) -> web.StreamResponse:
        vhost, _ = self._target(request, "source")
        info = request.match_info
        wanted = info["props"]  # decoded from the path, as the listing's key is not
        for binding in _bindings(vhost, info):
            if urllib.parse.unquote(binding.shape["properties_key"]) == wanted:
                try:
                    if binding.kind == "queue":
                        vhost.unbind_queue(
                            binding.destination,
                            binding.source,
                            binding.key,
                            binding.arguments,
                            None,
                        )
                    else:
                        vhost.unbind_exchange(
                            binding.destination, binding.source, binding.key, binding.arguments
                        )
                except exceptions.AMQPError as error:
                    raise _refusal(error) from None
                self._logged(
                    request,
                    f"binding of {binding.kind} '{binding.destination}' to exchange "
                    f"'{binding.source}' in vhost '{vhost.name}' deleted",
                )
                await self.objects.safe()
                return web.Response(status=204)
        raise not_found()

    # -- the way of a change --------------------------------------------------------------

    def _target(self, request: web.Request, key: str = "name") -> tuple[Any, str]:
        """The vhost the route names, and the object's name, once the login may change
        that vhost on a serving server."""
        vhost = self.objects._vhost(request)
        name = request.match_info[key]
        self.objects._may_change(request, vhost)
        return vhost, name

    async def _declare(
        self, request: web.Request, kind: str, item: dict[str, Any], what: str, existed: bool
    ) -> web.StreamResponse:
        """Declare one object as an import of it would: 201 when it is new, 204 when it
        was there and equivalent, the import's refusal otherwise; once it is safe."""
        try:
            plan = definitions.plan_import({kind: [item]}, self.broker.config)
            definitions.check_against(plan, self.broker.vhosts, self.broker.config)
            definitions.apply(plan, self.broker, self.broker.now())
        except definitions.Refused as error:
            reason = str(error).replace(f"{kind}[0]", what)
            reason = reason.replace(" (what came before it in the file was imported)", "")
            raise ApiError(error.status, _ERRORS.get(error.status, "bad_request"), reason) from None
        await self.objects.safe()
        if existed:
            return web.Response(status=204)
        self._logged(request, f"{what} in vhost '{item['vhost']}' declared")
        return web.Response(status=201)

    def _logged(self, request: web.Request, what: str) -> None:
        log.info("%s by %s (management)", escaped(what), escaped(request["user"].name))


_ERRORS = {403: "access_refused", 404: "not_found"}
# The default exchange's name in the API's URLs, as RabbitMQ's.
DEFAULT_ALIAS = "amq.default"


def _flag(body: dict[str, Any], key: str, default: bool) -> Any:
    """A flag of the body: JSON's true and false, or their words as rabbitmqadmin sends
    them; anything else is left for the import's check to refuse."""
    value = body.get(key, default)
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value


class _Found:
    """One binding of a vhost, as listed and as the model holds it."""

    __slots__ = ("shape", "kind", "source", "destination", "key", "arguments")

    def __init__(self, shape: dict[str, Any], source: str, binding: Any) -> None:
        self.shape = shape
        self.kind = shape["destination_type"]
        self.source = source
        self.destination = binding.destination.name
        self.key = binding.routing_key
        self.arguments = binding.arguments


def _bindings(vhost: Any, info: Any) -> list[_Found]:
    """The bindings from exchange ``source`` to the route's destination."""
    exchange = vhost.exchanges.get(info["source"])
    if exchange is None or exchange.control:
        raise not_found()
    kind = "queue" if info["kind"] == "q" else "exchange"
    return [
        _Found(shape, exchange.name, binding)
        for shape, binding in shapes.exchange_bindings(vhost.name, exchange)
        if shape["destination"] == info["destination"] and shape["destination_type"] == kind
    ]


def _between(vhost: Any, info: Any) -> list[dict[str, Any]]:
    return [found.shape for found in _bindings(vhost, info)]


def _refusal(error: exceptions.AMQPError) -> ApiError:
    status = 403 if isinstance(error, exceptions.AMQPAccessRefused) else 400
    return ApiError(status, _ERRORS.get(status, "bad_request"), str(error))
