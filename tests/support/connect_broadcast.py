"""Run by tests/test_spark_connect.py in a fresh interpreter, as a Spark Connect client: a
streaming query whose ``foreachBatch`` (on the server) passes a broadcast table to the
operator, a Connect DataFrame in the first micro-batch and none in the second, which reads the
broadcast state the first committed (``statecore.demo.thresholds.RouteThresholds``).

Usage: connect_broadcast.py URL ROOT BACKEND. Prints one JSON line: the output rows of the two
micro-batches and the broadcast metadata of their versions.
"""

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from statecore.demo.thresholds import THRESHOLD_SCHEMA, RouteThresholds
from statecore.spark import StatefulOperator, remote_session, streaming_query_id

FILES = (
    {"route": ["A|B", "A|B", "A|B", "C|D", "C|D"], "dep_delay": [10.0, 40.0, None, 5.0, 50.0]},
    {"route": ["A|B", "A|B", "C|D", "E|F"], "dep_delay": [25.0, 30.0, 1.0, 100.0]},
)
THRESHOLDS = {"route": ["A|B", "C|D"], "minutes": [20, 0]}


def main(url: str, root: str, backend: str) -> None:
    landing = os.path.join(root, "landing")
    os.makedirs(landing, exist_ok=True)
    for i, rows in enumerate(FILES):
        path = os.path.join(landing, f"part-{i}.parquet")
        pq.write_table(pa.table(rows), path)
        # The file source takes files in modification-time order.
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    spark = remote_session(url, shuffle_partitions=2)
    ckpt = os.path.join(root, "ckpt")
    op = StatefulOperator("thresholds", RouteThresholds(), "route", ckpt,
                          output=os.path.join(root, "out"), backend=backend, parallelism=3)
    spark_ckpt = os.path.join(root, "spark")

    def each_batch(df, batch_id):
        table = None
        if batch_id == 0:
            table = df.sparkSession.createDataFrame(pa.table(THRESHOLDS, schema=THRESHOLD_SCHEMA))
        op.process(df, batch_id, query_id=streaming_query_id(spark_ckpt), broadcast=table)

    query = (spark.readStream.schema("route string, dep_delay double")
             .option("maxFilesPerTrigger", 1).parquet(landing).writeStream
             .foreachBatch(each_batch).option("checkpointLocation", spark_ckpt)
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    spark.stop()
    out = {b: sorted(pq.read_table(os.path.join(root, "out", f"batch_id={b}")).to_pylist(),
                     key=lambda r: r["route"]) for b in (0, 1)}
    meta = {b: op.store.metadata(b).get("broadcast") for b in (0, 1)}
    print(json.dumps({"out": out, "broadcast": meta}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
