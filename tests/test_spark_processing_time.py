"""Processing-time timers in statecore.spark.StatefulOperator on a real local PySpark: the
micro-batch's processing time reaches the processor, a timer registered in one micro-batch fires
in the first later one whose processing time passed it, pending timers are checkpointed, a
replayed batch id runs with the processing time it was committed with, a non-final flush fires
due timers and the final flush fires none."""

import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.backends import create_backend
from statecore.spark import KeyedProcessor, StatefulOperator

pytestmark = pytest.mark.spark

MAXP = 128
LATER_MS = 3_600_000  # a timer that must not fire during the test
OUT = pa.schema([("kind", pa.string()), ("k", pa.int64()), ("ts", pa.int64()),
                 ("pt", pa.int64())])


class Remind(KeyedProcessor):
    """Per row of key ``k`` two processing-time timers: at the next millisecond and an hour on;
    emits a ``timer`` row per fired timer with the micro-batch's processing time."""

    output_schema = OUT

    def process_batch(self, batch, ctx):
        pt = ctx.processing_time_ms
        for k in sorted(batch.column("k").to_pylist()):
            ctx.backend.set_current_key(k)
            ctx.backend.timers.register_processing_time_timer(pt + 1)
            ctx.backend.timers.register_processing_time_timer(pt + LATER_MS)
        return ()

    def on_processing_time(self, ctx, processing_time_ms):
        assert processing_time_ms == ctx.processing_time_ms
        fired = ctx.backend.timers.advance_processing_time(processing_time_ms)
        rows = [{"kind": "timer", "k": k, "ts": ts, "pt": processing_time_ms}
                for ts, k, _ in fired]
        return [pa.RecordBatch.from_pylist(rows, schema=OUT)] if rows else ()


def _rows(path):
    if not os.path.isdir(path):
        return []
    return sorted(tuple(r.values()) for r in pq.read_table(path, schema=OUT).to_pylist())


@pytest.mark.parametrize("backend", ["python", "native"])
def test_processing_time_timers_fire_in_a_later_micro_batch(spark, tmp_path, backend):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    op = StatefulOperator("remind", Remind(), "k", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"), parallelism=2, max_parallelism=MAXP,
                          backend=backend)
    df = spark.createDataFrame([(k,) for k in range(6)], "k bigint")
    op(df, 0)
    pt0 = op.store.metadata(0)["processing_time_ms"]
    assert isinstance(pt0, int)
    assert _rows(str(tmp_path / "out" / "batch_id=0")) == []  # pt0 + 1 is still ahead
    # The pending timers are in the committed checkpoint, both of them per key.
    b = create_backend("python", key_type="int64", max_parallelism=MAXP)
    op.store.restore(b, 0)
    assert sorted((ts, k) for _, ts, k, _ in b.timers.all_processing_time_timers()) == sorted(
        (pt0 + d, k) for k in range(6) for d in (1, LATER_MS))
    assert b.timers.all_timers() == []
    # Batch 1, without input, runs later: its processing time passed pt0 + 1 in every partition.
    op(spark.createDataFrame([], "k bigint"), 1)
    pt1 = op.store.metadata(1)["processing_time_ms"]
    assert pt1 > pt0
    first = _rows(str(tmp_path / "out" / "batch_id=1"))
    assert first == [("timer", k, pt0 + 1, pt1) for k in range(6)]
    # A replay of batch 1 runs with batch 1's processing time and fires the same timers.
    op(spark.createDataFrame([], "k bigint"), 1)
    assert op.store.metadata(1)["processing_time_ms"] == pt1
    assert _rows(str(tmp_path / "out" / "batch_id=1")) == first
    b = create_backend("python", key_type="int64", max_parallelism=MAXP)
    op.store.restore(b, 1)
    assert sorted((ts, k) for _, ts, k, _ in b.timers.all_processing_time_timers()) == [
        (pt0 + LATER_MS, k) for k in range(6)]
    # A non-final flush fires the timers its processing time reached; the final flush fires
    # none (on_processing_time is not called), they stay in the final checkpoint.
    op(df, 2)
    pt2 = op.store.metadata(2)["processing_time_ms"]
    rep = op.flush(spark, final=False)
    assert (rep.version, rep.flush, rep.final) == (3, True, False)
    assert rep.processing_time_ms == op.store.metadata(3)["processing_time_ms"] > pt2
    assert _rows(str(tmp_path / "out" / "batch_id=3")) == [
        ("timer", k, pt2 + 1, rep.processing_time_ms) for k in range(6)]
    rep = op(df, 3)
    assert (rep.version, rep.batch_id) == (4, 3)
    pt4 = rep.processing_time_ms
    final = op.flush(spark)
    assert final.final and final.processing_time_ms > pt4
    assert _rows(str(tmp_path / "out" / "batch_id=5")) == []
    b = create_backend("python", key_type="int64", max_parallelism=MAXP)
    op.store.restore(b, 5)
    assert (pt4 + 1, 0) in {(ts, k) for _, ts, k, _ in b.timers.all_processing_time_timers()}
