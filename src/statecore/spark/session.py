"""Building a SparkSession suited to statecore jobs.

The one rule that matters for a local run: PySpark starts its Python workers with
``PYSPARK_PYTHON`` (default: ``python3`` on ``PATH``; Spark's configuration docs,
``spark.pyspark.python``), not with the driver's interpreter, so in a virtualenv the workers
would miss statecore, pyarrow and the native extension. For local masters this module points
``PYSPARK_PYTHON`` (environment and ``spark.pyspark.python``) at ``sys.executable``.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional

__all__ = ["local_session", "is_local_master"]


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[*]`` and ``local[N,F]`` masters."""
    return master == "local" or master.startswith("local[")


def local_session(
    app_name: str = "statecore",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    conf: Optional[Mapping[str, str]] = None,
):
    """Return a (possibly existing) SparkSession configured for statecore.

    Settings: session time zone UTC (event times in the bundled job are UTC and Arrow batches
    handed to Python carry the session time zone), Arrow enabled, UI disabled,
    ``spark.sql.shuffle.partitions = shuffle_partitions`` (statecore routes with
    ``repartitionById`` and does not depend on it; small values keep local runs fast), adaptive
    execution off (it could coalesce the ``repartitionById`` partitions, which would break the
    partition -> key-group range mapping). For a local master the Python workers run
    ``sys.executable`` and find this ``statecore`` package (its parent directory is put on
    ``PYTHONPATH``, which the JVM passes on to the workers it starts). ``conf`` entries override all
    of these.

    Raises ImportError when pyspark is not installed.
    """
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(int(shuffle_partitions)),
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.metricsEnabled": "false",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.driver.memory": "1g",
    }
    if is_local_master(master):
        # Workers must import the same packages as the driver: same interpreter, and the
        # directory this statecore was imported from (a source checkout need not be installed).
        os.environ["PYSPARK_PYTHON"] = sys.executable
        pkg_root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_root not in [os.path.abspath(p) for p in paths]:
            os.environ["PYTHONPATH"] = os.pathsep.join([pkg_root] + paths)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        settings["spark.pyspark.python"] = sys.executable
        settings["spark.pyspark.driver.python"] = sys.executable
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
    settings.update(dict(conf or {}))
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
