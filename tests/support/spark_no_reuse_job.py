"""Run by test_spark_operator.test_operator_without_python_worker_reuse in a fresh interpreter:
the operator's micro-batches on a SparkSession with ``spark.python.worker.reuse=false``, where
every Python worker exits right after its task (so the task must finish its checkpoint write
itself and no state can come from a worker cache). Prints one JSON line per backend with the
load sources per micro-batch; exits non-zero when an output differs from the model."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import test_spark_operator as t  # noqa: E402
from statecore.spark.session import local_session  # noqa: E402


def main(root: str, backends: list) -> None:
    spark = local_session("statecore-no-reuse", master="local[2]", shuffle_partitions=2,
                          conf={"spark.python.worker.reuse": "false"})
    try:
        assert spark.sparkContext.getConf().get("spark.python.worker.reuse") == "false"
        for backend in backends:
            tmp = Path(root) / backend
            op = t._op(tmp, backend)
            model, loads = t.Model(), []
            for i, rows in enumerate(t.BATCHES):
                rep = op(t._df(spark, rows), i)
                got = t._rows_of(str(tmp / "out" / f"batch_id={i}"))
                if got != model.batch(rows):
                    raise SystemExit(f"{backend}: micro-batch {i}: output differs from the model")
                loads.append(rep.loads)
            print(json.dumps({"backend": backend, "loads": loads}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
