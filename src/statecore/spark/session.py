"""Building a SparkSession suited to statecore jobs.

The one rule that matters for a local run: PySpark starts its Python workers with
``PYSPARK_PYTHON`` (default: ``python3`` on ``PATH``; Spark's configuration docs,
``spark.pyspark.python``), not with the driver's interpreter, so in a virtualenv the workers
would miss statecore, pyarrow and the native extension. For local masters this module points
``PYSPARK_PYTHON`` (environment and ``spark.pyspark.python``) at ``sys.executable``.

Under Spark Connect (:func:`remote_session`) the client has no SparkContext and sets only the
runtime SQL settings; the server's launch configuration decides the rest, the Python of its
workers included (``docs/deploy.md`` "Spark Connect").
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Mapping, Optional

from statecore.errors import InvalidInputError, StateError

__all__ = ["local_session", "remote_session", "is_local_master", "is_connect_session",
           "quiet_query_end", "RUNTIME_SETTINGS"]

#: The SQL settings statecore jobs rely on that a session may change at run time (so a Spark
#: Connect client sets them too): event times in UTC, Arrow, and no adaptive execution, which
#: could coalesce the ``repartitionById`` partitions and break the partition -> key-group range
#: mapping.
RUNTIME_SETTINGS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.metricsEnabled": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
}


def is_connect_session(spark) -> bool:
    """True when ``spark`` is a Spark Connect client session (``pyspark.sql.connect``), which
    has no SparkContext, JVM gateway, accumulators or broadcast through ``sparkContext``."""
    return type(spark).__module__.startswith("pyspark.sql.connect.")


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
    settings = dict(RUNTIME_SETTINGS)
    settings.update({
        "spark.sql.shuffle.partitions": str(int(shuffle_partitions)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
    })
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


def remote_session(url: str, shuffle_partitions: int = 2,
                   conf: Optional[Mapping[str, str]] = None):
    """Return a Spark Connect client session on ``url`` (``sc://HOST:PORT``, optionally with
    ``/;param=value`` parameters) with the runtime settings of :data:`RUNTIME_SETTINGS` and
    ``spark.sql.shuffle.partitions = shuffle_partitions``; ``conf`` entries override them.

    Only runtime SQL settings can be set from a client: the UI, memory, ``spark.pyspark.python``
    and every other static or core setting belong to the server's launch configuration (its
    Python workers and its ``foreachBatch`` runner must import statecore). Raises
    InvalidInputError for a URL that is not ``sc://...`` and for a setting the server refuses
    (naming it), StateError when adaptive execution stays on, ImportError when the Spark
    Connect client (``pyspark[connect]``: grpcio, grpcio-status, googleapis-common-protos,
    zstandard) is not installed.
    """
    if not isinstance(url, str) or not url.startswith("sc://") or len(url) <= len("sc://"):
        raise InvalidInputError(f"a Spark Connect URL looks like sc://HOST:PORT, got {url!r}")
    # Through pyspark.sql.SparkSession: it also switches pyspark.sql.functions to Connect.
    import pyspark.sql.connect.session  # noqa: F401  (ImportError without the Connect client)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    settings = dict(RUNTIME_SETTINGS)
    settings["spark.sql.shuffle.partitions"] = str(int(shuffle_partitions))
    settings.update(dict(conf or {}))
    for k, v in settings.items():
        try:
            spark.conf.set(k, v)
        except Exception as exc:
            raise InvalidInputError(
                f"the Spark Connect server at {url} refuses the setting {k}={v!r} from a "
                f"client ({str(exc).splitlines()[0]}); set it when starting the server "
                "(--conf) instead") from exc
    if spark.conf.get("spark.sql.adaptive.enabled").strip().lower() != "false":
        raise StateError(
            f"adaptive execution is still on in the Spark Connect session at {url}; statecore "
            "needs spark.sql.adaptive.enabled=false (it could coalesce the operator's "
            "partitions)")
    return spark


#: The loggers of Spark's micro-batch engine (Spark 4.1 and 4.0 packages), which log a query
#: ended by an exception of its foreachBatch function at ERROR with the whole stack.
_QUERY_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
                  "org.apache.spark.sql.execution.streaming.MicroBatchExecution")


@contextlib.contextmanager
def quiet_query_end(spark):
    """A context manager: within it, the driver JVM of ``spark`` does not log the end of a
    streaming query by an exception at ERROR (Spark's ``MicroBatchExecution`` logs it with the
    whole stack), for a query a ``foreachBatch`` function ends on purpose by raising (``statecore
    demo --max-batches``); the exception still reaches the caller, raised by
    ``awaitTermination``. The loggers' levels are restored at exit. Classic sessions only (Log4j
    2 through the JVM gateway); for a Spark Connect session (the server's log is not the
    client's) or without Log4j 2 it changes nothing."""
    before, configurator = {}, None
    try:
        log4j = spark.sparkContext._jvm.org.apache.logging.log4j
        configurator = log4j.core.config.Configurator
        for name in _QUERY_LOGGERS:
            before[name] = log4j.LogManager.getLogger(name).getLevel()
            configurator.setLevel(name, log4j.Level.OFF)
    except Exception:  # no JVM gateway (Spark Connect) or no Log4j 2: leave logging as it is
        pass
    try:
        yield
    finally:
        for name, level in before.items():
            configurator.setLevel(name, level)
