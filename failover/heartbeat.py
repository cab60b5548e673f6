"""The heartbeat: this server's state sent to the peer on a thread of its own.

Owns: a thread running its own asyncio loop, the peering link on that loop, the periodic
send of the newest state message (every heartbeat, and at once when poked), and the
record of its own ticks: ``last_tick`` (monotonic) and a gap longer than the failover
timeout between two ticks, which means the whole process was frozen (SIGSTOP, a VM pause,
a stall of the interpreter) and is reported through ``on_pause``.

Why a thread: a broker loop kept busy by one client (huge header tables, a flood of small
frames) must not delay the state messages its peer waits for, or a busy server looks dead
and the peer's client vote fails over from a healthy server. The thread holds the GIL only
for the short work of a send; the interpreter hands it over within its switch interval.

Must not know: the state machine or the broker. It calls back with values only: the
message to send comes from ``make_message`` (``None``: the periodic state; else a type
such as a handover) and a pause is first reported to ``fence`` (both
called on this thread: they must only read immutable values and assign attributes), and
``on_link_up`` / ``on_pause`` / ``on_peer_gone`` (the peer's link dropped and its port
refuses: its process is gone) are run on the broker's loop.
See docs/architecture.md ("The heartbeat thread").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from peering import Peering

log = logging.getLogger("amqha.failover")

Message = tuple[bytes, str, dict[str, Any]]  # body, type, headers


class Heartbeat:
    def __init__(
        self,
        peering_factory: Callable[[Callable[[], None]], Peering],
        make_message: Callable[[str | None], Message],
        interval: float,
        pause_after: float,
        main_loop: asyncio.AbstractEventLoop,
        on_link_up: Callable[[dict[str, Any]], None],
        on_pause: Callable[[float], None],
        fence: Callable[[float], None],
        exchange: str,
        on_peer_gone: Callable[[int], None] | None = None,
    ) -> None:
        self._peering_factory = peering_factory
        self._make_message = make_message
        self.interval = interval
        self.pause_after = pause_after
        self._main = main_loop
        self._on_link_up = on_link_up
        self._on_pause = on_pause
        self._fence = fence
        self._exchange = exchange
        self._on_peer_gone = on_peer_gone
        self.last_tick = time.monotonic()
        # Freezes seen so far: a report made before one (the peer's port refused) is stale
        # after it, and ``on_peer_gone`` gets the count it was made under.
        self.pauses = 0
        self.running = True  # console "controller stop" clears it: no state goes out
        self.peering: Peering | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None

    # -- from the broker's loop ---------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="amqha-heartbeat", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout=10):
            raise RuntimeError("the heartbeat thread did not start")

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def poke(self) -> None:
        """Send the current state now (a transition: the pair settles faster)."""
        self._call(self._send_state)

    def send(self, kind: str) -> None:
        """Send one message of type ``kind`` now (a handover). It is built on this thread,
        like every state message, so sequence numbers go out in order."""
        self._call(lambda: self._publish(self._make_message(kind)))

    def reset(self) -> None:
        """Count ticks from now (the controller starts again after a console stop)."""
        self.last_tick = time.monotonic()

    @property
    def connected(self) -> bool:
        return self.peering is not None and self.peering.connected

    def _call(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the thread is stopping
                loop.call_soon_threadsafe(callback)

    # -- on the heartbeat thread ---------------------------------------------------------

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main_task())
        finally:
            loop.close()

    async def _main_task(self) -> None:
        self._stop = asyncio.Event()
        self.peering = self._peering_factory(self._link_up)
        if self._on_peer_gone is not None:
            on_peer_gone = self._on_peer_gone
            self.peering.on_gone = lambda: self._to_main(on_peer_gone, self.pauses)
        await self.peering.start()
        self._started.set()
        self.last_tick = time.monotonic()
        tick = asyncio.get_running_loop().create_task(self._ticks())
        await self._stop.wait()
        tick.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tick
        await self.peering.stop()

    async def _ticks(self) -> None:
        while True:
            now = time.monotonic()
            gap = now - self.last_tick
            paused = gap > self.pause_after
            if paused:
                self.pauses += 1
                # On this thread, before last_tick moves: from the moment a confirm can no
                # longer see a stale tick, it sees the fence (see FailoverController.serving).
                self._fence(gap)
            self.last_tick = now
            if paused:
                self._to_main(self._on_pause, gap)
            self._send_state()
            await asyncio.sleep(self.interval)

    def _link_up(self) -> None:
        assert self.peering is not None
        self._to_main(self._on_link_up, dict(self.peering.server_properties))

    def _send_state(self) -> None:
        if self.running:
            self._publish(self._make_message(None))

    def _publish(self, message: Message) -> None:
        body, kind, headers = message
        if self.peering is not None:
            self.peering.publish(self._exchange, body, message_type=kind, headers=headers)

    def _to_main(self, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the broker's loop is closing
            self._main.call_soon_threadsafe(callback, *args)
