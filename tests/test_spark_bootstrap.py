"""StatefulOperator.bootstrap on a real local Spark: the flights job started from state that a
batch query read out of another run's checkpoint produces, together with that run, exactly
the Spark SQL reference of the whole input; a bootstrapped version is version 0, the next
micro-batch version 1; a checkpoint with versions is refused."""

import dataclasses
import os
import shutil
import struct

import pyarrow as pa
import pytest

from statecore import CheckpointStore, ListStateDescriptor, MapStateDescriptor
from statecore.demo.job import DemoConfig, DemoPipeline, run_demo
from statecore.demo.processors import idle_ttl
from statecore.demo.reference import (
    batch_plan,
    final_route_stats,
    read_sessions,
    reference_routes,
    reference_sessions,
)
from statecore.descriptors import ValueStateDescriptor
from statecore.errors import StateError
from statecore.offline import StateInput, read_state
from statecore.spark import KeyedProcessor, StatefulOperator, register_state_source
from support.frames import assert_same_rows

DAYS = 21
DAY_MS = 86_400_000
TTL_MS = 6 * DAY_MS


def _descriptors(op_name):
    """The descriptors the demo's processors register (with the configuration of the test)."""
    if op_name == "sessions":
        return [ValueStateDescriptor("open_session", "binary"),
                ValueStateDescriptor("aircraft", "binary").enable_time_to_live(idle_ttl(TTL_MS))]
    return [ValueStateDescriptor(n, "int64").enable_time_to_live(idle_ttl(TTL_MS))
            for n in ("active_since", "flights", "arr_delay_count", "arr_delay_sum",
                      "arr_delay_max")]


@pytest.mark.spark
def test_flights_job_started_from_a_bootstrapped_checkpoint_matches_spark_sql(spark, tmp_path):
    """Two micro-batches of the job, then each operator's state read back with the Spark state
    source (a batch query) and its open sessions' timers computed from their values; both
    operators bootstrapped from that into NEW checkpoints, the rest of the input run from
    them. The two runs' output together equals the Spark SQL reference of the full input."""
    cfg = DemoConfig(checkpoint=str(tmp_path / "ckpt"), output=str(tmp_path / "out"),
                     backend="native", days=DAYS, files_per_trigger=5, parallelism=2,
                     max_parallelism=128, aircraft_idle_ttl_ms=TTL_MS, route_idle_ttl_ms=TTL_MS,
                     max_batches=2)
    pytest.importorskip("statecore.backends.native")
    assert run_demo(cfg, spark=spark, progress=None).micro_batches == 2
    ops = os.path.join(cfg.checkpoint, "operators")
    old = os.path.join(cfg.checkpoint, "operators-old")
    os.rename(ops, old)

    register_state_source(spark)
    second = dataclasses.replace(cfg, max_batches=None, output=str(tmp_path / "out2"))
    pipe = DemoPipeline(second)
    for op in (pipe.sessions, pipe.routes):
        old_store = CheckpointStore(os.path.join(old, op.name))
        latest = old_store.latest_version()
        assert latest == 1
        states = [StateInput(d, spark.read.format("statecore").option("path", old)
                             .option("operatorName", op.name).option("stateName", d.name)
                             .load())
                  for d in _descriptors(op.name)]
        timers = None
        if op.name == "sessions":
            # One timer per open session, at its end: last event + gap (AircraftSessions).
            t = pa.Table.from_batches(list(read_state(old_store, "open_session")))
            ends = [struct.unpack_from("<q", v, 8)[0] + cfg.session_gap_ms
                    for v in t.column("value").to_pylist()]
            timers = pa.table({"key": t.column("key"),
                               "timestamp_ms": pa.array(ends, pa.int64())})
            assert t.num_rows > 0
        manifest = op.bootstrap(spark, states, timers=timers,
                                watermark_ms=old_store.metadata(latest)["watermark_ms"])
        assert manifest["version"] == 0 and manifest["metadata"]["bootstrap"]
        assert len(manifest["files"]) >= op.parallelism
        # Every entry of the old run's state is in the bootstrapped version.
        for d in _descriptors(op.name):
            got = pa.Table.from_batches(list(read_state(op.store, d.name)))
            want = pa.Table.from_batches(list(read_state(old_store, d.name)))
            assert got.sort_by("key").to_pylist() == want.sort_by("key").to_pylist()
        with pytest.raises(StateError, match="already holds versions"):
            op.bootstrap(spark, states)

    rest = run_demo(second, spark=spark, progress=None)
    assert (rest.micro_batches, rest.last_batch_id, rest.flushed) == (3, 4, True)
    for op in (pipe.sessions, pipe.routes):
        # Spark batch 2 opened a new stream at version 1 after the bootstrapped version 0:
        # batch 4 is version 3.
        meta = op.store.metadata(3)
        assert (meta["batch_id"], meta["batch_offset"]) == (4, -1)

    # Version v of the second run is micro-batch v + 1 of the whole input: its output goes
    # where the whole run's would be.
    for name in ("sessions", "route_delays"):
        src = os.path.join(second.output, name)
        for part in sorted(os.listdir(src)):
            if part.startswith("batch_id="):
                v = int(part.split("=", 1)[1])
                shutil.copytree(os.path.join(src, part),
                                os.path.join(cfg.output, name, f"batch_id={v + 1}"))
    landing = os.path.join(cfg.checkpoint, "landing")
    plan = batch_plan(os.path.join(cfg.checkpoint, "spark"))
    assert max(plan.values()) == 4
    got = read_sessions(spark, cfg.output)
    want = reference_sessions(spark, landing, cfg.session_gap_ms, TTL_MS, plan)
    assert_same_rows(got, want)
    assert_same_rows(final_route_stats(spark, cfg.output),
                     reference_routes(spark, landing, TTL_MS, plan))


class _Lists(KeyedProcessor):
    """Appends each row's ``v`` to the key's list and counts words in a map; emits nothing
    until the end of input, then every key's list and map size."""

    output_schema = pa.schema([("k", pa.int64()), ("items", pa.list_(pa.string())),
                               ("words", pa.int64())])
    LIST = ListStateDescriptor("items", "string")
    MAP = MapStateDescriptor("words", "string", "int64")

    def open(self, ctx):
        self.items = ctx.backend.get_state(self.LIST)
        self.words = ctx.backend.get_state(self.MAP)

    def process_batch(self, batch, ctx):
        for k, v in zip(batch.column("k").to_pylist(), batch.column("v").to_pylist()):
            ctx.backend.set_current_key(k)
            self.items.add(v)
            self.words.put(v, (self.words.get(v) or 0) + 1)
        return []

    def flush(self, ctx):
        rows = {"k": [], "items": [], "words": []}
        for k in sorted(ctx.backend.keys("items")):
            ctx.backend.set_current_key(k)
            rows["k"].append(k)
            rows["items"].append(list(self.items.get()))
            rows["words"].append(sum(1 for _ in self.words.items()))
        yield pa.RecordBatch.from_pydict(rows, schema=self.output_schema)


@pytest.mark.spark
def test_bootstrap_lists_and_maps_from_dataframes_then_micro_batches(spark, tmp_path):
    """Lists (whole-list rows) and maps bootstrapped from DataFrames of the operator's key
    column over 3 partitions; a micro-batch outside any streaming query continues at version
    1 and the final flush sees bootstrapped and new elements in order."""
    op = StatefulOperator("lists", _Lists(), "k", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"), parallelism=3, max_parallelism=32,
                          backend="python")
    lists = spark.createDataFrame([(k, [f"b{k}", f"c{k}"]) for k in range(40)],
                                  "k long, value array<string>")
    words = spark.createDataFrame([(k, f"b{k}", 1) for k in range(40)],
                                  "k long, user_key string, value long")
    # A user key given twice fails its task: nothing is committed, and a corrected bootstrap
    # then writes version 0.
    twice = words.union(words.limit(1))
    with pytest.raises(Exception, match="is given more than once"):
        op.bootstrap(spark, [(_Lists.LIST, lists), (_Lists.MAP, twice)])
    assert op.store.versions() == []
    manifest = op.bootstrap(spark, [(_Lists.LIST, lists), (_Lists.MAP, words)])
    assert len(manifest["files"]) == 3 and manifest["metadata"]["num_partitions"] == 3
    df = spark.createDataFrame([(k, f"n{k}") for k in range(0, 50, 5)], "k long, v string")
    report = op.process(df, 0)
    assert report.version == 1
    op.flush(spark)
    out = spark.read.parquet(str(tmp_path / "out" / "batch_id=2")).orderBy("k").collect()
    want = []
    for k in range(50):
        items = ([f"b{k}", f"c{k}"] if k < 40 else []) + ([f"n{k}"] if k % 5 == 0 else [])
        if items:
            want.append((k, items, (1 if k < 40 else 0) + (1 if k % 5 == 0 else 0)))
    assert [(r["k"], list(r["items"]), r["words"]) for r in out] == want
