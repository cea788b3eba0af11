"""Run by tests/test_spark_connect.py in a fresh interpreter, as a Spark Connect client: a
processor class defined in a file module that only this client can import (its directory is
put on this process's sys.path, never on the server's) runs inside a streaming query's
``foreachBatch`` on the server. The operator registers the module with cloudpickle for
pickling by value, so the class travels with the function to the server's foreachBatch runner
and, pickled again there, with every task to the Python workers.

Usage: connect_user_module.py URL ROOT BACKEND. Prints one JSON line: the shipped modules and
the rows of the two micro-batches' output.
"""

import importlib
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from user_modules import counter_module

from statecore.spark import StatefulOperator, remote_session, streaming_query_id

USER_MODULE = counter_module("ConnectUserCounter")


def main(url: str, root: str, backend: str) -> None:
    src = os.path.join(root, "client_only")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "connect_user_mod.py"), "w") as f:
        f.write(USER_MODULE)
    sys.path.insert(0, src)
    mod = importlib.import_module("connect_user_mod")
    landing = os.path.join(root, "landing")
    os.makedirs(landing, exist_ok=True)
    for i, keys in enumerate(([1, 2, 2, 3], [2, 3, 3])):
        path = os.path.join(landing, f"part-{i}.parquet")
        pq.write_table(pa.table({"k": pa.array(keys, pa.int64())}), path)
        # Spark's file source takes files oldest first by modification time: two files
        # written within one clock tick could come in either order.
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    spark = remote_session(url, shuffle_partitions=2)
    op = StatefulOperator("user", mod.ConnectUserCounter(), "k", os.path.join(root, "ckpt"),
                          output=os.path.join(root, "out"), backend=backend)
    spark_ckpt = os.path.join(root, "spark")

    def each_batch(df, batch_id):
        op.process(df, batch_id, query_id=streaming_query_id(spark_ckpt))

    query = (spark.readStream.schema("k bigint").option("maxFilesPerTrigger", 1)
             .parquet(landing).writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", spark_ckpt).trigger(availableNow=True).start())
    query.awaitTermination(300)
    spark.stop()
    out = {b: sorted((r["k"], r["count"]) for r in pq.read_table(
        os.path.join(root, "out", f"batch_id={b}")).to_pylist()) for b in (0, 1)}
    print(json.dumps({"shipped": op.shipped_modules, "out": out}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
