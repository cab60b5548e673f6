"""What a channel and its parts share: its states, and the wording of the control-only rule.

Owns: ``OPEN`` and ``CLOSING``, and the refusal a peering or administrator login gets for
touching application state on a server that is not serving (docs/security.md).

Must not know: frames, queues, the broker beyond its pair's state.
"""

from __future__ import annotations

from typing import Any

OPEN, CLOSING = "open", "closing"


def control_only_text(broker: Any, what: str) -> str:
    state = broker.pair.info().get("state", "not ACTIVE")
    return (
        f"ACCESS_REFUSED - {what} refused: this server is {state}, not serving; a peering or "
        "administrator login may only use the control plane here"
    )
