"""A small TCP proxy (on 127.0.0.1 unless told) for cutting, healing and delaying a link.

Owns: one listening socket that pipes every accepted connection to a fixed target,
and the link faults a test injects: ``cut()`` (close every piped connection, then
refuse or blackhole new ones), ``heal()`` and ``delay(seconds)``.

It runs its own asyncio loop in a daemon thread, so synchronous tests and tests on
another event loop use it alike: every control method blocks its caller (briefly,
bounded) until the proxy loop has carried it out. ``python -m tests.proxy`` runs one as a
process of its own (a test host in a network namespace uses it to delay a link: the kernel
there has no netem), until SIGTERM.

Must not know: AMQP, the pair, which process listens behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

CONTROL_TIMEOUT = 5.0
CHUNK = 65536


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port``.

    ``mode`` of a cut: ``"refuse"`` accepts and closes at once (the client sees a reset
    or EOF, like a refused connect); ``"blackhole"`` accepts and never answers (the
    client's connect hangs until its own timeout), closing those sockets on heal.
    """

    def __init__(
        self,
        target_port: int,
        target_host: str = "127.0.0.1",
        port: int = 0,
        listen_host: str = "127.0.0.1",
    ) -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.requested_port = port
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.cut_mode: str | None = None
        self.delay_seconds = 0.0
        self.accepted = 0
        self.piped = 0
        self._links: set[_Link] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name=f"proxy->{target_port}", daemon=True)

    # -- control, from any thread ---------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CONTROL_TIMEOUT)
        if not self._thread.is_alive():
            self.loop.close()

    def cut(self, mode: str = "refuse") -> None:
        """Close every piped connection now; new ones are refused or blackholed until heal()."""
        if mode not in ("refuse", "blackhole"):
            raise ValueError(f"cut mode is 'refuse' or 'blackhole', not {mode!r}")
        self._call(self._cut(mode))

    def heal(self) -> None:
        """Pipe new connections again (and release blackholed ones, by closing them)."""
        self._call(self._heal())

    def delay(self, seconds: float) -> None:
        """Hold every chunk this long before forwarding it, both ways; 0 restores."""
        if seconds < 0:
            raise ValueError("a delay cannot be negative")
        self._call(self._set_delay(seconds))

    @property
    def is_cut(self) -> bool:
        return self.cut_mode is not None

    @property
    def open_links(self) -> int:
        return len(self._links)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CONTROL_TIMEOUT)

    # -- the proxy loop -------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.listen_host, self.requested_port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut("refuse")
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _cut(self, mode: str) -> None:
        self.cut_mode = mode
        for link in list(self._links):
            link.close()
        self._links.clear()

    async def _heal(self) -> None:
        self.cut_mode = None
        for writer in list(self._held):
            _abort(writer)
        self._held.clear()

    async def _set_delay(self, seconds: float) -> None:
        self.delay_seconds = seconds

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.cut_mode == "refuse":
            _abort(writer)
            return
        if self.cut_mode == "blackhole":
            self._held.add(writer)
            return
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONTROL_TIMEOUT
            )
        except (TimeoutError, OSError):
            _abort(writer)
            return
        if self.cut_mode is not None:  # cut while we were connecting
            _abort(writer)
            _abort(target_writer)
            return
        self.piped += 1
        link = _Link(self, (reader, writer), (target_reader, target_writer))
        self._links.add(link)
        await link.run()
        self._links.discard(link)


class _Link:
    """One client connection piped to the target: two pumps, closed together."""

    def __init__(
        self,
        proxy: TcpProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.writers = (client[1], target[1])
        self.pumps = (
            asyncio.ensure_future(self._pump(client[0], target[1])),
            asyncio.ensure_future(self._pump(target[0], client[1])),
        )

    async def run(self) -> None:
        await asyncio.wait(self.pumps, return_when=asyncio.FIRST_COMPLETED)
        self.close()
        await asyncio.gather(*self.pumps, return_exceptions=True)

    def close(self) -> None:
        for pump in self.pumps:
            pump.cancel()
        for writer in self.writers:
            _abort(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Each chunk is due `delay` after it was read; a second task writes them in order,
        # so a delay adds latency without throttling throughput.
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(due, writer))
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                await due.put((loop.time() + self.proxy.delay_seconds, data))
            await due.put((loop.time() + self.proxy.delay_seconds, b""))
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()

    @staticmethod
    async def _send(due: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            when, data = await due.get()
            wait = when - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                return
            writer.write(data)
            await writer.drain()


def _abort(writer: asyncio.StreamWriter) -> None:
    transport = writer.transport
    if transport is not None and not transport.is_closing():
        transport.abort()


def main() -> None:
    """``python -m tests.proxy LISTEN_HOST:PORT TARGET_HOST:PORT [--delay S]``."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m tests.proxy", description=main.__doc__)
    parser.add_argument("listen")
    parser.add_argument("target")
    parser.add_argument("--delay", type=float, default=0.0)
    options = parser.parse_args()
    listen_host, _, listen_port = options.listen.rpartition(":")
    target_host, _, target_port = options.target.rpartition(":")
    proxy = TcpProxy(int(target_port), target_host, int(listen_port), listen_host).start()
    proxy.delay(options.delay)
    print(f"proxy listening on {listen_host}:{proxy.port}", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    proxy.stop()


if __name__ == "__main__":
    main()
