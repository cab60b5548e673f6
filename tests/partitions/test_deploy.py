"""The shipped two-host deployment (deploy/two-hosts, docs/deploy.md) on three test hosts
(network namespaces: tests/netns.py): the example configs with only their addresses,
folders and secrets put in, the peer link over TLS, a witness on the third host. Clients
on the bridge ride a kill -9 of the ACTIVE and a switchover back; a load balancer's health
check (https, only the ACTIVE answers 200) and an authenticated scrape follow the roles;
every confirmed message is consumed. Run by ``make partitions``."""

from __future__ import annotations

import asyncio
import secrets
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from amqha.client import Consumer, Publisher, connect
from amqha.console import ConsoleClient
from tests import netns
from tests.pairs import Pair, poll
from tests.support import ROOT

REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

EXAMPLES = ROOT / "deploy" / "two-hosts"
HOSTS = {"primary": "192.0.2.10", "backup": "192.0.2.11", "witness": "192.0.2.12"}
NAMES = {"primary": "amqha-a.example.net", "backup": "amqha-b.example.net"}
STEP = 120.0
QUEUE = "orders"


class Deployment:
    """The example configs on test hosts: what an operator fills in, filled in."""

    def __init__(self, workdir: Path, net: netns.Network) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.hosts = {role: net.add(role) for role in ("primary", "backup", "witness")}
        self.passwords = {user: secrets.token_hex(12) for user in ("app", "admin", "peering")}
        self.passwords["prometheus"] = secrets.token_hex(12)
        ca = trustme.CA(organization_name="amqha deploy test")
        self.ca_path = workdir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))
        self.etc: dict[str, Path] = {}
        for role in ("primary", "backup"):
            etc = workdir / f"etc-{role}"
            (etc / "tls").mkdir(parents=True)
            issued = ca.issue_cert(NAMES[role], self.hosts[role].address)
            issued.private_key_pem.write_to_path(str(etc / "tls" / "server.key"))
            issued.cert_chain_pems[0].write_to_path(str(etc / "tls" / "server.pem"))
            ca.cert_pem.write_to_path(str(etc / "tls" / "ca.pem"))
            for user, password in self.passwords.items():
                (etc / f"{user}.password").write_text(password + "\n")
            (etc / "pair.secret").write_text("deploy-test-secret-" + secrets.token_hex(16))
            self.etc[role] = etc
        # The same secret on both (and the witness).
        (self.etc["backup"] / "pair.secret").write_text(
            (self.etc["primary"] / "pair.secret").read_text()
        )
        self.pair = Pair(
            workdir,
            proxied=False,
            hosts=(self.hosts["primary"].address, self.hosts["backup"].address),
            prefixes=(self.hosts["primary"].prefix, self.hosts["backup"].prefix),
            ports=(5672, 5672),
            client="app",
        )
        for server in self.pair.servers:
            server.config = self.filled(EXAMPLES / f"{server.name}.yaml", server.name)
        self.witness: subprocess.Popen[bytes] | None = None

    def filled(self, path: Path, role: str) -> dict[str, Any]:
        """The example file with this site's addresses and folders, as an operator edits it."""
        text = path.read_text()
        for name, placeholder in HOSTS.items():
            text = text.replace(placeholder, self.hosts[name].address)
        text = text.replace("/etc/amqha", str(self.etc[role]))
        text = text.replace("/var/lib/amqha", str(self.workdir))
        loaded: dict[str, Any] = yaml.safe_load(text)
        return loaded

    def start_witness(self) -> None:
        """The witness as deploy/systemd/amqha-witness.service runs it."""
        unit = (ROOT / "deploy" / "systemd" / "amqha-witness.service").read_text()
        line = next(w for w in unit.splitlines() if w.startswith("ExecStart="))
        words = line.removeprefix("ExecStart=").split()[1:]  # after the amqha executable
        words = [
            w.replace(HOSTS["witness"], self.hosts["witness"].address).replace(
                "/etc/amqha", str(self.etc["primary"])
            )
            for w in words
        ]
        with open(self.workdir / "witness.log", "ab") as log:
            self.witness = subprocess.Popen(
                [*self.hosts["witness"].prefix, sys.executable, "-m", "amqha", *words],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    def url(self, role: str, user: str = "app") -> str:
        return f"amqp://{user}:{self.passwords[user]}@{self.hosts[role].address}:5672/"

    def https(self, role: str, path: str, port: int, user: str) -> tuple[int, str]:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.check_hostname = False  # reached by address; the chain is still checked
        token = b64encode(f"{user}:{self.passwords[user]}".encode()).decode()
        request = urllib.request.Request(
            f"https://{self.hosts[role].address}:{port}{path}",
            headers={"Authorization": f"Basic {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def scrape(self, role: str) -> str:
        token = b64encode(f"prometheus:{self.passwords['prometheus']}".encode()).decode()
        request = urllib.request.Request(
            f"http://{self.hosts[role].address}:15692/metrics",
            headers={"Authorization": f"Basic {token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(answer.read().decode())

    def close(self) -> None:
        if self.witness is not None and self.witness.poll() is None:
            self.witness.send_signal(signal.SIGTERM)
            try:
                self.witness.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.witness.kill()
                self.witness.wait(timeout=10)
        self.pair.stop()


@pytest.fixture
def deployment(tmp_path: Path) -> Any:
    with netns.Network() as net:
        made = Deployment(tmp_path / "site", net)
        try:
            yield made
        finally:
            made.close()


async def test_the_shipped_two_host_configs_fail_over_and_switch_over(
    deployment: Deployment,
) -> None:
    site = deployment
    site.start_witness()
    pair = site.pair.start()
    await pair.wait_states("ACTIVE", "PASSIVE", timeout=STEP)
    await pair.wait_in_sync(pair.backup, timeout=STEP)

    async def health(role: str) -> int:
        return site.https(role, "/api/health/checks/amqha-active", 15672, "admin")[0]

    assert (await asyncio.to_thread(lambda: site.https("primary", "/", 15672, "admin")))[0] == 200
    assert await health("primary") == 200 and await health("backup") == 503
    assert 'amqha_pair_state{state="ACTIVE"} 1.0' in await asyncio.to_thread(site.scrape, "primary")

    async def declare(channel: Any) -> None:
        await channel.declare_queue(QUEUE, durable=True)

    urls = [site.url("primary"), site.url("backup")]
    confirmed: set[str] = set()
    received: set[str] = set()

    async def took(message: Any) -> None:
        received.add(message.body.decode())

    async with (
        Publisher(urls, setup=declare, max_pending=50) as publisher,
        Consumer(urls, QUEUE, took, prefetch=20, setup=declare),
    ):

        async def send(prefix: str, count: int) -> None:
            for number in range(count):
                await publisher.publish(f"{prefix}-{number}".encode(), routing_key=QUEUE)
                confirmed.add(f"{prefix}-{number}")

        await send("before", 200)
        await pair.wait_in_sync(pair.backup, timeout=STEP)
        pair.kill(pair.primary)  # the host's server dies; the witness agrees it is gone
        # A client's vote (the publisher's own reconnecting votes too).
        vote = await connect([site.url("backup")], retry_for=STEP, attempt_timeout=2.0)
        await vote.close()
        await pair.wait_states(None, "ACTIVE", timeout=STEP)
        await send("after-kill", 200)
        assert await health("backup") == 200

        pair.primary.start()  # as systemd's Restart=on-failure does
        await pair.wait_states("PASSIVE", "ACTIVE", timeout=STEP)
        await pair.wait_in_sync(pair.primary, timeout=STEP)
        admin = site.url("backup", "admin")
        async with ConsoleClient(admin, 60.0) as console:
            answer = await console.call("switchover", wait=30)
        assert answer["to"] == "primary"
        await pair.wait_states("ACTIVE", "PASSIVE", timeout=STEP)
        await send("after-switchover", 200)
        await publisher.flush(STEP)
        await poll(lambda: confirmed <= received, STEP, "every confirmed message consumed")
    assert await health("primary") == 200 and await health("backup") == 503
    assert pair.quarantine_files() == []
