"""bench/federation_bench.py: its ratios point the way they say, its CLI refuses bad sizes."""

from __future__ import annotations

import subprocess
import sys

from bench import federation_bench
from tests.support import ROOT


def test_ratios_above_one_mean_amqha_is_better() -> None:
    amqha = {"rate_msgs_per_s": 3000.0, "bind_latency_median_ms": 4.0, "brokers_cpu_us_per_msg": 50}
    rabbit = {
        "rate_msgs_per_s": 1000.0,
        "bind_latency_median_ms": 8.0,
        "brokers_cpu_us_per_msg": 200,
    }
    table = federation_bench.ratios(amqha, rabbit)
    assert table["rate_amqha_over_rabbitmq"] == 3.0
    assert table["bind_latency_median_rabbitmq_over_amqha"] == 2.0
    assert table["brokers_cpu_rabbitmq_over_amqha"] == 4.0
    # A side that measured nothing (amqha without federation: an error) gives no ratio.
    assert federation_bench.ratios({"error": "x"}, rabbit)["rate_amqha_over_rabbitmq"] is None


def test_summary_rows_follow_the_ratios() -> None:
    result = {
        "amqha": {"rate_msgs_per_s": 2000.0},
        "rabbitmq": {"rate_msgs_per_s": 1000.0},
        "ratios": federation_bench.ratios({"rate_msgs_per_s": 2000.0}, {"rate_msgs_per_s": 1000.0}),
    }
    rows = {row[0]: row[1:] for row in federation_bench.summary_rows(result)}
    assert rows["federation rate_msgs_per_s"] == (2000.0, 1000.0, 2.0)


def test_cli_refuses_a_bad_size_without_a_traceback() -> None:
    for args in (["--messages", "0"], ["--only", "nats"]):
        done = subprocess.run(
            [sys.executable, "-m", "bench.federation_bench", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert args[0] in done.stderr
