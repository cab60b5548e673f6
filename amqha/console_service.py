"""The admin console, server side: requests over the reserved ``amq.console`` exchange.

Owns: ``ConsoleService``, which consumes amq.console in-process and answers JSON requests
(status, recover, promote, connections, queues, exchanges, bindings, events, controller
stop|start, purge, delete, close-connection, federation list|add|remove) to the
requester's own direct reply-to address (``ConsoleClient``'s: no queue, so a vhost at its
queue limit keeps its console) or exclusive reply queue, and ``read_events`` (the event
log's lines, for the console and the management API). amq.console is a control exchange:
only users tagged ``administrator`` may publish to it (the channel refuses others with
403), nothing can be bound to it, and the request is attributed to the user its
connection authenticated as. The service checks that tag again itself before it runs any
command, so no other path to it (a future control exchange, a receiver wired elsewhere)
can reach them (docs/security.md, docs/operations.md).

Must not know: how failover decides (it asks the broker's ``gate.Pair``), frames, the
client side (``amqha/console.py``: a server never imports it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import exceptions

from config.digest import shared_settings

from . import access_admin, clock
from .channel_state import the_active
from .core.message import Message
from .core.reserved import CONSOLE_EXCHANGE
from .federation.agent import Refused
from .gate import ConsoleRefused
from .logtext import escaped
from .wire import address_of, json_answer

if TYPE_CHECKING:
    from .host import ConsoleHost

COMMANDS = (
    "status",
    "recover",
    "switchover",
    "maintenance",
    "promote",
    "connections",
    "queues",
    "exchanges",
    "bindings",
    "events",
    "controller",
    "purge",
    "delete",
    "close-connection",
    "federation",
    "config-diff",
    "users",
    "user",
    "vhost",
    "permission",
)
ADMINISTRATOR = "administrator"
# The tag whose connections close-connection never closes: the pair's own links.
PEERING = "peering"

log = logging.getLogger(__name__)


class ConsoleService:
    """Answers console requests inside the server."""

    def __init__(self, broker: ConsoleHost) -> None:
        self.broker = broker
        self.handlers: dict[str, Callable[[dict[str, Any], str], Any]] = {
            "status": self.on_status,
            "recover": self.on_pair_command("recover"),
            "switchover": self.on_pair_command("switchover"),
            "maintenance": self.on_pair_command("maintenance"),
            "promote": self.on_pair_command("promote"),
            "connections": self.on_connections,
            "queues": self.on_queues,
            "exchanges": self.on_exchanges,
            "bindings": self.on_bindings,
            "events": self.on_events,
            "controller": self.on_pair_command("controller"),
            "purge": self.on_purge,
            "delete": self.on_delete,
            "close-connection": self.on_close_connection,
            "federation": self.on_federation,
            "config-diff": self.on_config,
            "users": self.on_users,
            "user": self.on_user,
            "vhost": self.on_vhost,
            "permission": self.on_permission,
        }

    def start(self) -> None:
        self.broker.receive_control(CONSOLE_EXCHANGE, self.on_request)

    def on_request(self, message: Message, connection: Any) -> None:
        properties = message.properties()
        reply_to = properties.reply_to
        user = connection.user.name

        def reply(answer: dict[str, Any]) -> None:
            # Answers go only to the asking connection's own direct reply-to address (what
            # ConsoleClient uses: no queue, so no vhost's queue limit can stop the console)
            # or to a reply queue it owns: the console never writes into application queues.
            consumer = self.broker.reply_consumer(reply_to) if reply_to else None
            if consumer is not None and consumer.channel.connection is connection:
                self._reply_direct(consumer, reply_to, properties.correlation_id, answer)
                return
            queue = connection.exclusive_queues.get(reply_to) if reply_to else None
            if queue is not None:
                self._reply(queue, properties.correlation_id, answer)

        def run() -> Any:
            if ADMINISTRATOR not in connection.user.tags:
                # The channel lets only administrators publish here; this holds even if a
                # request ever came another way.
                raise _Refusal(
                    "not_authorised",
                    f"ACCESS_REFUSED - console commands need a user tagged '{ADMINISTRATOR}';"
                    f" '{user}' is not",
                )
            request = json.loads(message.body)
            command = request["command"]
            handler = self.handlers[command]
            args = request.get("args") or {}
            if not isinstance(args, dict):
                # Every handler reads its arguments by name.
                raise TypeError(f"'args' must be a JSON object, not {type(args).__name__}")
            return handler(args, user)

        answer = _answer(run)
        result = answer.get("result")
        if asyncio.iscoroutine(result):
            # A command that waits (federation remove): answered when it is done.
            async def finish(pending: Any) -> None:
                async def wait() -> Any:
                    return await pending

                reply(await _answer_async(wait))

            self.broker.loop.create_task(finish(result))
            return
        reply(answer)

    def _reply(self, queue: Any, correlation_id: str | None, answer: dict[str, Any]) -> None:
        header, body = json_answer(correlation_id, answer)
        self.broker.enqueue(Message(address_of("", queue.name), header, body), (queue,))

    def _reply_direct(
        self, consumer: Any, address: str, correlation_id: str | None, answer: dict[str, Any]
    ) -> None:
        header, body = json_answer(correlation_id, answer)
        consumer.deliver(None, Message(address_of("", address), header, body), False)

    # -- commands -------------------------------------------------------------------------

    def on_status(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        broker = self.broker
        status = broker.pair.status()
        status.update(
            clients=len(broker.client_connections()),
            connections=len(broker.open_connections()),
            queues=sum(len(v.visible_queues()) for v in broker.vhosts.values()),
            queued_messages=sum(
                q.message_count for v in broker.vhosts.values() for q in v.visible_queues()
            ),
            uptime=round(clock.now() - broker.started, 1),
            control_received=broker.control_received,
            store=broker.store_status(),
            collector=broker.collector.status(),
        )
        upstream = getattr(broker, "upstream", None)
        status["federation"] = {
            "upstream": None if upstream is None else upstream.status(),
            # The hidden queues (a link's forwards): in no listing, only here.
            "hidden": [
                {
                    "vhost": vhost.name,
                    "queue": name,
                    "messages": vhost.queues[name].message_count,
                    "unacked": vhost.queues[name].unacked,
                    "consumers": vhost.queues[name].consumer_count,
                }
                for vhost in broker.vhosts.values()
                for name in sorted(vhost.hidden)
            ],
        }
        return status

    def on_pair_command(self, command: str) -> Callable[[dict[str, Any], str], Any]:
        def on_command(args: dict[str, Any], user: str) -> Any:
            return self.broker.pair.command(command, args, user)

        return on_command

    def on_federation(self, args: dict[str, Any], user: str) -> Any:
        """Every federation link and its state; ``action`` ``add`` or ``remove`` changes
        the links added at run time (docs/federation.md, "At run time")."""
        federation = self.broker.federation
        action = args.get("action", "list")
        if action == "list":
            return [] if federation is None else federation.status()
        if federation is None:
            raise _Refusal("refused", "this server runs no federation")
        if action == "add":
            result = federation.add(args)
        elif action == "remove":
            result = federation.remove(args)
        else:
            raise _Refusal("usage", f"federation: unknown action {action!r} (add, remove)")
        log.info(
            "console: %s: federation %s %s",
            escaped(user),
            action,
            escaped(str(args.get("exchange"))),
        )
        return result

    def on_config(self, args: dict[str, Any], user: str) -> dict[str, str]:
        """This server's settings the pair must share, as text without secrets: what
        ``amqha console config-diff`` compares."""
        return shared_settings(self.broker.config)

    def on_connections(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        return [{"name": c.peer, **c.describe()} for c in self.broker.connections]

    def on_queues(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        """Every queue but the hidden ones; a federation buffer queue left without a
        consumer says ``orphan: true`` (docs/federation.md)."""
        upstream = getattr(self.broker, "upstream", None)
        rows = []
        for vhost in self.broker.vhosts.values():
            for q in vhost.visible_queues():
                row = {
                    "vhost": vhost.name,
                    "name": q.name,
                    "messages": q.message_count,
                    "unacked": q.unacked,
                    "consumers": q.consumer_count,
                    "durable": q.durable,
                    "exclusive": q.exclusive_owner is not None,
                }
                if upstream is not None and upstream.orphans.is_orphan(vhost.name, q.name):
                    row["orphan"] = True
                rows.append(row)
        return rows

    def on_exchanges(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        """The vhosts' exchanges, not the control plane's (``amq.peer``, ``amq.console``:
        the pair's own, as in the management API)."""
        return [
            {
                "vhost": vhost.name,
                "name": exchange.name,
                "type": exchange.kind,
                "durable": exchange.durable,
                "auto_delete": exchange.auto_delete,
                "internal": exchange.internal,
                "bindings": len(exchange.bindings),
            }
            for vhost in self.broker.vhosts.values()
            for exchange in vhost.exchanges.values()
            if not exchange.control
        ]

    def on_bindings(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        """Every binding declared with Queue.Bind or Exchange.Bind (the default exchange's
        implicit one per queue is not listed: it always exists)."""
        rows = []
        for vhost in self.broker.vhosts.values():
            for exchange in vhost.exchanges.values():
                if exchange.control:
                    continue  # has none (nothing binds to it): not the user's either way
                for binding in exchange.bindings.values():
                    destination = binding.destination
                    is_queue = hasattr(destination, "message_count")
                    rows.append(
                        {
                            "vhost": vhost.name,
                            "source": exchange.name,
                            "destination": getattr(destination, "name", str(destination)),
                            "destination_type": "queue" if is_queue else "exchange",
                            "routing_key": binding.routing_key,
                            "arguments": binding.arguments,
                        }
                    )
        return rows

    def on_purge(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        """Drop a queue's ready messages, as Queue.Purge does (replicated alike)."""
        vhost, queue = self._queue(args, "purge")
        count = queue.purge()
        log.info(
            "console: %s purged %s", escaped(user), escaped(f"'{queue.name}' in '{vhost.name}'")
        )
        return {"queue": queue.name, "vhost": vhost.name, "purged": count}

    def on_delete(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        """Delete a queue, as Queue.Delete does, with its if-empty and if-unused conditions."""
        vhost, queue = self._queue(args, "delete")
        count = vhost.delete_queue(
            queue.name, None, bool(args.get("if_unused")), bool(args.get("if_empty"))
        )
        log.info(
            "console: %s deleted %s", escaped(user), escaped(f"'{queue.name}' in '{vhost.name}'")
        )
        return {"queue": queue.name, "vhost": vhost.name, "deleted": True, "messages": count}

    def on_close_connection(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        """Close a client's connection (320 CONNECTION_FORCED with the reason)."""
        name = str(args["name"])
        reason = str(args.get("reason") or "closed by an administrator")
        connection = next((c for c in self.broker.connections if c.peer == name), None)
        if connection is None:
            raise _Refusal("not_found", f"no connection '{name}' on this server")
        if PEERING in getattr(connection.user, "tags", ()):
            raise _Refusal(
                "refused",
                f"'{name}' is the pair's own peering link: it is not closed from the console",
            )
        connection.close_forced(f"CONNECTION_FORCED - {reason}")
        log.info("console: %s closed %s: %s", escaped(user), escaped(name), escaped(reason))
        return {"connection": name, "closed": True, "reason": reason}

    def _queue(self, args: dict[str, Any], command: str) -> tuple[Any, Any]:
        """The named queue, on a server that serves: a PASSIVE's queues are its ACTIVE's
        copy, changed only by the ACTIVE's change stream."""
        self._serving(command)
        vhost_name = str(args.get("vhost", "/"))
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is None:
            raise _Refusal("not_found", f"no vhost '{vhost_name}' on this server")
        return vhost, vhost.get_queue(str(args["queue"]))

    # -- users, vhosts, permissions (access_admin: the API's rules and way) ---------------

    def on_users(self, args: dict[str, Any], user: str) -> list[dict[str, Any]]:
        """Every user a login may be, but the pair's own: where it was made, its tags and
        vhosts."""
        broker = self.broker
        configured = {u.name for u in broker.config.users}
        return [
            {
                "name": found.name,
                "made": "config file" if found.name in configured else "run time",
                "tags": ",".join(found.tags),
                "vhosts": ",".join(found.vhosts),
            }
            for found in sorted(access_admin.known_users(broker), key=lambda u: u.name)
            if not access_admin.is_internal(broker, found.name)
        ]

    def on_user(self, args: dict[str, Any], user: str) -> Any:
        """``add`` (``tags``, ``password`` or ``password_hash``) or ``delete`` a run-time user."""
        action, name = str(args["action"]), str(args["name"])
        self._serving(f"user {action}")
        if action == "add":
            fields = {k: args[k] for k in ("tags", "password", "password_hash") if k in args}
            return self._access(
                user, "made or changed user", name, access_admin.put_user(self.broker, name, fields)
            )
        if action == "delete":
            return self._access(
                user, "deleted user", name, access_admin.delete_user(self.broker, name)
            )
        raise _Refusal("bad_request", f"user {action}: add or delete")

    def on_vhost(self, args: dict[str, Any], user: str) -> Any:
        action, name = str(args["action"]), str(args["name"])
        self._serving(f"vhost {action}")
        if action == "add":
            return self._access(user, "made vhost", name, access_admin.put_vhost(self.broker, name))
        if action == "delete":
            return self._access(
                user, "deleted vhost", name, access_admin.delete_vhost(self.broker, name)
            )
        raise _Refusal("bad_request", f"vhost {action}: add or delete")

    def on_permission(self, args: dict[str, Any], user: str) -> Any:
        action, vhost, name = str(args["action"]), str(args["vhost"]), str(args["user"])
        self._serving(f"permission {action}")
        what = f"'{name}' on vhost '{vhost}'"
        if action == "set":
            change = access_admin.put_permission(self.broker, vhost, name, {})
            return self._access(user, "gave", what, change)
        if action == "clear":
            change = access_admin.delete_permission(self.broker, vhost, name)
            return self._access(user, "took vhost from", what, change)
        raise _Refusal("bad_request", f"permission {action}: set or clear")

    def _access(self, user: str, did: str, what: str, change: Any) -> Any:
        """The change's answer once it is safe (a coroutine: answered when done)."""

        async def run() -> dict[str, Any]:
            try:
                result = await change
            except access_admin.Refused as refused:
                code = {403: "access_refused", 404: "not_found", 503: "failed"}.get(
                    refused.status, "bad_request"
                )
                raise _Refusal(code, str(refused)) from None
            log.info("console: %s %s %s", escaped(user), did, escaped(what))
            return {"done": f"{did} {what}", "result": result}

        return run()

    def _serving(self, command: str) -> None:
        """Refused unless this server serves: a PASSIVE's state is its ACTIVE's."""
        if not self.broker.pair.serving():
            info = self.broker.pair.info()
            state = info.get("state", "not ACTIVE")
            raise _Refusal(
                "not_serving",
                f"{command} refused: this server is {state}; ask the ACTIVE one{the_active(info)}",
            )

    def on_events(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        """Whole event-log lines from byte ``offset`` (the tail if negative) and the next offset."""
        return read_events(
            self.broker.config.event_log_path,
            int(args.get("offset", -1)),
            min(int(args.get("limit", 50)), 1000),
        )


def read_events(path: str, offset: int, limit: int) -> dict[str, Any]:
    """Whole event-log lines of ``path`` from byte ``offset`` (the last ``limit`` if
    negative), at most ``limit`` of them, and the offset after them (the console's
    ``events``, the management API's ``/api/amqha/events``)."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, 2)
            tail = offset < 0 or offset > size
            start = max(0, size - 64 * 1024) if tail else offset
            log.seek(start)
            data = log.read(1024 * 1024)
    except FileNotFoundError:
        return {"events": [], "offset": 0}
    end = data.rfind(b"\n") + 1  # only whole lines; a line being written waits
    lines = data[:end].splitlines()
    if tail:
        if start > 0:
            lines = lines[1:]  # the tail window may begin mid-line
        lines = lines[-limit:]
    else:
        lines = lines[:limit]
        end = sum(len(line) + 1 for line in lines)
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return {"events": events, "offset": start + end}


class _Refusal(Exception):
    """A console command refused, with the code its answer carries."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


def _answer(run: Callable[[], Any]) -> dict[str, Any]:
    """A command's answer: its result, or its error with the console's code."""
    try:
        return {"ok": True, "result": run()}
    except Exception as error:
        return _failure(error)


async def _answer_async(run: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"ok": True, "result": await run()}
    except Exception as error:
        try:
            return _failure(error)
        except Exception:
            log.exception("console: a command failed")
            return {"ok": False, "code": "failed", "error": f"{type(error).__name__}: {error}"}


def _failure(error: Exception) -> dict[str, Any]:
    if isinstance(error, _Refusal | Refused):
        return {"ok": False, "code": error.code, "error": error.text}
    if isinstance(error, ValueError | KeyError | TypeError | OverflowError):
        # OverflowError: int() of a JSON number too large for a float (1e400 is inf).
        return {"ok": False, "code": "bad_request", "error": f"bad request: {error!r}"}
    if isinstance(error, ConsoleRefused):
        return {"ok": False, "code": "refused", "error": str(error)}
    if isinstance(error, exceptions.AMQPError):
        # What a client's own Queue.Purge or Queue.Delete would have been answered.
        return {"ok": False, "code": _amqp_code(error), "error": str(error.args[0])}
    raise error


def _amqp_code(error: exceptions.AMQPError) -> str:
    """The console's code for what a client would have been answered (404, 405, 406...)."""
    return {
        exceptions.AMQPNotFound: "not_found",
        exceptions.AMQPResourceLocked: "locked",
        exceptions.AMQPPreconditionFailed: "precondition_failed",
        exceptions.AMQPAccessRefused: "not_authorised",
    }.get(type(error), "refused")
