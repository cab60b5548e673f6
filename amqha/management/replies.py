"""The management API's answers and refusals, as RabbitMQ's JSON.

Owns: ``ApiError`` (a refusal: its status, RabbitMQ's error word, the reason), the JSON
answer every route gives (never cached), a health check's ``ok``/``failed`` answer, an
integer query parameter kept within its bounds, a request's JSON object, and the credentials of an HTTP basic
``Authorization`` header (docs/operations.md, "Management API").

Must not know: routes, users, the broker, how a login is checked.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from aiohttp import web

from . import guard


class ApiError(Exception):
    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason


def not_found(what: str = "Not Found") -> ApiError:
    return ApiError(404, "Object Not Found", what)


def basic_credentials(header: str) -> tuple[str, str]:
    """The user name and password of a basic ``Authorization`` header; ApiError (401) if it
    is not one."""
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        raise ApiError(401, "not_authorised", "Login failed")
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise ApiError(401, "not_authorised", "Login failed") from None
    username, sep, password = text.partition(":")
    if not sep:
        raise ApiError(401, "not_authorised", "Login failed")
    return username, password


def need(allowed: bool) -> None:
    if not allowed:
        raise ApiError(401, "not_authorised", "Not authorised: the user's tags do not allow it")


def json_reply(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, headers={"Cache-Control": "no-store"})


def check_reply(ok: bool, reason: str) -> web.Response:
    if ok:
        return json_reply({"status": "ok", "reason": reason})
    return json_reply({"status": "failed", "reason": reason}, 503)


def int_query(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be an integer") from None
    return max(low, min(high, value))


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (an empty body: none); 400 otherwise."""
    text = await request.text()
    if not text.strip():
        return {}
    try:
        body = guard.loads(text)
    except ValueError as error:
        raise ApiError(400, "bad_request", f"not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "expected a JSON object")
    return body
