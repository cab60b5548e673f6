"""Entry point for ``python -m spark`` and ``spark-submit spark/__main__.py``: the report
command alone, for when ``amqha`` itself is not installed.

Under spark-submit the driver runs whatever Python ``PYSPARK_DRIVER_PYTHON`` names (else the
system's), which may lack the report's libraries: that is checked first, with the fix named.
"""

import importlib.util
import sys

_NEEDED = ("click", "matplotlib", "pyspark")
_missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
if _missing:
    sys.exit(
        f"amqha report: this Python ({sys.executable}) has no {', '.join(_missing)}. Run the "
        "driver with the Python amqha is installed in: PYSPARK_DRIVER_PYTHON=/path/to/venv/"
        "bin/python spark-submit ... (or --conf spark.pyspark.driver.python=...)"
    )

from spark.cli import report  # noqa: E402

report(prog_name="amqha report")
