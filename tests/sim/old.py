"""The rule the protocol had before: in sync as soon as the snapshot's end is acked.

The ACTIVE had gone on confirming alone during the snapshot, and those changes were still
in the feed's backlog: kill -9 of the ACTIVE right then, and the PASSIVE took over
without them. Kept here, not in ``amqha``, so the simulator can show it finds that.
"""

from __future__ import annotations

from amqha.core.sync import Leader, Phase, Synced


class OldLeader(Leader):
    __slots__ = ()

    def acked(self, tag: int, multiple: bool, confirmed_lsn: int) -> Synced:
        unacked = self.unacked
        done = [each for each in unacked if each <= tag] if multiple else [tag]
        moved = False
        snapshot_acked = False
        for each in done:
            run = unacked.pop(each, None)
            if run is None:
                continue
            if run.last_lsn > self.replicated_lsn:
                self.replicated_lsn = run.last_lsn
                moved = True
            snapshot_acked = snapshot_acked or run.snapshot_end
        declared = snapshot_acked and self.phase is Phase.SNAPSHOT
        if declared:
            # The sync LSN is what the snapshot covered: the confirms given alone since
            # are not waited for.
            self.phase = Phase.IN_SYNC
            self.sync_lsn = self.replicated_lsn
        return Synced(moved and self.gating, declared)
