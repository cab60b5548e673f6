"""The version of what the two servers of a pair say to each other (docs/operations.md,
"Upgrading").

Owns: this release's protocol number, the oldest a peer may speak, what each number adds,
and the version two servers speak: the lower of theirs, so that a pair of two releases
replicates while one server is upgraded after the other. Every wire between them carries
its version: state and handover messages (``protocol``; none: 1), the feed's subscription
(``x-amqha-protocol``; none: 1), and change runs and snapshots (``codec.VERSION`` in each
run's head). The store has its own (``store_file.SCHEMA_VERSION``: migrated forward at
open, a newer one refused naming both).

Must not know: sockets, the broker, the failover machine.
"""

from __future__ import annotations

from typing import Any

PROTOCOL = 2  # this release
OLDEST = 1  # the previous release's, which sent no number
# What each number adds to the feed's runs: 2, the deduplication caches' keys
# (``changes.DedupSeen``), the users, vhosts and permissions made at run time
# (``changes.ACCESS_CHANGES``) and policies (``changes.POLICY_CHANGES``); a PASSIVE that
# speaks 1 is sent everything else.
DEDUP_CHANGES = 2
ARGUMENT = "x-amqha-protocol"  # Basic.Consume argument of the feed's subscription


def spoken(theirs: int) -> int:
    """What this server speaks to a peer that speaks ``theirs``: the lower of the two."""
    return min(PROTOCOL, theirs)


def parse(value: Any) -> int:
    """A peer's protocol number as sent (None: the previous release's, 1); ValueError for
    one that is not a number this release can speak down to."""
    if value is None:
        return OLDEST
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"protocol {value!r} is not a version number")
    if value < OLDEST:
        raise ValueError(
            f"protocol {value}: this release speaks {OLDEST} to {PROTOCOL}; upgrade the peer"
            " to the previous release first"
        )
    return value
