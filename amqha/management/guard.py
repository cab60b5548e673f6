"""What a management request must be: a change asked by a page of this origin, a JSON body
of bounded depth, and errors as RabbitMQ's JSON.

Owns: the rule for state-changing requests (docs/security.md, "Management API: forged
requests"): a POST, PUT or DELETE whose ``Origin`` (or, without one, ``Referer``) names
another origin than the request's own ``Host`` is refused with 403; a POST or PUT must
carry ``Content-Type: application/json`` (a charset may follow), else 415, as RabbitMQ's
API answers. A browser sends a cross-origin request with that type only after a CORS
preflight, which this listener never grants, so a form or a script on another site cannot
make one, whatever login the browser holds. Also: the depth limit of a JSON body
(MAX_DEPTH, past it 400, never a recursion error) and the JSON body of an error aiohttp
raises itself (an unknown route, a method a route does not take: a change amqha does not
make is a 400 naming what to do instead).

Must not know: routes, users, the broker.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

CHANGES = frozenset({"POST", "PUT", "DELETE", "PATCH"})
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPE = "application/json"
# A definitions file nests four levels (file, list, object, arguments); arguments may
# nest tables and arrays of their own, and AMQP decodes at most 32 of them.
MAX_DEPTH = 40


class Forbidden(Exception):
    """Why a request may not change anything: (status, error, reason) for the answer."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def check_change(method: str, headers: Any, scheme: str) -> None:
    """Raise Forbidden unless a state-changing request may be acted on."""
    if method not in CHANGES:
        return
    origin = headers.get("Origin")
    if origin is None and "Referer" in headers:
        origin = headers["Referer"]
    if origin is not None and not same_origin(origin, headers.get("Host", ""), scheme):
        raise Forbidden(
            403,
            "forbidden",
            "a change must come from this listener's own origin "
            f"(Origin/Referer names {origin[:200]!r})",
        )
    if method in WITH_BODY:
        given = headers.get("Content-Type", "")
        if given.split(";", 1)[0].strip().lower() != JSON_TYPE:
            raise Forbidden(
                415,
                "unsupported_media_type",
                f"the body of a {method} must be {JSON_TYPE} (got {given[:100]!r})",
            )


def same_origin(origin: str, host: str, scheme: str) -> bool:
    """True if ``origin`` (an Origin or Referer value) is ``scheme://host``. ``null`` (a
    sandboxed or file page) is another origin."""
    try:
        given = urlsplit(origin.strip())
        given_port = given.port
        own = urlsplit(f"{scheme}://{host.strip()}")
        own_port = own.port
    except ValueError:
        return False
    default = 443 if scheme == "https" else 80
    return (
        given.scheme.lower() == scheme
        and given.hostname is not None
        and given.hostname == own.hostname
        and (given_port or default) == (own_port or default)
    )


def loads(text: str) -> Any:
    """A JSON body, nested at most MAX_DEPTH deep; ValueError says what is wrong. Costs
    time linear in the text: run it off the event loop for a large body."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    if too_deep(value, MAX_DEPTH):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    return value


def too_deep(value: Any, limit: int) -> bool:
    """True if ``value`` nests lists or objects more than ``limit`` deep (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def error_body(error: web.HTTPException, method: str, path: str) -> web.Response:
    """An error aiohttp raised as RabbitMQ's JSON ``{error, reason}``. A change to a
    route amqha does not have (a ``PUT /api/parameters/...``) is a 400 that says what to do
    instead: rabbitmqadmin prints a 400's reason, and ends in a traceback on any other
    status past 401 and 404."""
    if method in CHANGES and path.startswith("/api/") and error.status in (404, 405):
        return web.json_response(
            {
                "error": "bad_request",
                "reason": f"amqha's management API does not take {method} {path[:200]}: "
                'the changes it takes are listed in docs/operations.md ("Management API")',
            },
            status=400,
        )
    reason = error.reason or "error"
    words = {404: "Object Not Found", 405: "Method Not Allowed"}
    headers = {k: v for k, v in error.headers.items() if k.lower() == "allow"}
    return web.json_response(
        {"error": words.get(error.status, reason), "reason": reason},
        status=error.status,
        headers=headers,
    )
