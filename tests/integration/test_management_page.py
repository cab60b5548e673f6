"""The web page in a real headless Chromium (DevTools protocol): it signs in, shows both
servers of a real pair with their roles, the queues, the merged event log and the timeline
of both servers; after a kill -9 of the primary it shows the backup ACTIVE and the primary
not running, the switchover button on the ACTIVE's card (refused, with the reason, as
its peer is down), the takeover on the timeline and the backup's time alone counted as
unprotected, within bounded waits; the browser's console has no error; no confirmed
message is lost.

With AMQHA_SCREENSHOTS=DIR the two screenshots are also written there (docs/ keeps
``management-page.png`` and ``management-page-failover.png``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import aio_pika
import pytest

from tests.browser import Browser, chromium
from tests.integration.protocol_support import unique
from tests.integration.test_management import MGMT_USERS, Api, until_value
from tests.pairs import client_vote
from tests.support import free_port

pytestmark = pytest.mark.slow

NODE_STATE = (
    "(document.querySelector('[data-node=\"amqha@{name}\"]') || {{dataset: {{}}}}).dataset.state"
)


UNPROTECTED = "Number(document.getElementById('unprotected-today').dataset.seconds)"


def state_of(name: str) -> str:
    return NODE_STATE.format(name=name)


async def test_the_page_follows_a_failover(make_pair, tmp_path: Path) -> None:
    if chromium() is None:
        pytest.skip("chromium is not installed (Debian's chromium: the Makefile's venv step)")
    pair = make_pair(users=MGMT_USERS)
    ports = [free_port(), free_port()]
    for index, server in enumerate(pair.servers):
        server.config["management"] = {
            "listen": f"127.0.0.1:{ports[index]}",
            "peer": f"127.0.0.1:{ports[1 - index]}",
        }
    backup_api = Api(ports[1])
    pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=30)
    name = unique("shown")
    confirmed = 40
    connection = await aio_pika.connect(pair.primary.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True)
        for index in range(confirmed):
            await channel.default_exchange.publish(
                aio_pika.Message(str(index).encode(), delivery_mode=2), routing_key=name
            )

    browser = await Browser(tmp_path).start()
    try:
        await browser.navigate(f"http://127.0.0.1:{ports[1]}/")
        await browser.wait_for("document.readyState === 'complete'", 30, "the page loads")
        await browser.evaluate(
            "document.getElementById('user').value = 'admin';"
            "document.getElementById('password').value = 'admin';"
            "document.getElementById('login-form').requestSubmit(); true"
        )
        await browser.wait_for(
            f"{state_of('backup')} === 'PASSIVE' && {state_of('primary')} === 'ACTIVE'",
            30,
            "both servers shown: the backup PASSIVE, the primary ACTIVE",
        )
        await browser.wait_for(
            f"[...document.querySelectorAll('#queues td')].some(td => td.textContent === '{name}')",
            30,
            "the queue listed",
        )
        await browser.wait_for(
            "document.getElementById('events-note').textContent.startsWith('Merged')"
            " && document.querySelectorAll('#events tr').length > 0",
            30,
            "the merged event log",
        )
        servers = await browser.evaluate(
            "[...new Set([...document.querySelectorAll('#events .ev-server')]"
            ".map(td => td.textContent))].sort()"
        )
        assert servers == ["backup", "primary"]
        await browser.wait_for(
            "document.getElementById('status').dataset.ok === '1'", 30, "the status line"
        )
        # The timeline: both lanes, the primary's ACTIVE; the unprotected figure is shown.
        await browser.wait_for(
            "document.querySelector('#timeline rect.state-ACTIVE[data-node=\"primary\"]')"
            " !== null && document.querySelector('#timeline rect.state-PASSIVE"
            '[data-node="backup"]\') !== null'
            " && document.getElementById('unprotected-today').dataset.seconds !== undefined",
            30,
            "the timeline with the primary ACTIVE and the backup PASSIVE",
        )
        # The 1 hour window, chosen on the page.
        await browser.evaluate("document.querySelector('#hours [data-hours=\"1\"]').click(); true")
        await browser.wait_for(
            "document.getElementById('hours-label').textContent === 'hour'", 30, "the 1 h window"
        )
        unprotected_before = await browser.evaluate(UNPROTECTED)
        assert unprotected_before >= 0
        before = tmp_path / "management-page.png"
        await browser.screenshot(before)

        pair.kill(pair.primary)
        await client_vote(pair.servers, retry_for=30.0)
        await browser.wait_for(
            f"{state_of('backup')} === 'ACTIVE' && {state_of('primary')} === 'down'",
            30,
            "the backup ACTIVE, the primary not running",
        )
        await browser.wait_for(
            "document.getElementById('events-note').textContent.startsWith('Only this')",
            30,
            "the page says only this server's log is shown",
        )
        # The timeline shows the takeover: the backup's lane has an ACTIVE segment, its peer
        # lost and survivor marks, and the backup serving alone is unprotected time today.
        await browser.wait_for(
            "document.querySelector('#timeline rect.state-ACTIVE[data-node=\"backup\"]')"
            " !== null && document.querySelector('#timeline .marker-takeover"
            '[data-node="backup"]\') !== null && document.querySelector('
            "'#timeline .marker-peer_lost[data-node=\"backup\"]') !== null",
            30,
            "the takeover on the timeline",
        )
        # An administrator sees the switchover button on the ACTIVE's card; with its peer
        # down, the switchover is refused and the page says why.
        button = "document.querySelector('[data-node=\"amqha@backup\"] button.switchover')"
        await browser.wait_for(f"{button} !== null", 30, "the switchover button")
        await browser.evaluate(f"{button}.click(); true")
        await browser.wait_for(
            "document.getElementById('nodes-note').textContent"
            ".startsWith('Switchover refused after waiting 10 s: the primary is not heard')",
            60,
            "the refusal shown",
        )
        await browser.wait_for(
            "document.querySelector('#timeline rect.unprotected[data-node=\"backup\"]')"
            f" !== null && {UNPROTECTED} > {unprotected_before}",
            30,
            "the backup, ACTIVE alone, counted as unprotected",
        )
        shown = await browser.evaluate("document.getElementById('unprotected-today').textContent")
        assert shown.endswith(" s") and shown != "0.0 s"
        after = tmp_path / "management-page-failover.png"
        await browser.screenshot(after)
        # The refused switchover's 409 is the one failed request the browser reports.
        refused = "the server responded with a status of 409 (Conflict)"
        assert [e for e in browser.errors if refused not in e or "/switchover" not in e] == []
    finally:
        await browser.stop()
    target = os.environ.get("AMQHA_SCREENSHOTS")
    if target:
        for shot in (before, after):
            shutil.copy(shot, Path(target) / shot.name)

    # The API the timeline reads: the same figure, the takeover; a monitoring login only.
    history = await backup_api.get("/api/amqha/timeline?hours=1")
    assert history["hours"] == 1 and history["nodes"] == ["backup", "primary"]
    assert history["unprotected_today"]["recorded"] is True
    assert history["unprotected_today"]["seconds"] > unprotected_before
    assert any(m["kind"] == "takeover" and m["node"] == "backup" for m in history["markers"])
    assert history["peer"]["available"] is False and "as_of" in history["peer"]
    own = await backup_api.get(f"/api/amqha/history?since={history['since']}")
    assert own["server"] == "backup"
    assert any(r["event"] == "transition" and r["state"] == "ACTIVE" for r in own["records"])
    for path in ("/api/amqha/timeline?hours=2", "/api/amqha/history?since=nan"):
        status, body = await backup_api.call("GET", path)
        assert status == 400, (path, status, body)
    for user in ("guest", "mgmt"):
        for path in ("/api/amqha/timeline", "/api/amqha/history?since=0"):
            status, body = await backup_api.call("GET", path, user)
            assert status == 401, (user, path, status, body)

    # Nothing confirmed was lost: every message is on the new ACTIVE.
    shape = await until_value(
        lambda: backup_api.get(f"/api/queues/%2F/{name}"),
        lambda q: q["messages"] == confirmed,
        10,
        "every confirmed message on the backup",
    )
    assert shape["messages_ready"] == confirmed
    backup = await aio_pika.connect(pair.backup.url)
    async with backup:
        channel = await backup.channel()
        queue = await channel.declare_queue(name, durable=True, passive=True)
        bodies = set()
        for _ in range(confirmed):
            message = await queue.get(timeout=5)
            bodies.add(int(message.body))
            await message.ack()
    assert bodies == set(range(confirmed))


async def test_the_page_signs_in_from_its_address_and_keeps_no_password_there(
    make_server, tmp_path: Path
) -> None:
    """RabbitMQ's page takes a login in its address (``#/login/USER/PASSWORD``), as do
    links and bookmarks written for it: the page signs in with it, shows what the login
    may see, and rewrites the address without it; a wrong one lands on the form, saying
    so."""
    if chromium() is None:
        pytest.skip("chromium is not installed (Debian's chromium: the Makefile's venv step)")
    port = free_port()
    make_server("solo", users=MGMT_USERS, management={"listen": f"127.0.0.1:{port}"}).start()
    signed_in = "!document.getElementById('app').hidden && document.getElementById('login').hidden"
    browser = await Browser(tmp_path).start()
    try:
        await browser.navigate(f"http://127.0.0.1:{port}/#/login/admin/admin")
        await browser.wait_for(signed_in, 30, "signed in from the address")
        await browser.wait_for(
            "document.getElementById('status').dataset.ok === '1'", 30, "the figures shown"
        )
        assert await browser.evaluate("location.href") == f"http://127.0.0.1:{port}/"
        await browser.evaluate("document.getElementById('signout').click(); true")
        await browser.navigate(f"http://127.0.0.1:{port}/#/login/admin/wrong")
        await browser.wait_for(
            "!document.getElementById('login').hidden"
            " && document.getElementById('login-error').textContent !== ''",
            30,
            "the form again, saying why",
        )
        assert "wrong" not in await browser.evaluate("location.href")
        assert [e for e in browser.errors if "401" not in e] == []
    finally:
        await browser.stop()
