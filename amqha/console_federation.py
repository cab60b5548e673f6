"""``amqha console federation``: the links as a table, and changing them at run time.

Owns: a link's row (docs/federation.md, "What a link reports"), ``federation add`` and
``remove``'s options as a request, the order the servers are asked in (the ACTIVE first),
and what each server did, in words or JSON, with the exit status of a change that did
not reach every server (docs/federation.md, "At run time").

Must not know: the links themselves (the servers run them), the other commands.
"""

from __future__ import annotations

from typing import Any

import click

from .console import EXIT_OK, ConsoleClient, ConsoleError, Server, usage
from .console_health import status_all
from .console_text import echo_json, iso_time
from .console_words import syntax

# The columns of `federation` as a table, in this order (--json has every field).
_FEDERATION_COLUMNS = (
    "exchange", "vhost", "upstream", "upstream_name", "source", "delivery", "state",
    "reason", "since", "attempts", "server", "bindings", "repairs", "buffer_depth", "in",
    "out", "dropped", "duplicates", "last_message", "active",
)  # fmt: skip


def federation_row(link: dict[str, Any]) -> dict[str, Any]:
    """A link as a table row: its times in ISO 8601 (``confirmed`` bindings count the
    link's own probe binding: docs/federation.md, "What a link reports")."""
    row = {key: link.get(key) for key in _FEDERATION_COLUMNS}
    for key in ("since", "last_message"):
        if row[key] is not None:
            row[key] = iso_time(row[key])
    return row


_AUTH_CODES = ("auth_failed", "access_refused", "not_authorised")


def _federation_args(action: str, options: dict[str, Any]) -> dict[str, Any]:
    """``federation add|remove``'s options as the request's arguments (checked by the
    server, as the config's are)."""
    for required in ("--exchange", "--upstream"):
        if not options.get(required):
            usage(f"federation {action}: {required} is needed; usage: {syntax('federation')}")
    args: dict[str, Any] = {
        "action": action,
        "exchange": options["--exchange"],
        "upstream": options["--upstream"],
        "vhost": options.get("--vhost", "/"),
    }
    if action == "remove":
        if options.get("--drop-pending"):
            args["drop_pending"] = True
        return args
    if "--url" in options:
        args["urls"] = options["--url"]
    if options.get("--no-bindings"):
        args["bindings"] = False
    if options.get("--forward"):
        args["forward"] = True
    if "--max-hops" in options:
        text = str(options["--max-hops"])
        digits = text[1:] if text.startswith("-") else text
        # A number as a number (the server says if it is out of range); else as given.
        args["max_hops"] = int(text) if digits.isdigit() and len(digits) < 10 else text
    if "--delivery" in options:
        args["delivery"] = options["--delivery"]
    return args


async def _federation_order(
    servers: list[Server], timeout: float
) -> tuple[list[Server], list[tuple[Server, ConsoleError]]]:
    """The servers a run-time federation change goes to, the ACTIVE first, and those
    that do not answer. A refused login is raised: nothing is changed then."""
    if len(servers) == 1:
        return servers, []
    results = await status_all(servers, timeout)
    for wanted in _AUTH_CODES:
        for server, status in results:
            error = status.get("error") or {}
            if error.get("code") == wanted:
                raise ConsoleError(wanted, f"{server.where}: {error.get('message')}")
    down = [
        (s, ConsoleError(status["error"]["code"], status["error"]["message"]))
        for s, status in results
        if "error" in status
    ]
    answering = [(s, status) for s, status in results if "error" not in status]
    if not answering:
        raise ConsoleError(
            down[0][1].code,
            "no server answered:\n  " + "\n  ".join(f"{s.where}: {e.message}" for s, e in down),
        )
    answering.sort(key=lambda item: item[1].get("state") != "ACTIVE")
    return [s for s, _ in answering], down


async def federation_change(
    servers: list[Server], action: str, options: dict[str, Any], timeout: float, as_json: bool
) -> int:
    """``federation add|remove`` on every server named: each keeps its run-time
    federations (a pair's PASSIVE runs them once it leads). The ACTIVE is asked first: what
    it refuses changes nothing anywhere. A server that does not answer is named, and the
    exit status says so: the same command, run again, finishes the change."""
    args = _federation_args(action, options)
    order, missed = await _federation_order(servers, timeout)
    done: list[tuple[Server, dict[str, Any]]] = []
    absent: list[tuple[Server, ConsoleError]] = []
    for server in order:
        try:
            async with ConsoleClient(server, timeout) as console:
                result = await console.call("federation", **args)
        except ConsoleError as error:
            if action == "remove" and error.code == "not_found":
                absent.append((server, error))  # removed there before
                continue
            if not done and not absent:
                raise
            missed.append((server, error))
            continue
        done.append((server, result))
        if action == "remove":
            # The others delete nothing upstream the first did, and name the same queue.
            args.update(buffer_queue=result["buffer_queue"])
            if result.get("upstream_deleted"):
                args.update(upstream_deleted=True)
    if not done:
        raise absent[0][1] if absent else missed[0][1]
    ok = not missed
    if as_json:
        echo_json(
            {
                "ok": ok,
                "command": f"federation {action}",
                "servers": [{"server": s.where, "result": r} for s, r in done],
                "missed": [{"server": s.where, **e.as_json()["error"]} for s, e in missed],
            }
        )
    else:
        for server, result in done:
            click.echo(f"{server.where}: {_federation_text(action, result)}")
        for server, failure in missed:
            click.echo(f"{server.where}: not changed: {failure.message}", err=True)
        if missed:
            click.echo("run the same command again once every server answers", err=True)
    if ok:
        return EXIT_OK
    return min(failure.exit_code for _, failure in missed)


def _federation_text(action: str, result: dict[str, Any]) -> str:
    link = f"exchange '{result['exchange']}' (vhost {result['vhost']}) <- '{result['upstream']}'"
    if action == "add":
        if result.get("unchanged"):
            return f"{link}: already there, unchanged"
        where = "running here" if result.get("running_here") else "runs when this server leads"
        return f"{link}: added ({where})"
    queue = f"buffer queue '{result['buffer_queue']}'"
    if result.get("upstream_deleted"):
        upstream = f"{queue} deleted upstream"
    elif result.get("pending"):
        upstream = f"{queue} NOT deleted: {result['pending']}"
    else:
        upstream = f"{queue} deleted by the ACTIVE, or once this server leads"
    forward = ""
    if result.get("forward_queue_removed"):
        forward = f"; forward queue removed ({result.get('dropped', 0)} messages dropped)"
    return f"{link}: removed; {upstream}{forward}"
