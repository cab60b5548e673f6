"""Which socket of the management listener gives way to a newcomer (amqha.management.sockets):
the table's rule over stand-in sockets that record being dropped."""

from __future__ import annotations

from amqha.management.sockets import SocketTable


class Socket:
    def __init__(self, source: str = "10.0.0.1", logged_in: bool = False, busy: bool = False):
        self.source, self.logged_in, self.busy = source, logged_in, busy
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


def test_one_address_gives_way_to_itself_oldest_idle_first() -> None:
    table = SocketTable(limit=100, per_address=3)
    first, second, third = Socket(busy=True), Socket(), Socket()
    for socket in (first, second, third):
        table.opened(socket)  # type: ignore[arg-type]
    newcomer = Socket()
    table.opened(newcomer)  # type: ignore[arg-type]
    assert second.dropped and not first.dropped and not newcomer.dropped
    # Another address is not counted with it.
    elsewhere = Socket("10.0.0.2")
    table.opened(elsewhere)  # type: ignore[arg-type]
    assert not elsewhere.dropped and len(table) == 4


def test_logged_in_sockets_never_give_way_to_sockets_without_a_login() -> None:
    table = SocketTable(limit=3, per_address=10)
    operators = [Socket(logged_in=True) for _ in range(2)]
    anonymous = Socket(busy=True)
    for socket in (*operators, anonymous):
        table.opened(socket)  # type: ignore[arg-type]
    newcomer = Socket()
    table.opened(newcomer)  # type: ignore[arg-type]
    assert anonymous.dropped and not any(s.dropped for s in operators)
    newcomer.logged_in = True
    late = Socket()
    table.opened(late)  # type: ignore[arg-type]
    # Every place is held by a login: the newcomer is the one refused.
    assert late.dropped and not any(s.dropped for s in (*operators, newcomer))
