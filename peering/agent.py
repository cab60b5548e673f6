"""One peering: keep an AMQP connection to a remote server open, and publish over it.

Owns: connecting (aiormq) as the peering user, over TLS when given a context,
reconnecting with capped exponential backoff after any failure (refused, reset, cut,
remote restart, a connect that hangs, a certificate not trusted), one channel for
publishing, and up/down notifications; a link that carries the pair's control traffic
has its socket marked so (``control``, ``amqha.netmark``). A TLS failure is logged as an
error, once per distinct reason until the link comes up: it will not heal by retrying. Evidence that the
remote's process is gone: once a link that was up drops, its port refusing connections on
every address is reported to ``on_gone`` (docs/failover.md, "Evidence").

Must not know: what is published (failover state, later replication), the failover
state machine, the local broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiormq
from pamqp.commands import Basic

from amqha.logtext import error_chain
from amqha.netmark import mark_transport

log = logging.getLogger("amqha.peering")
# aiormq logs every refused connect at ERROR; a peering retries by design and logs its own
# link up/down lines, so only aiormq's critical messages are kept.
logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)


@dataclass
class PeeringStatus:
    connected: bool = False
    attempts: int = 0
    connects: int = 0
    last_error: str | None = None
    published: int = 0
    dropped: int = 0


def raise_if_cancelled() -> None:
    """Raise the cancel this task did not see as a ``CancelledError``: ``asyncio.wait_for``
    (Python 3.11) returns or raises a step's own outcome when the step finished in the
    turn the cancel came, and the cancel is not delivered again. A reconnect loop calls
    this on every lap; without it, a link whose connect was refused in that turn went on
    reconnecting after its task was cancelled, and a server's loop never finished
    closing at shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError


class Reconnecting:
    """The reconnect loop of a link: connect (``_open``, bounded by the subclass), count
    and report it up, wait until it closes (``_wait_closed``), report it down, back off
    and connect again, until ``stop``. After a failed connect the delay doubles up to
    ``backoff_max``; a TLS failure is logged as an error once per distinct reason until a
    connect works."""

    def __init__(
        self,
        url: str,
        name: str,
        backoff_initial: float,
        backoff_max: float,
        connect_timeout: float,
        on_up: Callable[[], None] | None,
        on_down: Callable[[str], None] | None,
    ) -> None:
        self.url = url
        self.name = name
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.on_up = on_up
        self.on_down = on_down
        self.status = PeeringStatus()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._tls_error_logged: str | None = None
        # Called when the link has dropped and the remote's port refuses connections on
        # every address: nothing serves there (docs/failover.md, "Evidence").
        self.on_gone: Callable[[], None] | None = None
        self._lost = False  # the link was up and dropped, and no evidence was given since

    async def _open(self) -> None:
        """Connect, within ``connect_timeout``; raise if it cannot."""
        raise NotImplementedError

    async def _wait_closed(self) -> str:
        """Wait until the link closes; why it did."""
        raise NotImplementedError

    async def _close(self) -> None:
        """Close the link, if one is open, and forget it."""
        raise NotImplementedError

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self._close()

    def _own_cancel(self) -> bool:
        """Whether a ``CancelledError`` seen now is this link being stopped. Anything else
        that ends in one (aiormq resolves a connection it calls stuck, with no frame for
        three heartbeats, with a ``CancelledError``) is a link that failed: the loop goes
        on. A link ends only when its owner stops it (docs/failover.md, "Freezes")."""
        task = asyncio.current_task()
        return self._stopping or (task is not None and task.cancelling() > 0)

    async def _run(self) -> None:
        while not self._stopping:
            raise_if_cancelled()
            try:
                await self._connect_loop()
            except asyncio.CancelledError:
                if self._own_cancel():
                    raise
                reason = "the link was cancelled under it (declared stuck)"
            except Exception as error:  # a bug in a callback must not end the link
                reason = f"{type(error).__name__}: {error}"
                log.exception("%s: link failed, reconnecting", self.name)
            if self._stopping:
                return
            self.status.connected = False
            with contextlib.suppress(Exception):
                await self._close()
            self.status.last_error = reason
            log.warning("%s: link down (%s), reconnecting", self.name, reason)
            if self.on_down is not None:
                self.on_down(reason)
            self._lost = True
            await asyncio.sleep(self.backoff_initial)

    async def _connect_loop(self) -> None:
        delay = self.backoff_initial
        while not self._stopping:
            raise_if_cancelled()
            self.status.attempts += 1
            try:
                await self._open()
            except asyncio.CancelledError:
                if self._own_cancel():
                    raise
                await self._close()
                self.status.last_error = "the connect was cancelled under it"
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max)
                continue
            except Exception as error:
                await self._close()
                self.status.last_error = f"{type(error).__name__}: {error}"
                log.debug("%s: connect to %s failed: %s", self.name, _censor(self.url), error)
                tls_error = _tls_failure(error)
                if tls_error is not None and tls_error != self._tls_error_logged:
                    self._tls_error_logged = tls_error
                    log.error("%s: TLS to %s refused: %s", self.name, _censor(self.url), tls_error)
                await self._look_for_evidence()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max)
                continue
            delay = self.backoff_initial
            self._tls_error_logged = None
            self._lost = False
            self.status.connected = True
            self.status.connects += 1
            self.status.last_error = None
            log.info("%s: link up to %s", self.name, _censor(self.url))
            if self.on_up is not None:
                self.on_up()
            reason = await self._wait_closed()
            self.status.connected = False
            await self._close()
            if self._stopping:
                return
            self.status.last_error = reason
            log.info("%s: link down (%s), reconnecting", self.name, reason)
            if self.on_down is not None:
                self.on_down(reason)
            self._lost = True
            await self._look_for_evidence()
            await asyncio.sleep(delay)

    async def _look_for_evidence(self) -> None:
        """After the link dropped (and until it is up again), tell ``on_gone`` once if the
        remote's port refuses connections: its process is gone, not merely silent."""
        if not self._lost or self.on_gone is None:
            return
        parts = urlsplit(self.url)
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        if await refused_everywhere(parts.hostname or "localhost", port, self.connect_timeout):
            self._lost = False
            log.info(
                "%s: %s refuses connections since the link dropped: nothing serves there",
                self.name,
                _censor(self.url),
            )
            self.on_gone()


class _Response:
    def __init__(self, text: str) -> None:
        self.text = text

    def marshal(self) -> str:
        return self.text


class _Proof:
    """A PLAIN login whose password field is a proof made from the Connection.Start."""

    name = "PLAIN"

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self, connection: Any) -> _Response:
        return _Response(self.text)


class ControlTransport(aiormq.TransportFactory):
    """Opens the socket as aiormq's own factories do (TCP, or TLS for amqps), then marks
    it as the pair's control traffic (``amqha.netmark``). ``problem``: why the last socket
    could not be marked, or None; ``writer``: the last one opened."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def create(
        self, url: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        opener = (
            aiormq.connection.TLSTransportFactory()
            if url.scheme == "amqps"
            else aiormq.connection.TCPTransportFactory()
        )
        reader, writer = await opener.create(url, **kwargs)
        self.problem = mark_transport(writer.transport)
        self.writer = writer
        return reader, writer


class _ProvingConnection(aiormq.Connection):
    """aiormq's connection, with a login that answers the server's Connection.Start
    (``login_proof(server_properties)``) instead of sending the URL's password."""

    login_proof: Callable[[dict[str, Any]], str]

    def _credentials_class(self, start_frame: Any) -> Any:
        if "PLAIN" not in (start_frame.mechanisms or "").split():
            raise aiormq.exceptions.AuthenticationError(start_frame.mechanisms, ["PLAIN"])
        proof = self.login_proof(dict(start_frame.server_properties or {}))
        return _Proof(f"\0{self.url.user or 'guest'}\0{proof}")


class Peering(Reconnecting):
    """A robust directed connection to ``url``; ``publish`` is fire-and-forget.

    Messages published while the link is down are dropped (and counted): state
    messages are periodic and only the newest matters.
    """

    def __init__(
        self,
        url: str,
        name: str = "peering",
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        connect_timeout: float = 2.0,
        heartbeat: int = 5,
        on_up: Callable[[], None] | None = None,
        on_down: Callable[[str], None] | None = None,
        client_properties: dict[str, Any] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        on_channel: Callable[[aiormq.abc.AbstractChannel], Awaitable[None]] | None = None,
        login_proof: Callable[[dict[str, Any]], str] | None = None,
        control: bool = False,
    ) -> None:
        """``login_proof(server_properties)``: what the login sends instead of the URL's
        password (docs/security.md, "Logins"); ``control``: the link carries what the
        failover rules read, marked ahead of bulk traffic; ``ssl_context``: connect with
        TLS (``url`` then says amqps); ``server_hostname``: the name checked in the
        remote's certificate, if not the host of ``url``;
        ``on_channel``: awaited with each new link's channel before it counts as up (to
        subscribe, say); if it fails, the link is retried like a failed connect."""
        super().__init__(url, name, backoff_initial, backoff_max, connect_timeout, on_up, on_down)
        self.heartbeat = heartbeat
        self.on_channel = on_channel
        self.login_proof = login_proof
        self.client_properties = {"connection_name": name, **(client_properties or {})}
        # What the remote announced in Connection.Start on the current link, for callers to vet.
        self.server_properties: dict[str, Any] = {}
        self._connection: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._connect_options: dict[str, Any] = {}
        self.transport: ControlTransport | None = None
        if control:
            self.transport = ControlTransport()
            self._connect_options["transport_factory"] = self.transport
        self._mark_logged: str | None = None
        if ssl_context is not None:
            self._connect_options["context"] = ssl_context
            if server_hostname is not None:
                self._connect_options["server_hostname"] = server_hostname

    @property
    def connected(self) -> bool:
        return self._channel is not None and not self._channel.is_closed

    def publish(
        self,
        exchange: str,
        body: bytes,
        routing_key: str = "",
        content_type: str = "application/json",
        message_type: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> bool:
        """Send one message if the link is up; False (and counted) if it is not."""
        channel = self._channel
        if channel is None or channel.is_closed:
            self.status.dropped += 1
            return False
        properties = Basic.Properties(
            content_type=content_type, message_type=message_type, headers=headers
        )
        task = asyncio.ensure_future(
            channel.basic_publish(
                body, exchange=exchange, routing_key=routing_key, properties=properties
            )
        )
        task.add_done_callback(self._published)
        return True

    def _published(self, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            self.status.dropped += 1
        else:
            self.status.published += 1

    async def _open(self) -> None:
        url = f"{self.url}{'&' if '?' in self.url else '?'}heartbeat={self.heartbeat}"
        if self.login_proof is not None:
            proving = _ProvingConnection(
                url, client_properties=self.client_properties, **self._connect_options
            )
            proving.login_proof = self.login_proof
            await bounded(proving.connect(), self.connect_timeout)
            connection: aiormq.abc.AbstractConnection = proving
        else:
            connection = await bounded(
                aiormq.connect(
                    url, client_properties=self.client_properties, **self._connect_options
                ),
                self.connect_timeout,
            )
        self._connection = connection
        problem = None if self.transport is None else self.transport.problem
        if problem is not None and problem != self._mark_logged:  # once per distinct reason
            log.warning("%s: %s; its heartbeats may wait behind bulk traffic", self.name, problem)
        self._mark_logged = problem
        channel = await bounded(connection.channel(), self.connect_timeout)
        if self.on_channel is not None:
            await bounded(self.on_channel(channel), self.connect_timeout)
        self._channel = channel
        self.server_properties = dict(connection.server_properties or {})

    async def _wait_closed(self) -> str:
        connection = self._connection
        assert connection is not None
        try:
            await connection.closing
        except asyncio.CancelledError:
            if self._own_cancel():
                raise
            # aiormq's verdict on a connection with no frame for three heartbeats (a frozen
            # or cut-off remote): the link is down, not this task cancelled.
            return "no frame from the remote for three heartbeats: the link is stuck"
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return "closed"

    async def _close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 1.0)


async def refused_everywhere(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` refuses a TCP connection on every address it resolves to: the
    kernel's answer that no process listens there. A connection that opens (it is closed at
    once), a timeout or any other error is no such answer: False."""
    loop = asyncio.get_running_loop()
    try:
        found = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout
        )
    except (OSError, TimeoutError):
        return False
    for family, kind, proto, _, address in found:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        except ConnectionRefusedError:
            continue
        except (OSError, TimeoutError):
            return False
        finally:
            sock.close()
        return False
    return bool(found)


async def bounded(step: Awaitable[Any], timeout: float) -> Any:
    """``asyncio.wait_for(step, timeout)``, but the step's own outcome is always taken.

    A link is stopped by cancelling its task, and ``wait_for`` then cancels the step and
    waits for it. An aiormq connect that is cancelled while its socket is being closed
    under it ends with the connection error rather than ``CancelledError``; ``wait_for``
    raises ``CancelledError`` and nothing ever reads that error, so asyncio logs "Task
    exception was never retrieved" with a traceback at shutdown. Reading it here keeps a
    clean stop clean."""
    task = asyncio.ensure_future(step)
    task.add_done_callback(_take_outcome)
    return await asyncio.wait_for(task, timeout)


def _take_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _tls_failure(error: BaseException) -> str | None:
    """The TLS reason behind a failed connect (aiormq wraps it), or None if not TLS."""
    for current in error_chain(error):
        if isinstance(current, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {current.verify_message}"
        if isinstance(current, ssl.SSLError):
            return str(current.reason or current)
    text = str(error)
    return text if "[SSL" in text else None


def _censor(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
