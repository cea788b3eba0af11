"""Operator state (``ctx.operator_state``) in the statecore Spark operator on a real local
PySpark (local[2]): every partition's even-split list, union list and broadcast state are
committed with each micro-batch's version and restored for its operator index, redistributed
when a micro-batch runs with another parallelism than the version before it."""

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.descriptors import MapStateDescriptor
from statecore.spark import KeyedProcessor, StatefulOperator

pytestmark = pytest.mark.spark

MAXP = 128
SCHEMA = pa.schema([("batch", pa.int64()), ("partition", pa.int64()), ("parallelism", pa.int64()),
                    ("own", pa.list_(pa.int64())), ("union", pa.list_(pa.int64())),
                    ("rules_batch", pa.int64())])
RULES = MapStateDescriptor("rules", "string", "int64")


class TaskLog(KeyedProcessor):
    """Per task: reports the operator state it was restored with, then appends its tag
    ``batch * 100 + partition`` to the even-split list, makes it the union list's contribution
    and records the batch in the broadcast map."""

    output_schema = SCHEMA

    def open(self, ctx):
        ops = ctx.operator_state
        own = ops.get_list_state("own", "int64")
        union = ops.get_union_list_state("seen", "int64")
        rules = ops.get_broadcast_state(RULES)
        self.before = (own.get(), union.get(), rules.get("batch"))
        tag = ctx.batch_id * 100 + ctx.partition_id
        own.add(tag)
        union.update([tag])
        rules.put("batch", ctx.batch_id)

    def on_processing_time(self, ctx, processing_time_ms):
        own, union, rules_batch = self.before
        yield pa.RecordBatch.from_pylist(
            [{"batch": ctx.batch_id, "partition": ctx.partition_id,
              "parallelism": ctx.num_partitions, "own": own, "union": union,
              "rules_batch": rules_batch}], schema=SCHEMA)


def _split(lists, n, i):
    """Flink's even split: own list at an unchanged parallelism, else contiguous parts of the
    concatenation, the first ``total % n`` one longer."""
    if len(lists) == n:
        return lists[i]
    flat = [e for lst in lists for e in lst]
    sizes = [len(flat) // n + (1 if t < len(flat) % n else 0) for t in range(n)]
    return flat[sum(sizes[:i]):sum(sizes[:i + 1])]


@pytest.mark.parametrize("backend", ["python", "native"])
def test_operator_state_across_parallelism_changes(spark, tmp_path, backend):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    op = StatefulOperator("tasks", TaskLog(), "k", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"), parallelism=2, max_parallelism=MAXP,
                          backend=backend)
    parallelisms = [2, 2, 3, 1, 4, 2]
    lists, union = None, None
    for b, n in enumerate(parallelisms):
        op.parallelism = n
        rows = [(k, 1) for k in range(b * 3)]
        op(spark.createDataFrame(rows, "k bigint, v bigint"), b)
        got = pq.read_table(str(tmp_path / "out" / f"batch_id={b}"), schema=SCHEMA).to_pylist()
        got = sorted(got, key=lambda r: r["partition"])
        assert [r["partition"] for r in got] == list(range(n)), f"micro-batch {b}"
        new_lists = []
        for i, r in enumerate(got):
            own = [] if lists is None else _split(lists, n, i)
            assert r["own"] == own, f"micro-batch {b}, partition {i}"
            assert r["union"] == ([] if union is None else union)
            assert r["rules_batch"] == (None if b == 0 else b - 1)
            new_lists.append(own + [b * 100 + i])
        lists, union = new_lists, [b * 100 + i for i in range(n)]
    # Every tag written is kept exactly once across the rescales.
    assert sorted(e for lst in lists for e in lst) == sorted(
        b * 100 + i for b, n in enumerate(parallelisms) for i in range(n))
