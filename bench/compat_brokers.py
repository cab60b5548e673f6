"""The brokers ``bench.compat``'s suites run against (``BROKERS``), each a context manager.

``amqha``, one server; ``amqha-pair``, the pair as it ships: the primary ACTIVE serves the
suite, the backup PASSIVE beside it, in sync before the suite starts, and ``kill_active``
kills -9 whichever is ACTIVE; ``rabbitmq``, Debian's rabbitmq-server as a private node
(``bench.rabbitmq``). Each also serves amqps on a port of its own, with a certificate made
for the run, and listens on [::1] too when asked (the suites run in a private network
namespace). Every process started here is stopped here, by pid.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from bench.compat_sources import SuiteUnavailable
from tests.support import ServerProcess, free_port


class Broker(NamedTuple):
    """Where a suite finds the broker under test: its AMQP port, its amqps port (a
    certificate the suites do not check: aio-pika's amqps tests turn verification off),
    and, for the pair, every server's address and a way to kill -9 the ACTIVE."""

    host: str
    port: int
    tls_port: int
    servers: tuple[str, ...] = ()
    kill_active: Callable[[], str] | None = None


def _pki(folder: Path) -> Any:
    from tests.certs import Pki

    return Pki(folder / "pki")


@contextmanager
def amqha_broker(port: int | None = None, ipv6: bool = False) -> Iterator[Broker]:
    with tempfile.TemporaryDirectory(prefix="amqha-compat-") as tmp:
        tls_port = free_port()
        server = ServerProcess(
            Path(tmp), "compat", port=port, tls=_pki(Path(tmp)).listener(tls_port)
        )
        if ipv6:
            server.config["server"]["listen"] = [server.address, f"[::1]:{server.port}"]
        server.start()
        try:
            yield Broker("127.0.0.1", server.port, tls_port, (server.address,))
        finally:
            server.stop()


# The pair's timings for suites that load the machine: a peer is lost after 3 s of silence.
PAIR_HEARTBEAT = 0.25
PAIR_TIMEOUT = 3.0
PAIR_SETTLE_TIMEOUT = 60.0


@contextmanager
def amqha_pair_broker(port: int | None = None, ipv6: bool = False) -> Iterator[Broker]:
    """The pair as it ships: the primary ACTIVE serves the suite (on ``port``, with its
    amqps listener), the backup PASSIVE beside it, in sync before the suite starts and
    replicating everything the suite does. ``kill_active`` kills -9 whichever server is
    ACTIVE (for suites run through a failover) and names it."""
    import asyncio

    from tests.pairs import Pair

    with tempfile.TemporaryDirectory(prefix="amqha-compat-pair-") as tmp:
        tls_port = free_port()
        pair = Pair(
            Path(tmp),
            heartbeat=PAIR_HEARTBEAT,
            timeout=PAIR_TIMEOUT,
            proxied=False,
            ports=(port or free_port(), free_port()),
        )
        primary = pair.primary
        primary.config["tls"] = _pki(Path(tmp)).listener(tls_port)
        if ipv6:
            primary.config["server"]["listen"] = [primary.address, f"[::1]:{primary.port}"]
        pair.start()

        async def settle() -> None:
            await pair.wait_states("ACTIVE", "PASSIVE", timeout=PAIR_SETTLE_TIMEOUT)
            await pair.wait_in_sync(pair.backup, timeout=PAIR_SETTLE_TIMEOUT)

        def kill_active() -> str:
            for server in pair.servers:
                if pair.state(server) == "ACTIVE":
                    pair.kill(server)
                    return server.name
            raise RuntimeError("no server of the pair is ACTIVE")

        try:
            asyncio.run(settle())
            yield Broker(
                "127.0.0.1",
                primary.port,
                tls_port,
                tuple(server.address for server in pair.servers),
                kill_active,
            )
        finally:
            pair.stop()


@contextmanager
def rabbitmq_broker(port: int | None = None, ipv6: bool = False) -> Iterator[Broker]:
    from bench.rabbitmq import RabbitNode, ensure_installed

    installed, how = ensure_installed()
    if not installed:
        raise SuiteUnavailable(f"RabbitMQ is not available: {how}")
    node = RabbitNode(port=port, ipv6=ipv6)
    pki = _pki(node.dir)
    tls_port = node.listen_tls(pki.server_cert, pki.server_key, pki.ca)
    node.start()
    try:
        yield Broker("127.0.0.1", node.port, tls_port, (f"127.0.0.1:{node.port}",))
    finally:
        node.stop()


BROKERS: dict[str, Callable[..., Any]] = {
    "amqha": amqha_broker,
    "amqha-pair": amqha_pair_broker,
    "rabbitmq": rabbitmq_broker,
}
