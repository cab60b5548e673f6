"""Why a connection's socket is not being read: one bit per reason, in one place.

Owns: the reasons and the two sets the connection reads them by. Reading resumes when
no reason is left (``Connection.hold_reading``). Knows nothing of who sets them.
"""

from __future__ import annotations

READ_HELD_MEMORY = 1  # the memory alarm is on and this connection publishes (flow.py)
READ_HELD_OUTPUT = 2  # this publisher's socket is not draining what we write to it
READ_HELD_BACKLOG = 4  # frames of the last read still wait for their turn
READ_HELD_PAIR = 8  # the pair says this server is not serving (a client connection's work waits)
READ_HELD_LOGIN = 16  # a login is being checked: frames behind Start-Ok wait for its answer
READ_HELD_STORE = 32  # a transaction's Commit-Ok waits for the store (channel_tx.py)
READ_HELD_SWITCHOVER = 64  # a planned switchover drains this ACTIVE: publishers wait

# Holds that stop our reading of a live peer: while one holds, its silence is ours, not its.
HEARTBEAT_PAUSING = READ_HELD_MEMORY | READ_HELD_PAIR | READ_HELD_LOGIN | READ_HELD_SWITCHOVER
# Holds that may last: while one does, the broker watches the socket for the client's
# going (asyncio sees a FIN or a reset only by reading).
LASTING_HOLDS = (
    READ_HELD_MEMORY | READ_HELD_OUTPUT | READ_HELD_PAIR | READ_HELD_STORE | READ_HELD_SWITCHOVER
)
