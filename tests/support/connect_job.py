"""Run by tests/test_spark_connect.py in a fresh interpreter, as a Spark Connect client (a
Connect session switches the whole process to Connect mode, so it cannot share the test
process with the classic local SparkSession): the flights job through the Python API on the
server at URL, stopped after ``--max-batches`` and resumed, plus the checks of what Connect does
not support. Prints one JSON line with the figures the test asserts on; the test compares the
output with the Spark SQL oracle itself.

Usage: connect_job.py URL ROOT BACKEND
"""

import dataclasses
import json
import pickle
import sys

from pyspark import cloudpickle

from statecore.demo.job import DemoConfig, DemoPipeline, run_demo
from statecore.errors import InvalidInputError
from statecore.spark import is_connect_session, remote_session, streaming_query_id

DAY_MS = 86_400_000


def main(url: str, root: str, backend: str) -> None:
    spark = remote_session(url, shuffle_partitions=2)
    result = {"connect": is_connect_session(spark),
              "adaptive": spark.conf.get("spark.sql.adaptive.enabled")}
    # What needs the classic API is refused with the name of the setting or the call.
    try:
        remote_session(url, conf={"spark.ui.enabled": "true"})
    except InvalidInputError as exc:
        result["static_conf_error"] = str(exc)
    cfg = DemoConfig(checkpoint=f"{root}/ckpt", output=f"{root}/out", backend=backend, days=14,
                     files_per_trigger=4, parallelism=2, max_parallelism=128,
                     aircraft_idle_ttl_ms=6 * DAY_MS, route_idle_ttl_ms=6 * DAY_MS, max_batches=2)
    pipe = DemoPipeline(cfg)
    try:
        pipe.sessions.start(spark.range(3).selectExpr("cast(id as string) as tailnum",
                                                      "current_timestamp() as event_time"), 0)
    except InvalidInputError as exc:
        result["query_id_error"] = str(exc)
    # An operator whose store was opened still pickles (it travels to the server's runner).
    pipe.sessions.latest_version()
    copy = pickle.loads(cloudpickle.dumps(pipe.sessions))
    result["pickled_latest"] = copy.latest_version()

    first = run_demo(cfg, spark=spark, progress=None)
    rest = run_demo(dataclasses.replace(cfg, max_batches=None, parallelism=3), spark=spark,
                    progress=None)
    result["first"] = dataclasses.asdict(first)
    result["rest"] = dataclasses.asdict(rest)
    result["query_id"] = streaming_query_id(f"{root}/ckpt/spark")
    pipe = DemoPipeline(cfg)
    result["query_ids"] = sorted({pipe.sessions.store.metadata(v).get("query_id")
                                  for v in pipe.sessions.store.versions()})
    spark.stop()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
