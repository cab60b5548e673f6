"""A server forked from the test worker's fork server (tests/forks.py) behaves as a cold
``python -m amqha start`` of the same config: the same output, the same answer to
SIGSTOP, SIGTERM and kill -9, the same exit status, and a refusal said the same way."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import aiormq
import pytest

from tests.forks import Forked
from tests.support import ServerProcess, wait_until

COLD = {"AMQHA_TEST_FORKS": "0"}  # extra environment: started as a process of its own


def server(tmp_path: Path, name: str, cold: bool) -> ServerProcess:
    made = ServerProcess(tmp_path, name)
    if cold:
        made.env = dict(COLD)
    return made


def said(made: ServerProcess) -> list[str]:
    """Its output's lines with the parts that differ between any two starts taken out."""
    text = made.own_output().decode()
    text = text.replace(str(made.workdir), "WORKDIR").replace(str(made.port), "PORT")
    return [re.sub(r"^\S+ \S+ ", "", line) for line in text.splitlines()]


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("cold", [False, True], ids=["forked", "cold"])
async def test_a_server_answers_signals_and_exits_as_a_cold_start_does(
    tmp_path: Path, cold: bool
) -> None:
    made = server(tmp_path, "one", cold).start()
    try:
        assert made.process is not None
        assert isinstance(made.process, Forked) is not cold
        pid = made.process.pid
        connection = await aiormq.connect(made.url)
        await connection.close()
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: state(pid) == "T", 10, what="stopped by SIGSTOP")
        assert made.process.poll() is None  # a stopped server has not ended
        os.kill(pid, signal.SIGCONT)
        wait_until(lambda: state(pid) != "T", 10, what="running again after SIGCONT")
        connection = await aiormq.connect(made.url)
        await connection.close()
        assert made.terminate(timeout=60) == 0  # SIGTERM: a clean stop
        assert "shutting down" in made.own_output().decode()
        made.start()
        made.kill()
        assert made.process.returncode == -signal.SIGKILL
    finally:
        made.discard()


async def test_a_forked_start_says_what_a_cold_start_says(tmp_path: Path) -> None:
    forked = server(tmp_path / "forked", "same", cold=False)
    cold = server(tmp_path / "cold", "same", cold=True)
    cold.port = forked.port  # the same config: one after the other on one port
    cold.config["server"]["listen"] = forked.config["server"]["listen"]
    outputs = []
    for made in (forked, cold):
        made.start()
        try:
            assert made.terminate(timeout=60) == 0
        finally:
            made.discard()
        outputs.append(said(made))
    assert outputs[0] == outputs[1]
    assert any("listening on" in line for line in outputs[0])


@pytest.mark.parametrize("cold", [False, True], ids=["forked", "cold"])
def test_a_refused_start_exits_1_and_says_why(tmp_path: Path, cold: bool) -> None:
    made = server(tmp_path, "bad", cold)
    made.config["failover"] = {"role": "backup"}  # no peer: refused
    with pytest.raises(RuntimeError, match="exited with 1") as refused:
        made.start()
    assert "bad configuration" in str(refused.value)
    assert "failover.peer: missing" in str(refused.value)
    assert "Traceback" not in str(refused.value)
    assert made.process is not None and made.process.wait(timeout=10) == 1
