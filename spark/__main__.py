"""Entry point for ``python -m spark`` and ``spark-submit spark/__main__.py``: the report
command alone, for when ``amqha`` itself is not installed."""

from spark.cli import report

report(prog_name="amqha report")
