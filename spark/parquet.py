"""Small tables as Parquet files, written by the driver itself.

Owns: the bytes of a Parquet file for the report's column kinds (``long``, ``double``,
``string``, ``boolean``: INT64, DOUBLE, UTF-8 BYTE_ARRAY, BOOLEAN), every column optional, one
row group, one uncompressed data page per column in PLAIN encoding with run-length definition
levels; its footer in Thrift's compact protocol; and the Hive-style ``name=value`` partition
directories, with values escaped as Spark escapes them, so that Spark (or any Parquet reader)
reads a folder written here exactly as one written by Spark. Meant for tables of thousands of
rows: a table that follows the events is Spark's to write. Must not know Spark or the report's
tables. See docs/report.md ("Output").
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAGIC = b"PAR1"
CREATED_BY = "amqha version 1.0.0"
ROOT = "spark_schema"

# Parquet's enums (parquet.thrift)
_TYPES = {"boolean": 0, "long": 2, "double": 5, "string": 6}
_OPTIONAL = 1
_UTF8 = 0
_PLAIN, _RLE = 0, 3
_UNCOMPRESSED = 0
_DATA_PAGE = 0

# Thrift compact protocol field kinds
_I32, _I64, _BINARY, _LIST, _STRUCT = 5, 6, 8, 9, 12

Field = tuple[int, int, Any]  # (id, kind, value); a None value is left out


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> int:
    return 2 * n if n >= 0 else -2 * n - 1


def _value(kind: int, value: Any) -> bytes:
    if kind in (_I32, _I64):
        return _varint(_zigzag(value))
    if kind == _BINARY:
        data = value.encode("utf-8") if isinstance(value, str) else value
        return _varint(len(data)) + data
    if kind == _STRUCT:
        return value  # already encoded
    if kind == _LIST:
        element, items = value
        size = len(items)
        head = (
            bytes([size << 4 | element]) if size < 15 else bytes([0xF0 | element]) + _varint(size)
        )
        return head + b"".join(_value(element, item) for item in items)
    raise ValueError(f"thrift kind {kind}")


def _struct(fields: Iterable[Field]) -> bytes:
    """A Thrift struct in the compact protocol, fields in increasing id order."""
    out = bytearray()
    last = 0
    for number, kind, value in fields:
        if value is None:
            continue
        delta = number - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out.append(kind)
            out += _varint(_zigzag(number))
        out += _value(kind, value)
        last = number
    out.append(0)  # stop
    return bytes(out)


def _levels(present: Sequence[bool]) -> bytes:
    """Definition levels (1 present, 0 null) in the RLE/bit-packing hybrid, as runs, with the
    4-byte length a data page of format 1 puts before them."""
    out = bytearray()
    i = 0
    while i < len(present):
        j = i
        while j < len(present) and present[j] == present[i]:
            j += 1
        out += _varint((j - i) << 1) + bytes([1 if present[i] else 0])
        i = j
    return struct.pack("<I", len(out)) + bytes(out)


def _plain(kind: str, values: Sequence[Any]) -> bytes:
    if kind == "long":
        return struct.pack(f"<{len(values)}q", *values)
    if kind == "double":
        return struct.pack(f"<{len(values)}d", *values)
    if kind == "string":
        encoded = [v.encode("utf-8") for v in values]
        return b"".join(struct.pack("<I", len(b)) + b for b in encoded)
    if kind == "boolean":
        bits = bytearray((len(values) + 7) // 8)
        for i, v in enumerate(values):
            if v:
                bits[i >> 3] |= 1 << (i & 7)
        return bytes(bits)
    raise ValueError(f"column kind {kind!r}")


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
    body = bytearray(MAGIC)
    chunks = []
    for index, (name, kind) in enumerate(columns):
        cells = [row[index] for row in rows]
        present = [c is not None for c in cells]
        data = _levels(present) + _plain(kind, [_typed(kind, c) for c in cells if c is not None])
        header = _struct(
            [
                (1, _I32, _DATA_PAGE),
                (2, _I32, len(data)),
                (3, _I32, len(data)),
                (
                    5,
                    _STRUCT,
                    _struct(
                        [(1, _I32, len(cells)), (2, _I32, _PLAIN), (3, _I32, _RLE), (4, _I32, _RLE)]
                    ),
                ),
            ]
        )
        offset = len(body)
        body += header + data
        size = len(header) + len(data)
        meta = _struct(
            [
                (1, _I32, _TYPES[kind]),
                (2, _LIST, (_I32, [_PLAIN, _RLE])),
                (3, _LIST, (_BINARY, [name])),
                (4, _I32, _UNCOMPRESSED),
                (5, _I64, len(cells)),
                (6, _I64, size),
                (7, _I64, size),
                (9, _I64, offset),
            ]
        )
        chunks.append((offset, size, meta))
    schema = [_struct([(4, _BINARY, ROOT), (5, _I32, len(columns))])] + [
        _struct(
            [
                (1, _I32, _TYPES[kind]),
                (3, _I32, _OPTIONAL),
                (4, _BINARY, name),
                (6, _I32, _UTF8 if kind == "string" else None),
            ]
        )
        for name, kind in columns
    ]
    group = _struct(
        [
            (1, _LIST, (_STRUCT, [_struct([(2, _I64, o), (3, _STRUCT, m)]) for o, _, m in chunks])),
            (2, _I64, sum(size for _, size, _ in chunks)),
            (3, _I64, len(rows)),
        ]
    )
    footer = _struct(
        [
            (1, _I32, 1),
            (2, _LIST, (_STRUCT, schema)),
            (3, _I64, len(rows)),
            (4, _LIST, (_STRUCT, [group])),
            (6, _BINARY, CREATED_BY),
        ]
    )
    body += footer + struct.pack("<I", len(footer)) + MAGIC
    return bytes(body)


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
