"""Pure-Python reference of the failover report.

Owns: reading every line of every log into one process's memory, parsing and typing it as
Spark's JSON reader does and telling good lines from bad, for small logs and as the oracle the
Spark job (``spark.job``) is tested against: the same input must give the same tables and
summary. Every good record is kept as a point (``spark.metrics.Collected``); the job reduces
the bulk of a large input before the figures are computed, this module never does, so
agreement checks that reduction. The figures themselves come from ``spark.metrics``; this
module must not import Spark.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from spark.metrics import Collected, report_of
from spark.model import (
    FIELDS,
    SCHEMA_VERSION,
    STATES,
    UNRECORDED_MAX,
    UnknownVersionError,
    expand_paths,
    no_valid_record,
    pair_from_path,
)

_KINDS = {name: {"long": int, "double": float, "string": str}[kind] for name, kind in FIELDS}
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_JSON_SPACE = " \t\r\n"
_DECODER = json.JSONDecoder()


@dataclass
class Report:
    summary: dict
    tables: dict[str, list[dict[str, Any]]]


def _lines(path: str) -> Iterator[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as stream:
        yield from stream


def _as_text(value: object) -> str:
    """Spark reads a non-string JSON value in a string column as its JSON text."""
    return json.dumps(value, separators=(",", ":"))


def _typed(obj: dict) -> bool:
    """Coerce ``obj``'s v1 fields in place the way Spark's JSON reader does; False if one
    does not fit its type (Spark's corrupt record), that field then being None."""
    fits = True
    for key, value in obj.items():
        kind = _KINDS.get(key)
        if kind is None or value is None:
            continue
        if type(value) is kind:
            if kind is int and not _LONG_MIN <= value <= _LONG_MAX:
                obj[key], fits = None, False
        elif kind is str:
            obj[key] = _as_text(value)
        elif kind is float and type(value) is int:
            try:
                obj[key] = float(value)
            except OverflowError:
                obj[key], fits = None, False
        else:
            obj[key], fits = None, False
    return fits


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _good(obj: dict) -> bool:
    last_seen, unrecorded = obj.get("last_seen"), obj.get("unrecorded")
    return (
        obj.get("v") == SCHEMA_VERSION
        and _finite(obj.get("ts"))
        and bool(obj.get("node"))
        and bool(obj.get("event"))
        and obj.get("state") in STATES
        and (last_seen is None or math.isfinite(last_seen))
        and (unrecorded is None or 0 <= unrecorded <= UNRECORDED_MAX)
    )


def read(paths: Iterable[str]) -> Collected:
    files = expand_paths(paths)
    events = Collected(files)
    bad_version: tuple[str, int] | None = None
    for path in files:
        bad = 0
        from_path = pair_from_path(path)
        for line in _lines(path):
            text = line.strip(_JSON_SPACE)
            if not text:
                continue
            try:
                obj, _ = _DECODER.raw_decode(text)
            except ValueError:
                bad += 1
                continue
            if not isinstance(obj, dict):
                bad += 1
                continue
            fits = _typed(obj)
            version = obj.get("v")
            if version is not None and version != SCHEMA_VERSION:
                found = (path, version)
                if bad_version is None or found < bad_version:
                    bad_version = found
                continue
            if not (fits and _good(obj)):
                bad += 1
                continue
            events.add(obj.get("pair") or from_path, obj["node"], obj)
        if bad:
            events.bad(path, bad)
    if bad_version is not None:
        raise UnknownVersionError(*bad_version)
    return events


def compute(
    paths: Iterable[str],
    since: float | None = None,
    until: float | None = None,
    skew: Mapping[str, float] | None = None,
    estimate_skew: bool = True,
    slo: float | None = None,
) -> Report:
    events = read(paths)
    if events.count == 0:
        raise no_valid_record(events.files, sum(events.bad_by_file.values()))
    summary, tables, _ = report_of(events, since, until, skew or {}, estimate_skew, slo)
    return Report(summary, tables)
