"""Who may see and do what through the management API, by RabbitMQ's user tags (pure).

Owns: the rules of docs/operations.md ("Management API"), as RabbitMQ's management
plugin applies its tags:

- a user without ``management``, ``policymaker``, ``monitoring`` or ``administrator``
  may not use the API at all (401, as RabbitMQ's "Not management user");
- ``management`` (and ``policymaker``): the vhosts it may use, their queues, exchanges
  and bindings, its own connections, channels and consumers; it may purge and delete the
  queues of its vhosts and close its own connections;
- ``monitoring``: the above, and every vhost, connection and channel, the nodes;
- ``administrator``: everything, definitions and users included.

And what nobody sees or touches through the API, whatever the tags: the pair's control
plane (the control exchanges ``amq.peer`` and ``amq.console``), the users tagged
``peering`` (the pair's own login) and their connections, which carry the heartbeat and
the replication link (docs/security.md, "The control plane").

Must not know: HTTP, the broker's objects beyond a user's name, tags and vhosts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.names import BUFFER_PREFIX

MANAGEMENT_TAGS = frozenset({"management", "policymaker", "monitoring", "administrator"})
MONITOR_TAGS = frozenset({"monitoring", "administrator"})
INTERNAL_TAG = "peering"


def tags_of(user: Any) -> frozenset[str]:
    return frozenset(user.tags)


def may_use_api(user: Any) -> bool:
    """A management tag, and not the pair's own login (a peering user never gets in)."""
    tags = tags_of(user)
    return bool(tags & MANAGEMENT_TAGS) and INTERNAL_TAG not in tags


def is_monitor(user: Any) -> bool:
    return bool(tags_of(user) & MONITOR_TAGS)


def is_admin(user: Any) -> bool:
    return "administrator" in tags_of(user)


def is_internal_user(user: Any) -> bool:
    return INTERNAL_TAG in tags_of(user)


def sees_vhost(user: Any, vhost: str) -> bool:
    """Monitoring and administrator users see every vhost; others the ones they may use."""
    return is_monitor(user) or vhost in user.vhosts


def visible_vhosts(user: Any, vhosts: Iterable[str]) -> list[str]:
    return [name for name in vhosts if sees_vhost(user, name)]


def may_change_queue(user: Any, vhost: str, queue: str = "") -> bool:
    """Purge or delete a queue: an administrator anywhere, any other management user in
    the vhosts it may use (RabbitMQ: configure permission there; amqha's users have full
    permissions on their vhosts). A federation buffer queue (``federation: ...``) holds
    another place's messages: only an administrator (an orphan's cleanup)."""
    if queue.startswith(BUFFER_PREFIX):
        return is_admin(user)
    return is_admin(user) or vhost in user.vhosts


def may_set_policy(user: Any, vhost: str) -> bool:
    """Set or delete a policy (RabbitMQ's rule): an administrator anywhere, a
    ``policymaker`` in the vhosts it may use."""
    return is_admin(user) or ("policymaker" in tags_of(user) and vhost in user.vhosts)


def sees_connection(user: Any, owner: str) -> bool:
    """Monitoring and administrator users see every client connection; others their own."""
    return is_monitor(user) or owner == user.name


def may_close_connection(user: Any, owner: str) -> bool:
    return is_admin(user) or owner == user.name
