"""Test hosts in Linux network namespaces, and faults made by the kernel.

Owns: a private bridge in the test's own namespace (the clients' side, the bridge holding
the first address of the subnet), one namespace per test host joined to it by a veth pair,
and faults inside a host's namespace: its link down, nftables rules that drop traffic to or
from another host (all of it, one direction of one port, or a random share of packets),
and a token-bucket bandwidth limit (``tc tbf``). Everything is made by the test and
removed by ``close()``, namespaces, bridge and rules; names carry a tag of this process so
two runs never meet. Loopback cannot partition; these can (docs/failover.md, "Partitions").

Needs root, ``ip`` (iproute2) and ``nft`` (nftables); ``unavailable()`` says what is
missing, for the tests to skip with that reason. The kernel here has no ``netem``: delay,
where a test needs it, comes from tests/proxy.py run inside a namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
from dataclasses import dataclass

COMMAND_TIMEOUT = 20.0
TABLE = "amqha_test"


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(args), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian's {package}; `make test` installs it)"
    probe = f"amqhaprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return f"`ip netns add` fails here: {error}"
    with contextlib.suppress(Exception):
        _run("ip", "netns", "del", probe)
    return None


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    inside: str  # the veth end in the namespace
    outside: str  # the veth end on the bridge
    limited: bool = False  # a tbf qdisc holds its way out

    @property
    def prefix(self) -> tuple[str, ...]:
        """What a command runs under to run on this host."""
        return ("ip", "netns", "exec", self.namespace)


class Network:
    """A bridge and the hosts on it. Use as a context manager, or call ``close()``."""

    def __init__(self) -> None:
        self.tag = f"aq{os.getpid() % 100000:05d}{random.randrange(16**2):02x}"
        # A /24 in 10.0.0.0/8 picked at random: a private range no real network here uses.
        self.subnet = ipaddress.ip_network(
            f"10.{random.randrange(200, 250)}.{random.randrange(256)}.0/24"
        )
        self.bridge = f"{self.tag}br"
        self.gateway = str(self.subnet.network_address + 1)
        self.hosts: dict[str, Host] = {}
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        try:
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
        except Exception:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def add(self, name: str) -> Host:
        """A new host on the bridge, with its own namespace and the next address."""
        number = len(self.hosts) + 2
        host = Host(
            name,
            f"{self.tag}-{name}",
            str(self.subnet.network_address + number),
            f"{self.tag}p{number}",
            f"{self.tag}v{number}",
        )
        self.hosts[name] = host
        _run("ip", "netns", "add", host.namespace)
        _run("ip", "link", "add", host.outside, "type", "veth", "peer", "name", host.inside)
        _run("ip", "link", "set", host.inside, "netns", host.namespace)
        _run("ip", "link", "set", host.outside, "master", self.bridge, "up")
        self.inside(host, "ip", "addr", "add", f"{host.address}/24", "dev", host.inside)
        self.inside(host, "ip", "link", "set", host.inside, "up")
        self.inside(host, "ip", "link", "set", "lo", "up")
        self.inside(host, "nft", "add", "table", "inet", TABLE)
        for hook in ("input", "output"):
            self.inside(
                host,
                "nft",
                "add",
                "chain",
                "inet",
                TABLE,
                hook,
                f"{{ type filter hook {hook} priority 0; policy accept; }}",
            )
        return host

    def inside(self, host: Host, *command: str) -> subprocess.CompletedProcess[str]:
        return _run(*host.prefix, *command)

    # -- faults ---------------------------------------------------------------------------

    def link(self, host: Host, up: bool) -> None:
        """The host's only link down (nothing in or out, no reset sent) or up again."""
        self.inside(host, "ip", "link", "set", host.inside, "up" if up else "down")

    def drop(
        self,
        host: Host,
        peer: Host,
        direction: str = "both",
        port: int | None = None,
        percent: int = 100,
    ) -> None:
        """Drop, on ``host``, packets exchanged with ``peer``: ``direction`` "out" (to it),
        "in" (from it) or "both"; only TCP to (out) or from (in) ``port`` if given; a random
        ``percent`` of them (nftables ``numgen random``) if below 100. Silent drops: the
        sender sees a timeout, never a reset."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent is 1..100, not {percent}")
        share = "" if percent == 100 else f" numgen random mod 100 < {percent}"
        for hook, match in (("output", "daddr"), ("input", "saddr")):
            if direction not in ("both", "out" if hook == "output" else "in"):
                continue
            ports = (
                "" if port is None else f" tcp {'dport' if hook == 'output' else 'sport'} {port}"
            )
            rule = f"ip {match} {peer.address}{ports}{share} drop"
            self.inside(host, "nft", "add", "rule", "inet", TABLE, hook, *rule.split())

    def heal(self, host: Host) -> None:
        """Every drop rule on ``host`` gone, its link up (a bandwidth limit stays)."""
        for hook in ("input", "output"):
            self.inside(host, "nft", "flush", "chain", "inet", TABLE, hook)
        self.link(host, True)

    def unlimit(self, host: Host) -> None:
        """The host's bandwidth limit gone, if it has one."""
        if host.limited:
            self.inside(host, "tc", "qdisc", "del", "dev", host.inside, "root")
            host.limited = False

    def limit(self, host: Host, rate: str = "1mbit", control_first: bool = False) -> None:
        """Bandwidth of the host's link out, by a token bucket (``tc tbf``).

        With ``control_first`` the queue behind the bucket is a ``pfifo_fast`` one (Linux's
        own default, in every kernel), which sends what is marked as control traffic
        (``amqha.netmark``: the socket priority) ahead of the rest and holds as much of
        the rest as the link's queue length, and the host's TCP loss-based (reno, which a
        namespace may choose where cubic, most hosts' default, is not allowed): a bulk
        flow fills that queue until it drops, seconds of it at a low rate: a bufferbloated
        uplink that honours the marks."""
        # The burst must hold more than a kernel tick's worth of the rate, or the bucket
        # empties between ticks and the link runs far below ``rate``. The queue holds at
        # most 200 ms of it: a host that fills its link (a catch-up after a cut) delays
        # everything else it sends by that much, its witness pings too; with 400 ms, a
        # ping every 0.2 s reached the witness up to 0.6 s late, the whole failover
        # timeout, and an ACTIVE fast enough to keep its link full lost its witness.
        self.inside(
            host, "tc", "qdisc", "replace", "dev", host.inside, "root", "handle", "1:",
            "tbf", "rate", rate, "burst", "256kbit", "latency", "200ms",
        )  # fmt: skip
        if control_first:
            self.inside(
                host, "tc", "qdisc", "add", "dev", host.inside, "parent", "1:1", "pfifo_fast",
            )  # fmt: skip
            self.inside(host, "sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno")
        host.limited = True

    def backlog(self, host: Host) -> int:
        """Bytes waiting in the host's limited way out (0 without a limit)."""
        shown = self.inside(host, "tc", "-s", "qdisc", "show", "dev", host.inside).stdout
        # The root's line comes first: what the bucket and the queue behind it hold.
        for line in shown.splitlines():
            if line.strip().startswith("backlog "):
                figure = line.split()[1]
                for suffix, scale in (("Mb", 1 << 20), ("Kb", 1 << 10), ("b", 1)):
                    if figure.endswith(suffix):
                        return int(figure[: -len(suffix)]) * scale
        return 0

    def pin_neighbours(self, host: Host, other: Host) -> None:
        """Each host knows the other's hardware address for good (permanent neighbour
        entries): no ARP between them. An ARP probe or reply waits in a full queue like
        any unmarked packet, and the entry then fails; the limit above stands for a
        bottleneck past the first hop, where the neighbour is reached on an idle link."""
        for one, two in ((host, other), (other, host)):
            shown = self.inside(two, "ip", "-o", "link", "show", "dev", two.inside).stdout
            mac = shown.split("link/ether ", 1)[1].split()[0]
            self.inside(
                one, "ip", "neigh", "replace", two.address, "lladdr", mac,
                "dev", one.inside, "nud", "permanent",
            )  # fmt: skip

    # -- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Remove every namespace and the bridge (a veth pair goes with its namespace)."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                _run("ip", "netns", "del", host.namespace)
            with contextlib.suppress(Exception):
                _run("ip", "link", "del", host.outside)
        self.hosts.clear()
        with contextlib.suppress(Exception):
            _run("ip", "link", "del", self.bridge)
