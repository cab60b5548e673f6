"""Small tables as Parquet files, written by the driver itself with pyarrow.

Owns: turning the report's small tables (column kinds ``long``, ``double``, ``string``,
``boolean``; every column nullable) into Parquet files with pyarrow, and the Hive-style
``name=value`` partition directories, with values escaped as Spark escapes them, so that
Spark (or any Parquet reader) reads a folder written here exactly as one written by
Spark. Meant for tables of thousands of rows: a table that follows the events is Spark's
to write. pyarrow is imported on first use (``warm_up``), so that a report can load it while
its JVM starts. Must not know Spark or the report's tables. See docs/report.md ("Output").
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

KINDS = ("long", "double", "string", "boolean")


def warm_up() -> None:
    """Import pyarrow: a fixed cost of the first table, paid when there is time to spare."""
    import pyarrow.parquet  # noqa: F401


def _arrow() -> dict[str, Any]:
    import pyarrow as pa

    return {
        "long": pa.int64(),
        "double": pa.float64(),
        "string": pa.string(),
        "boolean": pa.bool_(),
    }


def _typed(kind: str, value: Any) -> Any:
    """The value as its column stores it; a value of another kind is an error, not a guess."""
    if kind == "double" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "long" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "long" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    raise ValueError(f"{value!r} is not a {kind}")


def encode(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> bytes:
    """A whole Parquet file: ``columns`` as (name, kind), ``rows`` as sequences in that order,
    None for null."""
    unknown = [kind for _, kind in columns if kind not in KINDS]
    if unknown:
        raise ValueError(f"column kind {unknown[0]!r}")
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = _arrow()
    arrays = [
        pa.array(
            [None if row[index] is None else _typed(kind, row[index]) for row in rows],
            type=types[kind],
        )
        for index, (_, kind) in enumerate(columns)
    ]
    schema = pa.schema([pa.field(name, types[kind], nullable=True) for name, kind in columns])
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), sink, compression="NONE")
    return sink.getvalue()


# Characters Spark writes as %XX in a partition directory's value (the rest stay as they are).
_ESCAPED = frozenset([chr(c) for c in range(0x01, 0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_value(value: str | None) -> str:
    """A partition value as a directory name part, as Spark spells it."""
    if value is None or value == "":
        return NULL_PARTITION
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def write_partitioned(
    folder: str,
    columns: Sequence[tuple[str, str]],
    rows: Iterable[Mapping[str, Any]],
    by: Sequence[str],
) -> list[str]:
    """``rows`` as one file per partition, ``folder/k1=v1/k2=v2/part-....parquet``, the
    partition columns ``by`` in the path only; files are written whole under a hidden name
    and then renamed, so a reader never sees half of one. Returns the files written."""
    stored = [(name, kind) for name, kind in columns if name not in by]
    parts: dict[tuple, list[list[Any]]] = {}
    for row in rows:
        key = tuple(row[name] for name in by)
        parts.setdefault(key, []).append([row[name] for name, _ in stored])
    written = []
    run = uuid.uuid4()
    for key, part in parts.items():
        where = os.path.join(
            folder,
            *(f"{name}={partition_value(value)}" for name, value in zip(by, key, strict=True)),
        )
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, f"part-00000-{run}.c000.parquet")
        hidden = os.path.join(where, f".part-00000-{run}.c000.parquet.tmp")
        with open(hidden, "wb") as stream:
            stream.write(encode(stored, part))
        os.replace(hidden, path)
        written.append(path)
    return written
