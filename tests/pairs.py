"""Pair harness: a primary and a backup as real ``amqha`` processes, peered through proxies.

Owns: building the two configs (free ports picked first, each server's ``failover.peer``
pointing at a proxy that forwards to the other server), starting and stopping both
processes and proxies, reading a server's state from its event log (sync) or its console
(async), bounded waits on those states, client helpers, and turning the two event logs
plus the kill times into intervals during which each server was ACTIVE.

Clients always reach both servers directly; only the peer link goes through the proxies,
so ``cut()`` partitions the peers and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pika.exceptions
from pamqp import commands, frame
from pamqp.heartbeat import Heartbeat

from amqha.client import connect as ha_connect
from amqha.client.connection import _recorded
from amqha.console import ConsoleClient
from failover.epoch import load_epoch
from failover.events import read_events
from tests.proxy import TcpProxy
from tests.support import ServerProcess, free_port

ADMIN = ("admin", "admin")
EFA = ("efa", "efa")  # a federation link's login
PEERING = ("peering", "peering")


def url_of(server: ServerProcess, user: tuple[str, str] = ("guest", "guest")) -> str:
    """``user`` (name, the password tests use) at ``server``; a server configured with
    another password for that name (off loopback, say) gets its own."""
    name = user[0]
    return f"amqp://{name}:{server.password(name, user[1])}@{server.address}/"


# The shared secret every test pair signs its state messages with.
PAIR_SECRET = "test-pair-secret-0123456789"


def failover_section(
    role: str,
    peer_port: int,
    heartbeat: float,
    timeout: float,
    peer_listen: int | None = None,
    peer_name: str | None = None,
    peer_host: str = "127.0.0.1",
    proxy_host: str = "127.0.0.1",
) -> dict[str, Any]:
    """``peer_listen``: the port the peer serves clients on, when the peering goes elsewhere
    (through a proxy at ``proxy_host``)."""
    named = {} if peer_name is None else {"peer_name": peer_name}
    return {
        **named,
        "role": role,
        "peer": f"{proxy_host}:{peer_port}",
        "peer_listen": [f"{peer_host}:{peer_listen or peer_port}"],
        "heartbeat": heartbeat,
        "timeout": timeout,
        "peer_user": "peering",
        "secret": PAIR_SECRET,
    }


@dataclass
class Kill:
    """A kill -9 of one server: the wall-clock instants just before and after it."""

    node: str
    before: float
    after: float


class Pair:
    """Two servers of one pair (configurable roles and names, to build misconfigured ones)."""

    def __init__(
        self,
        workdir: Path,
        heartbeat: float = 0.1,
        timeout: float = 0.4,
        proxied: bool = True,
        roles: tuple[str, str] = ("primary", "backup"),
        names: tuple[str, str] | None = None,
        peering_tls: tuple[tuple[dict[str, Any], dict[str, Any]], ...] | None = None,
        failover_extra: dict[str, Any] | None = None,
        hosts: tuple[str, str] = ("127.0.0.1", "127.0.0.1"),
        prefixes: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
        client: str = "guest",
        ports: tuple[int, int] | None = None,
        **overrides: Any,
    ) -> None:
        """``overrides``: further config sections for both servers (as ServerProcess takes).

        ``ports``: the client ports of the primary and the backup (free ones by default).

        ``hosts``, ``prefixes``, ``client``: as ServerProcess takes them, per server (test
        hosts in network namespaces: tests/netns.py); such a pair is not proxied.

        ``peering_tls``: for each server, its ``tls`` section (without ``listen``) and its
        ``failover.peer_tls``; the peers then reach each other's amqps listener.
        """
        self.workdir = Path(workdir)
        self.heartbeat = heartbeat
        self.timeout = timeout
        names = names or roles
        ports = ports or (free_port(), free_port())
        tls_ports = (free_port(), free_port()) if peering_tls else ports
        self.proxies: list[TcpProxy] = []
        if proxied:
            # proxies[i] is how server i reaches the other one.
            self.proxies = [TcpProxy(tls_ports[1]).start(), TcpProxy(tls_ports[0]).start()]
            peer_ports = (self.proxies[0].port, self.proxies[1].port)
        else:
            peer_ports = (tls_ports[1], tls_ports[0])
        # Equal names would share a data dir and a config file: give each its own folder.
        dirs = (
            (self.workdir / "a", self.workdir / "b")
            if names[0] == names[1]
            else (self.workdir,) * 2
        )
        self.servers = [
            ServerProcess(
                dirs[i],
                names[i],
                port=ports[i],
                host=hosts[i],
                prefix=prefixes[i],
                client=client,
                failover={
                    **failover_section(
                        roles[i],
                        peer_ports[i],
                        heartbeat,
                        timeout,
                        peer_listen=ports[1 - i],
                        # Equal names are how misconfigured pairs are built: leave them unpinned.
                        peer_name=names[1 - i] if names[0] != names[1] else None,
                        peer_host=hosts[1 - i],
                        proxy_host="127.0.0.1" if proxied else hosts[1 - i],
                    ),
                    **(failover_extra or {}),
                },
                **overrides,
            )
            for i in range(2)
        ]
        for i, (tls, peer_tls) in enumerate(peering_tls or ()):
            server = self.servers[i]
            server.config["tls"] = {**tls, "listen": f"127.0.0.1:{tls_ports[i]}"}
            server.config["failover"] = {**server.config["failover"], "peer_tls": peer_tls}
        self.kills: list[Kill] = []
        self.replicating = (overrides.get("replication") or {}).get("enabled", True)

    @property
    def primary(self) -> ServerProcess:
        return self.servers[0]

    @property
    def backup(self) -> ServerProcess:
        return self.servers[1]

    def other(self, server: ServerProcess) -> ServerProcess:
        return self.servers[1] if server is self.servers[0] else self.servers[0]

    # -- processes --------------------------------------------------------------------------

    def start(self, first: str = "primary") -> Pair:
        """Both processes spawned at once (``first`` a moment before the other), then
        waited for together: as a pair started by ``amqha pair``, and one start's time."""
        order = self.servers if first == "primary" else list(reversed(self.servers))
        for server in order:
            server.start(wait=False)
        for server in order:
            server.wait_ready()
        return self

    def kill(self, server: ServerProcess) -> Kill:
        before = time.time()
        server.kill()
        kill = Kill(server.name, before, time.time())
        self.kills.append(kill)
        return kill

    def stop(self) -> None:
        """A clean stop of both servers at once (SIGTERM to both, as ``amqha pair`` on
        Ctrl-C; one still running after 5 s is killed -9), then of the proxies.

        At once: stopped one after the other, the second outlived the first by the first's
        whole stop, and on a loaded machine that was over a timeout: it logged its peer
        lost, an incident the report then counted."""
        for server in self.servers:
            if server.alive:
                assert server.process is not None
                os.kill(server.process.pid, signal.SIGTERM)
        for server in self.servers:
            server.stop()
        for proxy in self.proxies:
            proxy.stop()

    def discard(self) -> None:
        """The fixture's end of a pair once its test is over: both servers killed -9 (the
        test checks nothing more of them; one that checks a clean stop calls ``stop``)."""
        for server in self.servers:
            if server.alive:
                assert server.process is not None
                os.kill(server.process.pid, signal.SIGKILL)
        for server in self.servers:
            server.kill()
        for proxy in self.proxies:
            proxy.stop()

    # -- the peer link ----------------------------------------------------------------------

    def cut(self, mode: str = "refuse") -> None:
        for proxy in self.proxies:
            proxy.cut(mode)

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.heal()

    # -- state ------------------------------------------------------------------------------

    def events(self, server: ServerProcess) -> list[dict[str, Any]]:
        return read_events(server.events_path) if server.events_path.exists() else []

    def state(self, server: ServerProcess) -> str | None:
        """The server's state by its event log: the last ``started`` or ``transition`` record.

        Other records carry the state too, but one written by the same step just before
        its transition record (``dual_active``) would show the new state early.
        """
        state = None
        for record in self.events(server):
            if record["event"] == "started":
                state = record["state"]
            elif record["event"] == "transition":
                state = record["to"]
        return state

    def in_sync(self, server: ServerProcess) -> bool:
        """Whether this PASSIVE is in sync with its ACTIVE since it last became PASSIVE
        (its event log's last passive ``sync`` record), so it may take over by client
        vote."""
        return self._synced_since(server, "PASSIVE", "passive")

    def feeds_in_sync(self, server: ServerProcess) -> bool:
        """Whether this ACTIVE's feed has an in-sync PASSIVE since it last became ACTIVE
        (its event log's last active ``sync`` record). The PASSIVE's own record alone can
        be older than this ACTIVE's term: a primary restarted and leading again before its
        backup re-subscribed leaves the backup's "in sync" of the term before."""
        return self._synced_since(server, "ACTIVE", "active")

    def _synced_since(self, server: ServerProcess, became: str, side: str) -> bool:
        """The last ``sync`` record of ``side`` since ``server`` last became ``became``
        says in sync."""
        events = lifetime(self.events(server))
        since = max(
            (
                i
                for i, e in enumerate(events)
                if e["event"] == "transition" and e.get("to") == became
            ),
            default=None,
        )
        if since is None:
            return False
        records = [e for e in events[since:] if e["event"] == "sync" and e.get("side") == side]
        return bool(records) and records[-1].get("sync") == "in_sync"

    async def settled(
        self, timeout: float = 60.0, interval: float = 0.02
    ) -> tuple[ServerProcess, ServerProcess]:
        """Until one server is ACTIVE and the other PASSIVE and in sync (a dual active
        resolving, a restart still joining, are waited out): (active, passive).

        ``interval``: between two reads of the event logs (each reads both whole)."""

        def healthy() -> tuple[ServerProcess, ServerProcess] | None:
            states = self.states()
            if states == ("ACTIVE", "PASSIVE"):
                active, passive = self.primary, self.backup
            elif states == ("PASSIVE", "ACTIVE"):
                active, passive = self.backup, self.primary
            else:
                return None
            if self.replicating and not (self.in_sync(passive) and self.feeds_in_sync(active)):
                return None
            return active, passive

        found: tuple[ServerProcess, ServerProcess] = await poll(
            healthy,
            timeout,
            "one ACTIVE and one PASSIVE in sync, logs say {}",
            self.states,
            interval=interval,
        )
        return found

    def quarantine_files(self) -> list[Path]:
        return sorted(
            path for server in self.servers for path in server.data_dir.glob("quarantine/*.sqlite")
        )

    async def wait_in_sync(self, server: ServerProcess, timeout: float = 30.0) -> None:
        await poll(lambda: self.in_sync(server), timeout, f"{server.name} in sync")

    def states(self) -> tuple[str | None, str | None]:
        return self.state(self.primary), self.state(self.backup)

    def epoch(self, server: ServerProcess) -> int:
        return load_epoch(server.data_dir)

    async def wait_states(
        self, primary: str | None, backup: str | None, timeout: float = 10.0
    ) -> None:
        """Until the event logs show these states (None: either), at most ``timeout`` s.

        A healthy pair (one ACTIVE, one PASSIVE) counts as reached once the PASSIVE is in
        sync (when it replicates): only then may it take over by client vote."""
        wanted = (primary, backup)
        passive = (
            self.servers[wanted.index("PASSIVE")]
            if sorted(map(str, wanted)) == ["ACTIVE", "PASSIVE"] and self.replicating
            else None
        )

        def reached() -> bool:
            now = self.states()
            return (
                (primary is None or now[0] == primary)
                and (backup is None or now[1] == backup)
                and (passive is None or self.in_sync(passive))
            )

        await poll(reached, timeout, f"states {primary}/{backup}, logs say {{}}", self.states)

    async def status(self, server: ServerProcess) -> dict[str, Any]:
        async with ConsoleClient(url_of(server, ADMIN)) as console:
            return await console.call("status")

    def log_lines(self, server: ServerProcess, needle: str) -> list[str]:
        return [line for line in server.log().splitlines() if needle in line]

    # -- the ACTIVE intervals ---------------------------------------------------------------

    def active_intervals(self, now: float | None = None) -> dict[str, list[tuple[float, float]]]:
        return {
            server.name: active_intervals(
                self.events(server),
                [k.after for k in self.kills if k.node == server.name],
                time.time() if now is None else now,
            )
            for server in self.servers
        }


def lifetime(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the server's current (last started) process."""
    starts = [i for i, e in enumerate(events) if e["event"] == "started"]
    return events[starts[-1] :] if starts else []


def active_intervals(
    events: Iterable[dict[str, Any]], kill_times: Iterable[float], now: float
) -> list[tuple[float, float]]:
    """[start, end) wall-clock intervals during which one server was ACTIVE.

    An interval opens at a transition to ACTIVE and closes at the next transition out of
    it, at a clean ``stopped`` record, or, when the process died in it, at the end of the
    first kill after it opened (a killed server writes nothing). One still open is closed
    at ``now``.
    """
    kills = sorted(kill_times)
    intervals: list[tuple[float, float]] = []
    opened: float | None = None

    def died_after(start: float) -> float:
        return next((k for k in kills if k >= start), now)

    for record in events:
        kind = record.get("event")
        if kind == "started" and opened is not None:
            intervals.append((opened, died_after(opened)))
            opened = None
        elif kind == "transition":
            if record.get("to") == "ACTIVE" and opened is None:
                opened = record["ts"]
            elif record.get("from") == "ACTIVE" and opened is not None:
                intervals.append((opened, record["ts"]))
                opened = None
        elif kind == "stopped" and opened is not None:
            intervals.append((opened, record["ts"]))
            opened = None
    if opened is not None:
        intervals.append((opened, died_after(opened)))
    return intervals


def overlaps(
    first: list[tuple[float, float]], second: list[tuple[float, float]]
) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    return [(a, b) for a in first for b in second if a[0] < b[1] and b[0] < a[1]]


# -- bounded waits and clients --------------------------------------------------------------


async def poll(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    describe: Callable[[], Any] | None = None,
    interval: float = 0.02,
) -> Any:
    """Poll a sync predicate from async code, at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what.format(describe()) if describe is not None else what
            raise TimeoutError(f"not reached after {timeout} s: {detail}")
        await asyncio.sleep(interval)


async def witness_hears_both(pair: Pair, timeout: float = 30.0) -> None:
    """Until the witness hears both servers and each hears it: the primary's witness is
    reachable and the backup's witness does not call the primary gone (a server is heard
    from its second ping, its first fetching a challenge). The premise of a witness test."""
    deadline = time.monotonic() + timeout
    while True:
        primary = (await pair.status(pair.primary)).get("witness") or {}
        backup = (await pair.status(pair.backup)).get("witness") or {}
        if primary.get("reachable") and backup.get("agrees_peer_gone") is False:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not reached after {timeout} s: the witness hears both servers")
        await asyncio.sleep(0.1)


def pair_info(connection: aio_pika.abc.AbstractConnection) -> dict[str, Any]:
    """The ``amqha`` server property of the server this connection ended up on."""
    transport = connection.transport  # type: ignore[attr-defined]
    assert transport is not None
    return dict(transport.connection.server_properties["amqha"])


async def vote_refused(pair: Pair, server: ServerProcess, kill: ServerProcess, why: str) -> None:
    """Kill ``kill`` -9 while clients knock at ``server``: until ``server`` records a
    refused client whose reason says ``why`` (its vote asked and refused); none let in."""
    with Knocker(server, interval=0.1) as knocker:
        pair.kill(kill)
        await poll(
            lambda: any(
                e["event"] == "refuse" and why in (e.get("reason") or "")
                for e in pair.events(server)
            ),
            60,
            f"a client's vote at {server.name} refused: {why}",
        )
    assert knocker.let_in == 0, knocker.answers
    assert pair.state(server) == "PASSIVE"


async def client_vote(servers: Iterable[ServerProcess], retry_for: float = 10.0) -> dict[str, Any]:
    """Open (and close) one amqha.client connection over these servers: a client vote.

    Returns the ``amqha`` properties of the server that accepted it.
    """
    connection = await ha_connect(
        [s.url for s in servers], retry_for=retry_for, attempt_timeout=2.0
    )
    try:
        return pair_info(connection)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def vote_in(server: ServerProcess, retry_for: float = 20.0) -> None:
    """Client votes at ``server`` alone until it is the one that lets the client in, at most
    ``retry_for`` s. ``client_vote`` follows redirects: while ``server`` still hears a live
    ACTIVE (its peer's timeout not yet run out on a busy machine) the vote it redirects is
    let in by that ACTIVE instead, and says nothing of ``server``."""
    deadline = time.monotonic() + retry_for
    while True:
        left = deadline - time.monotonic()
        served_by = (await client_vote([server], retry_for=max(left, 0.1)))["name"]
        if served_by == server.name:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"not reached after {retry_for} s: a vote let in by {server.name} "
                f"(the last went to {served_by})"
            )
        await asyncio.sleep(0.1)


@dataclass
class Publisher:
    """A task publishing with confirms through a robust connection; records what happened."""

    connection: aio_pika.abc.AbstractRobustConnection
    routing_key: str
    # (wall-clock ts of the confirm, seq, name of the server that confirmed it)
    confirmed: list[tuple[float, int, str]] = field(default_factory=list)
    errors: int = 0
    task: asyncio.Task[None] | None = None
    stopping: bool = False

    def start(self) -> Publisher:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def _run(self) -> None:
        # One robust channel: after a failover aio-pika reopens it on the new server. A
        # publish attempted meanwhile fails; it is counted and retried, never waited on long.
        channel = await self.connection.channel(publisher_confirms=True)
        seq = 0
        while not self.stopping:
            seq += 1
            try:
                await asyncio.wait_for(
                    channel.default_exchange.publish(
                        aio_pika.Message(str(seq).encode()), routing_key=self.routing_key
                    ),
                    2.0,
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.01)
                continue
            self.confirmed.append((time.time(), seq, self._server_name()))
            await asyncio.sleep(0.002)

    def _server_name(self) -> str:
        try:
            return str(pair_info(self.connection)["name"])
        except (AssertionError, AttributeError, KeyError):
            return "?"

    def first_confirmed_after(self, since: float, by: str | None = None) -> float | None:
        """Wall-clock time of the first publish confirmed after ``since`` (by that server)."""
        first = None
        for ts, _, name in reversed(self.confirmed):
            if ts <= since:
                break
            if by is None or name == by:
                first = ts
        return first

    async def confirmed_after(self, since: float, timeout: float, by: str | None = None) -> float:
        return await poll(
            lambda: self.first_confirmed_after(since, by),
            timeout,
            f"a publish confirmed after {since} by {by or 'any server'}",
        )

    async def stop(self) -> None:
        self.stopping = True
        if self.task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self.task, 3.0)
            if not self.task.done():
                self.task.cancel()


async def hold(predicate: Callable[[], Any], duration: float, what: str) -> None:
    """Assert ``predicate`` stays true for ``duration`` s, checked every 50 ms."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        assert predicate(), f"no longer true: {what}"
        await asyncio.sleep(0.05)
    assert predicate(), f"no longer true: {what}"


async def plain_connect(url: str, timeout: float) -> aio_pika.abc.AbstractConnection:
    """``aio_pika.connect``, with a refused attempt's connection closed here: left to the
    garbage collector, aio-pika's finalizer schedules its close on whatever loop runs
    then, and warns 'never awaited' when none does."""
    made: list[aio_pika.Connection] = []
    try:
        return await aio_pika.connect(url, timeout=timeout, connection_class=_recorded(made))
    except BaseException:
        for attempt in made:
            with contextlib.suppress(Exception):
                await attempt.close()
        raise


async def connect_plain(
    server: ServerProcess, timeout: float = 10.0
) -> aio_pika.abc.AbstractConnection:
    """A plain aio-pika connection to this one server, retried until it lets us in."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await plain_connect(server.url, 2.0)
        except Exception:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.05)


# -- raw AMQP: exactly what the server answers to Connection.Open -----------------------------


def raw_open(
    port: int,
    redirect_capability: bool = False,
    user: tuple[str, str] = ("guest", "guest"),
    timeout: float = 5.0,
) -> Any:
    """Handshake with a bare socket; the server's answer to it.

    Connection.OpenOk, Connection.Close (reply_code, reply_text: a plain client is refused
    in reply to StartOk, before Tune) or, for a client that announces
    ``connection.redirect``, ``amqha.client.ConnectionRedirect`` (host, known_hosts) after Open.
    """
    capabilities: dict[str, Any] = {"publisher_confirms": True}
    if redirect_capability:
        capabilities["connection.redirect"] = True
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        reader = _FrameReader(sock)
        reader.expect(commands.Connection.Start)
        sock.sendall(
            frame.marshal(
                commands.Connection.StartOk(
                    client_properties={"product": "raw test client", "capabilities": capabilities},
                    mechanism="PLAIN",
                    response=f"\0{user[0]}\0{user[1]}",
                ),
                0,
            )
        )
        tune = reader.next_method()
        if not isinstance(tune, commands.Connection.Tune):
            return tune
        sock.sendall(
            frame.marshal(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0)
            + frame.marshal(commands.Connection.Open(virtual_host="/"), 0)
        )
        return reader.next_method()


class _FrameReader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next_method(self) -> Any:
        while True:
            if len(self.buffer) >= 7:
                size = int.from_bytes(self.buffer[3:7], "big")
                if len(self.buffer) >= size + 8:
                    _, _, value = frame.unmarshal(self.buffer[: size + 8])
                    self.buffer = self.buffer[size + 8 :]
                    if not isinstance(value, Heartbeat):
                        return value
                    continue
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the socket")
            self.buffer += data

    def expect(self, kind: type) -> Any:
        method = self.next_method()
        assert isinstance(method, kind), f"expected {kind.__name__}, got {method!r}"
        return method


def pika_open_error(port: int) -> str | None:
    """pika's error on opening a connection to this server; None if it was let in.

    pika reports a Connection.Close received in reply to Open as ProbableAccessDeniedError
    whose text is the repr of the ConnectionClosedByBroker: "(CODE) 'TEXT'".
    """
    parameters = pika.ConnectionParameters(
        "127.0.0.1", port, connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5
    )
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.AMQPConnectionError as error:
        return f"{type(error).__name__}: {error}"
    connection.close()
    return None


MakePair = Callable[..., "Pair"]


def pair_factory(tmp_path: Path) -> Iterator[MakePair]:
    """Body of the ``make_pair`` fixture: build pairs (not started) for one test.

    All are killed -9 at the end, by pid. On teardown each server's log tail and event log
    are printed: pytest shows them only when the test failed.
    """
    pairs: list[Pair] = []

    def make(**kwargs: Any) -> Pair:
        pair = Pair(tmp_path / f"pair{len(pairs)}", **kwargs)
        pairs.append(pair)
        return pair

    yield make
    for pair in pairs:
        pair.discard()
        for server in pair.servers:
            print(f"--- {server.name} log (tail) ---")
            print("\n".join(server.log().splitlines()[-40:]))
            print(f"--- {server.name} events ---")
            for record in pair.events(server)[-60:]:
                print(record)


class Knocker:
    """A thread that keeps opening raw connections to one server and records each answer.

    Answers: ``"open"`` (let in), ``"close <code> <text>"``, ``"redirect <host>"`` or
    ``"down"`` (no AMQP server answering). Use as a context manager around what is watched.
    """

    def __init__(self, server: ServerProcess, interval: float = 0.02, limit: float = 60.0) -> None:
        self.server = server
        self.interval = interval
        self.limit = limit
        self.answers: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"knock-{server.name}", daemon=True)

    def __enter__(self) -> Knocker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def let_in(self) -> int:
        return self.answers.count("open")

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.answers.append(self._knock())
            self._stop.wait(self.interval)

    def _knock(self) -> str:
        try:
            answer = raw_open(self.server.port, timeout=2.0)
        except (OSError, ConnectionError, AssertionError):
            return "down"
        if isinstance(answer, commands.Connection.OpenOk):
            return "open"
        if isinstance(answer, commands.Connection.Close):
            return f"close {answer.reply_code} {answer.reply_text}"
        return f"other {answer!r}"
