"""statecore.spark.StatefulOperator on a real local PySpark (local[2]).

The operator is driven directly, as Spark's ``foreachBatch`` would call it, with static
DataFrames per micro-batch, and checked against a plain-Python model of the same processor:
routing by key group, state carried across micro-batches, watermark and event-time timers in
partitions without input, replayed batch ids, rescaling between micro-batches, the end-of-input
flush, and error reporting.
"""

import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError, StateError
from statecore.key_groups import operator_index_for_key_group, spark_key_group
from statecore.spark import KeyedProcessor, StatefulOperator
from support.user_modules import counter_module

pytestmark = pytest.mark.spark

MAXP = 128


def _by_value():
    # Test-module classes must travel to the Python workers by value: the workers cannot
    # import this module.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


OUT_SCHEMA = pa.schema([("kind", pa.string()), ("k", pa.int64()), ("count", pa.int64()),
                        ("total", pa.int64()), ("ts", pa.int64())])
REMIND_AFTER = 10


class CountAndRemind(KeyedProcessor):
    """Per key: running count and sum of ``v``; an event-time timer ``t + 10`` per row. Emits a
    ``count`` row per key touched, a ``timer`` row per fired timer and ``flush`` rows at the end."""

    output_schema = OUT_SCHEMA

    def open(self, ctx):
        self.count = ctx.backend.get_state(ValueStateDescriptor("count", "int64", default=0))
        self.total = ctx.backend.get_state(ValueStateDescriptor("total", "int64", default=0))

    def process_batch(self, batch, ctx):
        rows = sorted(zip(batch.column("k").to_pylist(), batch.column("v").to_pylist(),
                          batch.column("t").to_pylist()))
        out = []
        for i, (k, v, t) in enumerate(rows):
            ctx.backend.set_current_key(k)
            self.count.update(self.count.value() + 1)
            self.total.update(self.total.value() + v)
            ctx.backend.timers.register_event_time_timer(t + REMIND_AFTER)
            if i + 1 == len(rows) or rows[i + 1][0] != k:
                out.append(("count", k, self.count.value(), self.total.value(), None))
        if out:
            yield _batch(out)

    def _fire(self, ctx, wm, kind):
        out = []
        for ts, k, _ in ctx.backend.timers.advance_watermark(wm):
            ctx.backend.set_current_key(k)
            out.append((kind, k, self.count.value(), self.total.value(), ts))
        if out:
            yield _batch(out)

    def on_watermark(self, ctx, watermark_ms):
        return self._fire(ctx, watermark_ms, "timer")

    def flush(self, ctx):
        return self._fire(ctx, 2**63 - 1, "flush")


def _batch(rows):
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, OUT_SCHEMA.types)],
                                      schema=OUT_SCHEMA)


class Model:
    """Plain-Python reference of CountAndRemind under the operator's watermark rule."""

    def __init__(self):
        self.count, self.total, self.timers, self.wm = {}, {}, set(), None

    def batch(self, rows):
        out = set()
        for k, v, t in rows:
            self.count[k] = self.count.get(k, 0) + 1
            self.total[k] = self.total.get(k, 0) + v
            self.timers.add((t + REMIND_AFTER, k))
        for k in {r[0] for r in rows}:
            out.add(("count", k, self.count[k], self.total[k], None))
        if self.wm is not None:
            for ts, k in sorted(x for x in self.timers if x[0] <= self.wm):
                self.timers.discard((ts, k))
                out.add(("timer", k, self.count[k], self.total[k], ts))
        if rows:
            m = max(t for _, _, t in rows)
            self.wm = m if self.wm is None else max(self.wm, m)
        return out

    def flush(self):
        out = {("flush", k, self.count[k], self.total[k], ts) for ts, k in self.timers}
        self.timers.clear()
        return out


def _rows_of(path):
    if not os.path.isdir(path):
        return set()
    t = pq.read_table(path, schema=OUT_SCHEMA)
    return {tuple(r.values()) for r in t.to_pylist()}


def _df(spark, rows):
    return spark.createDataFrame(rows, "k bigint, v bigint, t bigint")


def _keys_of_partition(pid, n, count, start=0):
    out, k = [], start
    while len(out) < count:
        if operator_index_for_key_group(MAXP, n, spark_key_group(k, "int64", MAXP)) == pid:
            out.append(k)
        k += 1
    return out


BATCHES = [
    [(k, k * 10, 100 + k) for k in range(12)],
    [(k, 1, 120 + k) for k in range(6, 18)] + [(3, 5, 101)],
    [],
    [(k, 2, 200) for k in range(0, 30, 3)],
]


@pytest.fixture(params=["python", "native"])
def backend(request):
    if request.param == "native":
        pytest.importorskip("statecore.backends.native")
    return request.param


def _op(tmp_path, backend, parallelism=2, name="counts"):
    _by_value()
    return StatefulOperator(name, CountAndRemind(), "k", str(tmp_path / "ckpt"),
                            output=str(tmp_path / "out"), parallelism=parallelism,
                            max_parallelism=MAXP, backend=backend, event_time_column="t")


def _run_all(spark, op, batches, tmp_path, parallelisms=None):
    model, outputs = Model(), []
    for i, rows in enumerate(batches):
        if parallelisms:
            op.parallelism = parallelisms[i]
        rep = op(_df(spark, rows), i)
        assert rep.version == i and rep.rows == len(rows)
        expected = model.batch(rows)
        got = _rows_of(str(tmp_path / "out" / f"batch_id={i}"))
        assert got == expected, f"micro-batch {i}"
        assert op.store.metadata(i)["watermark_ms"] == model.wm
        outputs.append(got)
    return model, outputs


def test_routing_columns_match_statecore_key_groups(spark):
    from pyspark.sql import functions as F

    from statecore.spark.routing import key_group_column, operator_index_column, operator_index_of

    strings = ["", "a", "N14228", "EWR|IAH", "héllo wörld", "日本語", "x" * 100]
    longs = [0, 1, -1, 42, 2**63 - 1, -(2**63), 123456789012]
    ints = [0, 1, -1, 2**31 - 1, -(2**31), 77]
    for values, sql_type, key_type in ((strings, "string", "string"), (longs, "bigint", "int64"),
                                       (ints, "int", "int32")):
        df = spark.createDataFrame([(v,) for v in values], f"k {sql_type}")
        for n in (1, 2, 3, 7):
            got = (df.select("k", key_group_column("k", MAXP).alias("kg"),
                             operator_index_of("k", n, MAXP).alias("op1"))
                   .select("k", "kg", "op1", operator_index_column("kg", n, MAXP).alias("op"))
                   .collect())
            for row in got:
                kg = spark_key_group(row.k, key_type, MAXP)
                assert row.kg == kg, (row.k, key_type)
                assert row.op == row.op1 == operator_index_for_key_group(MAXP, n, kg)
    typed = spark.range(1).select(F.lit(5).cast("bigint").alias("kg"))
    op_column = typed.select(operator_index_column("kg", 2, MAXP).alias("op"))
    assert dict(op_column.dtypes)["op"] == "int"
    # A column name with a backtick and a dot is one top-level column, not a struct field.
    odd = spark.createDataFrame([(5,)], "`a.b``c` bigint")
    got = odd.select(operator_index_of("a.b`c", 3, MAXP).alias("op")).collect()[0].op
    assert got == operator_index_for_key_group(MAXP, 3, spark_key_group(5, "int64", MAXP))
    # given=: a row's own index wins (the operator's control rows), a NULL one falls back to
    # the key's; the given column's name is quoted like the key's.
    given = spark.createDataFrame([(5, 2), (5, None), (None, 0)], "`a.b``c` bigint, `o``p` int")
    got = [r.op for r in given.select(operator_index_of("a.b`c", 3, MAXP, given="o`p")
                                      .alias("op")).collect()]
    assert got == [2, operator_index_for_key_group(MAXP, 3, spark_key_group(5, "int64", MAXP)), 0]
    for bad in ("", 3):
        with pytest.raises(InvalidInputError, match="given must be a column name"):
            operator_index_of("k", 2, MAXP, given=bad)


def test_state_watermark_and_timers_across_micro_batches(spark, tmp_path, backend):
    op = _op(tmp_path, backend)
    model, _ = _run_all(spark, op, BATCHES, tmp_path)
    rep = op.flush(spark)
    assert rep is not None and rep.final and rep.version == len(BATCHES)
    assert _rows_of(str(tmp_path / "out" / f"batch_id={rep.version}")) == model.flush()
    assert op.flush(spark) is None  # exactly once: a second flush is a no-op
    assert op.is_finalized()
    # Spark's next micro-batch (a scheduled run's) is refused, saying why and what to do.
    with pytest.raises(StateError, match="finalized(.|\n)*must not flush at the end of each run"):
        op(_df(spark, [(1, 1, 1)]), len(BATCHES))
    meta = op.store.metadata(len(BATCHES) - 1)
    assert meta["state_entries"] == 2 * len(model.count)
    assert sum(meta["loads"].values()) == 2


def test_timers_fire_in_partitions_without_input(spark, tmp_path, backend):
    op = _op(tmp_path, backend, name="quiet")
    p0 = _keys_of_partition(0, 2, 3)
    p1 = _keys_of_partition(1, 2, 3)
    batches = [[(k, 1, 50) for k in p0 + p1], [(p0[0], 1, 100)], [], []]
    _, outs = _run_all(spark, op, batches, tmp_path)
    fired = {(r[1], r[4]) for r in outs[1] if r[0] == "timer"}
    # Batch 1 runs with watermark 50 (batch 0's max): the timers at 60 wait. Batch 2 runs with
    # watermark 100 and no input at all: both partitions must still run and fire them.
    assert fired == set()
    fired2 = {(r[1], r[4]) for r in outs[2] if r[0] == "timer"}
    assert fired2 == {(k, 60) for k in p0 + p1}
    # The operator adds no rows to make a partition run: Spark runs the Python function of
    # every partition of the shuffle, also of an input without any partition (an empty RDD).
    assert [sorted(p["partition"] for p in r.partitions) for r in op.reports] == [[0, 1]] * 4
    empty = spark.createDataFrame(spark.sparkContext.emptyRDD(), "k bigint, v bigint, t bigint")
    assert empty.rdd.getNumPartitions() == 0
    rep = op(empty, 4)
    assert sorted(p["partition"] for p in rep.partitions) == [0, 1] and rep.rows == 0


def test_every_partition_runs_under_adaptive_execution(spark, tmp_path):
    """A user's session may have adaptive query execution on (Spark's default; local_session
    turns it off): it must neither coalesce the routed partitions nor skip the tasks of an
    empty micro-batch."""
    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        op = _op(tmp_path, "python", parallelism=3, name="aqe")
        op.commit_timeout_s = 60.0  # a skipped partition would fail the commit after this
        p0 = _keys_of_partition(0, 3, 2)
        _run_all(spark, op, [[(k, 1, 10) for k in p0], []], tmp_path)
        assert [sorted(p["partition"] for p in r.partitions) for r in op.reports] == [[0, 1, 2]] * 2
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before)


def test_replayed_batch_id_gives_the_same_state_and_output(spark, tmp_path, backend):
    op = _op(tmp_path / "a", backend)
    for i in (0, 1):
        op(_df(spark, BATCHES[i]), i)
    first = _rows_of(str(tmp_path / "a" / "out" / "batch_id=1"))
    first_meta = op.store.metadata(1)
    # The driver failed after the batch: Spark calls foreachBatch again with the same id.
    op(_df(spark, BATCHES[1]), 1)
    assert _rows_of(str(tmp_path / "a" / "out" / "batch_id=1")) == first
    again = op.store.metadata(1)
    assert again["attempt"] != first_meta["attempt"]
    for k in ("watermark_ms", "rows", "output_rows", "state_entries", "state_bytes"):
        assert again[k] == first_meta[k], k
    # A replay of an older id (Spark restarted from an older commit) also restores its predecessor.
    op(_df(spark, BATCHES[1]), 1)
    assert op.store.pending(1) == []  # cleared once committed
    # A pending descriptor left by a killed attempt of batch 2 (another writer) is ignored.
    stale = {"version": 2, "writer": "p7-0badattempt",
             "spark_report": {"attempt": "0badattempt", "partition": 7}}
    op.store.write_pending(2, "p7-0badattempt", stale)
    # Continuing after the replays matches a run without any replay.
    op(_df(spark, BATCHES[2]), 2)
    assert op.store.pending(2) == []
    op(_df(spark, BATCHES[3]), 3)
    ref = _op(tmp_path / "b", backend)
    _run_all(spark, ref, BATCHES, tmp_path / "b")
    for i in range(len(BATCHES)):
        assert _rows_of(str(tmp_path / "a" / "out" / f"batch_id={i}")) == \
            _rows_of(str(tmp_path / "b" / "out" / f"batch_id={i}"))
    assert _state(op, 3) == _state(ref, 3)


def _state(op, version):
    from statecore.backends import create_backend

    b = create_backend("python", key_type="int64", max_parallelism=MAXP)
    op.store.restore(b, version)
    keys = pa.array(range(40), pa.int64())
    out = {}
    for name in ("count", "total"):
        st = b.get_state(ValueStateDescriptor(name, "int64", default=0))
        out[name] = st.get_batch(keys).to_pylist()
    return out


def test_rescaling_between_micro_batches(spark, tmp_path, backend):
    op = _op(tmp_path / "r", backend)
    model, _ = _run_all(spark, op, BATCHES, tmp_path / "r", parallelisms=[2, 3, 1, 4])
    # retain_versions=3: version 0 is gone, the others record the parallelism they ran with.
    assert op.store.versions() == [1, 2, 3]
    assert [op.store.metadata(i)["num_partitions"] for i in (1, 2, 3)] == [3, 1, 4]
    op.parallelism = 3
    rep = op.flush(spark)
    assert _rows_of(str(tmp_path / "r" / "out" / f"batch_id={rep.version}")) == model.flush()


def test_bad_input_is_reported(spark, tmp_path):
    op = _op(tmp_path, "python", name="bad")
    with pytest.raises(Exception, match="null key"):
        op(spark.createDataFrame([(None, 1, 1), (2, 1, 1)], "k bigint, v bigint, t bigint"), 0)
    assert op.latest_version() is None  # nothing committed
    with pytest.raises(InvalidInputError, match="unsupported key column type"):
        # no float32 keys
        op(spark.createDataFrame([(1.5, 1, 1)], "k float, v bigint, t bigint"), 0)
    with pytest.raises(InvalidInputError, match="key column"):
        op(spark.createDataFrame([(1, 1)], "x bigint, v bigint"), 0)

    class WrongOutput(CountAndRemind):
        def process_batch(self, batch, ctx):
            yield pa.RecordBatch.from_pydict({"kind": ["x"]})

    wrong = StatefulOperator("wrong", WrongOutput(), "k", str(tmp_path / "ckpt"),
                             output=str(tmp_path / "out2"), backend="python")
    with pytest.raises(Exception, match="lacks columns"):
        wrong(_df(spark, [(1, 1, 1)]), 0)
    # A micro-batch whose predecessor version is gone cannot silently start from empty state.
    good = _op(tmp_path / "g", "python", name="gap")
    good(_df(spark, BATCHES[0]), 0)
    with pytest.raises(StateError, match="needs version 4"):
        good(_df(spark, BATCHES[1]), 5)
    fresh = _op(tmp_path / "f", "python", name="fresh")
    with pytest.raises(StateError, match="holds no committed version"):
        fresh(_df(spark, BATCHES[1]), 3)


def test_constructor_validation(tmp_path):
    p = CountAndRemind()
    ck = str(tmp_path)
    with pytest.raises(InvalidInputError):
        StatefulOperator("bad name!", p, "k", ck, output=ck)
    with pytest.raises(InvalidInputError):
        StatefulOperator("x", p, "k", ck)  # neither sink nor output
    with pytest.raises(InvalidInputError):
        StatefulOperator("x", p, "k", ck, output=ck, parallelism=0)
    with pytest.raises(InvalidInputError):
        StatefulOperator("x", p, "k", ck, output=ck, parallelism=5, max_parallelism=4)
    with pytest.raises(InvalidInputError):
        StatefulOperator("x", p, "k", ck, output=ck, backend="rocksdb")
    with pytest.raises(InvalidInputError):
        StatefulOperator("x", p, "k", ck, output=ck, retain_versions=1)
    with pytest.raises(InvalidInputError):
        StatefulOperator("x", object(), "k", ck, output=ck)
    for bad in (0, "lots", -5, 1.5):
        with pytest.raises(InvalidInputError, match="block_target_bytes"):
            StatefulOperator("x", p, "k", ck, output=ck, block_target_bytes=bad)
    op = StatefulOperator("x", p, "k", ck, output=ck, block_target_bytes="16KiB")
    assert op.block_target_bytes == op.store.block_target_bytes == 16 << 10
    # The tiered mode cuts small blocks unless told otherwise; the in-memory mode the store's.
    assert StatefulOperator("x", p, "k", ck, output=ck).block_target_bytes is None
    assert StatefulOperator("x", p, "k", ck, output=ck,
                            memory_budget="1MiB").block_target_bytes == 4096


def test_native_backend_is_the_default(tmp_path, monkeypatch):
    """Without ``backend=`` the operator runs the native backend; when the compiled extension
    does not import, construction fails on the driver (StateError naming the way out) instead
    of every task failing on the workers, and ``backend="python"`` still works."""
    pytest.importorskip("statecore.backends.native")
    ck = str(tmp_path)
    assert StatefulOperator("x", CountAndRemind(), "k", ck, output=ck).backend == "native"
    monkeypatch.setitem(sys.modules, "statecore.backends.native", None)  # import -> ImportError
    with pytest.raises(StateError, match="backend='python'"):
        StatefulOperator("x", CountAndRemind(), "k", ck, output=ck)
    assert StatefulOperator("x", CountAndRemind(), "k", ck, output=ck,
                            backend="python").backend == "python"


def test_operator_without_python_worker_reuse(tmp_path):
    """With ``spark.python.worker.reuse=false`` each worker exits after its task (os._exit):
    the task finishes its background write before returning and every micro-batch after the
    first restores from the checkpoint. Needs its own SparkContext, hence a fresh interpreter."""
    import json
    import subprocess

    pytest.importorskip("pyspark")
    backends = ["python"]
    try:
        import statecore.backends.native  # noqa: F401
        backends.append("native")
    except ImportError:
        pass
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support",
                          "spark_no_reuse_job.py")
    proc = subprocess.run([sys.executable, script, str(tmp_path), *backends],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["backend"] for r in results] == backends
    for r in results:
        first, *rest = r["loads"]
        assert set(first) == {"empty"}
        for loads in rest:
            assert set(loads) == {"checkpoint"}, r
            assert sum(loads.values()) == 2


def test_public_names_of_statecore_spark():
    """What a user of several operators needs is importable from ``statecore.spark`` and
    documented: ``start`` + ``commit_batches`` (two operators in one ``foreachBatch``),
    ``PendingBatch`` and ``epoch_ms`` (timestamps to the milliseconds of watermarks/timers)."""
    import statecore.spark as sp

    for name in ("StatefulOperator", "PendingBatch", "commit_batches", "epoch_ms",
                 "BatchReport", "KeyedProcessor", "ProcessorContext"):
        assert name in sp.__all__, name
        assert (getattr(sp, name).__doc__ or "").strip(), name
    assert (StatefulOperator.start.__doc__ or "").strip()
    assert (sp.PendingBatch.commit.__doc__ or "").strip()
    ts = pa.array([-1, 0, 1_999_999], pa.timestamp("us", tz="UTC"))
    assert sp.epoch_ms(ts).to_pylist() == [-1, 0, 1999]


USER_MODULE = counter_module("UserCounter")


def test_processor_from_a_user_module_reaches_the_workers(spark, tmp_path, monkeypatch):
    """A processor class defined in the user's own file module, importable on the driver only
    (through its sys.path, which the Python workers do not have), runs on the workers without
    PYTHONPATH or addPyFile: the operator ships its module by value."""
    import importlib

    pytest.importorskip("statecore.backends.native")
    src = tmp_path / "src"
    src.mkdir()
    (src / "my_counters_mod.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(src))
    mod = importlib.import_module("my_counters_mod")
    monkeypatch.setitem(sys.modules, "my_counters_mod", mod)
    op = StatefulOperator("user", mod.UserCounter(), "k", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"))
    assert op.shipped_modules == ["my_counters_mod"]
    for batch_id, keys in enumerate(([1, 2, 2, 3], [2, 3, 3])):
        op(spark.createDataFrame([(k,) for k in keys], "k bigint"), batch_id)
    out = pq.read_table(str(tmp_path / "out" / "batch_id=1")).to_pylist()
    assert max(r["count"] for r in out if r["k"] == 2) == 3
    assert max(r["count"] for r in out if r["k"] == 3) == 3
    # Installed modules (pyarrow here) and statecore itself are left to import by name.
    from statecore.spark import operator as operator_module

    assert not operator_module._needs_shipping(pa)
    assert not operator_module._needs_shipping(operator_module)
