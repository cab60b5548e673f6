"""Configs that cannot drift unseen: this server's settings against its peer's, by digest
(docs/operations.md, "Configs that must match").

Owns: this server's digests (``config.digest``), sent in every state message; the keys
whose digests differ from the peer's last ones (``keys``), and whether that changed with
the last message heard (the controller logs a ``config_drift`` record then: the keys when
they differ, an empty list once they match again). A peer that sends no digests (a
release before they were sent) is never counted as drifted.

Must not know: sockets, the loop, the event log's file.
"""

from __future__ import annotations

from config import ServerConfig
from config.digest import digests, drifted


class ConfigDrift:
    def __init__(self, config: ServerConfig) -> None:
        self.ours = digests(config)
        self.keys: list[str] = []
        self._theirs: dict[str, str] | None = None  # the peer's last, as heard

    def heard(self, theirs: dict[str, str] | None) -> bool:
        """The peer's digests from a state message: whether the drifted keys changed."""
        if theirs is None or theirs == self._theirs:
            return False  # the same digests as a heartbeat ago: nothing to compare again
        self._theirs = theirs
        keys = drifted(self.ours, theirs)
        if keys == self.keys:
            return False
        self.keys = keys
        return True
