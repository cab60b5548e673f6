"""``amqha report``: the command line of the failover report.

Owns: option parsing, time and skew syntax, progress lines on stderr and turning input
problems into a clear message with a non-zero exit. The work is ``spark.job.run_report``.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import click

from spark.model import ReportError, parse_skew


def _time(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    """Seconds since the epoch, or an ISO 8601 time (UTC unless it says otherwise)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter("expected epoch seconds or an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _conf(items: tuple[str, ...]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--conf")
        conf[key] = value
    return conf


@click.command(
    "report",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  amqha report --events var/primary --events var/backup --out report-out
  amqha report --events 'logs/*/events.jsonl*' --out r --since 2024-05-01T00:00Z
  amqha report --events hdfs://nn/amqha/*/events.jsonl --out /shared/r \\
               --master spark://spark-master:7077
""",
)
@click.option(
    "--events",
    "paths",
    multiple=True,
    required=True,
    metavar="PATH",
    help="Event log to read (repeatable): a file, a directory (every *.jsonl, *.jsonl.N and "
    ".gz below it), a glob, or any Hadoop path (hdfs://, s3a://, ...). Logs are grouped by "
    "their pair field, else by a pair=NAME directory in their path.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, writable=True),
    help="Directory for the tables (<table>/parquet/pair=P/day=D/ and <table>/<table>.csv), "
    "summary.json, summary.md, report.html (one file, pictures inside), fleet.png, "
    "timeline.png (one pair) or timeline-PAIR.png (each pair) and spark.log. Re-running a "
    "window replaces its partitions.",
)
@click.option(
    "--master",
    default=None,
    help="Spark master URL. Default local[*] (bound to 127.0.0.1), or the one spark-submit "
    "was given.",
)
@click.option("--since", callback=_time, help="Window start: epoch seconds or ISO 8601 (UTC).")
@click.option("--until", callback=_time, help="Window end: epoch seconds or ISO 8601 (UTC).")
@click.option(
    "--skew",
    multiple=True,
    metavar="NODE=SECONDS",
    help="How far NODE's clock runs ahead of its pair's primary's (repeatable; PAIR/NODE for "
    "one pair only); overrides the estimate from the records.",
)
@click.option(
    "--no-skew-estimate",
    is_flag=True,
    help="Trust the clocks: only --skew corrects them.",
)
@click.option(
    "--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark setting (repeatable)."
)
@click.option(
    "--slo",
    type=click.FloatRange(0, 100, min_open=True),
    default=None,
    metavar="PERCENT",
    help="Availability objective, e.g. 99.95: list the pairs and days that broke it.",
)
@click.option(
    "--pair",
    default=None,
    metavar="NAME",
    help="Draw only this pair, as timeline.png (default: every pair, up to the 20 worst, as "
    "timeline-PAIR.png; one pair read: timeline.png).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
def report(
    paths: tuple[str, ...],
    out: str,
    master: str | None,
    since: float | None,
    until: float | None,
    skew: tuple[str, ...],
    no_skew_estimate: bool,
    conf: tuple[str, ...],
    slo: float | None,
    pair: str | None,
    quiet: bool,
) -> None:
    """Availability report from the failover event logs of one pair or a fleet of pairs.

    Reads the JSON Lines event logs (schema v1) with Spark and writes, per pair and per day:
    availability, client-visible outages (no server ACTIVE), dual-active intervals, unprotected
    time (an ACTIVE with no in-sync PASSIVE; "not recorded" for logs without sync records),
    each failover with its cause (crash, silence, cut link, manual, stopped, dual active) and
    the outage a client saw, failover incidents with detection and takeover delays, time in
    each state per server,
    redirects and refusals per minute, manual recoveries, misconfigurations, quarantines and
    federation links' down time;
    a fleet summary (worst pairs,
    takeover delay percentiles, SLO breaches), pictures, summary.md and a self-contained
    report.html. A pair with no record in the window has no figure. Figures that depend on a clock
    offset the logs do not pin down are given with their range and marked uncertain. Bad lines
    are counted, never fatal; an unknown schema version, or no valid record, is an error.
    """
    from spark.job import run_report  # Spark loads only when the command runs

    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"

    def progress(message: str) -> None:
        if not quiet:
            click.echo(f"report: {message}", err=True)

    try:
        summary = run_report(
            paths,
            out,
            master=master,
            since=since,
            until=until,
            skew=parse_skew(skew),
            estimate_skew=not no_skew_estimate,
            conf=_conf(conf),
            progress=progress,
            echo=lambda text: click.echo(text, nl=False),
            slo=slo,
            pair=pair,
        )
    except ReportError as error:
        raise click.ClickException(str(error)) from None
    for warning in summary["warnings"]:  # also at the end of the summary; never quieted
        click.echo(f"report: warning: {warning}", err=True)
