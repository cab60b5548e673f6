"""Which socket of the management listener gives way to a newcomer (amqha.management.sockets):
the table's rule over stand-in sockets that record being dropped."""

from __future__ import annotations

from amqha.management.sockets import SocketTable


class Socket:
    """A socket as the table sees it: ``ripe`` once the loop has read it, ``sent`` once a
    byte came in, ``checking`` while a request carrying a login is answered."""

    def __init__(
        self,
        source: str = "10.0.0.1",
        logged_in: bool = False,
        sent: bool = False,
        ripe: bool = True,
        checking: bool = False,
    ) -> None:
        self.source, self.logged_in, self.sent, self.ripe = source, logged_in, sent, ripe
        self.checking = checking
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


def opened(table: SocketTable, *sockets: Socket) -> None:
    for socket in sockets:
        table.opened(socket)  # type: ignore[arg-type]


def test_one_address_gives_way_to_itself_silent_first_then_oldest() -> None:
    table = SocketTable(limit=100, per_address=3)
    first, second, third = Socket(sent=True), Socket(), Socket()
    opened(table, first, second, third)
    newcomer = Socket(ripe=False)
    opened(table, newcomer)
    # The oldest socket read and found silent goes; one that sent stays, older or not.
    assert second.dropped and not first.dropped and not third.dropped
    # Another address is not counted with it.
    elsewhere = Socket("10.0.0.2")
    opened(table, elsewhere)
    assert not elsewhere.dropped and len(table) == 4
    # With no silent socket left, the oldest that sent goes before any not read yet.
    third.sent = True
    late = Socket(ripe=False)
    opened(table, late)
    assert first.dropped and not third.dropped and not newcomer.dropped


def test_a_socket_not_read_yet_is_not_dropped_for_being_new() -> None:
    """Older sockets all being answered, an operator's socket whose request is not read
    yet, then more newcomers: the operator's socket is the last to go, not the first (it
    was the first)."""
    table = SocketTable(limit=100, per_address=4)
    answered = [Socket(sent=True) for _ in range(3)]
    operator = Socket(ripe=False)
    opened(table, *answered, operator)
    newcomers = [Socket(ripe=False) for _ in range(3)]
    opened(table, *newcomers)
    assert all(s.dropped for s in answered) and not operator.dropped
    # Read, with its request in, it outlasts every newcomer read and found silent.
    operator.sent = operator.ripe = True
    for socket in newcomers:
        socket.ripe = True
    opened(table, Socket(ripe=False), Socket(ripe=False), Socket(ripe=False))
    assert not operator.dropped and all(s.dropped for s in newcomers)


def test_a_login_being_checked_outlasts_a_flood_of_requests_without_one() -> None:
    """An operator's request in, its login checked (a costly hash on a loaded machine),
    while sockets of its own address that carry no login keep coming, sending and being
    answered: each newcomer takes the place of one of them, never the operator's (with
    the older rule it went once it was the oldest that had sent bytes)."""
    table = SocketTable(limit=100, per_address=4)
    operator = Socket(sent=True, checking=True)
    opened(table, operator)
    flood = [Socket(ripe=False) for _ in range(3)]
    opened(table, *flood)
    for _ in range(20):
        for socket in flood:
            socket.sent = socket.ripe = True
        newcomer = Socket(ripe=False)
        opened(table, newcomer)
        assert not operator.dropped and sum(s.dropped for s in flood) == 1
        flood = [s for s in flood if not s.dropped] + [newcomer]
    # Sockets that carry a login of their own give way oldest first: the operator's
    # outlasts every one that came after it.
    for socket in flood:
        socket.sent = socket.ripe = True
    checking = [Socket(sent=True, checking=True) for _ in range(3)]
    for socket in checking:
        opened(table, socket)
    assert all(s.dropped for s in flood) and not operator.dropped
    opened(table, Socket(sent=True, checking=True))
    assert operator.dropped and not any(s.dropped for s in checking)


def test_sockets_not_read_yet_outlast_logins_being_checked() -> None:
    """Every place of an address held by wrong passwords waiting out their delay (each
    carries a login): an operator's socket not read yet is not what a newcomer takes."""
    table = SocketTable(limit=100, per_address=4)
    waiting = [Socket(sent=True, checking=True) for _ in range(4)]
    opened(table, *waiting)
    operator = Socket(ripe=False)
    newcomers = [Socket(ripe=False) for _ in range(3)]
    opened(table, operator, *newcomers)
    assert all(s.dropped for s in waiting) and not operator.dropped


def test_logged_in_sockets_never_give_way_to_sockets_without_a_login() -> None:
    table = SocketTable(limit=3, per_address=10)
    operators = [Socket(logged_in=True) for _ in range(2)]
    anonymous = Socket(sent=True)
    opened(table, *operators, anonymous)
    newcomer = Socket(ripe=False)
    opened(table, newcomer)
    assert anonymous.dropped and not any(s.dropped for s in operators)
    newcomer.logged_in = True
    late = Socket()
    opened(table, late)
    # Every place is held by a login: the newcomer is the one refused.
    assert late.dropped and not any(s.dropped for s in (*operators, newcomer))
