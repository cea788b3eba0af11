"""spark.read.format("statecore") on a real local Spark: the state of a version and the change
feed between micro-batches equal what statecore.offline reads, partitioned by key-group range,
and bad options fail on the driver with the error named."""

import pyarrow as pa
import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
    create_backend,
)
from statecore.offline import read_changes, read_state
from statecore.spark import register_state_source


def _checkpoint(root):
    """Versions 0..3 of an operator-like checkpoint: micro-batches 0..3 (batch_id = version),
    value, list and map state over int64 keys; batch 3 removes some."""
    b = create_backend("python", key_type="int64")
    value = b.get_state(ValueStateDescriptor("value", "string"))
    lst = b.get_state(ListStateDescriptor("list", "int64"))
    mp = b.get_state(MapStateDescriptor("map", "string", "float64"))
    store = CheckpointStore(root)
    for version in range(4):
        for k in range(version * 20, 100):
            b.set_current_key(k)
            value.update(f"v{version}")
            lst.add(version)
            mp.put(f"u{k % 3}", k + version / 4)
        if version == 3:
            for k in range(5):
                b.set_current_key(k)
                value.clear()
        desc = store.write_snapshot(b.snapshot(incremental=version > 0), version)
        store.commit(version, [desc], metadata={"batch_id": version, "num_partitions": 3})
        b.notify_checkpoint_complete(desc["snapshot_id"], version)
    b.dispose()
    return store


def _sorted(rows, *cols):
    return sorted(rows, key=lambda r: tuple(str(r[c]) for c in cols))


def test_read_state_through_spark(spark, tmp_path):
    root = str(tmp_path / "ops" / "counts")
    _checkpoint(root)
    register_state_source(spark)
    for name in ("value", "list", "map"):
        df = (spark.read.format("statecore").option("path", str(tmp_path / "ops"))
              .option("operatorName", "counts").option("stateName", name)
              .option("batchId", 2).load())
        assert df.rdd.getNumPartitions() == 3
        want = pa.Table.from_batches(list(read_state(root, name, version=2))).to_pylist()
        got = [r.asDict() for r in df.collect()]
        for r in want:
            r.pop("namespace")
            if name == "value":
                r.pop("user_key")
        cols = ("key", "user_key") if name != "value" else ("key",)
        assert _sorted(got, *cols) == _sorted(want, *cols), name
    latest = (spark.read.format("statecore").option("path", root).option("stateName", "value")
              .load())
    assert latest.count() == 95


def test_change_feed_through_spark(spark, tmp_path):
    root = str(tmp_path / "c")
    _checkpoint(root)
    register_state_source(spark)
    df = (spark.read.format("statecore").option("path", root).option("stateName", "value")
          .option("readChangeFeed", "true").option("changeStartBatchId", 1)
          .option("changeEndBatchId", 3).option("numPartitions", 2).load())
    got = [r.asDict() for r in df.collect()]
    want = []
    for v in (1, 2, 3):
        for r in pa.Table.from_batches(list(read_changes(root, "value", v - 1, v))).to_pylist():
            r.pop("namespace")
            r.pop("user_key")
            want.append({**r, "batch_id": v, "version": v})
    cols = ("version", "key", "change_type")
    assert _sorted(got, *cols) == _sorted(want, *cols)
    assert {(r["version"], r["change_type"]) for r in got} >= {(3, "delete"), (1, "update")}


def test_bad_options_fail_on_the_driver(spark, tmp_path):
    root = str(tmp_path / "c")
    _checkpoint(root)
    register_state_source(spark)
    reader = spark.read.format("statecore").option("path", root)
    for opts, msg in (({}, "stateName"), ({"stateName": "nope"}, "no state 'nope'"),
                      ({"stateName": "value", "batchId": 9}, "batch id 9"),
                      ({"stateName": "value", "readChangeFeed": "true"}, "changeStartBatchId")):
        r = reader
        for k, v in opts.items():
            r = r.option(k, v)
        with pytest.raises(Exception, match=msg):
            r.load().collect()
