"""Hand-built failover event logs (schema v1) for the report's tests: a small writer that
appends records per server the way the servers do, with an optional clock skew."""

from __future__ import annotations

import json
from pathlib import Path

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z; minute 1699999980 starts 20 s before


class Server:
    """One server's log. ``at`` is true time in seconds after T0; ``skew`` is how far this
    server's clock runs ahead, so its records say ``T0 + at + skew``."""

    def __init__(self, name: str, role: str, skew: float = 0.0, pair: str | None = None) -> None:
        self.name, self.role, self.skew, self.pair = name, role, skew, pair
        self.lines: list[str] = []

    def clock(self, at: float) -> float:
        return T0 + at + self.skew

    def record(self, at: float, event: str, state: str, epoch: int = 0, **fields) -> Server:
        record = {
            "v": 1,
            "ts": self.clock(at),
            "node": self.name,
            "role": self.role,
            "epoch": epoch,
            "state": state,
            "event": event,
            **({} if self.pair is None else {"pair": self.pair}),
            **fields,
        }
        self.lines.append(json.dumps(record))
        return self

    def transition(
        self, at: float, old: str, new: str, epoch: int, trigger: str, reason: str = ""
    ) -> Server:
        fields = {"from": old, "to": new, "trigger": trigger, "reason": reason}
        return self.record(at, "transition", new, epoch, **fields)

    def heard(
        self,
        at: float,
        event: str,
        state: str,
        epoch: int,
        peer: Server,
        peer_state: str,
        sent: float,
        evidence: str | None = None,
    ) -> Server:
        """peer_up / peer_lost about ``peer``, whose last state message left at ``sent``;
        a peer_lost's ``evidence``: "refused" (its port refuses) or "silence" (a timeout)."""
        fields = {"peer": peer.name, "peer_state": peer_state, "last_seen": peer.clock(sent)}
        if evidence is not None:
            fields["evidence"] = evidence
        return self.record(at, event, state, epoch, **fields)

    def sync(
        self, at: float, state: str, epoch: int, sync: str, reason: str, side: str = "active"
    ) -> Server:
        """A replication record: ``side`` "active" is the ACTIVE about its PASSIVE."""
        lag = 0 if sync == "in_sync" else None
        fields = {"side": side, "sync": sync, "reason": reason, "lag_changes": lag}
        return self.record(at, "sync", state, epoch, **fields)

    def raw(self, text: str) -> Server:
        self.lines.append(text)
        return self

    def write(self, folder: Path, torn: str | None = None) -> Path:
        """Write ``<folder>/<name>/events.jsonl``; ``torn`` is a last line cut mid-write."""
        path = folder / self.name / "events.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(line + "\n" for line in self.lines)
        path.write_text(text + (torn or ""), encoding="utf-8")
        return path
