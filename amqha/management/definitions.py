"""Definitions: RabbitMQ's definitions.json, exported from and imported into amqha.

Owns: the export (users with RabbitMQ password hashes, vhosts, permissions, exchanges,
queues, bindings) and the import: a file is checked whole before anything of it is
applied, first alone (``plan_import``: pure, run off the event loop, since a password
hash it carries may cost scrypt), then against what the broker holds
(``check_against``: every declare equivalent to what exists, every binding's ends there
or in the file, every vhost's queue limit kept), then its vhosts, exchanges, queues and
bindings are declared through the model (durable ones reach the store and the PASSIVE
as any declare does). A file that would fail any of it changes nothing.

Users: a user of the config files must match them (tags, a password that matches the
file's hash), else the import is refused naming them; a user they do not have is made at
run time (``core.access``: replicated, so it logs in after a failover), as are the
file's vhosts and the permissions the config does not give (``Plan.users``,
``Plan.grants``). Permissions give full rights: a file that gives narrower ones is
refused rather than widened (docs/operations.md, "Management API").

Never importable, whatever the file says (docs/security.md): the pair's own users (tagged
``peering``, or ``failover.peer_user``), the control plane (the control exchanges of
``core.reserved.CONTROL_EXCHANGES``, any ``amq.`` name, bindings to or from them): 403; a
vhost name with a control character (``config.vhostnames``): 400.

Must not know: HTTP, sockets, the clock (``now`` is given).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pamqp import exceptions

from config.passwords import BadHash, hash_password, parse_hash
from config.vhostnames import vhost_name_problem

from .. import access_admin
from ..core import policies
from ..core.arguments import QueueArgumentError
from ..core.changes import PermissionSet, PolicySet, UserSet, VhostSet
from ..core.kinds import new_queue
from ..core.reserved import ALTERNATE_EXCHANGE, CONTROL_EXCHANGES, STANDARD_EXCHANGES
from ..core.routing import arguments_size
from ..wire import decode_field_table, field_table
from . import access, shapes

if TYPE_CHECKING:
    from ..host import DefinitionsHost

ALGORITHMS = access_admin.ALGORITHMS
FULL = ".*"
# The control plane's exchanges: the model's own list, so a new one is refused here too.
CONTROL = frozenset(CONTROL_EXCHANGES)
_OBJECT_KEYS = ("users", "vhosts", "permissions", "queues", "exchanges", "bindings")
# Keys a RabbitMQ export has that amqha has nothing for: accepted when empty.
_EMPTY_OK = ("topic_permissions", "parameters", "global_parameters")
# Global parameters every RabbitMQ export has, meaningless here: left out of an import.
_IGNORED = ("internal_cluster_id",)


class Refused(Exception):
    """The file cannot be imported; ``status`` 400 (what it says) or 403 (what it may not
    touch)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# -- export -------------------------------------------------------------------------------


def hashing_algorithm(user: Any) -> str:
    if user.password_hash is None:
        return ALGORITHMS["rabbitmq-sha256"]
    return ALGORITHMS.get(parse_hash(user.password_hash).scheme, "unknown")


def _user_hash(user: Any) -> str:
    """A RabbitMQ hash for a plain password (a fresh salt each export), the stored one
    otherwise (an scrypt hash is amqha's own: RabbitMQ cannot read it)."""
    if user.password_hash is not None:
        return str(user.password_hash)
    return hash_password(user.password, "rabbitmq-sha256")


def export(users: Iterable[Any], vhosts: Iterable[Any]) -> dict[str, Any]:
    from .. import __version__

    users = [u for u in users if not access.is_internal_user(u)]
    vhosts = sorted(vhosts, key=lambda v: v.name)
    queues, exchanges, bindings = [], [], []
    for vhost in vhosts:
        for queue in sorted(vhost.visible_queues(), key=lambda q: q.name):
            if queue.exclusive_owner is not None or queue.name.startswith("amq."):
                continue
            queues.append(
                {
                    "name": queue.name,
                    "vhost": vhost.name,
                    "durable": queue.durable,
                    "auto_delete": queue.auto_delete,
                    "arguments": shapes._jsonable(dict(queue.arguments)),
                }
            )
        for exchange in sorted(shapes.visible_exchanges(vhost), key=lambda e: e.name):
            if exchange.name == "" or exchange.name.startswith("amq."):
                continue
            exchanges.append(
                {
                    "name": exchange.name,
                    "vhost": vhost.name,
                    "type": exchange.kind,
                    "durable": exchange.durable,
                    "auto_delete": exchange.auto_delete,
                    "internal": exchange.internal,
                    "arguments": shapes._jsonable(dict(exchange.arguments)),
                }
            )
        for binding in shapes.bindings_of(vhost):
            if binding["source"] == "":
                continue
            if binding["destination_type"] == "queue":
                queue = vhost.queues.get(binding["destination"])
                if queue is None or queue.exclusive_owner is not None:
                    continue
            binding.pop("properties_key")
            bindings.append(binding)
    return {
        "rabbit_version": shapes.MANAGEMENT_VERSION,
        "rabbitmq_version": shapes.MANAGEMENT_VERSION,
        "product_name": "amqha",
        "product_version": __version__,
        "users": [
            {
                "name": u.name,
                "password_hash": _user_hash(u),
                "hashing_algorithm": hashing_algorithm(u),
                "tags": list(u.tags),
                "limits": {},
            }
            for u in users
        ],
        "vhosts": [
            {"name": v.name, "limits": [], "metadata": {"description": "", "tags": []}}
            for v in vhosts
        ],
        "permissions": [
            {"user": u.name, "vhost": v, "configure": FULL, "write": FULL, "read": FULL}
            for u in users
            for v in u.vhosts
        ],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [
            shapes.policy_shape(p)
            for v in vhosts
            if v.name
            for p in v.policies.changes()
            if not p.operator
        ],
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


# -- import -------------------------------------------------------------------------------


@dataclass
class Plan:
    vhosts: list[str] = field(default_factory=list)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] = field(default_factory=list)
    bindings: list[dict[str, Any]] = field(default_factory=list)
    users_checked: int = 0
    # Users not in the config files, made at run time, and the (vhost, user) permissions
    # the config does not give (``core.access``).
    users: list[UserSet] = field(default_factory=list)
    grants: list[tuple[str, str]] = field(default_factory=list)
    policies: list[PolicySet] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.vhosts)} vhosts, {len(self.exchanges)} exchanges, "
            f"{len(self.queues)} queues, {len(self.bindings)} bindings, "
            f"{self.users_checked - len(self.users)} users matching the config, "
            f"{len(self.users)} users and {len(self.grants)} permissions made at run time, "
            f"{len(self.policies)} policies"
        )


def _list(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = body.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise Refused(f"{key}: expected a list of objects")
    return items


def _text(item: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    """A string of at most 255 bytes: every name and key here is an AMQP shortstr."""
    value = item.get(key, default)
    if not isinstance(value, str):
        raise Refused(f"{where}: '{key}' must be a string, got {value!r}"[:300])
    if len(value.encode("utf-8", "surrogateescape")) > 255:
        raise Refused(f"{where}: '{key}' is longer than 255 bytes")
    return value


def _vhost(item: dict[str, Any], key: str, where: str, default: str | None = "/") -> str:
    name = _text(item, key, where, default)
    problem = vhost_name_problem(name)
    if problem is not None:
        raise Refused(f"{where}: '{key}': {problem}")
    return name


def _flag(item: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise Refused(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


def _arguments(item: dict[str, Any], where: str) -> dict[str, Any]:
    """The arguments, if they make an AMQP field table that reads back the same (what
    the store and the replication link write): no integer beyond 64 bits, no NaN, no
    key over 255 bytes."""
    value = item.get("arguments") or {}
    if not isinstance(value, dict):
        raise Refused(f"{where}: 'arguments' must be an object")
    try:
        same = decode_field_table(field_table(value)) == value
    except (ValueError, TypeError, OverflowError, struct.error) as error:
        raise Refused(f"{where}: 'arguments' are not an AMQP field table: {error}") from None
    if not same:
        raise Refused(f"{where}: 'arguments' do not read back the same as an AMQP field table")
    for key in ("alternate-exchange", "x-dead-letter-exchange"):
        if key in value and not isinstance(value[key], str):
            raise Refused(f"{where}: argument '{key}' must be an exchange name")
    return value


def _tags(item: dict[str, Any], where: str) -> set[str]:
    value = item.get("tags", [])
    if isinstance(value, str):  # RabbitMQ before 3.9 wrote "administrator,management"
        return {t.strip() for t in value.split(",") if t.strip()}
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise Refused(f"{where}: 'tags' must be a list of strings")
    return set(value)


def _password_matches(configured: Any, given_hash: str) -> bool:
    if configured.password_hash is not None and configured.password_hash == given_hash:
        return True
    verifier = parse_hash(given_hash)  # BadHash: the caller names it
    # A RabbitMQ hash of the configured plain password: the same salt gives the same hash.
    return configured.password is not None and verifier.check(configured.password)


def _check_users(body: dict[str, Any], config: Any, plan: Plan) -> int:
    configured = {u.name: u for u in config.users}
    internal = {u.name for u in config.users if access.is_internal_user(u)}
    if config.failover.peer is not None:
        internal.add(config.failover.peer_user)
    problems: list[str] = []
    seen: set[str] = set()
    for index, item in enumerate(_list(body, "users")):
        where = f"users[{index}]"
        name = _text(item, "name", where)
        if name in seen:
            # Each entry may cost a password check: one per configured user at most.
            raise Refused(f"{where}: user '{name}' is listed twice")
        seen.add(name)
        tags = _tags(item, where)
        if name in internal or access.INTERNAL_TAG in tags:
            raise Refused(
                f"{where}: user '{name}' is the pair's own login (tag 'peering'): "
                "definitions cannot create or change it",
                403,
            )
        user = configured.get(name)
        if user is None:
            plan.users.append(_runtime_user(item, name, tags, where))
            continue
        if tags != set(user.tags):
            problems.append(
                f"'{name}' has tags {sorted(tags)} in the file, {sorted(user.tags)} in the config"
            )
        given = item.get("password_hash")
        try:
            matches = given in (None, "") or _password_matches(user, str(given))
        except BadHash as error:
            problems.append(f"'{name}': its password_hash is refused: {error}")
            continue
        if not matches:
            problems.append(f"'{name}' has another password in the config")
    if problems:
        raise Refused(
            "these users are in the config files of both servers (read-only at run time), "
            "and the file differs: " + "; ".join(problems)
        )
    made = {u.name for u in plan.users}
    for index, item in enumerate(_list(body, "permissions")):
        where = f"permissions[{index}]"
        name, vhost = _text(item, "user", where), _vhost(item, "vhost", where, None)
        if name in internal:
            raise Refused(f"{where}: user '{name}' is the pair's own login", 403)
        user = configured.get(name)
        if user is None and name not in made:
            raise Refused(
                f"{where}: user '{name}' is neither in the config files nor in the file's users"
            )
        if user is None or vhost not in user.vhosts:
            # Given at run time (``core.access``): the user, or the vhost, is not the
            # config's (checked against the broker's users and vhosts before it applies).
            plan.grants.append((vhost, name))
        for key in ("configure", "write", "read"):
            if item.get(key, FULL) != FULL:
                raise Refused(
                    f"{where}: {key} '{item.get(key)}': amqha gives a user full rights on the "
                    "vhosts of its config entry, no narrower"
                )
    return len(_list(body, "users"))


def _runtime_user(item: dict[str, Any], name: str, tags: set[str], where: str) -> UserSet:
    """A user of the file that is not the config's, to make at run time under the rules
    of the user routes (``access_admin``): its RabbitMQ (or scrypt) hash as given, never
    the peering or federation tag."""
    try:
        access_admin.checked_name(name)
        access_admin.ungranted(name, tags)
        given = access_admin.checked_hash(
            name, item.get("password_hash"), item.get("hashing_algorithm")
        )
    except access_admin.Refused as refused:
        raise Refused(f"{where}: {refused}", refused.status) from None
    return UserSet(name, given, tuple(sorted(tags)))


def _policy(item: dict[str, Any], where: str) -> PolicySet:
    """A policy of the file, checked as the policy routes check one (``core.policies``)."""
    priority = item.get("priority", 0)
    definition = item.get("definition")
    if not isinstance(definition, dict):
        raise Refused(f"{where}: 'definition' must be an object")
    policy = PolicySet(
        _vhost(item, "vhost", where),
        _text(item, "name", where),
        _text(item, "pattern", where),
        _text(item, "apply-to", where, "all"),
        priority,
        definition,
        False,
    )
    try:
        policies.check(policy)
    except policies.PolicyError as error:
        raise Refused(f"{where}: {error}", error.status) from None
    return policy


def _refuse_control(name: str, where: str) -> None:
    if name.startswith("amq."):
        raise Refused(
            f"{where}: '{name}' is a reserved name (amq.): the server's own objects and the "
            "pair's control plane are not declared by an import or the API",
            403,
        )


def plan_import(body: Any, config: Any) -> Plan:
    """Everything a file would change, checked before any of it is applied."""
    if not isinstance(body, dict):
        raise Refused("expected a JSON object (a definitions file)")
    for key in _EMPTY_OK:
        items = body.get(key) or []
        if key == "global_parameters" and isinstance(items, list):
            # Every RabbitMQ export names its cluster: nothing to carry over.
            items = [i for i in items if not (isinstance(i, dict) and i.get("name") in _IGNORED)]
        if items:
            raise Refused(f"{key}: amqha has none; remove them from the file")
    plan = Plan()
    plan.users_checked = _check_users(body, config, plan)
    for index, item in enumerate(_list(body, "vhosts")):
        plan.vhosts.append(_vhost(item, "name", f"vhosts[{index}]", None))
    for index, item in enumerate(_list(body, "policies")):
        plan.policies.append(_policy(item, f"policies[{index}]"))
    for index, item in enumerate(_list(body, "exchanges")):
        where = f"exchanges[{index}]"
        name = _text(item, "name", where)
        if not name:
            raise Refused(f"{where}: the default exchange cannot be declared", 403)
        _refuse_control(name, where)
        kind = _text(item, "type", where)
        if kind not in ("direct", "fanout", "topic", "headers"):
            raise Refused(f"{where}: unknown exchange type '{kind}'")
        arguments = _arguments(item, where)
        alternate = arguments.get("alternate-exchange")
        if alternate in CONTROL:
            raise Refused(f"{where}: alternate-exchange '{alternate}' is the control plane", 403)
        plan.exchanges.append(
            {
                "vhost": _vhost(item, "vhost", where),
                "name": name,
                "kind": kind,
                "durable": _flag(item, "durable", where, True),
                "auto_delete": _flag(item, "auto_delete", where, False),
                "internal": _flag(item, "internal", where, False),
                "arguments": arguments,
            }
        )
    for index, item in enumerate(_list(body, "queues")):
        where = f"queues[{index}]"
        name = _text(item, "name", where)
        if not name:
            raise Refused(f"{where}: a queue needs a name")
        _refuse_control(name, where)
        arguments = _arguments(item, where)
        dlx = arguments.get("x-dead-letter-exchange")
        if dlx in CONTROL:
            raise Refused(f"{where}: x-dead-letter-exchange '{dlx}' is the control plane", 403)
        plan.queues.append(
            {
                "vhost": _vhost(item, "vhost", where),
                "name": name,
                "durable": _flag(item, "durable", where, True),
                "auto_delete": _flag(item, "auto_delete", where, False),
                "arguments": arguments,
            }
        )
    for index, item in enumerate(_list(body, "bindings")):
        where = f"bindings[{index}]"
        source = _text(item, "source", where)
        destination = _text(item, "destination", where)
        kind = _text(item, "destination_type", where, "queue")
        if kind not in ("queue", "exchange"):
            raise Refused(f"{where}: destination_type must be 'queue' or 'exchange'")
        # From amq.direct and the other standard exchanges, as RabbitMQ's exports have them;
        # never to or from the control plane, never to an amq. queue (amq.replication).
        for name in (source, destination):
            if name in CONTROL:
                raise Refused(f"{where}: '{name}' belongs to the control plane", 403)
        if kind == "queue" and destination.startswith("amq."):
            raise Refused(f"{where}: queue '{destination}' is a reserved name (amq.)", 403)
        if source == "":
            continue  # the default exchange's bindings are implicit
        plan.bindings.append(
            {
                "vhost": _vhost(item, "vhost", where),
                "source": source,
                "destination": destination,
                "kind": kind,
                "routing_key": _text(item, "routing_key", where, ""),
                "arguments": _arguments(item, where),
            }
        )
    return plan


_STANDARD = frozenset(name for name, _ in STANDARD_EXCHANGES)


def check_against(plan: Plan, vhosts: Mapping[str, Any], config: Any) -> None:
    """Refused if applying ``plan`` to these vhosts would stop part way: a declare not
    equivalent to what exists (or to an earlier entry of the file), a binding whose
    source or destination is neither there nor in the file, arguments past
    ``limits.max_arguments_size``, more queues in a vhost than ``limits.vhost.max_queues``.
    Reads the model only (run it on the loop, right before ``apply``)."""
    limit = config.limits.vhost.max_queues
    max_size = config.limits.max_arguments_size
    for vhost, name in plan.grants:
        if vhost not in vhosts and vhost not in plan.vhosts:
            raise Refused(f"permission of user '{name}': vhost '{vhost}' does not exist")
    for policy in plan.policies:
        if policy.vhost not in vhosts and policy.vhost not in plan.vhosts:
            raise Refused(f"policy '{policy.name}': vhost '{policy.vhost}' does not exist")
    exchanges: dict[tuple[str, str], dict[str, Any]] = {}
    for item in plan.exchanges:
        key = (item["vhost"], item["name"])
        where = f"exchange '{item['name']}' in vhost '{item['vhost']}'"
        _check_size(item["arguments"], max_size, where)
        vhost = vhosts.get(item["vhost"])
        existing = vhost.exchanges.get(item["name"]) if vhost is not None else None
        if existing is not None:
            have = {
                "type": existing.kind,
                "durable": existing.durable,
                "auto_delete": existing.auto_delete,
                "internal": existing.internal,
                ALTERNATE_EXCHANGE: existing.arguments.get(ALTERNATE_EXCHANGE),
            }
            _same(have, _exchange_fields(item), where, "exists with")
        elif key in exchanges:
            _same(_exchange_fields(exchanges[key]), _exchange_fields(item), where, "is earlier")
        exchanges.setdefault(key, item)
    queues: dict[tuple[str, str], dict[str, Any]] = {}
    new: dict[str, int] = {}
    for item in plan.queues:
        key = (item["vhost"], item["name"])
        where = f"queue '{item['name']}' in vhost '{item['vhost']}'"
        _check_size(item["arguments"], max_size, where)
        vhost = vhosts.get(item["vhost"])
        existing = vhost.queues.get(item["name"]) if vhost is not None else None
        if vhost is not None and existing is not None:
            if item["name"] in vhost.hidden or existing.exclusive_owner is not None:
                raise Refused(f"{where} is held by the server or a connection (exclusive)", 403)
            have = {"durable": existing.durable, "auto_delete": existing.auto_delete}
            have.update(_x_arguments(existing.arguments))
            _same(have, _queue_fields(item), where, "exists with")
        elif key in queues:
            _same(_queue_fields(queues[key]), _queue_fields(item), where, "is earlier")
        else:
            try:
                # A throwaway queue: its arguments are checked as a declare checks them.
                new_queue(
                    item["name"], item["durable"], None, item["auto_delete"], item["arguments"]
                )
            except QueueArgumentError as error:
                raise Refused(f"{where}: {error}") from None
            new[item["vhost"]] = new.get(item["vhost"], 0) + 1
        queues.setdefault(key, item)
    for name, count in sorted(new.items()):
        vhost = vhosts.get(name)
        held = len(vhost.queues) if vhost is not None else 0
        if limit and held + count > limit:
            raise Refused(
                f"the file would make {count} new queues in vhost '{name}', which holds {held}: "
                f"more than its queue limit (limits.vhost.max_queues: {limit}); nothing was "
                "imported"
            )
    for item in plan.bindings:
        where = (
            f"binding of '{item['destination']}' to '{item['source']}' in vhost '{item['vhost']}'"
        )
        _check_size(item["arguments"], max_size, where)
        vhost = vhosts.get(item["vhost"])
        if not _exchange_there(item["source"], item["vhost"], vhost, exchanges):
            raise Refused(f"{where}: no exchange '{item['source']}' there or in the file")
        destination = item["destination"]
        if item["kind"] == "exchange":
            if not _exchange_there(destination, item["vhost"], vhost, exchanges):
                raise Refused(f"{where}: no exchange '{destination}' there or in the file")
            continue
        if (item["vhost"], destination) in queues:
            continue
        queue = vhost.queues.get(destination) if vhost is not None else None
        if vhost is None or queue is None:
            raise Refused(f"{where}: no queue '{destination}' there or in the file")
        if destination in vhost.hidden or queue.exclusive_owner is not None:
            raise Refused(
                f"{where}: queue '{destination}' is held by the server or a connection", 403
            )


def _exchange_there(name: str, vhost_name: str, vhost: Any, exchanges: Mapping[Any, Any]) -> bool:
    if name in _STANDARD or (vhost_name, name) in exchanges:
        return True
    return vhost is not None and name in vhost.exchanges


def _exchange_fields(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": item["kind"],
        "durable": item["durable"],
        "auto_delete": item["auto_delete"],
        "internal": item["internal"],
        ALTERNATE_EXCHANGE: item["arguments"].get(ALTERNATE_EXCHANGE),
    }


def _queue_fields(item: dict[str, Any]) -> dict[str, Any]:
    fields = {"durable": item["durable"], "auto_delete": item["auto_delete"]}
    fields.update(_x_arguments(item["arguments"]))
    return fields


def _x_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a redeclare must repeat (as ``VHost.declare_queue`` compares them);
    an absent x-queue-type is 'classic'."""
    found = {key: value for key, value in arguments.items() if key.startswith("x-")}
    kind = found.get("x-queue-type", "classic")
    found["x-queue-type"] = kind.decode(errors="replace") if isinstance(kind, bytes) else kind
    return found


def _same(have: dict[str, Any], want: dict[str, Any], where: str, what: str) -> None:
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            raise Refused(
                f"{where} {what} {key} {have.get(key)!r}, the file says {want.get(key)!r} "
                "(inequivalent): nothing was imported"
            )


def _check_size(arguments: dict[str, Any], limit: int, where: str) -> None:
    size = arguments_size(arguments) if arguments else 0
    if limit and size > limit:
        raise Refused(
            f"{where}: the arguments count {size} bytes, more than "
            f"limits.max_arguments_size ({limit})"
        )


def apply(plan: Plan, broker: DefinitionsHost, now: float) -> None:
    """Declare what the plan holds, vhosts first, bindings last. A declare the model
    refuses (an existing queue with other arguments, say) stops the import there, named."""
    step = "vhosts"
    try:
        configured = {v for u in broker.config.users for v in u.vhosts}
        for name in plan.vhosts:
            if name not in configured and name not in broker.access.vhosts:
                broker.record_access(VhostSet(name))  # made at run time: replicated
            broker.vhost(name)
        for user in plan.users:
            broker.record_access(user)
        for vhost, name in plan.grants:
            if (vhost, name) not in broker.access.permissions:
                broker.record_access(PermissionSet(vhost, name))
        for policy in plan.policies:
            step = f"policy '{policy.name}' in vhost '{policy.vhost}'"
            policies.change(broker.vhost(policy.vhost), policy, serving=True)
        for item in plan.exchanges:
            step = f"exchange '{item['name']}' in vhost '{item['vhost']}'"
            broker.vhost(item["vhost"]).declare_exchange(
                item["name"],
                item["kind"],
                durable=item["durable"],
                auto_delete=item["auto_delete"],
                internal=item["internal"],
                arguments=item["arguments"],
            )
        for item in plan.queues:
            step = f"queue '{item['name']}' in vhost '{item['vhost']}'"
            queue = broker.vhost(item["vhost"]).declare_queue(
                item["name"],
                None,
                now,
                durable=item["durable"],
                auto_delete=item["auto_delete"],
                arguments=item["arguments"],
            )
            broker.watch_queue(queue)
        for item in plan.bindings:
            step = f"binding of '{item['destination']}' to '{item['source']}'"
            vhost = broker.vhost(item["vhost"])
            if item["kind"] == "queue":
                vhost.bind_queue(
                    item["destination"],
                    item["source"],
                    item["routing_key"],
                    item["arguments"],
                    None,
                )
            else:
                vhost.bind_exchange(
                    item["destination"], item["source"], item["routing_key"], item["arguments"]
                )
    except exceptions.AMQPError as error:
        status = 403 if isinstance(error, exceptions.AMQPAccessRefused) else 400
        raise Refused(
            f"{step}: {error} (what came before it in the file was imported)", status
        ) from None


def users_as_config(body: Any) -> list[dict[str, Any]]:
    """The users of a definitions file as entries of the config's ``users`` list, with
    their vhosts from the file's permissions (``amqha definitions users``)."""
    if not isinstance(body, dict):
        raise Refused("expected a JSON object (a definitions file)")
    vhosts: dict[str, list[str]] = {}
    for index, item in enumerate(_list(body, "permissions")):
        where = f"permissions[{index}]"
        vhosts.setdefault(_text(item, "user", where), []).append(_text(item, "vhost", where))
    entries = []
    for index, item in enumerate(_list(body, "users")):
        where = f"users[{index}]"
        name = _text(item, "name", where)
        password_hash = _text(item, "password_hash", where, "")
        algorithm = item.get("hashing_algorithm", "rabbit_password_hashing_sha256")
        if algorithm not in ALGORITHMS.values() or not password_hash:
            raise Refused(f"{where}: user '{name}': no usable password hash ({algorithm})")
        try:
            parse_hash(password_hash)
        except BadHash as error:
            raise Refused(f"{where}: user '{name}': {error}") from None
        # Tags amqha does not know (impersonator, say) are left out: the loader refuses them.
        tags = sorted(t for t in _tags(item, where) if t in access.MANAGEMENT_TAGS)
        entry: dict[str, Any] = {
            "name": name,
            "password_hash": password_hash,
            "vhosts": vhosts.get(name, []),
        }
        if tags:
            entry["tags"] = tags
        entries.append(entry)
    return entries
