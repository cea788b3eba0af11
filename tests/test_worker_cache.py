"""The Spark operator's per-worker state cache (no Spark needed): a dropped backend is closed
once its background checkpoint write ends, and a write that does not end in time is cancelled
so it cannot keep the backend's memory for the life of the worker."""

import dataclasses
import threading
import time
from concurrent.futures import CancelledError

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from statecore.backends import create_backend
from statecore.checkpoint import CheckpointStore
from statecore.descriptors import ReducingStateDescriptor
from statecore.spark import checkpoint_write
from statecore.spark import task as op_mod
from statecore.spark import worker_cache as W
from support.fs_wrappers import LocalDelegatingHandler

pytest.importorskip("statecore._native")


class SlowHandler(LocalDelegatingHandler):
    """Local disk whose output streams sleep ``delay_s`` per write: storage that is slow but
    alive."""

    type_name = "slow"

    def __init__(self, delay_s):
        super().__init__()
        self.delay_s = delay_s

    def before_write(self, stream, data):
        time.sleep(self.delay_s)


def _loaded_native(n=20_000):
    b = create_backend("native", key_type="int64")
    st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    k = pa.array(np.arange(n, dtype=np.int64))
    st.add_batch(k, k)
    return b


def _entry(backend, write, abandon_after_s):
    return W.CachedState(7, "a", 1, 128, "native", "int64", backend, writer="p0-a-t0",
                               snapshot_id=None, write=write, abandon_after_s=abandon_after_s)


def _background_write(store, backend):
    snap = backend.snapshot()
    report = {"attempt": "a", "partition": 0}
    # chunk_bytes=1: a write per block (~1,000), each delayed by the SlowHandler.
    def start(st, s, v, w):
        return st.write_snapshot_async(s, v, w, block_target_bytes=256, chunk_bytes=1)

    return checkpoint_write.checkpoint_in_background(store, snap, 7, "p0-a-t0", report, start)


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_dropped_entry_closes_after_its_write(tmp_path):
    backend = _loaded_native(2_000)
    store = CheckpointStore(tmp_path)
    done = _background_write(store, backend)
    W._close_entry(_entry(backend, done, abandon_after_s=60.0))
    done.result(timeout=60)
    _wait(lambda: backend._closed)
    # The write was not cancelled: its data file and pending descriptor exist.
    assert [d["writer"] for d in store.pending(7)] == ["p0-a-t0"]
    assert "error" not in store.pending(7)[0]["spark_report"]


def test_write_outliving_the_abandon_delay_is_cancelled_and_the_backend_closed(tmp_path):
    backend = _loaded_native()
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(SlowHandler(0.05)))
    done = _background_write(store, backend)  # ~1,000 blocks at 50 ms each: minutes
    t0 = time.monotonic()
    W._close_entry(_entry(backend, done, abandon_after_s=0.3))
    assert not backend._closed
    with pytest.raises(CancelledError):
        done.result(timeout=30)
    _wait(lambda: backend._closed)
    assert time.monotonic() - t0 < 30
    # No data file was published, the temporary file is gone, and the driver learns about the
    # failure from the pending descriptor instead of waiting for its timeout.
    data = tmp_path / "data"
    assert not [p for p in data.rglob("*") if p.is_file()]
    (desc,) = store.pending(7)
    assert "cancelled" in desc["spark_report"]["error"].lower()


def test_entry_without_a_write_in_flight_closes_at_once():
    # Other tests of the same process may leave pool threads behind; what matters here is that
    # closing starts no abandon timer of its own.
    before = set(threading.enumerate())
    backend = _loaded_native(10)
    W._close_entry(_entry(backend, None, abandon_after_s=0.1))
    assert backend._closed
    backend2 = _loaded_native(10)
    finished = op_mod.Future()
    finished.set_result({})
    W._close_entry(_entry(backend2, finished, abandon_after_s=0.1))
    assert backend2._closed
    started = set(threading.enumerate()) - before
    assert not [t for t in started if isinstance(t, threading.Timer)]


@pytest.mark.parametrize("commit_id", ["c0ffee", None])
def test_a_cache_hit_takes_the_committed_manifests_commit_id_as_its_base(commit_id):
    """The backend of a cache hit gets the committed version's commit id as its incremental
    base, as a restore from that manifest would: the store then refuses to chain its next
    incremental run onto another commit of the same version number."""
    backend = _loaded_native(10)
    sid = backend.snapshot().snapshot_id
    entry = dataclasses.replace(_entry(backend, None, abandon_after_s=0.1), snapshot_id=sid)
    key = ("store-uri", "op-commit-id", 0)
    W.put_cached(key, entry)
    try:
        hit = W.take_after_standby(key, entry.state(), frozenset({"p0-a-t0"}), 1.0, commit_id)
        assert hit is not None and hit.backend is backend
        assert backend.base_version == 7
        assert backend.base_commit_id == commit_id
    finally:
        backend.close()


# ------------------------------------------------- the task: write start vs its last output

class _Count(op_mod.KeyedProcessor):
    """One output batch per micro-batch: (k, running count)."""

    output_schema = pa.schema([("k", pa.int64()), ("count", pa.int64())])

    def open(self, ctx):
        self.count = ctx.backend.get_state(ReducingStateDescriptor("count", "count"))

    def process_batch(self, batch, ctx):
        keys = batch.column(ctx.key_column)
        yield pa.RecordBatch.from_arrays([keys, self.count.add_batch(keys, keys)],
                                         schema=self.output_schema)


def _task(tmp_path, events, name):
    """A version-0 task of partition 0 of 1 whose checkpoint writes append ("write", version) to
    ``events`` when they start."""

    def start(store, snap, version, writer):
        events.append(("write", version))
        return checkpoint_write.start_snapshot_write(store, snap, version, writer)

    spec = op_mod.TaskSpec(
        operator_name=name, store_uri=str(tmp_path / name), processor=_Count(),
        backend_kind="native", key_type="int64", key_column="k", event_time_column=None,
        max_parallelism=128, num_partitions=1, batch_id=0, prev_version=None, prev_attempt=None,
        attempt="a1", watermark_ms=None, is_flush=False, output_schema=_Count.output_schema,
        start_write=start, freeze_worker_gc=False)  # gc.freeze is process-wide
    routed = pa.RecordBatch.from_pydict({"k": pa.array([1, 2, 1], pa.int64())})
    return spec, spec(iter([routed]))


@pytest.fixture
def partition_0(monkeypatch):
    """Outside Spark: the task runs as Spark partition 0."""
    monkeypatch.setattr(op_mod, "_spark_partition_id", lambda: 0)


def test_the_checkpoint_write_starts_before_the_last_output_batch_is_taken(tmp_path, partition_0):
    events = []
    spec, gen = _task(tmp_path, events, "op")
    out = []
    for ob in gen:
        events.append(("output", ob.num_rows))
        out.append(ob)
    assert events == [("write", 0), ("output", 3)]
    assert out[0].column("count").to_pylist() == [1, 1, 2]
    pending = CheckpointStore(spec.store_uri).pending(0)
    assert [d["writer"] for d in pending] == ["p0-a1-t0"]
    W.clear_state_cache()


def test_a_task_whose_output_was_cut_short_does_not_report(tmp_path, partition_0):
    events = []
    spec, gen = _task(tmp_path, events, "cut")
    next(gen)  # the write started; Spark stops taking output (the task was cancelled)
    gen.close()
    entry = W._STATE_CACHE[(CheckpointStore(spec.store_uri).uri, "cut", 0)]
    with pytest.raises(op_mod.StateError, match="cut short"):
        entry.write.result(timeout=30)
    assert CheckpointStore(spec.store_uri).pending(0) == []
    W.clear_state_cache()


def test_a_null_key_in_the_input_raises_as_soon_as_it_arrives(tmp_path, partition_0):
    """A micro-batch's input is data rows only: the first null key is reported at once (before
    later chunks are read). The flush's input is its control row (one null key) alone: none
    means the routed input was repartitioned again."""
    spec, _ = _task(tmp_path, [], "ctl")
    seen = []

    def chunks():
        for keys in ([1, 2], [3, None], [4]):
            seen.append(keys)
            yield pa.RecordBatch.from_pydict({"k": pa.array(keys, pa.int64())})

    with pytest.raises(op_mod.InvalidInputError, match="1 rows with a null key in column 'k'"):
        list(spec(chunks()))
    assert len(seen) == 2
    flush = dataclasses.replace(spec, is_flush=True)
    with pytest.raises(op_mod.StateError, match="no control row"):
        list(flush._data_chunks(iter([]), 0))
    two = pa.RecordBatch.from_pydict({"k": pa.array([None, None], pa.int64())})
    with pytest.raises(op_mod.InvalidInputError, match="1 rows with a null key"):
        list(flush._data_chunks(iter([two]), 0))
    one = pa.RecordBatch.from_pydict({"k": pa.array([None], pa.int64())})
    assert list(flush._data_chunks(iter([one]), 0)) == []


class _ChunkedCount(_Count):
    chunked_input = True

    def process_batch(self, batch, ctx):
        ctx.metrics["calls"] += 1
        return super().process_batch(batch, ctx)


def _chunks(events, n):
    for i in range(n):
        events.append(("in", i))
        yield pa.RecordBatch.from_pydict({"k": pa.array([i, 100], pa.int64())})


@pytest.mark.parametrize("chunked", [True, False])
def test_chunked_input_streams_output_while_input_arrives(tmp_path, partition_0, chunked):
    events = []
    spec, _ = _task(tmp_path, events, f"chunked{chunked}")
    proc = _ChunkedCount() if chunked else _Count()
    spec = dataclasses.replace(spec, processor=proc, output_schema=proc.output_schema)
    out = []
    for ob in spec(_chunks(events, 3)):
        events.append(("out", ob.num_rows))
        out.append(ob)
    ins = [i for i, e in enumerate(events) if e[0] == "in"]
    outs = [i for i, e in enumerate(events) if e[0] == "out"]
    if chunked:
        # One process_batch per chunk; the first chunk's output leaves before the last chunk
        # arrives (the last output waits for the checkpoint write to start).
        assert len(outs) == 3 and outs[0] < ins[-1]
        assert events.index(("write", 0)) < outs[-1]
    else:
        assert len(outs) == 1 and max(ins) < outs[0]
    counts = pa.concat_arrays([b.column("count") for b in out]).to_pylist()
    keys = pa.concat_arrays([b.column("k") for b in out]).to_pylist()
    assert keys == [0, 100, 1, 100, 2, 100]
    assert counts == [1, 1, 1, 2, 1, 3]  # running counts in arrival order
    W.clear_state_cache()


def _commit(store_uri, version):
    store = CheckpointStore(store_uri)
    pending = store.pending(version)
    descs = [{k: v for k, v in d.items() if k != "spark_report"} for d in pending]
    store.commit(version, descs, {"attempt": "a1", "writers": [d["writer"] for d in descs]})
    store.clear_pending(version)


def test_a_restore_runs_while_the_input_arrives(tmp_path, partition_0, monkeypatch):
    events = []
    spec0, gen = _task(tmp_path, events, "rs")
    spec0 = dataclasses.replace(spec0, processor=_ChunkedCount())
    list(spec0(_chunks([], 1)))  # version 0: keys 0 and 100 once
    _commit(spec0.store_uri, 0)
    W.clear_state_cache()  # the next task must restore version 0 from the checkpoint

    real_restore = CheckpointStore.restore

    def slow_restore(self, backend, version=None, **kw):
        events.append(("restore", "start"))
        time.sleep(0.3)
        out = real_restore(self, backend, version, **kw)
        events.append(("restore", "end"))
        return out

    monkeypatch.setattr(CheckpointStore, "restore", slow_restore)
    spec1 = dataclasses.replace(spec0, batch_id=1, prev_version=0, prev_attempt="a1",
                                attempt="a2", prev_writers=frozenset(["p0-a1-t0"]))
    del events[:]
    out = list(spec1(_chunks(events, 3)))
    start, end = events.index(("restore", "start")), events.index(("restore", "end"))
    assert start < events.index(("in", 0)) < end  # the input was taken during the restore
    counts = pa.concat_arrays([b.column("count") for b in out]).to_pylist()
    assert counts == [2, 2, 1, 3, 1, 4]  # on top of the restored counts of 0 and 100
    W.clear_state_cache()

    def failing_restore(self, backend, version=None, **kw):
        time.sleep(0.1)
        raise op_mod.StateError("injected restore failure")

    monkeypatch.setattr(CheckpointStore, "restore", failing_restore)
    spec2 = dataclasses.replace(spec1, attempt="a3")
    with pytest.raises(op_mod.StateError, match="injected restore failure"):
        list(spec2(_chunks([], 3)))
    W.clear_state_cache()
