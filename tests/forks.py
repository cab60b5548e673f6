"""Broker processes forked from one that has already imported the broker.

A test run starts about 700 servers, and each ``python -m amqha start`` spent about 0.3 s
of CPU importing the broker before it served: over a run, minutes of a 2-core machine's
time. Each test worker keeps one *fork server* instead: a process that imports what
``amqha start`` imports, then waits for requests on its stdin. For each start it forks;
the child leaves the request loop, takes its own log as stdout and stderr, its working
directory, environment and arguments, and runs the same ``amqha start`` command a fresh
interpreter would run, ending through the interpreter's own exit (threads joined, atexit
handlers run, the exit status from ``SystemExit``).

So a server is still a real process with its own pid: kill -9, SIGSTOP and SIGTERM reach
it as before. It is the fork server's child, not the test's: ``Forked`` stands in for
``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``returncode``, ``kill``,
``terminate``), asking the fork server to reap it. The fork server reaps a child only when
asked, so a pid is never reused while its ``Forked`` may still signal it.

``ServerProcess.start`` (tests/support.py) forks only a plain start: the default command,
from this tree, with no wrapper (``ip netns exec``), no extra environment, and the worker's
environment unchanged since the fork server started. Anything else is run as before.
``AMQHA_TEST_FORKS=0`` turns forking off."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SWITCH = "AMQHA_TEST_FORKS"
# The command a forked child runs, as ``ServerProcess.command`` names it.
COMMAND = ("-m", "amqha", "start")


# A fork server answers at once; a start (the imports) takes about a second on a busy
# machine. This bounds a fork server that hangs.
ANSWER_WITHIN = 120.0


def _line(stream: Any, timeout: float) -> bytes:
    """One line from ``stream`` (b"" at its end), or TimeoutError after ``timeout`` s."""
    # A reply is one line written at once, and nothing follows it unasked: nothing is left
    # in the reader's buffer for select to miss.
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise TimeoutError(f"the fork server did not answer within {timeout} s")
    return bytes(stream.readline())


def _environment() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")


def _read_at_start(environment: dict[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in environment.items()
        if key.startswith(("PYTHON", "AMQHA", "LD_"))
    }


class ForkServer:
    """One fork server of this test process, started at its first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._environment: dict[str, str] = {}
        self._errors: Path | None = None

    def usable(self, environment: dict[str, str]) -> bool:
        """Whether a server with ``environment`` may be forked: what an interpreter or the
        broker's imports read (``PYTHON*``, ``AMQHA*``, ``LD_*``) is as the fork server
        started with. The rest (pytest's ``PYTEST_CURRENT_TEST`` changes with each test)
        is the child's ``os.environ``."""
        if os.environ.get(SWITCH) == "0":
            return False
        return self._process is None or _read_at_start(environment) == _read_at_start(
            self._environment
        )

    def spawn(self, args: list[str], cwd: Path, log: Path, env: dict[str, str]) -> Forked:
        request = {"op": "spawn", "args": args, "cwd": str(cwd), "log": str(log), "env": env}
        reply = self._ask(request, start=True)
        return Forked(self, int(reply["pid"]), args)

    def reap(self, pid: int) -> int | None:
        """The exit status of ``pid`` once it has ended (a signal as its negative)."""
        status = self._ask({"op": "reap", "pid": pid})["status"]
        return None if status is None else int(status)

    def _end(self) -> None:
        """At the test process's exit: the fork server ends (its servers were the
        fixtures' to end) and its file of errors goes."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                self._process.kill()
                self._process.wait(timeout=10)
            if self._errors is not None:
                self._errors.unlink(missing_ok=True)

    def _ask(self, request: dict[str, Any], start: bool = False) -> dict[str, Any]:
        with self._lock:
            if self._process is None:
                if not start:
                    raise RuntimeError("the fork server is not running")
                self._start()
            process = self._process
            assert process is not None and process.stdin and process.stdout
            try:
                process.stdin.write(json.dumps(request).encode() + b"\n")
                process.stdin.flush()
                line = _line(process.stdout, ANSWER_WITHIN)
            except OSError as error:
                raise RuntimeError(f"the fork server is gone ({error}):\n{self._said()}") from None
            if not line:
                raise RuntimeError(f"the fork server ended:\n{self._said()}")
            reply: dict[str, Any] = json.loads(line)
            if "error" in reply:
                raise RuntimeError(f"the fork server: {reply['error']}")
            return reply

    def _start(self) -> None:
        self._environment = _environment()
        handle, name = tempfile.mkstemp(prefix="amqha-forks-", suffix=".log")
        os.close(handle)
        self._errors = Path(name)
        atexit.register(self._end)
        with open(self._errors, "wb") as errors:
            self._process = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                cwd=ROOT,
                env=self._environment,
            )
        assert self._process.stdout is not None
        # Its first line says it has imported the broker.
        try:
            ready = _line(self._process.stdout, ANSWER_WITHIN)
        except OSError:
            ready = b"(no answer)"
        if ready.strip() != b"ready":
            self._process.kill()
            self._process.wait(timeout=10)
            self._process = None
            raise RuntimeError(f"the fork server did not start:\n{ready!r}\n{self._said()}")

    def _said(self) -> str:
        if self._errors is None or not self._errors.exists():
            return ""
        return self._errors.read_text(errors="replace")[-4000:]


class Forked:
    """A forked server, seen as ``subprocess.Popen`` sees its child."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.reap(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


FORKS = ForkServer()


# --- the fork server itself (run as a script) -------------------------------------------


def _serve() -> dict[str, Any]:
    """Answer requests until one is a spawn and this is its child: return it there."""
    # What `amqha start` imports, so that a child has nothing left to import; with what a
    # start imports only when configured (about a seventh of the suite's servers): the HTTP
    # endpoints, aiohttp and prometheus_client, 0.12 s of CPU each.
    import amqha.cli  # noqa: F401
    import amqha.datadir  # noqa: F401
    import amqha.management.api  # noqa: F401
    import amqha.metrics  # noqa: F401
    import amqha.server  # noqa: F401
    import amqha.store_file  # noqa: F401
    import failover.controller  # noqa: F401

    with contextlib.suppress(ImportError):  # the "speed" extra
        import uvloop  # noqa: F401
    requests = sys.stdin.buffer
    replies = sys.stdout.buffer

    def reply(value: dict[str, Any]) -> None:
        replies.write(json.dumps(value).encode() + b"\n")
        replies.flush()

    replies.write(b"ready\n")  # the broker is imported
    replies.flush()
    while True:
        line = requests.readline()
        if not line:  # the test process is gone
            sys.exit(0)
        request = json.loads(line)
        try:
            if request["op"] == "spawn":
                if threading.active_count() != 1:
                    raise RuntimeError("the fork server runs threads; it cannot fork")
                pid = os.fork()
                if pid == 0:
                    return dict(request)
                reply({"pid": pid})
            elif request["op"] == "reap":
                done, status = os.waitpid(request["pid"], os.WNOHANG)
                reply({"status": None if done == 0 else os.waitstatus_to_exitcode(status)})
            else:
                reply({"error": f"unknown request {request!r}"})
        except Exception as error:  # answered, so the test sees it
            reply({"error": f"{type(error).__name__}: {error}"})


def _become(request: dict[str, Any]) -> None:
    """In the child: the process ``python -m amqha start ...`` would have been."""
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    from amqha.cli import main

    sys.argv = ["python -m amqha", *request["args"]]
    main(args=request["args"], prog_name="python -m amqha")


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # as `python -m amqha` run from the tree finds it, not tests/
    _become(_serve())
