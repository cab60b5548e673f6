"""A channel's transactions (Tx.Select, Commit, Rollback): actions held as data until commit.

Owns: the open transaction's actions (publishes, acks, returns) and the bytes it holds,
the commit that runs them as one batch of changes, and Commit-Ok only once the store has
them (the connection is not read meanwhile: nothing overtakes it).

Must not know: sockets, how the store writes. A part of ``channel.Channel`` (a mixin,
compiled as a trait: ``channel_parts.py``).
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import trait
from pamqp import commands, exceptions

from .channel_parts import ChannelParts, TxAction, Unacked
from .core.confirms import Commit
from .read_holds import READ_HELD_STORE

# A transaction is data: the actions it will take on commit, in order (``TxAction``).
TX_PUBLISH: Final = 0
TX_ACK: Final = 1
TX_RETURN: Final = 2


@trait
class Transactions(ChannelParts):
    """Tx.Select, Commit and Rollback: part of ``Channel``."""

    # Deliveries acked inside the open transaction: a rollback makes them unacked again.
    transaction_acks: list[Unacked]
    transaction_bytes: int  # message bodies published in the open transaction
    unacked: dict[int, Unacked]
    unacked_order: list[int]
    order_head: int

    def on_tx_select(self, method: commands.Tx.Select) -> None:
        if self.confirm:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
            )
        if self.transaction is None:
            self.transaction = []
        self.reply(commands.Tx.SelectOk())

    def _hold_in_transaction(self, size: int) -> None:
        """A transaction commits as one change, replicated as one run: its bodies are
        bounded like one message's (``limits.max_message_size``), so the run, and what
        encoding it costs, are bounded too."""
        limit = self.broker.config.limits.max_message_size
        self.transaction_bytes += size
        if self.transaction_bytes > limit:
            raise exceptions.AMQPPreconditionFailed(
                f"PRECONDITION_FAILED - the transaction holds more than {limit} bytes of "
                "message bodies (limits.max_message_size): commit in smaller transactions"
            )

    def _require_transaction(self) -> list[TxAction]:
        if self.transaction is None:
            raise exceptions.AMQPPreconditionFailed(
                "PRECONDITION_FAILED - channel is not transactional"
            )
        return self.transaction

    def on_tx_commit(self, method: commands.Tx.Commit) -> None:
        actions = self._require_transaction()
        self.transaction = None
        self.transaction_acks = []
        self.transaction_bytes = 0
        log = self.vhost.log
        wait = 0
        if log is not None:
            log.begin_batch()  # the transaction's changes leave as one Batch
        try:
            for action in actions:
                if action[0] == TX_PUBLISH:
                    self._route(action[1], action[2], action[3])
                elif action[0] == TX_ACK:
                    self._settle(action[1])
                else:
                    self._return_to_queues(action[1], action[2])
        finally:
            if log is not None:
                wait = log.end_batch()
            self.transaction = []
        if wait:
            self._commit_when_safe(wait)
        else:
            self.reply(commands.Tx.CommitOk())

    def _commit_when_safe(self, lsn: int) -> None:
        """Commit-Ok once the store has the transaction on disk: the commit goes to the
        confirm pipeline as a value and its connection answers it (``commit_done``); the
        connection is not read meanwhile, so nothing overtakes it."""
        connection = self.connection
        connection.hold_reading(READ_HELD_STORE, True)
        self.broker.confirms.expect_commit(Commit(lsn, self.number, connection, self))

    def on_tx_rollback(self, method: commands.Tx.Rollback) -> None:
        actions = self._require_transaction()
        actions.clear()
        self.transaction_bytes = 0
        # Deliveries acked, nacked or rejected inside the transaction are unacked again.
        for entry in self.transaction_acks:
            self.unacked[entry.tag] = entry
        if self.transaction_acks:
            self.unacked_order = sorted(self.unacked)
            self.order_head = 0
        self.transaction_acks = []
        self.reply(commands.Tx.RollbackOk())
