"""``bench.replication_bench`` on servers it did not start, named by their URLs, as on two
machines: a standalone server and the ACTIVE of a pair, started as an operator would; the
command measures both ratios on them, round by round, and prints them as JSON."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
from collections.abc import Callable

import aiormq

from amqha.console import ConsoleClient
from tests.pairs import ADMIN, MakePair, url_of
from tests.support import ROOT, ServerProcess


async def test_the_ratios_on_servers_named_by_their_urls(
    make_pair: MakePair, make_server: Callable[..., ServerProcess]
) -> None:
    solo = make_server("elsewhere").start()
    pair = make_pair().start()
    await pair.wait_states("ACTIVE", "PASSIVE")
    command = [
        sys.executable,
        "-m",
        "bench.replication_bench",
        "--standalone",
        solo.url,
        "--active",
        url_of(pair.primary, ADMIN),
        "--rounds",
        "2",
        "--messages",
        "300",
    ]
    done = await asyncio.to_thread(
        subprocess.run, command, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["servers"] == "named" and result["sizes"]["messages"] == 300
    for section in (result, result["wide_window"]):
        for side in ("standalone", "replicated"):
            assert len(section[side]["rounds"]) == 2 and section[side]["nacked"] == 0
            # Their CPU is not this machine's to read when they run elsewhere.
            assert section[side]["server_cpu_us_per_msg"] is None
        ratio = statistics.median(section["replicated"]["rounds"]) / statistics.median(
            section["standalone"]["rounds"]
        )
        assert section["ratio_of_medians"] == round(ratio, 3)
    assert result["window"] == 100 and result["wide_window"]["window"] == 1000
    assert result["target_met"] == (result["ratio_of_medians"] >= 0.85)
    assert f"127.0.0.1:{solo.port} alone" in done.stderr
    # A login the standalone server refuses stops the bench before any round, saying so.
    wrong = command.copy()
    wrong[wrong.index("--standalone") + 1] = solo.url.replace(":guest@", ":wrong@")
    refused = await asyncio.to_thread(
        subprocess.run, wrong, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1 and refused.stdout == "", refused.stderr[-3000:]
    assert f"--standalone 127.0.0.1:{solo.port}: no AMQP login (" in refused.stderr
    assert "ACCESS_REFUSED" in refused.stderr and "Traceback" not in refused.stderr
    # The rounds went where they were named: each server holds the bench's queue, emptied
    # after each round (a passive declare: an error if it is missing); the pair's PASSIVE
    # holds it too, replicated (it applies what it keeps a moment later).
    for server in (solo, pair.primary):
        assert await queue_depth(server, "b") == 0, server.name
    passive: list[dict] = []
    for _ in range(300):  # up to 30 s
        async with ConsoleClient(url_of(pair.backup, ADMIN)) as console:
            passive = [q for q in await console.call("queues") if q["name"] == "b"]
        if passive and passive[0]["messages"] == 0:
            break
        await asyncio.sleep(0.1)
    assert passive and passive[0]["messages"] == 0, passive


async def queue_depth(server: ServerProcess, queue: str) -> int:
    connection = await aiormq.connect(server.url)
    try:
        channel = await connection.channel()
        declared = await channel.queue_declare(queue, passive=True)
        return int(declared.message_count or 0)
    finally:
        await connection.close()
