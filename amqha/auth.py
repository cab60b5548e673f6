"""Who may log in: passwords checked off the event loop, loopback-only users, failed logins.

Owns: checking a login's user name and password against the configured users (plain,
RabbitMQ SHA-256/512 or scrypt, see ``config.passwords``), the loopback-only rule
(``auth.loopback_users``, guest by default, as RabbitMQ), and what a failed login costs
its sender: the refusal comes ``auth.failed_login_delay`` seconds after the attempt, never
sooner, whatever the reason (no user, wrong password, wrong address), so a wrong user
name cannot be told from a wrong password by timing. Failed logins are logged, at most
``LOG_BURST`` lines per ``LOG_WINDOW`` seconds, with a count of the ones left out.

Bounds: scrypt checks run on ``CHECK_THREADS`` threads; at most ``MAX_PENDING`` logins wait
for a check or a delayed refusal at once, and one source (an IPv4 address, an IPv6 /64:
``source_of``) holds at most ``PER_SOURCE`` of them; the last ``RESERVE`` places go only to
sources that hold fewer than ``RESERVE_BELOW``. Past its share a login is refused at once,
without a check, so a flood of attempts holds neither memory nor CPU (connections waiting
here stop being read) and cannot keep the logins of other sources out (docs/security.md,
"Logins under a flood"). A costly check is made once for logins that give the same hash
and password at once, and a match is remembered for ``VERIFIED_TTL`` seconds (at most
``VERIFIED_MAX``), by a digest under a random key of this process: a reconnect storm
costs one check per distinct login, not one per connection (docs/security.md, "Logins").

Must not know: frames and connection states (``connection`` asks and closes), sockets.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from config import AuthConfig, User
from config.passwords import BadHash, Verifier, parse_hash

from .core.access import Access
from .logtext import escaped

log = logging.getLogger("amqha.auth")

CHECK_THREADS = 2
MAX_PENDING = 1024
PER_SOURCE = 64
RESERVE = 256
RESERVE_BELOW = 4
LOG_BURST = 10
LOG_WINDOW = 60.0
MADE_VERIFIERS = 4096  # run-time users' verifiers kept parsed
VERIFIED_TTL = 300.0  # seconds a costly check's match is remembered
VERIFIED_MAX = 4096  # matches remembered, the least recently used forgotten first


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def source_of(address: str) -> str:
    """Whose login this is, for the per-source shares: the IPv4 address (IPv4-mapped
    included), or the /64 of an IPv6 address (one host usually holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


@dataclass(frozen=True)
class Refused:
    """Why a login was refused: ``text`` goes to the client in Connection.Close 403."""

    text: str
    reason: str  # for the log only


class LogLimiter:
    """Lets ``burst`` lines through per ``window`` seconds and counts the rest (pure)."""

    def __init__(self, burst: int = LOG_BURST, window: float = LOG_WINDOW) -> None:
        self.burst = burst
        self.window = window
        self.window_start: float | None = None
        self.logged = 0
        self.suppressed = 0

    def admit(self, now: float) -> tuple[bool, int]:
        """(may this line be logged, how many were left out before it)."""
        if self.window_start is None or now - self.window_start >= self.window:
            self.window_start = now
            self.logged = 0
        if self.logged >= self.burst:
            self.suppressed += 1
            return False, 0
        self.logged += 1
        left_out, self.suppressed = self.suppressed, 0
        return True, left_out


class Authenticator:
    def __init__(
        self, users: tuple[User, ...], config: AuthConfig, clock: Callable[[], float]
    ) -> None:
        self.users = {user.name: user for user in users}
        self.verifiers = {user.name: user.verifier for user in users}
        self.loopback_users = frozenset(config.loopback_users)
        self.delay = config.failed_login_delay
        self.clock = clock
        # The users, vhosts and permissions made at run time (the broker's), and the
        # verifiers of run-time users already read, by name (with the value read).
        self.access: Access | None = None
        self._made: dict[str, tuple[Any, Verifier]] = {}
        # Costly checks: the matches remembered (digest -> until, by this clock), those in
        # progress (digest -> their result), under a key of this process's own.
        self._key = os.urandom(32)
        self._verified: OrderedDict[bytes, float] = OrderedDict()
        self._checking: dict[bytes, asyncio.Future[bool]] = {}
        self.costly_checks = 0
        self.pending = 0
        # source_of(address) -> its logins pending (absent at 0)
        self.pending_by_source: dict[str, int] = {}
        self.failed = 0
        self.limiter = LogLimiter()
        self._executor: ThreadPoolExecutor | None = None
        # Checked when the user does not exist, so that costs the same as a wrong password.
        self._decoy = next((v for v in self.verifiers.values() if v.costly), None) or next(
            iter(self.verifiers.values()), None
        )

    async def login(
        self, username: str, password: str, address: str, mechanism: str
    ) -> User | Refused:
        """The user, or why not (a refusal is returned only once its delay has passed)."""
        started = self.clock()
        source = source_of(address)
        held = self.pending_by_source.get(source, 0)
        if held >= PER_SOURCE:
            return self._refused(
                address, username, mechanism, "too many logins in progress from this address"
            )
        if self.pending >= MAX_PENDING or (
            self.pending >= MAX_PENDING - RESERVE and held >= RESERVE_BELOW
        ):
            return self._refused(address, username, mechanism, "too many logins in progress")
        self.pending += 1
        self.pending_by_source[source] = held + 1
        try:
            user, verifier = self.lookup(username)
            if verifier is None:
                verifier = self._decoy
            matches = verifier is not None and await self._check(verifier, password)
            if user is None or not matches:
                refusal = self._refused(
                    address,
                    username,
                    mechanism,
                    "no such user" if user is None else "wrong password",
                )
            elif user.name in self.loopback_users and not is_loopback(address):
                refusal = self._refused(
                    address,
                    username,
                    mechanism,
                    "not from a loopback address",
                    f"ACCESS_REFUSED - user '{user.name}' may only log in from a loopback "
                    "address (auth.loopback_users)",
                )
            else:
                return user
            await self._wait_until(started + self.delay)
            return refusal
        finally:
            self.pending -= 1
            left = self.pending_by_source[source] - 1
            if left:
                self.pending_by_source[source] = left
            else:
                del self.pending_by_source[source]

    def lookup(self, name: str) -> tuple[User | None, Verifier | None]:
        """The user ``name`` as a login sees it, and its verifier: a config file's user
        (with the vhosts it was given at run time too), else a run-time user
        (``core.access``, its vhosts those it was given), else (None, None)."""
        user = self.users.get(name)
        access = self.access
        if user is not None:
            extra = [v for v in access.vhosts_of(name) if v not in user.vhosts] if access else []
            if extra:
                user = replace(user, vhosts=user.vhosts + tuple(extra))
            return user, self.verifiers[name]
        made = access.users.get(name) if access is not None else None
        if made is None:
            return None, None
        cached = self._made.get(name)
        if cached is None or cached[0] is not made:
            try:
                verifier = parse_hash(made.password_hash)
            except BadHash:
                return None, None
            cached = self._made[name] = (made, verifier)
            if len(self._made) > MADE_VERIFIERS:
                self._made.pop(next(iter(self._made)))
        vhosts = tuple(access.vhosts_of(name)) if access is not None else ()
        return User(name, None, vhosts, made.tags, password_hash=made.password_hash), cached[1]

    async def _check(self, verifier: Verifier, password: str) -> bool:
        """Whether ``password`` matches. A costly (scrypt) check is made once for the same
        hash and password however many logins ask at once (they wait for that one), and
        a match is remembered for ``VERIFIED_TTL`` seconds, keyed by a digest under this
        process's own random key (no password is kept): a reconnect storm of clients that
        share a login costs one check, not one per connection. A mismatch is never
        remembered, so a wrong guess costs its full check every time."""
        if not verifier.costly:
            return verifier.check(password)
        key = hmac.new(
            self._key,
            verifier.salt + verifier.digest + password.encode("utf-8", "surrogateescape"),
            hashlib.sha256,
        ).digest()
        now = self.clock()
        until = self._verified.get(key)
        if until is not None and until > now:
            self._verified.move_to_end(key)
            return True
        checking = self._checking.get(key)
        if checking is None:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="amqha-login")
            loop = asyncio.get_running_loop()
            checking = asyncio.ensure_future(
                loop.run_in_executor(self._executor, verifier.check, password)
            )
            self._checking[key] = checking
            self.costly_checks += 1
            checking.add_done_callback(lambda _: self._checking.pop(key, None))
        matches = await asyncio.shield(checking)
        if matches:
            self._verified[key] = self.clock() + VERIFIED_TTL
            self._verified.move_to_end(key)
            while len(self._verified) > VERIFIED_MAX:
                self._verified.popitem(last=False)
        return matches

    async def _wait_until(self, deadline: float) -> None:
        # A loop's timer may fire a little before the deadline by this clock (uvloop keeps
        # its time in whole milliseconds, read at the start of an iteration): the rest is
        # slept too, so a refusal never comes sooner than the delay.
        while (remaining := deadline - self.clock()) > 0:
            await asyncio.sleep(remaining)

    def _refused(
        self,
        address: str,
        username: str,
        mechanism: str,
        reason: str,
        text: str | None = None,
    ) -> Refused:
        self.failed += 1
        logged, left_out = self.limiter.admit(self.clock())
        if logged:
            log.warning(
                "login refused: user '%s' from %s (%s, %s)%s",
                escaped(username[:64]),
                address,
                escaped(mechanism),
                reason,
                f"; {left_out} more refused logins not logged" if left_out else "",
            )
        text = text or (
            f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}"
        )
        return Refused(text, reason)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
