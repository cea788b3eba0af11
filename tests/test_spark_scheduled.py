"""A scheduled job on a real local PySpark: ``trigger(availableNow=True)`` runs over files that
arrive between runs, each run ended by a non-final flush, all feeding one statecore checkpoint.

Run 1 and run 2 are one Spark query (one Spark checkpoint: batch ids go on), run 3 a new one
(another Spark checkpoint: batch ids restart at 0); failures after a commit make Spark replay
a micro-batch, once inside a run and once across a flush; the flush itself fails once midway.
The union of every version's output must equal a Spark SQL aggregation over all files, each
window exactly once, and the processing-time timers must fire in the first version whose
processing time reached them, flushes included, as computed from the recorded processing times.
"""

import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.descriptors import MapStateDescriptor, ValueStateDescriptor
from statecore.spark import KeyedProcessor, StatefulOperator, parquet_batch_sink

pytestmark = pytest.mark.spark

WIN = 100  # tumbling event-time windows of 100 ms
DELAY = 150  # watermark_delay, ms
LATER_MS = 3_600_000  # a processing-time timer that never comes due during the test
OUT = pa.schema([("kind", pa.string()), ("k", pa.int64()), ("a", pa.int64()),
                 ("b", pa.int64())])


class WindowCounts(KeyedProcessor):
    """Rows per key and tumbling window ``[start, start + WIN)`` of ``t``, emitted as
    ``("window", k, start, count)`` once the watermark passes the window's end (an event-time
    timer at the end). On a key's first row ever, two processing-time timers: ``pt + 1``, which
    emits ``("welcome", k, registered pt, firing pt)``, and one an hour on, which never fires."""

    output_schema = OUT

    def open(self, ctx):
        self.counts = ctx.backend.get_state(MapStateDescriptor("counts", "int64", "int64"))
        self.seen = ctx.backend.get_state(ValueStateDescriptor("seen", "int64"))

    def process_batch(self, batch, ctx):
        timers = ctx.backend.timers
        for k, t in sorted(zip(batch.column("k").to_pylist(), batch.column("t").to_pylist())):
            ctx.backend.set_current_key(k)
            start = t - t % WIN
            self.counts.put(start, (self.counts.get(start) or 0) + 1)
            timers.register_event_time_timer(start + WIN)
            if self.seen.value() is None:
                self.seen.update(ctx.processing_time_ms)
                timers.register_processing_time_timer(ctx.processing_time_ms + 1)
                timers.register_processing_time_timer(ctx.processing_time_ms + LATER_MS)
        return ()

    def _windows(self, ctx, watermark_ms):
        rows = []
        for end, k, _ in ctx.backend.timers.advance_watermark(watermark_ms):
            ctx.backend.set_current_key(k)
            rows.append({"kind": "window", "k": k, "a": end - WIN,
                         "b": self.counts.get(end - WIN)})
            self.counts.remove(end - WIN)
        return [pa.RecordBatch.from_pylist(rows, schema=OUT)] if rows else ()

    def on_watermark(self, ctx, watermark_ms):
        return self._windows(ctx, watermark_ms)

    def on_processing_time(self, ctx, processing_time_ms):
        rows = []
        for ts, k, _ in ctx.backend.timers.advance_processing_time(processing_time_ms):
            ctx.backend.set_current_key(k)
            assert ts == self.seen.value() + 1, "the hour-later timer must never fire"
            rows.append({"kind": "welcome", "k": k, "a": self.seen.value(),
                         "b": processing_time_ms})
        return [pa.RecordBatch.from_pylist(rows, schema=OUT)] if rows else ()

    def flush(self, ctx):
        return self._windows(ctx, 2**63 - 1)


def _write(path, keys, ts, mtime):
    pq.write_table(pa.table({"k": pa.array(keys, pa.int64()), "t": pa.array(ts, pa.int64())}),
                   path)
    os.utime(path, (mtime, mtime))  # the file source takes files in modification-time order


def _files(root):
    """Input files in three directories: day 1 (two files), day 2 (one more file in day 1's
    directory, read by the same query) and day 3 (a new directory and Spark checkpoint). Event
    times grow from file to file, so no row is late."""
    days = {1: [], 2: [], 3: []}
    spans = [(1, "in12", 0, 480), (1, "in12", 500, 990), (2, "in12", 1000, 1490),
             (3, "in3", 1500, 1980), (3, "in3", 2000, 2470)]
    for i, (day, d, lo, hi) in enumerate(spans):
        os.makedirs(root / d, exist_ok=True)
        ts = list(range(lo, hi + 1, 10))
        keys = [(t * 7 + i) % 13 + 5 * i for t in ts]  # keys 0..32: later files bring new keys
        path = root / d / f"f{i}.parquet"
        days[day].append((path, keys, ts, 1_700_000_000 + i))
    return days


def _oracle(spark, paths, max_end=None):
    from pyspark.sql import functions as F

    df = spark.read.parquet(*[str(p) for p in paths])
    rows = (df.groupBy("k", (F.col("t") - F.col("t") % WIN).alias("start")).count()
            .collect())
    return sorted(("window", r.k, r.start, r["count"]) for r in rows
                  if max_end is None or r.start + WIN <= max_end)


def _output(root, versions=None):
    """The output rows of ``versions`` (default all), from the sink's directory per version."""
    out = []
    for name in sorted(os.listdir(root)):
        v = int(name.split("=")[1])
        if versions is None or v in versions:
            out += [tuple(r.values()) for r in
                    pq.read_table(os.path.join(root, name), schema=OUT).to_pylist()]
    return out


def test_scheduled_runs_with_non_final_flushes_are_exactly_once(spark, tmp_path):
    pytest.importorskip("statecore.backends.native")
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    out = str(tmp_path / "out")
    fail_sink = set()  # versions whose sink fails once, after writing its output

    def sink(out_df, version):
        parquet_batch_sink(out)(out_df, version)
        if version in fail_sink:
            fail_sink.discard(version)
            raise RuntimeError(f"injected failure after the output of version {version}")

    op = StatefulOperator("windows", WindowCounts(), "k", str(tmp_path / "ckpt"), sink=sink,
                          parallelism=2, event_time_column="t", watermark_delay=DELAY,
                          retain_versions=20)
    reports, fail_after = [], set()  # (checkpoint, batch id): fail once after the commit

    def each_batch(df, batch_id):
        reports.append(op(df, batch_id))
        if (spark_ckpt[0], batch_id) in fail_after:
            fail_after.discard((spark_ckpt[0], batch_id))
            raise RuntimeError(f"injected driver failure after committing batch {batch_id}")

    spark_ckpt = [None]

    def run(source_dir, ckpt_name):
        """One scheduled run: every file of ``source_dir`` not taken yet, one per micro-batch.
        False when the query failed."""
        spark_ckpt[0] = ckpt_name
        query = (spark.readStream.schema("k bigint, t bigint").option("maxFilesPerTrigger", 1)
                 .parquet(str(tmp_path / source_dir)).writeStream.foreachBatch(each_batch)
                 .trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / ckpt_name)).start())
        try:
            query.awaitTermination()
        except Exception as exc:  # pyspark's StreamingQueryException
            assert "injected driver failure" in str(exc)
            return False
        return True

    days = _files(tmp_path)
    for path, keys, ts, mtime in days[1]:
        _write(path, keys, ts, mtime)

    # Run 1: two micro-batches, then a non-final flush. It emits exactly the windows the
    # watermark of all day-1 input allows, the ones the last micro-batch's event times closed
    # among them, and leaves the checkpoint open.
    assert run("in12", "spark1")
    assert [(r.batch_id, r.version) for r in reports] == [(0, 0), (1, 1)]
    rep = op.flush(spark, final=False)
    assert (rep.version, rep.batch_id, rep.flush, rep.final) == (2, None, True, False)
    assert not op.is_finalized()
    wm1 = 990 - DELAY
    assert rep.watermark_ms == wm1
    closed = sorted(r for r in _output(out, {0, 1, 2}) if r[0] == "window")
    assert closed == _oracle(spark, [p for p, *_ in days[1]], wm1)
    assert [r for r in _output(out, {2}) if r[0] == "window"]
    assert op.flush(spark, final=False) is None  # rerun: nothing new to flush

    # Run 2, the same Spark query on the next day's file: batch 2 is version 3. The driver
    # fails right after the commit, so Spark replays batch 2 on restart (version 3 again);
    # the flush's output is written, then it fails, and the next call redoes it.
    for path, keys, ts, mtime in days[2]:
        _write(path, keys, ts, mtime)
    fail_after.add(("spark1", 2))
    assert not run("in12", "spark1")
    assert run("in12", "spark1")
    assert [(r.batch_id, r.version) for r in reports[2:]] == [(2, 3), (2, 3)]
    fail_sink.add(4)
    with pytest.raises(RuntimeError, match="injected failure after the output of version 4"):
        op.flush(spark, final=False)
    assert op.latest_version() == 3
    assert op.flush(spark, final=False).version == 4

    # Run 3, a new Spark query (new checkpoint, batch ids from 0) on a new directory: versions
    # 5 and 6. The driver fails after committing its last batch; the job flushes anyway, and
    # the restarted query's replay of batch 1, which the flush built on, runs nothing.
    for path, keys, ts, mtime in days[3]:
        _write(path, keys, ts, mtime)
    fail_after.add(("spark3", 1))
    assert not run("in3", "spark3")
    assert [(r.batch_id, r.version) for r in reports[4:]] == [(0, 5), (1, 6)]
    assert op.flush(spark, final=False).version == 7
    assert run("in3", "spark3")
    assert [(r.batch_id, r.version, r.skipped) for r in reports[6:]] == [(1, 6, True)]
    final = op.flush(spark)
    assert (final.version, final.final) == (8, True) and op.is_finalized()

    # Every window exactly once, as Spark SQL counts them over all files.
    everything = _output(out)
    windows = sorted(r for r in everything if r[0] == "window")
    assert windows == _oracle(spark, [p for day in days.values() for p, *_ in day])

    # Processing-time timers: each key welcomed once, registered at the processing time of a
    # micro-batch and fired in the first later version whose processing time reached it
    # (flushes included: on_processing_time runs in non-final flushes), never in the final one.
    metas = {v: op.store.metadata(v) for v in op.store.versions()}
    assert sorted(metas) == list(range(9))
    pts = {v: m["processing_time_ms"] for v, m in metas.items()}
    assert {r.version: r.processing_time_ms for r in reports + [rep, final]} == {
        r.version: pts[r.version] for r in reports + [rep, final]}
    welcomes = sorted(r for r in everything if r[0] == "welcome")
    all_keys = {k for day in days.values() for _, keys, _, _ in day for k in keys}
    assert sorted(r[1] for r in welcomes) == sorted(all_keys)
    batch_pts = {pts[v] for v, m in metas.items() if not m["flush"]}
    for _, k, registered, fired in welcomes:
        assert registered in batch_pts, k
        assert fired == min(p for v, p in pts.items()
                            if p >= registered + 1 and not metas[v]["final"]), k
    assert not [r for r in _output(out, {8}) if r[0] == "welcome"]
