"""data_dir/federations.json: the links added at run time, written whole and read back
with the config loader's checks (docs/federation.md, "At run time")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqha.federation import runtime
from config.schema import ConfigError, FederatedExchange, FederationUpstream

URL = "amqp://efa:secret@10.0.0.1:5672/"


def test_what_is_saved_is_read_back_and_only_its_owner_may_read_it(tmp_path: Path) -> None:
    kept = runtime.Runtime(
        {"central": FederationUpstream("central", (URL,))},
        [FederatedExchange("market", "central", forward=True, max_hops=2)],
        [runtime.PendingDeletion("old", "central", "/", "federation: old central to x", (URL,))],
    )
    runtime.save(str(tmp_path), kept)
    path = tmp_path / runtime.FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / f"{runtime.FILE}.tmp").exists()
    assert runtime.load(str(tmp_path), []) == kept


def test_no_file_is_no_run_time_federation(tmp_path: Path) -> None:
    assert runtime.load(str(tmp_path), ["central"]) == runtime.Runtime()


@pytest.mark.parametrize(
    ("data", "key", "problem"),
    [
        ("not json", "(file)", "not JSON"),
        ({"version": 2}, "version", "expected 1"),
        (
            {"version": 1, "upstreams": {"bad name": {"urls": [URL]}}},
            "upstreams.bad name",
            "not a valid name",
        ),
        (
            {"version": 1, "upstreams": {"c": {"urls": ["http://h/"]}}},
            "upstreams.c.urls[0]",
            "amqp://",
        ),
        (
            {"version": 1, "exchanges": [{"exchange": "x", "upstream": "nope"}]},
            "exchanges[0].upstream",
            "no upstream 'nope'",
        ),
        (
            {"version": 1, "exchanges": [{"exchange": "x", "upstream": "central", "max_hops": 0}]},
            "exchanges[0].max_hops",
            "1 or more",
        ),
        (
            {"version": 1, "exchanges": [{"exchange": "x", "upstream": "central", "colour": 1}]},
            "exchanges[0].colour",
            "unknown key",
        ),
        (
            {"version": 1, "pending_deletions": [{"queue": "q", "upstream": "c", "urls": [URL]}]},
            "pending_deletions[0].queue",
            "not a buffer queue",
        ),
    ],
)
def test_a_bad_file_names_itself_the_key_and_the_problem(
    tmp_path: Path, data: object, key: str, problem: str
) -> None:
    path = tmp_path / runtime.FILE
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(ConfigError) as raised:
        runtime.load(str(tmp_path), ["central"])
    assert (raised.value.path, raised.value.key) == (str(path), key)
    assert problem in raised.value.problem
