"""The driver's own Parquet files: Spark reads them back exactly (both of its readers), and
partition directories are named as Spark names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark import parquet
from spark.scan import TYPES

COLUMNS = (
    ("pair", "string"),
    ("day", "string"),
    ("count", "long"),
    ("seconds", "double"),
    ("text", "string"),
    ("flag", "boolean"),
)


def _rows() -> list[dict]:
    rows = [
        {
            "pair": "eu=1/a b" if i % 2 else "us-1",
            "day": "2023-11-14" if i < 20 else "2023-11-15",
            "count": None if i % 3 == 0 else i * 7919 - 50_000,
            "seconds": None if i % 4 == 0 else i * 0.1 - 1.5,
            "text": None if i % 5 == 0 else "é日" * (i % 6),
            "flag": None if i % 7 == 0 else i % 2 == 0,
        }
        for i in range(41)
    ]
    rows.append(
        {
            "pair": "us-1",
            "day": "2023-11-15",
            "count": -(2**63),
            "seconds": -0.0,
            "text": "",
            "flag": True,
        }
    )
    return rows


def _key(row: dict) -> tuple:
    return tuple((row[c] is None, str(row[c])) for c, _ in COLUMNS)


@pytest.mark.spark
@pytest.mark.parametrize("vectorized", ["true", "false"])
def test_spark_reads_back_every_value(tmp_path: Path, spark_session, vectorized: str) -> None:
    from pyspark.sql import types as T

    rows = _rows()
    written = parquet.write_partitioned(str(tmp_path), COLUMNS, rows, ("pair", "day"))
    assert len(written) == 4  # one file per partition: two pairs, two days
    schema = T.StructType([T.StructField(c, TYPES[k]) for c, k in COLUMNS])
    spark_session.conf.set("spark.sql.parquet.enableVectorizedReader", vectorized)
    try:
        frame = spark_session.read.schema(schema).parquet(str(tmp_path))
        found = [r.asDict() for r in frame.collect()]
    finally:
        spark_session.conf.unset("spark.sql.parquet.enableVectorizedReader")
    assert sorted(found, key=_key) == sorted(rows, key=_key)


@pytest.mark.spark
def test_the_files_schema_is_the_tables(tmp_path: Path, spark_session) -> None:
    parquet.write_partitioned(str(tmp_path), COLUMNS, _rows(), ("pair", "day"))
    fields = {
        f.name: f.dataType.simpleString() for f in spark_session.read.parquet(str(tmp_path)).schema
    }
    assert fields == {
        "count": "bigint",
        "seconds": "double",
        "text": "string",
        "flag": "boolean",
        "pair": "string",
        "day": "date",  # inferred from the directory names, as for Spark's own output
    }


@pytest.mark.spark
def test_partition_values_are_escaped_as_spark_escapes_them(spark_session) -> None:
    utils = spark_session.sparkContext._jvm.org.apache.spark.sql.catalyst.catalog
    escape = utils.ExternalCatalogUtils.escapePathName
    values = [chr(c) for c in range(1, 0x250)] + ["eu-1", "a b", "x=y/z", "日本", "%41"]
    assert [parquet.partition_value(v) for v in values] == [escape(v) for v in values]


def test_a_value_of_another_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match="is not a long"):
        parquet.encode([("n", "long")], [["3"]])
    with pytest.raises(ValueError, match="is not a boolean"):
        parquet.encode([("b", "boolean")], [[1]])
    assert parquet.encode([("d", "double")], [[3]]) == parquet.encode([("d", "double")], [[3.0]])


def test_a_file_is_framed_by_its_magic() -> None:
    data = parquet.encode(COLUMNS[2:], [[1, 2.0, "x", True], [None, None, None, None]])
    assert data[:4] == data[-4:] == b"PAR1"
    footer = int.from_bytes(data[-8:-4], "little")
    assert 0 < footer < len(data) - 12
