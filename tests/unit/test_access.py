"""The run-time users, vhosts and permissions (amqha/core/access.py) as changes: the codec
carries them (and refuses a user with the pair's own tag, whoever sent it), applying them
gives the state the snapshot form rebuilds, a Reset clears them, and the store keeps them
across a reopen, an older file gaining the table."""

from __future__ import annotations

import sqlite3

import pytest

from amqha.core import codec
from amqha.core.access import Access
from amqha.core.apply import apply, state_changes
from amqha.core.changes import (
    PermissionDeleted,
    PermissionSet,
    QueueDeclared,
    Reset,
    UserDeleted,
    UserSet,
    VhostDeleted,
    VhostSet,
)
from amqha.store import Store
from tests.unit.test_changes import Replica

WALL = 1_700_000_000.0

CHANGES = [
    VhostSet("v1"),
    VhostSet("v2"),
    UserSet("ann", "$scrypt$ln=15,r=8,p=1$c2FsdA$ZGlnZXN0", ("management",)),
    UserSet("bo", "aGFzaC1vZi1ibw==", ()),
    PermissionSet("v1", "ann"),
    PermissionSet("v2", "ann"),
    PermissionSet("v1", "bo"),
    PermissionSet("/", "bo"),
    UserSet("bo", "bmV3LWhhc2g=", ("monitoring", "x")),  # changed
    PermissionDeleted("v1", "bo"),
    VhostDeleted("v2"),  # takes ann's permission there with it
    VhostSet("v3"),
    UserSet("cy", "Y3k=", ()),
    PermissionSet("v3", "cy"),
    UserDeleted("cy"),  # takes cy's permission with it
]


def applied(changes: list) -> Replica:
    replica = Replica()
    for change in changes:
        apply(replica, change, WALL)
    return replica


def test_applied_changes_give_the_users_vhosts_and_permissions_left() -> None:
    access = applied(CHANGES).access
    assert access.snapshot() == {
        "users": [
            ("ann", CHANGES[2].password_hash, ["management"]),
            ("bo", "bmV3LWhhc2g=", ["monitoring", "x"]),
        ],
        "vhosts": ["v1", "v3"],
        "permissions": [("/", "bo"), ("v1", "ann")],
    }
    assert access.vhosts_of("ann") == ["v1"] and access.vhosts_of("cy") == []
    # A vhost made is a vhost of the state; one deleted is not.
    replica = applied(CHANGES)
    assert "v1" in replica.vhosts and "v2" not in replica.vhosts


def test_the_codec_carries_each_access_change_and_refuses_the_pairs_tag() -> None:
    run = codec.encode(7, [QueueDeclared("/", "q", False, {}), *CHANGES])
    assert codec.decode(run) == (7, [QueueDeclared("/", "q", False, {}), *CHANGES])
    forged = codec.encode(1, [UserSet("intruder", "aGFzaA==", ("administrator", "peering"))])
    with pytest.raises(ValueError, match="peering"):
        codec.decode(forged)
    with pytest.raises(ValueError, match="peering"):
        Access().apply(UserSet("intruder", "aGFzaA==", ("peering",)))


def test_the_snapshot_form_rebuilds_them_and_a_reset_clears_them() -> None:
    source = applied(CHANGES)
    stale = applied([VhostSet("old"), UserSet("old", "b2xk", ()), PermissionSet("old", "old")])
    for change in state_changes(source.vhosts, access=source.access):
        apply(stale, change, WALL)
    assert stale.access.snapshot() == source.access.snapshot()
    assert list(stale.access.users) == ["ann", "bo"]  # the order made, kept
    apply(stale, Reset(), WALL)
    assert stale.access.snapshot() == {"users": [], "vhosts": [], "permissions": []}


def test_the_store_keeps_them_across_a_reopen(tmp_path) -> None:
    path = tmp_path / "store" / "amqha.db"
    store = Store.open(path)
    for lsn, change in enumerate(CHANGES, 1):
        store.submit(lsn, [change])
    store.close()
    store = Store.open(path)
    try:
        recovered = applied(list(store.recover()))
    finally:
        store.close()
    assert recovered.access.snapshot() == applied(CHANGES).access.snapshot()
    # A Reset (a snapshot follows) clears them on disk too.
    store = Store.open(path)
    store.submit(len(CHANGES) + 1, [Reset(), VhostSet("only")])
    store.close()
    store = Store.open(path)
    try:
        assert list(store.recover()) == [VhostSet("only")]
    finally:
        store.close()


def test_a_version_5_store_gains_the_access_table_at_open(tmp_path) -> None:
    path = tmp_path / "amqha.db"
    Store.open(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE access")
    db.execute("UPDATE meta SET value = 5 WHERE key = 'version'")
    db.commit()
    db.close()
    store = Store.open(path)
    store.submit(1, [VhostSet("v")])
    store.close()
    store = Store.open(path)
    try:
        assert list(store.recover()) == [VhostSet("v")]
    finally:
        store.close()
