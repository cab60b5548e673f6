"""The pair's console commands, the controller's side: recover, promote, controller.

Owns: what ``amqha console`` asks of the pair through the broker's ``gate.Pair.command``:
``recover`` (the failback, run on the ACTIVE backup), ``promote`` (``--force``: without
the peer's agreement), ``maintenance`` (``maintenance_rule``), ``controller stop|start``
(a stopped controller neither sends nor hears state); each fed to the machine, answered, refused with ``ConsoleRefused`` and its
reason, and recorded as a ``console`` event (docs/operations.md, docs/failover.md).
``FailoverController`` inherits it.

Must not know: how the machine decides (``fsm``), who may run a command (the console
service checks it), the console's words.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqha.gate import ConsoleRefused

from . import fsm

if TYPE_CHECKING:
    from .heartbeat import Heartbeat


class PairCommands:
    """Mixed into ``FailoverController``, whose machine, heartbeat and records it uses."""

    machine: fsm.Machine
    loop: asyncio.AbstractEventLoop
    heartbeat: Heartbeat
    running: bool

    def apply(self, outcome: fsm.Outcome) -> fsm.Decision | None:
        raise NotImplementedError

    def _write(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def init_pair_commands(self) -> None:
        self._commands: dict[str, Callable[[dict[str, Any], str], Any]] = {
            "recover": self._command_recover,
            "promote": self._command_promote,
            "controller": self._command_controller,
            "switchover": self._command_switchover,  # type: ignore[attr-defined]
            "maintenance": self._command_maintenance,  # type: ignore[attr-defined]
        }

    def command(self, name: str, args: dict[str, Any], user: str) -> Any:
        handler = self._commands.get(name)
        if handler is None:
            raise ConsoleRefused(f"unknown pair command {name!r}")
        return handler(args, user)

    def _command_recover(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        """The failback, run on the ACTIVE backup."""
        decision = self.apply(fsm.step(self.machine, fsm.Event.MANUAL_RECOVER, self.loop.time()))
        ok = isinstance(decision, fsm.Accept)
        result = "handed over to the primary" if ok else getattr(decision, "reason", "refused")
        self._write("console", user=user, command="recover", result=result)
        if not ok:
            raise ConsoleRefused(f"recover refused: {result}")
        return {"result": result, "state": self.machine.state.value}

    def _command_promote(self, args: dict[str, Any], user: str) -> dict[str, Any]:
        force = bool(args.get("force"))
        event = fsm.Event.FORCE_PROMOTE if force else fsm.Event.PROMOTE
        command = "promote --force" if force else "promote"
        before = self.machine
        decision = self.apply(fsm.step(before, event, self.loop.time()))
        if not isinstance(decision, fsm.Accept):
            reason = getattr(decision, "reason", "refused")
            self._write("console", user=user, command=command, result=f"refused: {reason}")
            raise ConsoleRefused(f"promote refused: {reason}")
        peer = before.peer
        warning = (
            f"every message {peer.name if peer else 'the peer'} confirmed is here (this "
            "server was in sync)"
            if before.in_sync and before.state is fsm.State.PASSIVE
            else f"messages queued on {peer.name if peer else 'the peer'} may not be here: "
            "they come back only if that server rejoins with its queues"
        )
        result = f"{self.machine.name} is ACTIVE in epoch {self.machine.epoch}; {warning}"
        self._write("console", user=user, command=command, result=result)
        self._promoted_out_of_maintenance(user)  # type: ignore[attr-defined]
        return {"result": result, "state": self.machine.state.value}

    def _command_controller(self, args: dict[str, Any], user: str) -> str:
        """``controller stop|start``: a stopped controller neither sends nor hears state."""
        action = args.get("action")
        if action not in ("stop", "start"):
            raise ConsoleRefused("controller takes 'stop' or 'start'")
        running = action == "start"
        if running == self.running:
            result = f"controller already {'running' if running else 'stopped'}"
        else:
            self.running = running
            self.heartbeat.running = running
            if running:
                self.heartbeat.poke()
            result = f"controller {'started' if running else 'stopped'}"
        self._write("console", user=user, command=f"controller {action}", result=result)
        return result
