"""``make bench``: run every benchmark module that exists, print one JSON document.

    python -m bench.run [--quick] [--only broker,durable,failover,report] [--out FILE]

Modules: ``bench.broker_bench``, ``bench.durable_bench`` and ``bench.federation_bench``
(amqha beside RabbitMQ: the second on a durable queue with persistent messages, the third
through a federated exchange), ``bench.failover_bench``,
``bench.client_freeze_bench`` and ``bench.busy_pair_bench`` (``run() -> dict``), ``bench.report_bench``,
``bench.store_bench``, ``bench.dedup_bench``, ``bench.switchover_bench`` and
``bench.quorum_bench`` (the pair beside a 3-node RabbitMQ cluster with quorum queues), ``bench.storm_bench`` (a reconnect storm)
(``run(sizes) -> dict``). A module
that is not there is skipped and said so; one that fails is reported with its error,
and the others still run. The JSON goes to stdout and to ``bench/out/latest.json``;
a short table goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import inspect
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

BENCHES = {
    "broker": "bench.broker_bench",
    "durable": "bench.durable_bench",
    "failover": "bench.failover_bench",
    "busy_pair": "bench.busy_pair_bench",
    "report": "bench.report_bench",
    "store": "bench.store_bench",
    "replication": "bench.replication_bench",
    "federation": "bench.federation_bench",
    "client_freeze": "bench.client_freeze_bench",
    "dedup": "bench.dedup_bench",
    "switchover": "bench.switchover_bench",
    "quorum": "bench.quorum_bench",
    "storm": "bench.storm_bench",
}
OUT = Path(__file__).resolve().parent / "out" / "latest.json"


def sizes_from(options: Any, quick: dict[str, int], default: dict[str, int]) -> dict[str, int]:
    """A bench's sizes from its command line: ``--quick``'s or the defaults, each size
    the options give (an attribute of the same name, not None) put over them."""
    sizes = dict(quick if options.quick else default)
    for name in sizes:
        value = getattr(options, name, None)
        if value is not None:
            sizes[name] = value
    return sizes


def _sizes(module: Any, quick: bool) -> Any:
    """The module's own QUICK_SIZES / DEFAULT_SIZES, when it defines them."""
    return getattr(module, "QUICK_SIZES" if quick else "DEFAULT_SIZES", None)


def run_one(name: str, quick: bool) -> dict[str, Any]:
    module_name = BENCHES[name]
    if importlib.util.find_spec(module_name) is None:
        return {"skipped": f"{module_name} does not exist"}
    module = importlib.import_module(module_name)
    parameters = inspect.signature(module.run).parameters
    sizes = _sizes(module, quick)
    started = time.perf_counter()
    if "sizes" in parameters and (
        sizes is not None or parameters["sizes"].default is inspect.Parameter.empty
    ):
        result = module.run(sizes)
    else:
        result = module.run()
    if isinstance(result, dict):
        result.setdefault("seconds", round(time.perf_counter() - started, 1))
    return result


def _figure(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def print_table(document: dict[str, Any]) -> None:
    """Side by side figures of the benches that compare amqha with RabbitMQ."""
    lines = []
    for name in ("broker", "durable", "federation", "quorum"):
        result = document["benches"].get(name, {})
        if "amqha" not in result:
            continue
        rows = importlib.import_module(BENCHES[name]).summary_rows(result)
        width = max(44, *(len(row[0]) for row in rows))
        rabbit = result["rabbitmq"]
        label = f"RabbitMQ {rabbit.get('version')}" if rabbit.get("available") else "RabbitMQ (n/a)"
        lines.append(f"{'measurement':{width}} {'amqha':>14} {label:>16} {'ratio(>1 ours)':>15}")
        for row, ours, theirs, ratio in rows:
            lines.append(
                f"{row:{width}} {_figure(ours):>14} {_figure(theirs):>16} {_figure(ratio):>15}"
            )
        if result["targets"]:
            lines.append("targets: " + ", ".join(f"{k}={v}" for k, v in result["targets"].items()))
    if lines:
        print("\n".join(lines), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--only", default=",".join(BENCHES), help=f"comma-separated subset of {','.join(BENCHES)}"
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"where to save the JSON ({OUT})")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in BENCHES]
    if unknown:
        parser.error(f"unknown bench {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    document: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "host": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "benches": {},
    }
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            document["benches"][name] = run_one(name, args.quick)
        except Exception as error:  # one broken bench must not hide the others
            traceback.print_exc()
            document["benches"][name] = {"error": f"{type(error).__name__}: {error}"}
    text = json.dumps(document, indent=2, default=str)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    print_table(document)
    return 0 if not any("error" in value for value in document["benches"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
