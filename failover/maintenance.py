"""Which servers of the pair are in maintenance (docs/failover.md, "Maintenance").

Owns: the pair's maintenance view (`View`: the roles in maintenance and a sequence number
that grows with each change), merging the view a peer's state message carries (the higher
sequence wins; on a tie the primary's, so both servers settle on one), the refusals of a
change, and the view's file in the data dir (kept across restarts: a server restarted after
its patch is still in maintenance until an operator says otherwise).

Must not know: how the machine uses the flag (``fsm``), sockets, the console's words.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .epoch import write_durably

MAINTENANCE_FILE = "maintenance.json"
ROLES = ("primary", "backup")


class MaintenanceFileError(ValueError):
    """The maintenance file exists but cannot be read: one line for the operator."""


@dataclass(frozen=True)
class View:
    """The roles in maintenance, and how many changes led here (0: never any)."""

    roles: frozenset[str] = frozenset()
    seq: int = 0

    def changed(self, role: str, on: bool) -> View:
        roles = self.roles | {role} if on else self.roles - {role}
        return View(frozenset(roles), self.seq + 1)

    def merged(self, theirs: View, theirs_is_primary: bool) -> View:
        """Ours or the peer's, whichever is later; on equal counts, the primary's."""
        if theirs.seq > self.seq or (theirs.seq == self.seq and theirs_is_primary):
            return theirs
        return self

    def to_json(self) -> dict[str, Any]:
        return {"on": sorted(self.roles), "seq": self.seq}

    @classmethod
    def from_json(cls, value: Any) -> View:
        """The view a peer sent or a file holds; ValueError naming what is wrong."""
        if not isinstance(value, dict):
            raise ValueError("not a map with 'on' and 'seq'")
        roles, seq = value.get("on"), value.get("seq")
        if not isinstance(roles, list) or any(r not in ROLES for r in roles):
            raise ValueError(f"'on' must list roles among {list(ROLES)}, not {roles!r}")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise ValueError(f"'seq' must be a non-negative integer, not {seq!r}")
        return cls(frozenset(roles), seq)


def refusal(view: View, role: str, on: bool, active: str | None) -> str | None:
    """Why ``role`` cannot be put in (``on``) or out of maintenance now, if it cannot:
    ``active`` is the role of the server known ACTIVE, if any."""
    if role not in ROLES:
        return f"no server {role!r}: name the primary or the backup"
    if not on:
        return None
    other = ROLES[1 - ROLES.index(role)]
    if other in view.roles:
        return f"the {other} is in maintenance: both servers would be"
    if active == role:
        return (
            f"the {role} is ACTIVE: hand the service to the {other} first "
            "(`amqha console switchover`)"
        )
    return None


def load(data_dir: str | os.PathLike[str]) -> View:
    path = Path(data_dir) / MAINTENANCE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return View()
    except (OSError, UnicodeDecodeError) as exc:
        raise MaintenanceFileError(f"{path}: cannot read: {exc}") from exc
    try:
        return View.from_json(json.loads(text))
    except ValueError as exc:
        raise MaintenanceFileError(
            f"{path}: corrupt ({exc}); delete it (no server in maintenance) and set "
            "maintenance again with `amqha console maintenance on SERVER`"
        ) from exc


def store(data_dir: str | os.PathLike[str], view: View) -> None:
    write_durably(data_dir, MAINTENANCE_FILE, json.dumps(view.to_json()) + "\n")
