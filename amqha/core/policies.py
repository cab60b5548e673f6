"""Policies: RabbitMQ's way of setting a queue's TTLs, length limits, overflow,
dead-lettering and delivery limit by a name pattern rather than by its arguments
(docs/operations.md, "Policies").

Owns: the ``PolicySet`` and ``PolicyDeleted`` changes applied to a vhost's ``Policies``
(its policies and its operator policies); the check of a policy as RabbitMQ 3.10 checks
it (its keys for queues; mirroring keys accepted and ignored, since the pair replicates
every durable queue; an operator policy only the keys that cap); which policy and which
operator policy apply to a queue (the highest priority among those whose pattern matches
the queue's name and whose ``apply-to`` takes it; between equals, the last by name); and
the queue's effective arguments: its own merged with the policy's (the lower number of
the two for TTLs, expiry, lengths and the delivery limit, the queue's own for overflow
and dead-lettering) and capped by the operator policy's (the lower number). A queue the
server keeps for itself (a hidden queue) takes no policy.

Must not know: the loop, the store, how an operator asks for a policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .arguments import OVERFLOW_MODES, QueueArgumentError, queue_type
from .changes import PolicyDeleted, PolicySet
from .reserved import CONTROL_EXCHANGES, HIDDEN

if TYPE_CHECKING:
    from .queue import Queue

# A policy key and the queue argument it stands for.
KEYS = {
    "message-ttl": "x-message-ttl",
    "expires": "x-expires",
    "max-length": "x-max-length",
    "max-length-bytes": "x-max-length-bytes",
    "overflow": "x-overflow",
    "dead-letter-exchange": "x-dead-letter-exchange",
    "dead-letter-routing-key": "x-dead-letter-routing-key",
    "delivery-limit": "x-delivery-limit",
}
# Where a queue's argument and a policy both say, the lower number wins; for the other
# keys the queue's argument wins. An operator policy caps these only.
LOWER_WINS = frozenset(
    {"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit"}
)
OPERATOR_KEYS = LOWER_WINS
# Accepted and ignored: mirroring (the pair replicates every durable queue), queue modes
# and locators, quorum memory limits (every message is in memory here).
IGNORED = frozenset(
    {
        "ha-mode",
        "ha-params",
        "ha-sync-mode",
        "ha-sync-batch-size",
        "ha-promote-on-shutdown",
        "ha-promote-on-failure",
        "queue-mode",
        "queue-version",
        "queue-master-locator",
        "queue-leader-locator",
        "max-in-memory-length",
        "max-in-memory-bytes",
    }
)
APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues")
MAX_PATTERN = 255  # bytes


class PolicyError(ValueError):
    """A policy refused: ``status`` 400, or 403 for one that names the control plane."""

    def __init__(self, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.status = status


def check(policy: PolicySet) -> list[str]:
    """Refuse a policy RabbitMQ would refuse (``PolicyError``); the warnings for the keys
    accepted and ignored."""
    what = f"{'operator policy' if policy.operator else 'policy'} '{policy.name}'"
    if not policy.name or len(policy.name.encode("utf-8", "surrogateescape")) > 255:
        raise PolicyError(f"{what}: a name is 1 to 255 bytes")
    if len(policy.pattern.encode("utf-8", "surrogateescape")) > MAX_PATTERN:
        raise PolicyError(f"{what}: the pattern is longer than {MAX_PATTERN} bytes")
    try:
        re.compile(policy.pattern)
    except re.error as error:
        raise PolicyError(
            f"{what}: pattern {policy.pattern!r} is not a regular expression: {error}"
        ) from None
    if policy.apply_to not in APPLY_TO:
        raise PolicyError(
            f"{what}: apply-to '{policy.apply_to}' is not one of {', '.join(APPLY_TO)}"
        )
    if isinstance(policy.priority, bool) or not isinstance(policy.priority, int):
        raise PolicyError(f"{what}: priority must be an integer")
    if not policy.definition:
        raise PolicyError(f"{what}: the definition is empty")
    warnings = []
    for key, value in policy.definition.items():
        if key in IGNORED:
            warnings.append(
                f"{what}: '{key}' has no effect here (the pair replicates every durable queue)"
            )
            continue
        if key not in KEYS:
            raise PolicyError(f"{what}: '{key}' is not recognised (amqha takes {', '.join(KEYS)})")
        if policy.operator and key not in OPERATOR_KEYS:
            raise PolicyError(f"{what}: '{key}' is not allowed in an operator policy")
        if key in LOWER_WINS:
            least = 1 if key == "expires" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise PolicyError(
                    f"{what}: '{key}' must be an integer of at least {least}, got {value!r}"
                )
        elif not isinstance(value, str):
            raise PolicyError(f"{what}: '{key}' must be a string, got {value!r}")
        elif key == "overflow" and value not in OVERFLOW_MODES:
            raise PolicyError(
                f"{what}: overflow '{value}' is not one of {', '.join(OVERFLOW_MODES)}"
            )
        elif key == "dead-letter-exchange" and (
            value in CONTROL_EXCHANGES or value.startswith("amq.")
        ):
            raise PolicyError(f"{what}: dead-letter-exchange '{value}' is a reserved exchange", 403)
    return warnings


def _takes(policy: PolicySet, kind: str) -> bool:
    return policy.apply_to in ("all", "queues") or policy.apply_to == f"{kind}_queues"


def _pick(policies: dict[str, PolicySet], name: str, kind: str) -> PolicySet | None:
    best = None
    for key in sorted(policies):
        policy = policies[key]
        if (
            _takes(policy, kind)
            and re.search(policy.pattern, name)
            and (best is None or policy.priority >= best.priority)
        ):
            best = policy
    return best


class Policies:
    """A vhost's policies and operator policies, by name."""

    __slots__ = ("user", "operator")

    def __init__(self) -> None:
        self.user: dict[str, PolicySet] = {}
        self.operator: dict[str, PolicySet] = {}

    def apply(self, change: PolicySet | PolicyDeleted) -> None:
        table = self.operator if change.operator else self.user
        if type(change) is PolicySet:
            table[change.name] = change
        else:
            table.pop(change.name, None)

    def clear(self) -> None:
        self.user.clear()
        self.operator.clear()

    def changes(self) -> Iterator[PolicySet]:
        """Every policy as its change (a snapshot's), by name."""
        for table in (self.user, self.operator):
            for name in sorted(table):
                yield table[name]

    def effective(self, queue: Queue) -> tuple[dict[str, Any], PolicySet | None, PolicySet | None]:
        """The queue's arguments with the policies that apply to it, and those policies."""
        kind = queue_type(queue.arguments)
        policy = _pick(self.user, queue.name, kind) if self.user else None
        operator = _pick(self.operator, queue.name, kind) if self.operator else None
        arguments = dict(queue.arguments)
        for source in (policy, operator):
            if source is None:
                continue
            for key, value in source.definition.items():
                argument = KEYS.get(key)
                if argument is None:
                    continue
                have = arguments.get(argument)
                if have is None or (key in LOWER_WINS and _lower(value, have)):
                    arguments[argument] = value
        if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
            del arguments["x-dead-letter-routing-key"]  # a policy's key without an exchange
        return arguments, policy, operator

    def refresh(self, queue: Queue) -> bool:
        """Give ``queue`` the limits its arguments and the policies make; whether they
        changed. Arguments the queue's own would refuse leave its limits as they were."""
        limits = queue.limits
        if not self.user and not self.operator and limits.effective is queue.arguments:
            return False  # no policy, none before: the queue's own arguments (the common case)
        if queue.arguments.get(HIDDEN) is True:
            return False  # the server's own queue
        arguments, policy, operator = self.effective(queue)
        policy_name = policy.name if policy is not None else None
        operator_name = operator.name if operator is not None else None
        if (arguments, policy_name, operator_name) == (
            limits.effective,
            limits.policy,
            limits.operator_policy,
        ):
            return False
        try:
            queue.set_effective(arguments, policy_name, operator_name)
        except QueueArgumentError:
            return False
        return True


def _lower(value: Any, have: Any) -> bool:
    return isinstance(have, int) and not isinstance(have, bool) and value < have


def change(vhost: Any, change: PolicySet | PolicyDeleted, serving: bool = False) -> None:
    """Apply a policy change to ``vhost``: every queue's limits follow it, and a vhost
    that logs emits the change first. On a server that serves (``serving``: an operator
    set the policy there) new length limits apply at once to the messages its queues
    hold, as a publish would, and their timers are told; elsewhere (a PASSIVE, a
    restart) only the limits are set: what the ACTIVE dropped comes as its own changes."""
    log = vhost.log
    if log is not None:
        log.emit(change, True)
    policies: Policies = vhost.policies
    policies.apply(change)
    for queue in list(vhost.queues.values()):
        if policies.refresh(queue) and serving:
            queue.enforce_limits()
            if queue.on_due_changed is not None:
                queue.on_due_changed(queue)
