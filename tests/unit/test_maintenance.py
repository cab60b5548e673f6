"""The pair's maintenance view (failover/maintenance.py): changes, the merge of a peer's
view, the refusals, and its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from failover import maintenance
from failover.maintenance import MaintenanceFileError, View
from failover.peer_message import STATE_TYPE, encode, parse
from tests.unit.test_peer_message import EXPECTED, SECRET, fields


def test_each_change_counts_and_the_later_view_wins_on_both_sides() -> None:
    ours = View().changed("primary", True)
    assert ours == View(frozenset({"primary"}), 1)
    theirs = ours.changed("primary", False)
    assert ours.merged(theirs, theirs_is_primary=False) == theirs
    assert theirs.merged(ours, theirs_is_primary=True) == theirs  # ours is later
    # Changed on both sides while apart (equal counts): both settle on the primary's.
    backup_view, primary_view = View(frozenset({"primary"}), 2), View(frozenset(), 2)
    assert backup_view.merged(primary_view, theirs_is_primary=True) == primary_view
    assert primary_view.merged(backup_view, theirs_is_primary=False) == primary_view


def test_refusals_name_the_reason() -> None:
    none, primary_on = View(), View(frozenset({"primary"}), 1)
    assert maintenance.refusal(none, "backup", True, active="primary") is None
    assert "the primary is ACTIVE: hand the service to the backup first" in (
        maintenance.refusal(none, "primary", True, active="primary") or ""
    )
    assert "both servers would be" in (maintenance.refusal(primary_on, "backup", True, None) or "")
    assert maintenance.refusal(primary_on, "primary", False, active="backup") is None
    assert "no server 'arbiter'" in (maintenance.refusal(none, "arbiter", True, None) or "")


def test_the_view_survives_a_restart_and_a_damaged_file_is_named(tmp_path: Path) -> None:
    assert maintenance.load(tmp_path) == View()
    view = View(frozenset({"backup"}), 3)
    maintenance.store(tmp_path, view)
    assert maintenance.load(tmp_path) == view
    (tmp_path / maintenance.MAINTENANCE_FILE).write_text('{"on": ["nobody"], "seq": 1}')
    with pytest.raises(MaintenanceFileError, match="maintenance.json: corrupt"):
        maintenance.load(tmp_path)


def test_a_state_message_carries_the_view() -> None:
    view = View(frozenset({"primary"}), 4)
    body, kind, headers = encode(SECRET, STATE_TYPE, fields(maintenance=view.to_json()))
    assert parse(EXPECTED, kind, body, headers, 4).maintenance == view
    body, kind, headers = encode(SECRET, STATE_TYPE, fields())
    assert parse(EXPECTED, kind, body, headers, 4).maintenance is None  # an older peer
