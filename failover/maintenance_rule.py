"""Maintenance, the controller's side (docs/failover.md, "Maintenance").

Owns: ``amqha console maintenance on|off SERVER`` on either server (refused with the reason:
no such server, the ACTIVE itself, both servers at once), the pair's maintenance view kept
in the data dir and carried by every state message (a peer's later view is adopted), the
machine's ``maintenance`` flag and the peer's, and the ``maintenance`` records (who, on or
off, by a console or from the peer). A forced promotion of a server in maintenance ends it.
``FailoverController`` inherits it.

Must not know: how the machine decides (``fsm``), the console's words, the file's format
(``maintenance``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from amqha.gate import ConsoleRefused
from amqha.logtext import escaped
from config.schema import ServerConfig

from . import fsm, maintenance
from .maintenance import View

if TYPE_CHECKING:
    from .heartbeat import Heartbeat

log = logging.getLogger(__name__)


class MaintenanceRule:
    """Mixed into ``FailoverController``, whose machine, heartbeat and records it uses."""

    machine: fsm.Machine
    config: ServerConfig
    heartbeat: Heartbeat

    def _write(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def init_maintenance(self) -> None:
        self.maintenance = maintenance.load(self.config.data_dir)
        self.machine = replace(self.machine, maintenance=self._in_maintenance(self.machine.role))

    def _in_maintenance(self, role: fsm.Role) -> bool:
        return role.value in self.maintenance.roles

    def _command_maintenance(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        on, server = args.get("on"), args.get("server")
        if not isinstance(on, bool) or not isinstance(server, str):
            raise ConsoleRefused("maintenance takes 'on' or 'off' and a server (primary, backup)")
        role = self._role_named(server)
        now = self.loop.time()  # type: ignore[attr-defined]
        machine = self.machine
        active = None
        if machine.state is fsm.State.ACTIVE:
            active = machine.role.value
        elif machine.peer is not None and machine.peer.state is fsm.State.ACTIVE:
            active = machine.peer.role.value if machine.peer_alive(now) else None
        refusal = maintenance.refusal(self.maintenance, role, on, active)
        if refusal is not None:
            self._write("maintenance", server=role, on=on, user=user, result=f"refused: {refusal}")
            raise ConsoleRefused(f"maintenance refused: {refusal}")
        words = "in maintenance" if on else "out of maintenance"
        if (role in self.maintenance.roles) == on:
            return {"result": f"the {role} is already {words}", "maintenance": self._on()}
        self._adopt(self.maintenance.changed(role, on), by="console", user=user)
        self.heartbeat.poke()  # the peer hears it now, not at the next heartbeat
        return {"result": f"the {role} is {words}", "maintenance": self._on()}

    def _role_named(self, server: str) -> str:
        """A role from its name or a server's configured name."""
        if server in maintenance.ROLES:
            return server
        if server == self.config.name:
            return self.machine.role.value
        peer = self.machine.peer
        if server in (self.config.failover.peer_name, peer.name if peer else None):
            return fsm.peer_role(self.machine)
        raise ConsoleRefused(
            f"maintenance: no server {server!r} in this pair (primary, backup, "
            f"{self.config.name}{', ' + peer.name if peer else ''})"
        )

    def _on(self) -> list[str]:
        return sorted(self.maintenance.roles)

    def _adopt(self, view: View, by: str, user: str | None = None) -> None:
        """Take ``view`` as the pair's: kept on disk first, then the machine's flags."""
        before = self.maintenance
        try:
            maintenance.store(self.config.data_dir, view)
        except OSError as error:
            raise ConsoleRefused(
                f"maintenance: cannot write {maintenance.MAINTENANCE_FILE}: {error}"
            ) from None
        self.maintenance = view
        self.machine = replace(self.machine, maintenance=self._in_maintenance(self.machine.role))
        for role in maintenance.ROLES:
            on = role in view.roles
            if on != (role in before.roles):
                log.warning(
                    "maintenance: the %s is %s (%s%s)",
                    role,
                    "in maintenance" if on else "out of maintenance",
                    by,
                    f" {escaped(user)}" if user else "",
                )
                self._write("maintenance", server=role, on=on, by=by, user=user)

    def _heard_maintenance(self, peer: fsm.PeerInfo, theirs: View | None) -> fsm.PeerInfo:
        """A state message's view: adopted if later than ours; the peer as the pair's view
        says it is (the flag the machine reads)."""
        if theirs is not None:
            merged = self.maintenance.merged(theirs, peer.role is fsm.Role.PRIMARY)
            if merged != self.maintenance:
                try:
                    self._adopt(merged, by="peer")
                except ConsoleRefused as error:
                    log.error("%s", error)
        return replace(peer, maintenance=self._in_maintenance(peer.role))

    def _promoted_out_of_maintenance(self, user: str) -> None:
        """A forced promotion of a server in maintenance: it serves, so it is out of it."""
        if self.machine.state is fsm.State.ACTIVE and self._in_maintenance(self.machine.role):
            self._adopt(self.maintenance.changed(self.machine.role.value, False), "promote", user)
