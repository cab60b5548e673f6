"""RabbitMQ beside amqha: install Debian's ``rabbitmq-server`` if missing, run a private node.

The node is a child process of the benchmark: its own name (``bench-<pid>@localhost``),
its own data, log and config in a temporary directory, AMQP on a free loopback port,
Erlang distribution and a private epmd on loopback ports of their own, no plugins.
Everything it started, and only that, is stopped at the end: the node by its pid (after
``rabbitmqctl stop``), the private epmd with ``epmd -kill`` on its own port, and the
Debian service only if our own ``apt-get install`` is what started it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.rawclient import ping
from tests.support import free_port

SERVER_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server",)
CTL_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmqctl",)
PLUGINS_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-plugins",)
INSTALL_TIMEOUT = 900.0
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


def say(text: str) -> None:
    print(f"[rabbitmq] {text}", file=sys.stderr, flush=True)


def _script(candidates: tuple[str, ...], name: str) -> str | None:
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def _all_pids() -> set[int]:
    return {int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()}


def _service_pids(candidates: set[int]) -> set[int]:
    """Those of ``candidates`` run by the Debian service users (rabbitmq, epmd)."""
    uids = set()
    for name in ("rabbitmq", "epmd"):
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    found = set()
    for pid in candidates:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}").stat().st_uid in uids:
                found.add(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_installed() -> tuple[bool, str]:
    """(available, how): install Debian's package if it is missing and we may."""
    if _script(SERVER_SCRIPTS, "rabbitmq-server"):
        return True, "already installed"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False, "rabbitmq-server is not installed and apt-get as root is not available"
    say("rabbitmq-server is not installed: apt-get update && apt-get install -y rabbitmq-server")
    before = _all_pids()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", "rabbitmq-server"],
        ):
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT
            )
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                return False, f"{' '.join(command)} failed ({done.returncode}): {' | '.join(tail)}"
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"install failed: {error}"
    finally:
        _stop_service_started_by_install(before)
    if not _script(SERVER_SCRIPTS, "rabbitmq-server"):
        return False, "installed, but no rabbitmq-server script found"
    return True, "installed by this benchmark from Debian"


def _stop_service_started_by_install(before: set[int]) -> None:
    """apt may start the Debian service (unless policy-rc.d forbids it): stop it only then."""
    started = _service_pids(_all_pids() - before)
    if not started:
        return
    say(f"the install started the Debian service (pids {sorted(started)}): stopping it")
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["invoke-rc.d", "rabbitmq-server", "stop"], capture_output=True, timeout=STOP_TIMEOUT
        )
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(_alive(pid) for pid in started):
        time.sleep(0.1)
    for pid in started:
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


def package_version() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command may contain spaces or parentheses: the ppid follows the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class RabbitNode:
    """One private RabbitMQ node on 127.0.0.1; ``start()`` then ``stop()``. In between,
    ``shutdown()`` and ``start()`` restart it on the same data (same name, same ports).

    ``name`` tells two nodes of one benchmark apart (``NAME-<pid>@localhost``); ``plugins``
    are enabled offline, with ``rabbitmq-plugins --offline``, before the first start.
    Nodes of one cluster share an Erlang ``cookie`` and the ``epmd_port`` they find each
    other by (``join``)."""

    def __init__(
        self,
        port: int | None = None,
        ipv6: bool = False,
        name: str = "bench",
        plugins: tuple[str, ...] = (),
        cookie: str | None = None,
        epmd_port: int | None = None,
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="amqha-bench-rabbitmq-"))
        self.port = port or free_port()
        # Also listen on [::1] (same port): for suites that connect to amqp://[::1].
        self.ipv6 = ipv6
        self.dist_port = free_port()
        self.epmd_port = epmd_port or free_port()
        self.shares_epmd = epmd_port is not None
        if cookie is not None:
            path = self.dir / ".erlang.cookie"  # HOME is this directory
            path.write_text(cookie)
            path.chmod(0o400)
        self.nodename = f"{name}-{os.getpid()}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        self.version: str | None = None
        self.erlang_version: str | None = None
        self.start_seconds: float | None = None
        self.spawned = 0.0  # perf_counter() when the node process was last spawned
        self.env = self._environment()
        if plugins:
            self._enable_offline(plugins)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _environment(self) -> dict[str, str]:
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir()
        listeners = f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
        if self.ipv6:
            listeners += f"listeners.tcp.ipv6 = ::1:{self.port}\n"
        (self.dir / "rabbitmq.conf").write_text(
            listeners + "loopback_users = none\nlog.console = false\nlog.file.level = warning\n"
        )
        (self.dir / "enabled_plugins").write_text("[].\n")
        env = dict(
            os.environ,
            HOME=str(self.dir),  # the Erlang cookie is written here, not in ours
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.dir / "rabbit.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.epmd_port),
        )
        if self.ipv6:
            # These variables would replace the listeners the config file names.
            del env["RABBITMQ_NODE_IP_ADDRESS"], env["RABBITMQ_NODE_PORT"]
        return env

    def _enable_offline(self, plugins: tuple[str, ...]) -> None:
        """``rabbitmq-plugins --offline enable``: writes this node's enabled plugins file."""
        script = _script(PLUGINS_SCRIPTS, "rabbitmq-plugins")
        if script is None:
            raise RuntimeError("rabbitmq-plugins is not installed")
        done = subprocess.run(
            [script, "-n", self.nodename, "--offline", "enable", *plugins],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmq-plugins enable {' '.join(plugins)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl -n NODE ARGS`` on this node: its output, or RuntimeError saying why."""
        script = _script(CTL_SCRIPTS, "rabbitmqctl")
        if script is None:
            raise RuntimeError("rabbitmqctl is not installed")
        done = subprocess.run(
            [script, "-n", self.nodename, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args[:2])} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    def join(self, first: RabbitNode) -> None:
        """Join the cluster of the running node ``first`` (this one running, with the same
        cookie and epmd): ``stop_app``, ``join_cluster``, ``start_app``."""
        self.ctl("stop_app")
        self.ctl("join_cluster", first.nodename, timeout=120)
        self.ctl("start_app", timeout=120)
        self.wait_serving()

    def listen_tls(self, cert: str, key: str, ca: str) -> int:
        """Also serve amqps, on a free port it returns, with this certificate (before
        ``start()``); clients are not asked for certificates."""
        port = free_port()
        with (self.dir / "rabbitmq.conf").open("a") as conf:
            conf.write(
                f"listeners.ssl.default = 127.0.0.1:{port}\n"
                f"ssl_options.cacertfile = {ca}\n"
                f"ssl_options.certfile = {cert}\n"
                f"ssl_options.keyfile = {key}\n"
                "ssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
            )
        return port

    def start(self, wait: bool = True) -> None:
        """Spawn the node on this node's directory (kept across ``shutdown()``); with
        ``wait``, return once it serves AMQP (``start_seconds``: spawn to that)."""
        script = _script(SERVER_SCRIPTS, "rabbitmq-server")
        if script is None:
            raise RuntimeError("rabbitmq-server is not installed")
        log = open(self.dir / "stdout.log", "ab")  # noqa: SIM115 - handed to the child
        self.spawned = time.perf_counter()
        self.process = subprocess.Popen(
            [script], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
        )
        log.close()
        if wait:
            self.wait_serving()

    def wait_serving(self) -> None:
        """Until the node completes an AMQP handshake, at most ``START_TIMEOUT`` seconds."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited with {self.process.returncode}: {self.log_tail()}"
                )
            properties = ping("127.0.0.1", self.port, limit=1.0)
            if properties is not None:
                self.start_seconds = time.perf_counter() - self.spawned
                version = properties.get("version")
                self.version = version.decode() if isinstance(version, bytes) else version
                platform = properties.get("platform")
                self.erlang_version = platform.decode() if isinstance(platform, bytes) else platform
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"RabbitMQ did not serve AMQP in {START_TIMEOUT} s: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        texts = []
        for path in [self.dir / "stdout.log", *sorted((self.dir / "log").glob("*.log"))]:
            with contextlib.suppress(OSError):
                texts += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(texts[-lines:])

    def beam_pid(self) -> int | None:
        """The Erlang VM under our rabbitmq-server script (the script may exec it)."""
        if self.process is None:
            return None
        pending = [self.process.pid]
        for _ in range(4):
            found = []
            for pid in pending:
                if _comm(pid).startswith("beam"):
                    return pid
                found += _children(pid)
            pending = found
        return None

    def shutdown(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the node cleanly (``rabbitmqctl stop``, then by pid if it takes longer than
        ``timeout``) and its private epmd; its directory stays, for ``start()`` again."""
        process = self.process
        if process is None:
            return
        pids = [process.pid]
        beam = self.beam_pid()
        if beam is not None and beam not in pids:
            pids.append(beam)
        ctl = _script(CTL_SCRIPTS, "rabbitmqctl")
        if process.poll() is None and ctl is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    [ctl, "-n", self.nodename, "stop"],
                    env=self.env,
                    capture_output=True,
                    timeout=timeout,
                )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                process.wait(timeout=10)
        if beam is not None and _alive(beam) and _comm(beam).startswith("beam"):
            with contextlib.suppress(OSError):
                os.kill(beam, signal.SIGKILL)
        if not self.shares_epmd:
            # Our private epmd, on our own port: nothing else uses it (a cluster's nodes
            # share theirs: the cluster's owner stops it).
            stop_epmd(self.epmd_port, self.env)
        self.process = None

    def stop(self) -> None:
        """Stop the node and remove its directory: the end of this node."""
        self.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)


def stop_epmd(port: int, env: dict[str, str]) -> None:
    """``epmd -kill`` on ``port``: a private epmd, one node's or one cluster's."""
    epmd = shutil.which("epmd") or next(
        iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None
    )
    if epmd is None:
        return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            [str(epmd), "-port", str(port), "-kill"], env=env, capture_output=True, timeout=10
        )


def describe(node: RabbitNode | None, how: str) -> dict[str, Any]:
    return {
        "available": node is not None,
        "how": how,
        "version": node.version if node else None,
        "package": package_version(),
        "platform": node.erlang_version if node else None,
    }
