"""A server's global name and federation id (docs/federation.md, "Names")."""

from __future__ import annotations

from pathlib import Path

from amqha.federation import names
from amqha.federation.agent import local_federation_id, local_global_name
from config.loader import FailoverConfig, ServerConfig


def pair_member(name: str, peer_name: str | None, secret: bytes = b"s" * 20) -> ServerConfig:
    failover = FailoverConfig("primary", "127.0.0.1:1", secret=secret, peer_name=peer_name)
    return ServerConfig(name=name, failover=failover)


def test_a_standalone_server_is_named_by_itself() -> None:
    assert local_global_name(ServerConfig(name="london")) == "london"


def test_both_servers_of_a_pair_compute_one_name_and_one_id() -> None:
    primary, backup = pair_member("primary", "backup"), pair_member("backup", "primary")
    assert local_global_name(primary) == local_global_name(backup) == "backup+primary"
    assert local_federation_id(primary) == local_federation_id(backup)
    assert local_federation_id(primary) == names.federation_id(b"s" * 20)
    assert local_federation_id(pair_member("primary", "backup", b"t" * 20)) != (
        local_federation_id(primary)
    )


def test_a_standalone_server_keeps_its_random_id(tmp_path: Path) -> None:
    config = ServerConfig(name="london", data_dir=str(tmp_path / "data"))
    first = local_federation_id(config)
    assert len(first) == 16 and int(first, 16) >= 0
    assert local_federation_id(config) == first
    assert (tmp_path / "data" / "federation.id").read_text().strip() == first
    other = ServerConfig(name="london", data_dir=str(tmp_path / "other"))
    assert local_federation_id(other) != first
