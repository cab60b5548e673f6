"""The alerting rules and the dashboard in deploy/ (docs/operations.md, "Alerts and a
dashboard"): the rules load and their unit tests pass under Prometheus's own promtool,
and every metric the rules and the dashboard name is one a real pair exposes (a pair
with a federation link, a queue, and both servers scraped): a renamed metric cannot leave
an alert that never fires or a panel that stays empty."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from typing import Any

import aio_pika
import pytest
import yaml

from tests.pairs import MakePair
from tests.support import ROOT, free_port

PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "amqha-pair.json"
# Names in PromQL that are not a server's metrics: Prometheus's own, functions, keywords.
NOT_OURS = {"up"}
METRIC = re.compile(r"\b((?:amqha|rabbitmq)_[a-z0-9_]+)\b")


def promtool(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *words], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian's prometheus package has it; make test's setup "
    "installs it where apt-get can)",
)
def test_the_alert_rules_load_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", "amqha-alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 11 rules found" in checked.stdout
    tested = promtool("test", "rules", "amqha-alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def named_in_rules() -> set[str]:
    rules = yaml.safe_load((PROMETHEUS / "amqha-alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return {name for expr in exprs for name in METRIC.findall(expr)}


def named_in_dashboard() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries = [v.get("definition", "") for v in dashboard["templating"]["list"]]
    return {name for expr in [*exprs, *queries] for name in METRIC.findall(expr)}


def exposed(port: int) -> set[str]:
    """The sample names a server's /metrics page holds."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
        text = page.read().decode()
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def test_every_metric_the_rules_and_the_dashboard_name_is_exposed(
    make_pair: MakePair,
) -> None:
    pair = make_pair()
    ports: dict[str, int] = {}
    for server in pair.servers:
        ports[server.name] = free_port()
        server.config["metrics"] = {"listen": f"127.0.0.1:{ports[server.name]}"}
    # A federation link on the primary (its upstream never answers: the link's series are
    # there all the same).
    pair.primary.config["federation"] = {
        "upstreams": {"central": {"urls": [f"amqp://guest:guest@127.0.0.1:{free_port()}/"]}},
        "exchanges": [{"exchange": "orders", "upstream": "central"}],
    }
    pair.start()
    await pair.settled(timeout=60)
    connection = await aio_pika.connect(pair.primary.url, timeout=10)
    async with connection:
        channel = await connection.channel()
        await channel.declare_exchange("orders", aio_pika.ExchangeType.TOPIC, durable=True)
        await channel.declare_queue("watched", durable=True)
    names: set[str] = set()
    for port in ports.values():
        names |= exposed(port)
    wanted: dict[str, Any] = {
        "the alert rules": named_in_rules() - NOT_OURS,
        "the dashboard": named_in_dashboard() - NOT_OURS,
    }
    for where, used in wanted.items():
        assert used, f"no metric found in {where}: the pattern no longer reads it"
        missing = sorted(used - names)
        assert not missing, f"{where} name metrics no server exposes: {missing}"
