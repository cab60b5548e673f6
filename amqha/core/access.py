"""Users, vhosts and permissions made at run time: the replicated part of who may log in
where (docs/security.md, "Users at run time").

Owns: ``Access``, the state the ``UserSet``, ``UserDeleted``, ``VhostSet``,
``VhostDeleted``, ``PermissionSet`` and ``PermissionDeleted`` changes build (the ACTIVE
makes them through the management API, a definitions import or the console; the PASSIVE
and a restart apply them as every other change), its canonical form for a snapshot, and
the rule a change must keep whoever sent it: a run-time user never has the ``peering``
tag. (The config files' users are never made or changed here: the shell refuses their
names, and they take precedence at every login.)

Must not know: passwords and how they are checked (the shell's ``auth``), the store, the
loop, sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .changes import (
    PermissionDeleted,
    PermissionSet,
    UserDeleted,
    UserSet,
    VhostDeleted,
    VhostSet,
)

# The tag of the pair's own login: never given at run time (docs/security.md).
INTERNAL_TAG = "peering"


class Access:
    """The run-time users (by name: their ``UserSet``), vhosts (in the order made) and
    permissions ((vhost, user) pairs). ``version`` grows with every change applied, so a
    shell may tell that a login it remembers may be stale."""

    def __init__(self) -> None:
        self.users: dict[str, UserSet] = {}
        self.vhosts: dict[str, None] = {}
        self.permissions: dict[tuple[str, str], None] = {}
        self.version = 0

    def apply(self, change: Any) -> None:
        """Apply one access change (an unknown user's or vhost's deletion is a no-op, as a
        change applied twice must be)."""
        self.version += 1
        match change:
            case UserSet():
                if INTERNAL_TAG in change.tags:
                    raise ValueError(f"user {change.name!r}: the tag 'peering' is not given")
                self.users[change.name] = change
            case UserDeleted():
                self.users.pop(change.name, None)
                for key in [k for k in self.permissions if k[1] == change.name]:
                    del self.permissions[key]
            case VhostSet():
                self.vhosts[change.vhost] = None
            case VhostDeleted():
                self.vhosts.pop(change.vhost, None)
                for key in [k for k in self.permissions if k[0] == change.vhost]:
                    del self.permissions[key]
            case PermissionSet():
                self.permissions[(change.vhost, change.user)] = None
            case PermissionDeleted():
                self.permissions.pop((change.vhost, change.user), None)
            case _:
                raise ValueError(f"not an access change: {change!r}")

    def reset(self) -> None:
        """A snapshot starts: what follows it says who may log in where."""
        self.users.clear()
        self.vhosts.clear()
        self.permissions.clear()
        self.version += 1

    def vhosts_of(self, user: str) -> list[str]:
        """The vhosts ``user`` was given at run time, in the order given."""
        return [vhost for vhost, name in self.permissions if name == user]

    def changes(self) -> Iterator[Any]:
        """The state as changes, applied after a ``Reset``: vhosts, users, permissions."""
        for vhost in self.vhosts:
            yield VhostSet(vhost)
        yield from self.users.values()
        for vhost, user in self.permissions:
            yield PermissionSet(vhost, user)

    def snapshot(self) -> dict[str, Any]:
        """The canonical form two servers compare (``apply.snapshot``)."""
        return {
            "users": sorted((u.name, u.password_hash, sorted(u.tags)) for u in self.users.values()),
            "vhosts": sorted(self.vhosts),
            "permissions": sorted(self.permissions),
        }
