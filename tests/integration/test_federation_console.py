"""Federations added and removed at run time from the console (docs/federation.md, "At
run time"): real servers, the real `amqha console` command, a restart, a kill -9 of a
downstream pair's ACTIVE, an upstream away while a link is removed, and the refusals."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqha.console import ConsoleClient
from tests.integration.test_federation import (
    EXCHANGE,
    FED_USERS,
    bound_queue,
    declare_exchange,
    drain,
    kill_the_downstream_active_under_load,
    links,
    lost,
    publish,
    running_with,
    wait_link,
)
from tests.pairs import ADMIN, EFA, PEERING, MakePair, url_of
from tests.support import ServerProcess, console_in_process, free_port

TIMINGS = {"reconcile": 1, "probe": 0.2}


def console(
    servers: list[ServerProcess], *words: str, user: tuple[str, str] = ADMIN, vhost: str = ""
) -> subprocess.CompletedProcess[str]:
    """`amqha console` against ``servers`` as ``user`` (in this process: test_console.py
    runs it as a process of its own); never a traceback, whatever it says."""
    targets = [a for s in servers for a in ("--server", url_of(s, user) + vhost)]
    result = console_in_process(*targets, *words, timeout=60)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def add_words(upstream: ServerProcess | None, *extra: str, url: str | None = None) -> list[str]:
    words = ["federation", "add", "--exchange", EXCHANGE, "--upstream", "central"]
    if url is not None or upstream is not None:
        words += ["--url", url or url_of(upstream, EFA)]  # type: ignore[arg-type]
    return [*words, *extra]


REMOVE = ["federation", "remove", "--exchange", EXCHANGE, "--upstream", "central"]


def stored(server: ServerProcess) -> dict[str, Any]:
    """The server's run-time federations file (empty when there is none)."""
    path = server.data_dir / "federations.json"
    return json.loads(path.read_text()) if path.exists() else {}


async def upstream_queues(server: ServerProcess) -> list[str]:
    async with asyncio.timeout(15), ConsoleClient(url_of(server, ADMIN)) as admin:
        return [q["name"] for q in await admin.call("queues")]


async def take(url: str, until: str) -> list[str]:
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue("eu-prices")
        return [m.body.decode() for m in await drain(queue, until)]


async def test_a_federation_added_at_run_time_runs_survives_a_restart_and_is_removed(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = ServerProcess(tmp_path, "london", federation=TIMINGS).start()
    try:
        await declare_exchange(london.url)
        await bound_queue(london.url)
        assert await links(london) == []
        added = console([london], *add_words(central), "--json")
        assert added.returncode == 0, added.stdout + added.stderr
        answer = json.loads(added.stdout)
        assert answer["ok"] and answer["servers"][0]["result"]["added"] is True
        assert "efa" not in added.stdout  # the URL (and its password) is not echoed
        link = await wait_link(london, running_with(1), "the added link running")
        assert link["source"] == "console" and link["server"] == central.address
        await publish(central.url, [("eu.fr", "fr-1"), ("us.ny", "ny-1"), ("eu.end", "end-1")])
        assert await take(london.url, "end-1") == ["fr-1", "end-1"]
        # Kept on disk, readable by the server's user only.
        path = london.data_dir / "federations.json"
        assert path.stat().st_mode & 0o077 == 0
        assert [e["exchange"] for e in stored(london)["exchanges"]] == [EXCHANGE]
        # The same add again changes nothing.
        again = console([london], *add_words(central))
        assert again.returncode == 0 and "unchanged" in again.stdout, again.stdout
        assert len(await links(london)) == 1

        london.stop()
        london.start()
        link = await wait_link(london, running_with(1), "the link back after a restart")
        assert link["source"] == "console"
        await publish(central.url, [("eu.de", "de-2"), ("eu.end", "end-2")])
        assert await take(london.url, "end-2") == ["de-2", "end-2"]
        # As a person reads it: one row, its state, its times in ISO 8601 UTC.
        shown = console([london], "federation")
        assert shown.returncode == 0, shown.stderr
        header, row = shown.stdout.splitlines()
        assert header.split()[:7] == [
            "exchange", "vhost", "upstream", "upstream_name", "source", "delivery", "state"
        ]  # fmt: skip
        assert row.split()[:7] == [
            EXCHANGE,
            "/",
            "central",
            "central",
            "console",
            "confirm",
            "running",
        ]
        assert re.search(r" 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", row), row

        buffer = link["buffer_queue"]
        assert buffer in await upstream_queues(central)
        removed = console([london], *REMOVE, "--json")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        result = json.loads(removed.stdout)["servers"][0]["result"]
        assert result["removed"] and result["upstream_deleted"] and result["pending"] is None
        assert result["buffer_queue"] == buffer
        assert buffer not in await upstream_queues(central)
        listed = console([london], "federation")
        assert listed.returncode == 0 and "(none)" in listed.stdout, listed.stdout
        assert stored(london)["exchanges"] == [] and stored(london)["upstreams"] == {}
        # Removing it again: there is nothing to remove.
        missing = console([london], *REMOVE)
        assert missing.returncode == 1 and "no link" in missing.stderr, missing.stderr
    finally:
        london.stop()


async def test_a_removal_while_the_upstream_is_away_is_finished_when_it_is_back(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = ServerProcess(tmp_path, "london", federation=TIMINGS).start()
    try:
        await declare_exchange(london.url)
        await bound_queue(london.url)
        assert console([london], *add_words(central)).returncode == 0
        buffer = (await wait_link(london, running_with(1), "the added link running"))[
            "buffer_queue"
        ]
        central.stop()
        removed = console([london], *REMOVE, "--json")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        result = json.loads(removed.stdout)["servers"][0]["result"]
        assert result["upstream_deleted"] is False and "unreachable" in result["pending"]
        assert [p["queue"] for p in stored(london)["pending_deletions"]] == [buffer]
        assert await links(london) == []
        # Kept across a restart of the downstream; done once the upstream is back.
        london.stop()
        london.start()
        central.start()
        assert buffer in await upstream_queues(central)

        async def gone() -> bool:
            return buffer not in await upstream_queues(central)

        for _ in range(300):
            if await gone() and not stored(london)["pending_deletions"]:
                break
            await asyncio.sleep(0.1)
        assert await gone(), "the buffer queue is still upstream"
        assert stored(london)["pending_deletions"] == []
    finally:
        london.stop()


async def test_a_link_taken_out_of_the_config_file_has_its_buffer_queue_deleted_upstream(
    tmp_path: Path, make_server: Any
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    federation = {
        "upstreams": {"central": {"urls": [url_of(central, EFA)]}},
        "exchanges": [{"exchange": EXCHANGE, "upstream": "central"}],
        **TIMINGS,
    }
    london = ServerProcess(tmp_path, "london", federation=federation).start()
    try:
        await declare_exchange(london.url)
        await bound_queue(london.url)
        link = await wait_link(london, running_with(1), "the configured link running")
        buffer = link["buffer_queue"]
        assert buffer in await upstream_queues(central)
        assert [k["queue"] for k in stored(london)["config_links"]] == [buffer]
        # The operator takes the federation out of the config file and restarts.
        london.stop()
        london.config["federation"] = TIMINGS
        london.start()
        # Deleted upstream first, then the pending deletion struck from the file: wait for both.
        for _ in range(300):
            if buffer not in await upstream_queues(central) and not stored(london).get(
                "pending_deletions"
            ):
                break
            await asyncio.sleep(0.1)
        assert buffer not in await upstream_queues(central)
        assert stored(london)["config_links"] == []
        assert stored(london)["pending_deletions"] == []
        assert await links(london) == []
    finally:
        london.stop()


async def test_a_forwarding_link_is_removed_only_once_nothing_waits_to_be_forwarded(
    tmp_path: Path,
) -> None:
    # The upstream never answers (nothing listens there): what is published here waits
    # in the link's hidden queue.
    nowhere = f"amqp://efa:efa@127.0.0.1:{free_port()}/"
    london = ServerProcess(tmp_path, "london", federation=TIMINGS).start()
    try:
        await declare_exchange(london.url)
        added = console([london], *add_words(None, "--forward", url=nowhere))
        assert added.returncode == 0, added.stdout + added.stderr
        await publish(london.url, [("eu.fr", "a"), ("eu.de", "b"), ("us.ny", "c")])
        refused = console([london], *REMOVE)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "still holds 3 messages to forward" in refused.stderr
        assert len(await links(london)) == 1
        assert stored(london)["exchanges"][0]["forward"] is True
        removed = console([london], *REMOVE, "--drop-pending", "--json")
        assert removed.returncode == 0, removed.stdout + removed.stderr
        result = json.loads(removed.stdout)["servers"][0]["result"]
        assert result["forward_queue_removed"] is True and result["dropped"] == 3
        assert result["upstream_deleted"] is False and result["pending"]
        async with asyncio.timeout(15), ConsoleClient(url_of(london, ADMIN)) as admin:
            status = await admin.call("status")
        assert status["federation"]["hidden"] == []
        assert await links(london) == []
    finally:
        london.stop()


async def test_federation_changes_are_refused_to_non_administrators_and_bad_input(
    tmp_path: Path,
) -> None:
    other = f"amqp://efa:efa@127.0.0.1:{free_port()}/"
    london = ServerProcess(
        tmp_path,
        "london",
        federation={
            "upstreams": {"central": {"urls": [other]}},
            "exchanges": [{"exchange": "configured", "upstream": "central"}],
            **TIMINGS,
        },
    ).start()
    try:
        before = await links(london)
        for user, vhost in (
            (("guest", "guest"), ""),
            (("limited", "limited"), "other"),
            (PEERING, ""),
        ):
            for words in (add_words(None), REMOVE):
                result = console([london], *words, user=user, vhost=vhost)
                assert result.returncode == 5, (user, result.stdout, result.stderr)
                assert "administrator" in result.stderr or "refused" in result.stderr
        bad = [
            (["federation", "add", "--upstream", "central"], 2, "--exchange is needed"),
            (
                ["federation", "add", "--exchange", "x", "--upstream", "nope"],
                2,
                "--upstream: no upstream 'nope'",
            ),
            (
                add_words(None, "--max-hops", "0"),
                2,
                "--max-hops: must be 1 or more",
            ),
            (add_words(None, "--max-hops", "many"), 2, "--max-hops: expected an integer"),
            (add_words(None, "--delivery", "maybe"), 2, "--delivery: expected 'confirm' or 'drop'"),
            (
                [
                    "federation",
                    "add",
                    "--exchange",
                    "x",
                    "--upstream",
                    "new",
                    "--url",
                    "http://h:1/",
                ],
                2,
                "--url[0]: expected an amqp:// or amqps:// URL",
            ),
            (
                [
                    "federation",
                    "add",
                    "--exchange",
                    "x",
                    "--upstream",
                    "new",
                    "--url",
                    "amqp://u@h:1/",
                ],
                2,
                "the URL has no password",
            ),
            (
                ["federation", "add", "--exchange", "x", "--upstream", "bad name", "--url", other],
                2,
                "--upstream: 'bad name' is not a valid name",
            ),
            (
                ["federation", "add", "--exchange", "amq.topic", "--upstream", "central"],
                2,
                "amq. exchanges are not federated",
            ),
            (add_words(None, url=other), 2, "is in the config file: leave out --url"),
            (
                ["federation", "add", "--exchange", "configured", "--upstream", "central"],
                1,
                "in the config file",
            ),
            (
                ["federation", "remove", "--exchange", "configured", "--upstream", "central"],
                1,
                "edit the config",
            ),
            (
                ["federation", "add", "--exchange", "x", "--upstream", "central", "--bogus", "1"],
                2,
                "unknown option",
            ),
            (["federation", "rename"], 2, "usage"),
            (["federation", "add", "--exchange"], 2, "needs a value"),
        ]
        for words, status, text in bad:
            result = console([london], *words)
            assert result.returncode == status, (words, result.stdout, result.stderr)
            assert text in result.stderr, (words, result.stderr)
        as_json = console([london], *add_words(None, "--max-hops", "0"), "--json")
        assert as_json.returncode == 2
        assert json.loads(as_json.stdout)["error"]["code"] == "usage"
        # Nothing changed: the configured link only, no run-time file.
        assert [link["exchange"] for link in await links(london)] == [
            link["exchange"] for link in before
        ]
        assert stored(london) == {}
    finally:
        london.stop()


async def test_a_federation_added_on_a_pair_runs_on_its_new_active_after_a_kill(
    make_server: Any, make_pair: MakePair
) -> None:
    central = make_server("central", users=FED_USERS).start()
    await declare_exchange(central.url)
    london = make_pair(proxied=False, federation=TIMINGS).start()
    await london.wait_states("ACTIVE", "PASSIVE", timeout=30)
    primary, backup = london.primary, london.backup
    await declare_exchange(url_of(primary))
    await bound_queue(url_of(primary))
    added = console([primary, backup], *add_words(central), "--json")
    assert added.returncode == 0, added.stdout + added.stderr
    answer = json.loads(added.stdout)
    # The ACTIVE first; both keep it.
    assert [s["server"] for s in answer["servers"]] == [primary.address, backup.address]
    assert [s["result"]["running_here"] for s in answer["servers"]] == [True, False]
    assert stored(primary)["exchanges"] == stored(backup)["exchanges"]
    link = await wait_link(primary, running_with(1), "the ACTIVE's link running")
    assert link["buffer_queue"] == "federation: market central to backup+primary"
    standby = (await links(backup))[0]
    assert standby["active"] is False and standby["source"] == "console"

    confirmed, got = await kill_the_downstream_active_under_load(london, central.url)
    missing = lost(confirmed, got)
    assert missing == [], f"{len(missing)} confirmed matching messages lost: {missing[:10]}"
    # With one server down, a change reaches the other and says who missed it.
    removed = console([primary, backup], *REMOVE, "--json")
    answer = json.loads(removed.stdout)
    assert removed.returncode == 3 and answer["ok"] is False, removed.stdout
    assert [s["server"] for s in answer["servers"]] == [backup.address]
    assert answer["servers"][0]["result"]["upstream_deleted"] is True
    assert [m["server"] for m in answer["missed"]] == [primary.address]
    assert link["buffer_queue"] not in await upstream_queues(central)
    assert await links(backup) == []


def test_a_start_with_an_unreadable_federations_file_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    london = ServerProcess(tmp_path, "london", federation=TIMINGS)
    london.data_dir.mkdir(parents=True)
    bad = {"version": 1, "exchanges": [{"exchange": EXCHANGE, "upstream": "nowhere"}]}
    (london.data_dir / "federations.json").write_text(json.dumps(bad))
    try:
        with pytest.raises(RuntimeError):
            london.start()
        assert london.process is not None and london.process.wait(timeout=15) != 0
        log = london.log()
        assert "cannot start:" in log and "federations.json: exchanges[0].upstream" in log, log
        assert "Traceback" not in log
    finally:
        london.stop()
