"""What a channel and its parts share: its states, and the wording of the control-only rule.

Owns: ``OPEN`` and ``CLOSING``, and the refusal a peering or administrator login gets for
touching application state on a server that is not serving (docs/security.md).

Must not know: frames, queues, the broker beyond its pair's state.
"""

from __future__ import annotations

from typing import Any, Protocol

OPEN, CLOSING = "open", "closing"


class PairInfo(Protocol):
    """The pair, as far as the wording needs it (``gate.Pair.info``)."""

    def info(self) -> dict[str, Any]: ...


def control_only_text(pair: PairInfo, what: str) -> str:
    info = pair.info()
    state = info.get("state", "not ACTIVE")
    return (
        f"ACCESS_REFUSED - {what} refused: this server is {state}, not serving; a peering or "
        "administrator login may only use the control plane here; do it on the ACTIVE"
        f"{the_active(info)}"
    )


def the_active(info: dict[str, Any]) -> str:
    """`` (the ACTIVE: HOST:PORT)`` from a PASSIVE's ``Pair.info()``: its ACTIVE is its
    peer, the second of its known hosts; else nothing."""
    hosts = str(info.get("known_hosts") or "").split(",")
    return f" (the ACTIVE: {hosts[1]})" if info.get("state") == "PASSIVE" and len(hosts) > 1 else ""
