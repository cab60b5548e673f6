"""The broker's hot path counted in CPU instructions per message, under valgrind.

    python -m bench.instructions [--messages N] [--tree DIR ...]

The same in-process load as ``bench.hotpath`` (a ``Broker`` and one ``Connection``, client
bytes fed to ``data_received``), run in a child process under ``valgrind --tool=cachegrind``,
which counts the instructions the process executes. Each phase runs twice, with N messages
and with none (or, for the consume phases, with the queue filled and nothing consumed); the
difference over N is the phase's instructions per message (a first empty run writes any
stale bytecode, which would otherwise be counted). Unlike time, the count does not move
with other load on the machine (two runs agree within about 0.5%): this is the figure for "within x% of before" on a
shared machine. ``--tree`` runs the same load against other checkouts of the repository
(say, a worktree of an older commit) for a side-by-side table; by default, this one.

Phases: publish (no confirms), publish_confirms, consume_ack_each (prefetch 1000, an ack
per delivery, 100 per read), consume_ack_multiple (every 100th, multiple). Needs valgrind
(Debian: ``apt-get install valgrind``); without it, prints why and exits 2.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("publish", "publish_confirms", "consume_ack_each", "consume_ack_multiple")
# The load, run by the child: "python -c LOAD phase count" with the tree on sys.path.
LOAD = """
import asyncio, sys
from bench.hotpath import (BODY, Broker, ServerConfig, User, ack_frame, commands, feed,
                           method, open_connection, publish_frames)
phase, count = sys.argv[1], int(sys.argv[2])
async def go():
    broker = Broker(ServerConfig(users=(User("guest", "guest"),)))
    connection, _ = await open_connection(broker)
    setup = method(1, commands.Channel.Open()) + method(1, commands.Queue.Declare(queue="hot"))
    setup += method(2, commands.Channel.Open()) + method(2, commands.Confirm.Select())
    await feed(connection, setup)
    if phase in ("publish", "publish_confirms"):
        channel = 1 if phase == "publish" else 2
        await feed(connection, publish_frames(channel, "hot", BODY) * count)
        return
    await feed(connection, publish_frames(1, "hot", BODY) * count)
    if phase == "fill":
        return
    consume = method(3, commands.Channel.Open())
    consume += method(3, commands.Basic.Qos(prefetch_count=1000))
    consume += method(3, commands.Basic.Consume(queue="hot", consumer_tag="c"))
    await feed(connection, consume)
    if phase == "consume_ack_each":
        acks = [ack_frame(3, tag, False) for tag in range(1, count + 1)]
        per_read = 100
    else:
        acks = [ack_frame(3, tag, True) for tag in range(100, count + 1, 100)]
        per_read = 1
    for at in range(0, len(acks), per_read):
        connection.data_received(b"".join(acks[at : at + per_read]))
        await asyncio.sleep(0)
asyncio.run(go())
"""
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(tree: Path, phase: str, count: int) -> int:
    """Instructions the child executed for one phase and count."""
    result = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            "-c",
            LOAD,
            phase,
            str(count),
        ],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    found = _REFS.search(result.stderr)
    if result.returncode != 0 or found is None:
        raise RuntimeError(f"valgrind run failed in {tree} ({phase}): {result.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def per_message(tree: Path, count: int) -> dict[str, int]:
    instructions(tree, "publish", 0)  # writes any stale .pyc first: not counted below
    empty = instructions(tree, "publish", 0)
    filled = instructions(tree, "fill", count)
    figures = {}
    for phase in PHASES:
        base = empty if phase.startswith("publish") else filled
        figures[phase] = round((instructions(tree, phase, count) - base) / count)
        print(f"instructions: {tree.name}: {phase} {figures[phase]}", file=sys.stderr, flush=True)
    return figures


def run(count: int = 20_000, trees: list[Path] | None = None) -> dict[str, Any]:
    trees = trees or [ROOT]
    result: dict[str, Any] = {"messages": count, "instructions_per_msg": {}}
    for tree in trees:
        result["instructions_per_msg"][str(tree)] = per_message(tree, count)
    if len(trees) > 1:
        first = result["instructions_per_msg"][str(trees[0])]
        result["over_first"] = {
            str(tree): {
                phase: round(result["instructions_per_msg"][str(tree)][phase] / first[phase], 4)
                for phase in PHASES
            }
            for tree in trees[1:]
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument(
        "--tree", type=Path, action="append", help="a checkout to measure (repeatable)"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind is not installed (apt-get install valgrind)")
        sys.exit(2)
    trees = [tree.resolve() for tree in args.tree] if args.tree else None
    print(json.dumps(run(args.messages, trees), indent=2))


if __name__ == "__main__":
    main()
