"""A plain client that reaches the passive server reads why, in every client library
(aiormq, aio-pika, pika, py-amqp, kombu, and amqplib where Node.js is installed).

The refusal is a Connection.Close in reply to StartOk (before Tune): aiormq and aio-pika
read a Close in reply to Open as a framing error and lose its text. A client announcing
``connection.redirect`` is still sent Connection.Redirect after Open. Either way the pair
counts one client vote per connection attempt.
"""

from __future__ import annotations

import asyncio
import time

import aiormq
import amqp
import kombu
import pytest
from pamqp import commands

from amqha.client import ConnectionRedirect
from tests.pairs import MakePair, pika_open_error, plain_connect, raw_open
from tests.support import amqplib_modules, amqplib_run

# Connects, and prints what amqplib's user gets: the error's message, or that it opened.
AMQPLIB_CONNECT = """
const amqp = require('amqplib');
amqp.connect(process.argv[1]).then(
  (connection) => connection.close().then(() => console.log(JSON.stringify({opened: true}))),
  (error) => console.log(JSON.stringify({error: error.message})),
);
"""


async def test_every_client_reads_the_not_active_text(make_pair: MakePair) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    text = f"NOT_ACTIVE - active server is {pair.primary.address}"
    url = pair.backup.url

    with pytest.raises(aiormq.exceptions.ConnectionClosed) as caught:
        await aiormq.connect(url)
    assert caught.value.args == (320, text)

    with pytest.raises(aiormq.exceptions.ConnectionClosed) as caught_pika:
        await plain_connect(url, 5)
    assert caught_pika.value.args == (320, text)

    error = await asyncio.to_thread(pika_open_error, pair.backup.port)
    assert error is not None and f"(320) '{text}'" in error

    def py_amqp() -> BaseException:
        connection = amqp.Connection(f"127.0.0.1:{pair.backup.port}", connect_timeout=5)
        with pytest.raises(amqp.exceptions.ConnectionForced) as raised:
            connection.connect()
        return raised.value

    forced = await asyncio.to_thread(py_amqp)
    assert text in str(forced)

    def with_kombu() -> BaseException:
        with (
            kombu.Connection(f"pyamqp://guest:guest@127.0.0.1:{pair.backup.port}//") as connection,
            pytest.raises(amqp.exceptions.ConnectionForced) as raised,
        ):
            connection.connect()
        return raised.value

    assert text in str(await asyncio.to_thread(with_kombu))


async def test_amqplib_reads_the_not_active_text(make_pair: MakePair) -> None:
    modules = amqplib_modules()
    if isinstance(modules, str):
        pytest.skip(f"amqplib is not available: {modules}")
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    text = f"NOT_ACTIVE - active server is {pair.primary.address}"

    refused = await asyncio.to_thread(amqplib_run, modules, AMQPLIB_CONNECT, pair.backup.url)
    assert refused == {
        "error": f'Handshake terminated by server: 320 (CONNECTION-FORCED) with message "{text}"'
    }
    opened = await asyncio.to_thread(amqplib_run, modules, AMQPLIB_CONNECT, pair.primary.url)
    assert opened == {"opened": True}


async def test_one_vote_per_attempt_at_start_ok_or_at_open(make_pair: MakePair) -> None:
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")

    async def redirects() -> int:
        # The counter, not the event log: the log records at most one redirect a second.
        return int((await pair.status(pair.backup))["redirects"])

    before = await redirects()
    close = await asyncio.to_thread(raw_open, pair.backup.port)
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 320
    redirect = await asyncio.to_thread(raw_open, pair.backup.port, True)
    assert isinstance(redirect, ConnectionRedirect)
    assert redirect.host == pair.primary.address
    assert await redirects() == before + 2
    # The active admits a plain client at StartOk and does not ask again at Open.
    assert isinstance(
        await asyncio.to_thread(raw_open, pair.primary.port), commands.Connection.OpenOk
    )


async def test_a_flood_of_attempts_on_the_passive_is_recorded_once_a_second(
    make_pair: MakePair,
) -> None:
    """A guest looping on the passive's port wrote one event record per attempt (19 MB in
    15 s). Now a redirect is recorded at most once a second, and the next record counts the
    ones left out, so the log still adds up to every attempt."""
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")

    def redirect_records() -> list[dict]:
        return [e for e in pair.events(pair.backup) if e["event"] == "redirect"]

    earlier = len(redirect_records())
    before = (await pair.status(pair.backup))["redirects"]
    attempts = 200
    started = time.monotonic()

    def flood() -> None:
        for _ in range(attempts):
            close = raw_open(pair.backup.port)
            assert isinstance(close, commands.Connection.Close) and close.reply_code == 320

    await asyncio.to_thread(flood)
    elapsed = time.monotonic() - started
    assert (await pair.status(pair.backup))["redirects"] == before + attempts
    flooded = redirect_records()[earlier:]
    assert 1 <= len(flooded) <= elapsed + 2 < attempts
    # One attempt more once a second has passed is recorded, with the count of the rest.
    extra = 0
    async with asyncio.timeout(15):
        while len(redirect_records()) - earlier == len(flooded) and extra < 60:
            await asyncio.sleep(0.1)
            await asyncio.to_thread(raw_open, pair.backup.port)
            extra += 1
    records = redirect_records()[earlier:]
    assert len(records) == len(flooded) + 1
    assert sum(1 + e.get("unrecorded", 0) for e in records) == attempts + extra
    assert pair.states() == ("ACTIVE", "PASSIVE")
