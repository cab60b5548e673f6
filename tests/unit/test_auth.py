"""Password hashes, the loopback-only rule, and what a failed login costs (amqha.auth)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time

import pytest

from amqha import auth
from amqha.auth import Authenticator, LogLimiter, Refused, is_loopback
from config import AuthConfig, User
from config.passwords import BadHash, hash_password, parse_hash, plain

# -- password hashes ----------------------------------------------------------------------


def test_rabbitmq_documented_sha256_example() -> None:
    # The example of RabbitMQ's password hashing guide: salt 908DC60A, password test12.
    verifier = parse_hash("kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR")
    assert verifier.scheme == "rabbitmq-sha256" and verifier.salt == bytes.fromhex("908DC60A")
    assert verifier.check("test12")
    assert not verifier.check("test13") and not verifier.check("")


@pytest.mark.parametrize("scheme", ["scrypt", "rabbitmq-sha256", "rabbitmq-sha512"])
def test_hash_round_trip(scheme: str) -> None:
    text = hash_password("pässwörd", scheme)
    verifier = parse_hash(text)
    assert verifier.scheme == scheme
    assert verifier.check("pässwörd")
    assert not verifier.check("passwörd")
    assert verifier.costly == (scheme == "scrypt")


def test_hashes_are_salted() -> None:
    assert hash_password("same") != hash_password("same")
    assert hash_password("same", "rabbitmq-sha256") != hash_password("same", "rabbitmq-sha256")


def test_scrypt_format_and_cost() -> None:
    text = hash_password("pw")
    assert text.startswith("$scrypt$ln=15,r=8,p=1$")
    verifier = parse_hash(text)
    assert (verifier.ln, verifier.r, verifier.p, len(verifier.salt), len(verifier.digest)) == (
        15,
        8,
        1,
        16,
        32,
    )


def test_a_weaker_scrypt_hash_from_elsewhere_is_checked_with_its_own_cost() -> None:
    salt = b"0123456789abcdef"
    digest = hashlib.scrypt(b"pw", salt=salt, n=2**10, r=8, p=1, dklen=32)
    b64 = base64.b64encode
    text = f"$scrypt$ln=10,r=8,p=1${b64(salt).decode()}${b64(digest).decode().rstrip('=')}"
    assert parse_hash(text).check("pw") and not parse_hash(text).check("px")


def test_md5_hashes_are_refused() -> None:
    md5 = base64.b64encode(b"salt" + hashlib.md5(b"saltpw").digest()).decode()
    with pytest.raises(BadHash, match="MD5 hashes are not accepted"):
        parse_hash(md5)


def test_plain_password_compares_non_ascii() -> None:
    assert plain("güest").check("güest") and not plain("güest").check("guest")


# -- loopback -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("192.168.1.20", False),
        ("::ffff:10.0.0.1", False),
        ("2001:db8::1", False),
        ("fe80::1%eth0", False),
        ("0.0.0.0", False),
        ("", False),
        ("not an address", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


# -- log rate limit -----------------------------------------------------------------------


def test_log_limiter_lets_a_burst_through_then_counts() -> None:
    limiter = LogLimiter(burst=3, window=60.0)
    assert [limiter.admit(10.0 + i) for i in range(5)] == [
        (True, 0),
        (True, 0),
        (True, 0),
        (False, 0),
        (False, 0),
    ]
    # The next window's first line says how many were left out.
    assert limiter.admit(70.0) == (True, 2)
    assert limiter.admit(71.0) == (True, 0)


# -- the authenticator --------------------------------------------------------------------

USERS = (
    User("guest", "guest"),
    User("app", None, password_hash=hash_password("app-pw", "scrypt")),
    User("legacy", None, password_hash=hash_password("old", "rabbitmq-sha512")),
    User("ops", "ops"),
)


def make(delay: float = 0.0, loopback_users: tuple[str, ...] = ("guest",)) -> Authenticator:
    loop = asyncio.get_running_loop()
    return Authenticator(USERS, AuthConfig(loopback_users, delay), loop.time)


@pytest.mark.parametrize(
    ("user", "password", "address"),
    [
        ("guest", "guest", "127.0.0.1"),
        ("guest", "guest", "::1"),
        ("app", "app-pw", "10.1.2.3"),
        ("legacy", "old", "10.1.2.3"),
        ("ops", "ops", "192.168.1.20"),
    ],
)
async def test_good_logins(user: str, password: str, address: str) -> None:
    authenticator = make()
    result = await authenticator.login(user, password, address, "PLAIN")
    assert isinstance(result, User) and result.name == user
    assert authenticator.failed == 0 and authenticator.pending == 0
    authenticator.close()


@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [
        ("guest", "wrong", "wrong password"),
        ("app", "app-PW", "wrong password"),
        ("legacy", "", "wrong password"),
        ("nobody", "guest", "no such user"),
    ],
)
async def test_bad_logins(user: str, password: str, reason: str) -> None:
    authenticator = make()
    result = await authenticator.login(user, password, "127.0.0.1", "AMQPLAIN")
    assert result == Refused(
        "ACCESS_REFUSED - Login was refused using authentication mechanism AMQPLAIN", reason
    )
    assert authenticator.failed == 1 and authenticator.pending == 0
    authenticator.close()


@pytest.mark.parametrize("address", ["10.0.0.7", "192.168.1.20", "2001:db8::1", "::ffff:10.0.0.1"])
async def test_guest_is_refused_from_a_remote_address(address: str) -> None:
    authenticator = make()
    result = await authenticator.login("guest", "guest", address, "PLAIN")
    assert isinstance(result, Refused) and result.reason == "not from a loopback address"
    assert result.text == (
        "ACCESS_REFUSED - user 'guest' may only log in from a loopback address "
        "(auth.loopback_users)"
    )
    # The rule follows the config: another user listed, guest not.
    other = make(loopback_users=("ops",))
    assert isinstance(await other.login("guest", "guest", address, "PLAIN"), User)
    assert isinstance(await other.login("ops", "ops", address, "PLAIN"), Refused)
    authenticator.close()
    other.close()


async def test_a_refusal_comes_after_the_delay_counted_from_the_attempt() -> None:
    loop = asyncio.get_running_loop()
    authenticator = make(delay=0.2)
    started = loop.time()
    assert isinstance(await authenticator.login("nobody", "x", "127.0.0.1", "PLAIN"), Refused)
    assert loop.time() - started >= 0.2
    started = loop.time()
    assert isinstance(await authenticator.login("app", "wrong", "127.0.0.1", "PLAIN"), Refused)
    assert loop.time() - started >= 0.2
    authenticator.close()


async def test_a_refusal_waits_for_the_delay_by_its_own_clock_when_a_timer_fires_early() -> None:
    # A clock that runs at half the loop's speed: every sleep ends before this clock has
    # reached the deadline, as a uvloop timer may against the monotonic clock.
    origin = time.monotonic()

    def slow_clock() -> float:
        return origin + (time.monotonic() - origin) / 2

    authenticator = Authenticator(USERS, AuthConfig(("guest",), 0.05), slow_clock)
    started = slow_clock()
    assert isinstance(await authenticator.login("nobody", "x", "127.0.0.1", "PLAIN"), Refused)
    assert slow_clock() - started >= 0.05
    authenticator.close()


async def test_failed_logins_wait_concurrently_and_a_good_one_does_not_wait() -> None:
    authenticator = make(delay=5.0)
    failing = [
        asyncio.ensure_future(authenticator.login("guest", f"bad{i}", "127.0.0.1", "PLAIN"))
        for i in range(20)
    ]
    await asyncio.sleep(0)
    assert authenticator.pending == 20
    assert isinstance(await authenticator.login("guest", "guest", "127.0.0.1", "PLAIN"), User)
    assert not any(f.done() for f in failing)
    for future in failing:
        future.cancel()
    await asyncio.gather(*failing, return_exceptions=True)
    assert authenticator.pending == 0
    authenticator.close()


async def test_past_the_cap_a_login_is_refused_at_once_without_a_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "MAX_PENDING", 3)
    authenticator = make(delay=5.0)
    waiting = [
        asyncio.ensure_future(authenticator.login("guest", "bad", "127.0.0.1", "PLAIN"))
        for _ in range(3)
    ]
    await asyncio.sleep(0)
    # Even the right password: past the cap nothing is checked.
    result = await authenticator.login("guest", "guest", "127.0.0.1", "PLAIN")
    assert isinstance(result, Refused) and result.reason == "too many logins in progress"
    assert authenticator.pending == 3
    for future in waiting:
        future.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(await authenticator.login("guest", "guest", "127.0.0.1", "PLAIN"), User)
    authenticator.close()


async def test_failed_logins_are_logged_at_most_a_burst_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    authenticator = make()
    with caplog.at_level("WARNING", logger="amqha.auth"):
        for i in range(auth.LOG_BURST + 5):
            await authenticator.login("guest", f"bad{i}", "127.0.0.1", "PLAIN")
    lines = [r.getMessage() for r in caplog.records if r.name == "amqha.auth"]
    assert len(lines) == auth.LOG_BURST
    assert lines[0] == "login refused: user 'guest' from 127.0.0.1 (PLAIN, wrong password)"
    assert authenticator.failed == auth.LOG_BURST + 5
    authenticator.close()


async def test_a_refused_user_name_cannot_forge_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    authenticator = make()
    forged = "x\n2026-01-01 00:00:00,000 primary WARNING amqha.auth: forged\x1b[2J"
    with caplog.at_level("WARNING", logger="amqha.auth"):
        await authenticator.login(forged, "guest", "127.0.0.1", "PLAIN")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "amqha.auth"]
    assert "\n" not in line and "\x1b" not in line
    assert "user 'x\\n2026-01-01 00:00:00,000 primary WARNING amqha.auth: forged\\x1b[2J'" in line
    authenticator.close()


@pytest.mark.parametrize(
    ("address", "source"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9%eth0", "2001:db8:1:2::/64"),
        ("not an address", "not an address"),
    ],
)
def test_the_source_of_a_login(address: str, source: str) -> None:
    assert auth.source_of(address) == source


async def test_one_source_holds_its_share_and_others_still_log_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "MAX_PENDING", 12)
    monkeypatch.setattr(auth, "PER_SOURCE", 5)
    monkeypatch.setattr(auth, "RESERVE", 4)
    monkeypatch.setattr(auth, "RESERVE_BELOW", 2)
    authenticator = make(delay=5.0)
    flood = [
        asyncio.ensure_future(authenticator.login("guest", "bad", "127.0.0.1", "PLAIN"))
        for _ in range(20)
    ]
    await asyncio.sleep(0)
    # The flood holds its share; the rest of it was refused at once, unchecked.
    assert authenticator.pending == 5
    refused = [f.result() for f in flood if f.done()]
    assert len(refused) == 15
    assert {r.reason for r in refused} == {"too many logins in progress from this address"}
    # Another address logs in, and so do many more; past MAX_PENDING - RESERVE, only
    # sources holding fewer than RESERVE_BELOW are let in.
    assert isinstance(await authenticator.login("guest", "guest", "127.0.0.2", "PLAIN"), User)
    others = [
        asyncio.ensure_future(authenticator.login("guest", "bad", f"127.0.1.{i}", "PLAIN"))
        for i in range(3)
    ]
    second = asyncio.ensure_future(authenticator.login("guest", "bad", "127.0.1.0", "PLAIN"))
    await asyncio.sleep(0)
    assert authenticator.pending == 9  # 5 + 3 + the second of 127.0.1.0
    held = asyncio.ensure_future(authenticator.login("guest", "bad", "127.0.1.0", "PLAIN"))
    await asyncio.sleep(0)
    assert held.done() and held.result().reason == "too many logins in progress"
    assert isinstance(await authenticator.login("guest", "guest", "127.0.2.1", "PLAIN"), User)
    for future in [*flood, *others, second]:
        future.cancel()
    await asyncio.gather(*flood, *others, second, return_exceptions=True)
    assert authenticator.pending == 0 and authenticator.pending_by_source == {}
    authenticator.close()


def test_scrypt_work_is_capped() -> None:
    salt, digest = "AAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAA"
    assert parse_hash(f"$scrypt$ln=17,r=8,p=1${salt}${digest}").ln == 17
    for cost in ("ln=15,r=8,p=16", "ln=18,r=8,p=1", "ln=16,r=8,p=3"):
        with pytest.raises(BadHash, match=r"n\*r\*p"):
            parse_hash(f"$scrypt${cost}${salt}${digest}")


async def test_a_storm_of_logins_with_one_password_costs_one_costly_check() -> None:
    """Fifty logins of one scrypt user at once wait for one check; a match is remembered
    (a later login makes none); a wrong password is checked each time and never
    remembered, so it stays refused and costs its full check. Another hash of the same
    password (another user, a changed password) is checked on its own."""
    authenticator = make()
    results = await asyncio.gather(
        *(authenticator.login("app", "app-pw", f"10.0.0.{i}", "PLAIN") for i in range(50))
    )
    assert all(isinstance(r, User) and r.name == "app" for r in results)
    assert authenticator.costly_checks == 1
    assert isinstance(await authenticator.login("app", "app-pw", "10.0.1.1", "PLAIN"), User)
    assert authenticator.costly_checks == 1
    for attempt in range(3):
        refused = await authenticator.login("app", "app-pw ", "10.0.1.1", "PLAIN")
        assert isinstance(refused, Refused) and authenticator.costly_checks == 2 + attempt
    authenticator.close()
    twins = (
        User("app", None, password_hash=hash_password("app-pw", "scrypt")),
        User("twin", None, password_hash=hash_password("app-pw", "scrypt")),
    )
    other = Authenticator(twins, AuthConfig(("guest",), 0.0), asyncio.get_running_loop().time)
    for name in ("app", "twin", "app", "twin"):
        assert isinstance(await other.login(name, "app-pw", "10.0.0.1", "PLAIN"), User)
    assert other.costly_checks == 2
    other.close()
