"""The loop under a ``Publisher`` or ``Consumer``: one channel on the ACTIVE at a time.

Owns: ``Link`` (connect to the ACTIVE, open a channel, run the application's ``setup``
on it and run on it until it is lost or its server falls silent, then connect again, the
failover logged once; until closed), and telling a server that refused a channel or a
setup from a server that is gone (docs/client.md).

Must not know: what a publisher holds or a consumer handles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

import aio_pika
import aiormq
from yarl import URL

from amqha.client_watch import DEFAULT_SILENT_AFTER, WatchedTransport, Watching

from .connection import connect
from .failover_log import FailoverLog, current_failover, describe
from .servers import address_of, watched_servers

log = logging.getLogger("amqha.client")


class Link:
    """The loop of a Publisher or Consumer over connections: connect to the ACTIVE, open
    a channel and run on it until it is lost (or its server falls silent: see
    amqha.client_watch), connect again (the failover logged once); until closed."""

    publisher_confirms = False

    def __init__(
        self,
        urls: Sequence[str | URL] | str,
        name: str,
        setup: Callable[[aio_pika.abc.AbstractChannel], Awaitable[Any]] | None,
        attempt_timeout: float,
        warn_after: float,
        connect_kwargs: dict[str, Any],
        silent_after: float = DEFAULT_SILENT_AFTER,
    ) -> None:
        self.servers = watched_servers(urls)
        self.watching = Watching(silent_after)
        self.setup = setup
        self.attempt_timeout = attempt_timeout
        self.connect_kwargs = connect_kwargs
        self.failover = FailoverLog(name, warn_after)
        self.serving = asyncio.Event()
        self.closing = False
        self.task: asyncio.Task[None] | None = None
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.channel: aio_pika.abc.AbstractChannel | None = None
        self.underlay: aiormq.abc.AbstractChannel | None = None  # None while failing over
        self.server: str | None = None  # the address of the server in use
        self.channel_refused = False  # the server closed the last channel over an error
        self.setup_error: BaseException | None = None  # the server's answer to setup
        self._setup_failed = asyncio.Event()
        self._lost = asyncio.Event()

    @property
    def failovers(self) -> int:
        """How many times this client moved to another server after losing one."""
        return self.failover.failovers

    async def start(self, timeout: float = 30.0) -> Self:
        """Connect (at most ``timeout`` s, else ConnectionError) and start publishing or
        consuming."""
        await self._start(timeout)
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    async def _start(self, timeout: float) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        waits = [
            asyncio.ensure_future(self.serving.wait()),
            asyncio.ensure_future(self._setup_failed.wait()),
        ]
        try:
            await asyncio.wait(
                [*waits, self.task], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
        if self.task.done():
            self.task.result()  # its error, if it had one
        if not self.serving.is_set():
            await self._stop()
            if self.setup_error is not None:
                raise RuntimeError(
                    f"{self.failover.name}: setup failed: {describe(self.setup_error)}"
                ) from self.setup_error
            raise ConnectionError(f"{self.failover.name}: no ACTIVE server after {timeout} s")

    async def _run(self) -> None:
        current_failover.set(self.failover)
        while not self.closing:
            if await self._open():
                await self._serve()

    async def _serve(self) -> None:
        """Run on the channel just opened until it is lost."""
        await self._until_lost()

    async def _open(self) -> bool:
        """One connection and channel to the ACTIVE; False when they failed (reported)."""
        wire = WatchedTransport()
        try:
            connection = await connect(
                self.servers,
                retry_for=max(self.attempt_timeout, 1.0),
                attempt_timeout=self.attempt_timeout,
                failover=self.failover,
                transport_factory=wire,
                **self.connect_kwargs,
            )
        except ConnectionError:
            return False
        address = address_of(connection.url)  # type: ignore[attr-defined]
        underlying = connection.transport.connection  # type: ignore[attr-defined,union-attr]
        self.watching.begin(underlying, wire, address, self.lost)
        try:
            channel = await connection.channel(publisher_confirms=self.publisher_confirms)
            self.underlay = await channel.get_underlay_channel()
            if self.setup is not None:
                await self.setup(channel)
            await self._on_channel(channel)
        except Exception as error:
            self.underlay = None
            await self.watching.end()
            if alive(connection):
                # The server answered the setup with an error: the application's to fix.
                log.error(
                    "%s: setup on %s failed: %s", self.failover.name, address, describe(error)
                )
                self.setup_error = error
                self._setup_failed.set()
                await drop(connection)
                await asyncio.sleep(1.0)
            else:
                self.failover.attempt_failed(address, error)
                await drop(connection)
            return False
        except BaseException:
            self.underlay = None
            await self.watching.end()
            await drop(connection)
            raise
        self.connection, self.channel, self.server = connection, channel, address
        self._lost.clear()
        self.failover.served(address)
        self.serving.set()
        return True

    async def _on_channel(self, channel: aio_pika.abc.AbstractChannel) -> None:
        """What a fresh channel needs before it serves (qos, consume)."""

    async def _until_lost(self) -> None:
        """Until the connection or channel in use closes, ``lost()`` is called, or closing."""
        assert self.connection is not None and self.underlay is not None
        underlay = self.underlay
        transport = self.connection.transport  # type: ignore[attr-defined]
        watched = [asyncio.ensure_future(self._lost.wait()), underlay.closing]
        if transport is not None:
            watched.append(transport.connection.closing)
        try:
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in watched:
                future.cancel()
        self.serving.clear()
        self.underlay = None
        heard_ago, silence = await self.watching.end()
        if self.closing:
            return
        error = silence or next(
            (f.exception() for f in done if not f.cancelled() and f.exception() is not None),
            None,
        )
        if error is None and underlay.is_closed:  # woken by lost(): why the channel closed
            closing = underlay.closing
            if closing.done() and not closing.cancelled():
                error = closing.exception()
        if isinstance(error, aiormq.exceptions.ChannelClosed) and alive(self.connection):
            # The server closed this channel only: an error of the application's (a
            # missing exchange, say), not a failover.
            log.warning(
                "%s: the server at %s closed the channel (%s); opening another",
                self.failover.name,
                self.server,
                describe(error),
            )
            self.channel_refused = True
            await drop(self.connection)
            await asyncio.sleep(1.0)
            return
        self.failover.lost(self.server or "?", error, heard_ago)
        self.servers.lost(self.connection.url, error)  # type: ignore[attr-defined]
        await drop(self.connection)

    def lost(self) -> None:
        """The connection in use failed an operation: drop it and fail over."""
        self._lost.set()

    async def _stop(self) -> None:
        self.closing = True
        self._lost.set()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.watching.end()
        if self.connection is not None:
            await drop(self.connection)
        self.serving.clear()
        self.underlay = None


def alive(connection: aio_pika.abc.AbstractConnection | None) -> bool:
    transport = getattr(connection, "transport", None)
    return transport is not None and not transport.connection.is_closed


async def drop(connection: aio_pika.abc.AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(connection.close(), 2.0)
