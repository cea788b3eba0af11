"""Broadcast input of the statecore Spark operator on a real local PySpark (local[2]): a
driver-provided threshold table per micro-batch (statecore.demo.thresholds) checked against
Spark SQL, which joins each micro-batch's flights with the thresholds in force for it and counts
per route; across a restart with another parallelism, partitions without rows, a replayed
micro-batch and the refused inputs."""

import warnings

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from statecore.demo.data import load_flights
from statecore.demo.thresholds import THRESHOLD_OUTPUT_SCHEMA, THRESHOLD_SCHEMA, RouteThresholds
from statecore.errors import InvalidInputError
from statecore.spark import KeyedProcessor, StatefulOperator
from statecore.spark.operator import BROADCAST_MAX_BYTES

pytestmark = pytest.mark.spark

MAXP = 64


def _flights(days: int) -> pa.Table:
    t = load_flights(days)
    route = pc.binary_join_element_wise(t.column("origin"), t.column("dest"), "|")
    return pa.table({"route": route, "dep_delay": t.column("dep_delay")})


def _changes(routes, minutes_of) -> pa.Table:
    return pa.table({"route": routes, "minutes": [minutes_of(i) for i in range(len(routes))]},
                    schema=THRESHOLD_SCHEMA)


def _expected(spark, rows: pa.Table, thresholds: dict, totals: dict) -> list:
    """Spark SQL's answer for one micro-batch: its rows joined with the thresholds in force,
    counted per route; ``totals`` (route -> delayed so far) is updated."""
    if not thresholds:
        return []
    spark.createDataFrame(rows).createOrReplaceTempView("flights_batch")
    spark.createDataFrame(pa.table({"route": list(thresholds), "minutes": list(
        thresholds.values())}, schema=THRESHOLD_SCHEMA)).createOrReplaceTempView("thresholds")
    got = spark.sql(
        "SELECT f.route, MAX(t.minutes) AS threshold_minutes, COUNT(*) AS flights, "
        "SUM(CASE WHEN f.dep_delay > t.minutes THEN 1 ELSE 0 END) AS delayed "
        "FROM flights_batch f JOIN thresholds t ON f.route = t.route "
        "GROUP BY f.route ORDER BY f.route").collect()
    out = []
    for r in got:
        totals[r.route] = totals.get(r.route, 0) + r.delayed
        out.append({"route": r.route, "threshold_minutes": r.threshold_minutes,
                    "flights": r.flights, "delayed": r.delayed,
                    "delayed_total": totals[r.route]})
    return out


def _output(out_dir, version: int) -> list:
    t = pq.read_table(str(out_dir / f"batch_id={version}"), schema=THRESHOLD_OUTPUT_SCHEMA)
    return sorted(t.to_pylist(), key=lambda r: r["route"])


def _apply(thresholds: dict, table) -> dict:
    new = dict(thresholds)
    if table is not None:
        for r, m in zip(table.column("route").to_pylist(), table.column("minutes").to_pylist()):
            if m is None:
                new.pop(r, None)
            else:
                new[r] = m
    return new


@pytest.mark.parametrize("backend", ["python", "native"])
def test_thresholds_match_spark_sql(spark, tmp_path, backend):
    flights = _flights(3)
    routes = sorted(set(flights.column("route").to_pylist()))
    one_route = routes[0]
    ckpt, out = str(tmp_path / "ckpt"), tmp_path / "out"

    # (rows, threshold changes or None, parallelism): a tiny micro-batch of one route carries
    # a change that partitions without rows must apply too; micro-batches without a table
    # (after a restart with another parallelism, too) read the broadcast state committed.
    n = flights.num_rows
    cuts = [0, n // 5, None, 2 * n // 5, 3 * n // 5, 4 * n // 5, n]
    first = _changes(routes[::2], lambda i: 5 + (i % 4) * 10)
    tiny = flights.filter(pc.equal(flights.column("route"), one_route)).slice(0, 3)
    plan = [
        (flights.slice(cuts[0], cuts[1]), first, 2),
        (tiny, _changes(routes[1::2], lambda i: 0 if i % 2 else 30), 2),
        (flights.slice(cuts[1], cuts[3] - cuts[1]), None, 2),
        (flights.slice(cuts[3], cuts[4] - cuts[3]), None, 3),
        (flights.slice(cuts[4], cuts[5] - cuts[4]),
         _changes(routes[:20], lambda i: None if i % 3 == 0 else 60), 3),
        (flights.slice(cuts[5], cuts[6] - cuts[5]), None, 1),
    ]
    thresholds: dict = {}
    totals: dict = {}
    op = None
    for b, (rows, change, parallelism) in enumerate(plan):
        if op is None or op.parallelism != parallelism:
            # A restart: a new operator object on the same checkpoint.
            op = StatefulOperator("thresholds", RouteThresholds(), "route", ckpt,
                                  output=str(out), parallelism=parallelism,
                                  max_parallelism=MAXP, backend=backend)
        # The first change goes in as a Spark DataFrame (collected with toArrow), the rest
        # as Arrow tables.
        given = spark.createDataFrame(change) if b == 0 else change
        report = op.process(spark.createDataFrame(rows), b, broadcast=given)
        thresholds = _apply(thresholds, change)
        prev_totals = dict(totals)
        assert _output(out, b) == _expected(spark, rows, thresholds, totals), f"micro-batch {b}"
        meta = op.store.metadata(b)["broadcast"]
        assert meta == report.broadcast
        assert (meta is None) == (change is None)
        if change is not None:
            assert meta["rows"] == change.num_rows and len(meta["sha256"]) == 64

    # Replay the last micro-batch (Spark crashed before its commit log): the same table (none)
    # gives the same output without a warning; another table warns and counts with it.
    last = len(plan) - 1
    rows = plan[last][0]
    before = _output(out, last)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*broadcast table.*", category=RuntimeWarning)
        op.process(spark.createDataFrame(rows), last)
    assert _output(out, last) == before
    other = _changes(routes, lambda i: 1)
    with pytest.warns(RuntimeWarning, match="broadcast table"):
        op.process(spark.createDataFrame(rows), last, broadcast=other)
    replay_totals = prev_totals
    assert _output(out, last) == _expected(spark, rows, _apply(thresholds, other), replay_totals)
    assert op.store.metadata(last)["broadcast"]["rows"] == len(routes)


class _NoHook:
    """A duck-typed processor without process_broadcast."""

    output_schema = THRESHOLD_OUTPUT_SCHEMA

    def open(self, ctx):
        pass

    def process_batch(self, batch, ctx):
        return ()

    def on_watermark(self, ctx, wm):
        return ()

    def flush(self, ctx):
        return ()


def test_bad_broadcast_inputs_are_refused(spark, tmp_path):
    df = spark.createDataFrame(pa.table({"route": ["a|b"], "dep_delay": [1.0]}))
    op = StatefulOperator("t", RouteThresholds(), "route", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"), max_parallelism=MAXP, backend="python")
    with pytest.raises(InvalidInputError, match="pyarrow.Table or a Spark DataFrame"):
        op.process(df, 0, broadcast={"a|b": 3})
    big = pa.table({"b": pa.array([b"x" * (1 << 20)] * (BROADCAST_MAX_BYTES // (1 << 20) + 1),
                                  pa.binary())})
    with pytest.raises(InvalidInputError, match=r"\d+ bytes as Arrow IPC, above the limit"):
        op.process(df, 0, broadcast=big)
    bare = StatefulOperator("u", _NoHook(), "route", str(tmp_path / "ckpt"),
                            output=str(tmp_path / "out2"), max_parallelism=MAXP,
                            backend="python")
    with pytest.raises(InvalidInputError, match="lacks process_broadcast"):
        bare.process(df, 0, broadcast=pa.table({"route": ["a|b"]}))
    # A table the processor rejects fails the micro-batch in its tasks.
    with pytest.raises(Exception, match="a route is null"):
        op.process(df, 0, broadcast=pa.table({"route": [None], "minutes": [3]},
                                             schema=THRESHOLD_SCHEMA))
    # Nothing was committed by the refusals.
    assert op.store.versions() == [] and bare.store.versions() == []
    op.process(df, 0, broadcast=pa.table({"route": ["a|b"], "minutes": [0]},
                                         schema=THRESHOLD_SCHEMA))
    assert _output(tmp_path / "out", 0) == [{"route": "a|b", "threshold_minutes": 0,
                                             "flights": 1, "delayed": 1, "delayed_total": 1}]


class _FlushEcho(KeyedProcessor):
    """Emits the broadcast table's row count from process_broadcast, once per partition."""

    output_schema = pa.schema([("partition", pa.int64()), ("rows", pa.int64()),
                               ("flush", pa.bool_())])

    def process_broadcast(self, table, ctx):
        yield pa.RecordBatch.from_pylist(
            [{"partition": ctx.partition_id, "rows": table.num_rows, "flush": ctx.is_flush}],
            schema=self.output_schema)


def test_broadcast_reaches_every_partition_and_the_flush(spark, tmp_path):
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    out = tmp_path / "out"
    op = StatefulOperator("echo", _FlushEcho(), "k", str(tmp_path / "ckpt"), output=str(out),
                          parallelism=3, max_parallelism=MAXP, backend="python")
    # One row: two of the three partitions have none and still get the table.
    op.process(spark.createDataFrame([(1,)], "k bigint"), 0, broadcast=pa.table({"x": [1, 2]}))
    op.process(spark.createDataFrame([(1,)], "k bigint"), 1)
    op.flush(spark, broadcast=pa.table({"x": [7]}))
    schema = _FlushEcho.output_schema
    got = [sorted(pq.read_table(str(out / f"batch_id={v}"), schema=schema).to_pylist(),
                  key=lambda r: r["partition"]) for v in range(3)]
    assert got[0] == [{"partition": i, "rows": 2, "flush": False} for i in range(3)]
    assert got[1] == []
    assert got[2] == [{"partition": i, "rows": 1, "flush": True} for i in range(3)]
