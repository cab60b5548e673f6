"""The watch on a client's connection: leaving a server that stops answering.

A frozen server (a paused VM, a stopped process) keeps its TCP connections open and its
port accepting: no reset, no refusal tells the client. This module owns what does
(docs/client.md, "A silent server"):

- ``Silence``, the rule, pure (time passed in): when a frame from the server is due and
  how late it may be before the connection is given up;
- ``WatchedTransport``, the aiormq transport factory that records when the server last
  sent a byte and can cut the socket at once (a frozen server never answers a close);
- ``Watch``, the asyncio shell that applies the rule to one connection: it probes a
  late server, and on the verdict cuts the socket and tells its owner;
- the defaults: the heartbeat asked for in every URL that names none, and
  ``silent_after``.

It knows nothing of the pair or of failing over: the owner (amqha.client's robust
connection, Publisher and Consumer) is told the server is silent and goes to the next
listed server itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Literal

import aiormq
from yarl import URL

# Seconds of AMQP heartbeat asked for when a URL names none: the server then sends a
# frame at least this often on an idle connection, and drops a client silent for twice
# as long. AMQP counts heartbeats in whole seconds; 1 would drop a client whose event
# loop stalls for 2 s.
DEFAULT_HEARTBEAT = 2
# How late a frame due from the server may be before the connection is given up: about
# twice the pair's shipped failover.timeout (0.6 s, config/*.yaml), so that by then the
# other server has found its peer silent too and takes over on this client's vote.
DEFAULT_SILENT_AFTER = 1.2

# A watch tick later than this share of ``silent_after`` (over three ticks) means the
# client's own loop stalled: the count against the server starts again (``Silence``).
STALL_SHARE = 1 / 3

Verdict = Literal["wait", "probe", "silent"]


class ServerSilent(ConnectionError):
    """The server owed this client a frame and sent none for ``silent_after`` s."""


def with_heartbeat(url: URL, seconds: int) -> URL:
    """``url`` asking for a ``seconds`` heartbeat, unless it names its own."""
    if "heartbeat" in url.query:
        return url
    return url.update_query(heartbeat=seconds)


def check_silent_after(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"silent_after must be a number of seconds above 0, not {value!r}")
    return float(value)


class Silence:
    """When a connection's server is late, and when it is silent.

    A frame is due from the server ``heartbeat`` s after its last one (it sends at least
    one that often on an idle connection), and at once while the client awaits an
    answer (a confirm): from the last frame, or from when the wait began if that is
    later. A frame late by half of ``silent_after`` earns a probe (a request the server
    answers at once: a slow confirm is not a silent server); late by ``silent_after``,
    the server is silent. Times are the caller's clock; nothing here reads one.

    With ``stall_after``, the caller ticks more often than that: a tick that comes later
    means the client's own loop did not run meanwhile (a long synchronous call, a GC
    pause, a starved process). It could neither read what the server sent nor send what
    it owed, so that time is not the server's: the count starts again at that tick.
    """

    def __init__(
        self,
        silent_after: float,
        heartbeat: float,
        started: float,
        stall_after: float | None = None,
    ) -> None:
        self.silent_after = check_silent_after(silent_after)
        self.heartbeat = heartbeat
        self.started = started
        self.stall_after = stall_after
        self.last_tick = started
        self.stalls = 0
        self.owed_since: float | None = None
        self.probed_at: float | None = None

    def due(self, heard: float) -> float:
        """When the next frame is due, the last one heard at ``heard``."""
        heard = max(heard, self.started)
        due = heard + self.heartbeat if self.heartbeat > 0 else float("inf")
        if self.owed_since is not None:
            due = min(due, max(heard, self.owed_since))
        return due

    def tick(self, now: float, heard: float, owed: bool) -> Verdict:
        """``heard``: when the server last sent a byte; ``owed``: whether the client
        awaits an answer now."""
        if self.stall_after is not None and now - self.last_tick > self.stall_after:
            self.stalls += 1
            self.started = now
            self.owed_since = self.probed_at = None
        self.last_tick = now
        if not owed:
            self.owed_since = None
        elif self.owed_since is None:
            self.owed_since = now
        if self.probed_at is not None and heard >= self.probed_at:
            self.probed_at = None  # answered
        late = now - self.due(heard)
        if late >= self.silent_after:
            return "silent"
        if late >= self.silent_after / 2 and self.probed_at is None:
            self.probed_at = now
            return "probe"
        return "wait"


class _HeardReader(asyncio.StreamReader):
    """A stream reader that notes when bytes last arrived."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self.heard = loop.time()
        self._clock = loop.time

    def feed_data(self, data: Any) -> None:
        self.heard = self._clock()
        super().feed_data(data)


class WatchedTransport(aiormq.TransportFactory):
    """Opens an AMQP connection's socket as aiormq's own factories do (TCP, or TLS for
    amqps) and keeps the last one opened: when its server last sent a byte, and a way
    to cut it without waiting for a server that may never answer."""

    def __init__(self) -> None:
        self.reader: _HeardReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        provider = kwargs.pop("ssl_context_provider", None)
        ssl = await provider.get_context() if url.scheme == "amqps" and provider else None
        loop = asyncio.get_running_loop()
        reader = _HeardReader(loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await loop.create_connection(
                lambda: protocol, url.host or "", url.port or 5672, ssl=ssl, **kwargs
            )
        except OSError as error:
            raise aiormq.exceptions.AMQPConnectionError(*error.args) from error
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        self.reader, self.writer = reader, writer
        return reader, writer

    def heard(self) -> float:
        """When the server last sent a byte (loop time). Bytes the client has not read
        yet (its reader paused, the application slow) count as heard now."""
        if self.reader is None or self.writer is None:
            return asyncio.get_running_loop().time()
        transport = self.writer.transport
        if not transport.is_closing() and not transport.is_reading():  # type: ignore[attr-defined]
            return asyncio.get_running_loop().time()
        return self.reader.heard

    def cut(self) -> None:
        """Close the socket now (aiormq then finds its connection closed)."""
        if self.writer is not None:
            self.writer.transport.abort()


def owes_confirms(connection: aiormq.abc.AbstractConnection) -> bool:
    """Whether a publish on any channel of this connection awaits its confirm."""
    return any(
        channel is not None and bool(getattr(channel, "confirmations", None))
        for channel in list(connection.channels.values())
    )


class Watch:
    """Applies ``Silence`` to one aiormq connection until stopped or silent.

    ``owed`` says whether the client awaits an answer; a probe is a Basic.Qos on a
    channel of the watch's own, opened at the first probe. On the verdict the socket
    is cut and ``on_silent`` called (once) with a ``ServerSilent`` naming the server.
    """

    def __init__(
        self,
        connection: aiormq.abc.AbstractConnection,
        transport: WatchedTransport,
        silent_after: float,
        address: str,
        on_silent: Callable[[ServerSilent], None],
        owed: Callable[[], bool] | None = None,
    ) -> None:
        self.connection = connection
        self.transport = transport
        self.address = address
        self.on_silent = on_silent
        self.owed = owed or (lambda: owes_confirms(connection))
        loop = asyncio.get_running_loop()
        tune = getattr(connection, "connection_tune", None)
        heartbeat = float(getattr(tune, "heartbeat", 0) or 0)
        self.interval = min(0.1, check_silent_after(silent_after) / 10)
        self.rule = Silence(
            silent_after, heartbeat, loop.time(), stall_after=silent_after * STALL_SHARE
        )
        self.probes = 0
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._probe: asyncio.Task[None] | None = None
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.connection.is_closed:
            await asyncio.sleep(self.interval)
            verdict = self.rule.tick(loop.time(), self.transport.heard(), self.owed())
            if verdict == "probe":
                self.probes += 1
                if self._probe is None or self._probe.done():
                    self._probe = loop.create_task(self._ask())
            elif verdict == "silent":
                heard = self.transport.heard()
                self.transport.cut()
                self.on_silent(
                    ServerSilent(
                        f"{self.address} sent nothing for {loop.time() - heard:.1f} s "
                        f"(silent_after {self.rule.silent_after} s)"
                    )
                )
                return

    async def _ask(self) -> None:
        with contextlib.suppress(Exception):
            if self._channel is None or self._channel.is_closed:
                self._channel = await self.connection.channel(publisher_confirms=False)
            else:
                await self._channel.basic_qos(prefetch_count=0)

    def heard_ago(self) -> float:
        """Seconds since the server last sent a byte."""
        return max(0.0, asyncio.get_running_loop().time() - self.transport.heard())

    async def stop(self) -> None:
        """Stop ticking. A probe still waiting for its answer is left to end with its
        connection (cut, or closed by the owner next): cancelled, aiormq would warn of
        the cancelled call."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class Watching:
    """The watch of whichever connection its owner uses now: begun on each new one, ended
    when that one is lost or closed."""

    def __init__(self, silent_after: float) -> None:
        self.silent_after = check_silent_after(silent_after)
        self.watch: Watch | None = None
        self._silence: ServerSilent | None = None

    def begin(
        self,
        connection: aiormq.abc.AbstractConnection,
        transport: WatchedTransport,
        address: str,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Watch this connection; ``then`` is called when its server is found silent
        (after its socket is cut)."""

        def silent(silence: ServerSilent) -> None:
            self._silence = silence
            if then is not None:
                then()

        self._silence = None
        self.watch = Watch(connection, transport, self.silent_after, address, silent)

    async def end(self) -> tuple[float, ServerSilent | None]:
        """Stop watching: how long ago the server last sent a byte, and the verdict if
        the watch found it silent."""
        watch, self.watch = self.watch, None
        silence, self._silence = self._silence, None
        if watch is None:
            return 0.0, silence
        await watch.stop()
        return watch.heard_ago(), silence
