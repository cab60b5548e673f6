"""The broker's parts name what they need of each other as protocols (amqha/host.py):
the broker and the connection really provide every member of the ones they implement."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import yaml

from amqha import host
from amqha.connection import Connection
from amqha.gate import Member
from amqha.replication import Feed
from amqha.server import Broker
from config import load_config


def members(protocol: type) -> set[str]:
    names = set()
    for klass in protocol.__mro__:
        if klass in (object,) or klass.__name__ in ("Protocol", "Generic"):
            continue
        names |= set(getattr(klass, "__annotations__", {}))
        names |= {
            name
            for name, value in vars(klass).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))
        }
    return names


def missing(instance: object, protocol: type) -> set[str]:
    return {name for name in members(protocol) if not hasattr(instance, name)}


def test_the_broker_and_a_connection_provide_every_member_they_promise(tmp_path: Path) -> None:
    path = tmp_path / "solo.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "server": {"name": "solo", "listen": "127.0.0.1:0", "data_dir": str(tmp_path)},
                "users": [{"name": "guest", "password": "guest"}],
            }
        )
    )
    config = load_config(path)

    async def check() -> None:
        broker = Broker(config)
        for protocol in (
            host.ChannelHost,
            host.ConnectionHost,
            host.BrokerHost,
            host.ReplicationHost,
            host.MetricsSource,
            host.ManagementSource,
            host.DefinitionsHost,
            host.FederationHost,
            host.ConsoleHost,
            Member,
        ):
            assert not missing(broker, protocol), (protocol.__name__, missing(broker, protocol))
        connection = Connection(broker)
        assert not missing(connection, host.ChannelOwner), missing(connection, host.ChannelOwner)
        assert not missing(broker.feed, host.FeedPort)
        assert isinstance(broker.feed, Feed)

    asyncio.run(check())


def test_no_module_of_the_broker_imports_the_server_or_a_channel_its_connection() -> None:
    """server -> connection -> channel, server -> replication, server -> metrics: none of
    them imports back (docs/architecture.md). Read from the sources: a compiled module
    (amqha/compiled.py) has none to inspect."""
    amqha = Path(__file__).resolve().parents[2] / "amqha"
    for name in ("channel", "connection", "replication", "metrics"):
        source = (amqha / f"{name}.py").read_text()
        assert "from .server import" not in source, name
    assert "from .connection import" not in (amqha / "channel.py").read_text()


def test_no_module_writes_into_the_broker() -> None:
    """The broker's faces and the pair's controller change it through its methods (an
    observer attaches itself, a hook is registered), never by setting its attributes or
    filling its lists; only ``server.serve``, which builds it, wires its parts in."""
    root = Path(__file__).resolve().parents[2]
    writes = re.compile(
        r"\bbroker\.\w+(?:\[[^]]*\])?\s*(?:=(?!=)|\+=|-=)|\bbroker\.\w+\.(?:append|add)\("
    )
    found = []
    for folder in ("amqha", "failover", "peering", "config"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name == "server.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if writes.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
