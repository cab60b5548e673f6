"""bench/replication_bench.py: the disk's share of a replicated round, measured on the
disk the servers write to, and the cap it puts on the ratio; servers named by their URLs
(two machines), and the command's refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import replication_bench


def test_the_disk_share_measures_both_ways_and_leaves_no_file(tmp_path: Path) -> None:
    share = replication_bench.disk_share(tmp_path, 100_000)
    assert share["fsync_us_alone"] > 0 and share["fsync_us_two_at_once"] > 0
    # 100 in flight at 100,000 msg/s: a round of 1 ms.
    assert share["standalone_round_us"] == 1000
    assert 0 < share["cap"] <= 1
    slower = share["fsync_us_two_at_once"] - share["fsync_us_alone"]
    # The fsync figures are rounded to whole microseconds, the cap is not.
    assert abs(share["cap"] - 1000 / (1000 + max(0, slower))) < 0.002
    assert list(tmp_path.iterdir()) == []


def test_a_server_named_by_its_url_gives_its_address_and_login() -> None:
    named = replication_bench.Target.from_url("amqp://bench:p%40ss@10.0.0.2:5674/ha%2Fone")
    assert (named.host, named.port, named.pid) == ("10.0.0.2", 5674, None)
    assert named.login == {"user": "bench", "password": "p@ss", "vhost": "ha/one"}
    assert named.console_url == "amqp://bench:p%40ss@10.0.0.2:5674/ha%2Fone"
    plain = replication_bench.Target.from_url("amqp://[::1]/")
    assert (plain.host, plain.port, plain.login) == ("::1", 5672, {"vhost": "/"})


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--standalone", "amqp://guest:guest@127.0.0.1:1/"],
            "--standalone and --active go together",
        ),
        (["--messages", "0"], "--messages must be at least 1, not 0"),
        (["--rounds", "-1"], "--rounds must be at least 0, not -1"),
        (
            ["--standalone", "amqp://a:b@127.0.0.1:1/", "--active", "amqp://a:b@127.0.0.1:2/"]
            + ["--catch-up", "1000"],
            "--catch-up needs servers of the bench's own",
        ),
        (
            ["--standalone", "amqp://a:b@127.0.0.1:1/", "--active", "amqp://a:b@127.0.0.1:2/"]
            + ["--rounds", "0"],
            "--rounds must be at least 1 with --standalone/--active",
        ),
        (
            ["--standalone", "http://127.0.0.1:1/", "--active", "amqp://a:b@127.0.0.1:2/"],
            "'http://127.0.0.1:1/' is not an amqp://USER:PASS@HOST:PORT/ URL",
        ),
        (
            ["--standalone", "amqp://127.0.0.1:x/", "--active", "amqp://a:b@127.0.0.1:2/"],
            "'amqp://127.0.0.1:x/' has no valid port",
        ),
    ],
)
def test_the_command_refuses_bad_input_saying_what_is_wrong(
    args: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # The command's own main, in this process: it must stop before it starts any server.
    monkeypatch.setattr(sys, "argv", ["replication_bench", *args])
    with pytest.raises(SystemExit) as stopped:
        replication_bench.main()
    out, err = capsys.readouterr()
    assert out == ""
    assert said in err + str(stopped.value.code), (err, stopped.value.code)
    assert stopped.value.code != 0
