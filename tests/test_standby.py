"""Standby copies in the Spark operator's worker cache (statecore.spark.worker_cache, no Spark
needed): after its task a worker waits for the driver's commit and brings its copies of the
operator's other partitions up to that version -- catching an older copy up, or restoring one it
does not hold -- so that the partition's next task there is a cache hit. Checked differentially
against a restore of the committed version, on both backends, and for the cases where it must do
nothing (no commit, a later task, an unsettled write, a compacted chain)."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pytest

from statecore.checkpoint.store import CheckpointStore
from statecore.descriptors import ReducingStateDescriptor
from statecore.key_groups import key_group_range_for_operator, spark_key_group
from statecore.spark import task as O
from statecore.spark import worker_cache as W
from test_apply_changes import _snapshot_contents
from test_async_snapshot import BACKENDS

N, MAXP = 2, 32
_KEYS = np.arange(4000, dtype=np.int64)
_KG = np.array([spark_key_group(int(k), "int64", MAXP) for k in _KEYS])


def _keys_of(partition: int) -> np.ndarray:
    r = key_group_range_for_operator(MAXP, N, partition)
    return _KEYS[(_KG >= r.start) & (_KG <= r.end)]


class _Job:
    """Both partitions of an operator run by their owners (two workers' backends), each
    micro-batch written and committed as the operator does: writers ``p<i>-a<v>-t0``,
    metadata ``attempt`` / ``writers``."""

    def __init__(self, tmp_path, kind, seed=1):
        self.kind = kind
        self.store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)
        self.rnd = np.random.default_rng(seed)
        self.owners = [self.backend(p) for p in range(N)]
        self.version = -1

    def backend(self, partition):
        b = W.partition_backend(self.kind, "int64", MAXP, N, partition)
        b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
        return b

    @staticmethod
    def writer(partition, version):
        return f"p{partition}-a{version}-t0"

    def micro_batch(self):
        """Random adds on every partition, then the incremental (version 0: full) checkpoint."""
        self.version += 1
        v = self.version
        descs = []
        for p, b in enumerate(self.owners):
            keys = self.rnd.choice(_keys_of(p), 300)
            b.get_state(ReducingStateDescriptor("sum", "sum", "int64")).add_batch(
                pa.array(keys), pa.array(self.rnd.integers(1, 9, len(keys))))
            snap = b.snapshot(incremental=v > 0)
            descs.append(self.store.write_snapshot(snap, v, self.writer(p, v)))
            snap.release()
        self.store.commit(v, descs, {"attempt": f"a{v}",
                                     "writers": [self.writer(p, v) for p in range(N)]})
        for b, d in zip(self.owners, descs):
            b.notify_checkpoint_complete(d["snapshot_id"], d["version"])
        return descs

    def restored(self, partition, version):
        b = self.backend(partition)
        self.store.restore(b, version)
        return b

    def key(self, partition):
        return (self.store.uri, "op", partition)

    def config(self):
        return (N, MAXP, self.kind, "int64")

    def cache_copy(self, partition, version, write=None):
        """This worker's copy of ``partition`` as the task that ran it at ``version`` left it."""
        done = Future()
        done.set_result({})
        W.put_cached(self.key(partition), W.CachedState(
            version, f"a{version}", *self.config(), self.restored(partition, version),
            writer=self.writer(partition, version), write=done if write is None else write), 1)

    def standby(self, version, generation=None, wait_s=5.0):
        op_key = self.key(0)[:2]
        gen = W._TASKS_STARTED.get(op_key, 0) if generation is None else generation
        return W._standby_catch_up(self.store, op_key, self.key(0), version, gen,
                                   self.config(), 1, wait_s=wait_s)

    def take(self, partition, version):
        """The next task's lookup of ``partition`` at ``version`` (or None)."""
        meta = self.store.metadata(version)
        return W._take_cached(self.key(partition),
                              (version, meta["attempt"], *self.config()),
                              frozenset(meta["writers"]))


@pytest.fixture
def job(tmp_path):
    W.clear_state_cache()
    yield lambda kind: _Job(tmp_path, kind)
    W.clear_state_cache()


@pytest.mark.parametrize("kind", BACKENDS)
def test_standby_catches_a_stale_copy_up_to_the_committed_version(job, kind):
    j = job(kind)
    j.micro_batch()
    j.cache_copy(1, 0)     # this worker ran partition 1 at version 0 ...
    j.micro_batch()
    j.micro_batch()        # ... and another worker carried it on to version 2
    assert j.standby(2) == 1
    hit = j.take(1, 2)
    assert hit is not None and hit.version == 2 and hit.standby_cpu_s is not None
    assert _snapshot_contents(hit.backend) == _snapshot_contents(j.restored(1, 2))
    # The copy's incremental base is version 2: its next incremental snapshot is empty.
    assert _snapshot_contents(hit.backend, incremental=True) == {}
    hit.backend.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_standby_restores_a_partition_the_worker_does_not_hold(job, kind):
    j = job(kind)
    j.micro_batch()
    j.micro_batch()
    assert j.standby(1) == 1  # own partition 0; partition 1 restored at version 1
    hit = j.take(1, 1)
    assert hit is not None and hit.standby_cpu_s is not None
    assert _snapshot_contents(hit.backend) == _snapshot_contents(j.restored(1, 1))
    hit.backend.close()
    # Holding stale_copies (1) copies already: nothing more is restored.
    j.cache_copy(1, 1)
    j.micro_batch()
    assert j.standby(2) == 1  # the catch-up of that copy, no restore
    assert set(W._STATE_CACHE) == {j.key(1)}


@pytest.mark.parametrize("kind", BACKENDS)
def test_standby_gives_up_without_a_commit_or_after_a_later_task(job, kind):
    j = job(kind)
    j.micro_batch()
    j.cache_copy(1, 0)
    # Version 1 is never committed: the copy stays as it was.
    assert j.standby(1, wait_s=0.05) == 0
    assert W._STATE_CACHE[j.key(1)].version == 0
    # A later task of the operator started in this process before the commit showed up.
    op_key = j.key(0)[:2]
    gen = W._TASKS_STARTED.get(op_key, 0)
    W._TASKS_STARTED[op_key] = gen + 1
    assert j.standby(1, generation=gen) == 0
    assert W._STATE_CACHE[j.key(1)].version == 0


@pytest.mark.parametrize("kind", BACKENDS)
def test_standby_leaves_an_unsettled_copy_and_drops_an_unusable_one(job, kind):
    j = job(kind)
    j.micro_batch()
    never = Future()
    j.cache_copy(1, 0, write=never)
    j.micro_batch()
    assert j.standby(1) == 0
    entry = W._STATE_CACHE[j.key(1)]
    assert entry.version == 0 and not entry.backend._closed  # kept for a later catch-up
    never.set_exception(OSError("write failed"))
    j.micro_batch()
    assert j.standby(2) == 1  # the failed copy dropped, partition 1 restored instead
    assert entry.backend._closed and W._STATE_CACHE[j.key(1)].version == 2
    # A chain that no longer holds the copy's run (compacted): dropped, then restored.
    copy = W._STATE_CACHE[j.key(1)]
    j.store.compact(2)
    j.micro_batch()
    assert j.standby(3) == 1
    hit = j.take(1, 3)
    assert copy.backend._closed and hit.backend is not copy.backend
    assert _snapshot_contents(hit.backend) == _snapshot_contents(j.restored(1, 3))
    hit.backend.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_task_waits_for_the_standby_working_on_its_partition(job, kind, monkeypatch):
    j = job(kind)
    j.micro_batch()
    j.cache_copy(1, 0)
    j.micro_batch()
    entered, release = threading.Event(), threading.Event()
    real_open = j.store.open_changes

    def slow_open(*a, **kw):
        entered.set()
        release.wait(10)
        return real_open(*a, **kw)

    monkeypatch.setattr(j.store, "open_changes", slow_open)
    t = threading.Thread(target=j.standby, args=(1,))
    t.start()
    assert entered.wait(10)
    assert j.key(1) not in W._STATE_CACHE and j.key(1) in W._STANDBY_BUSY
    meta = j.store.metadata(1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(W.take_after_standby(
        j.key(1), (1, meta["attempt"], *j.config()), frozenset(meta["writers"]), 10)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # waiting for the standby, not restoring on its own
    release.set()
    t.join(10)
    waiter.join(10)
    assert got and got[0] is not None and got[0].version == 1
    got[0].backend.close()


class _Sum(O.KeyedProcessor):
    """The _Job's state: a running sum of v per key."""

    output_schema = pa.schema([("k", pa.int64()), ("sum", pa.int64())])

    def open(self, ctx):
        self.sum = ctx.backend.get_state(ReducingStateDescriptor("sum", "sum", "int64"))

    def process_batch(self, batch, ctx):
        keys = batch.column("k")
        yield pa.RecordBatch.from_arrays([keys, self.sum.add_batch(keys, batch.column("v"))],
                                         schema=self.output_schema)


@pytest.mark.parametrize("kind", BACKENDS)
def test_the_next_task_of_the_partition_takes_the_standby_copy(job, kind, monkeypatch):
    """A task of partition 1 in this worker after its standby ran: load "standby", its CPU in
    the report, and the output continues the committed state."""
    j = job(kind)
    j.micro_batch()
    j.cache_copy(1, 0)
    j.micro_batch()
    assert j.standby(1) == 1
    meta = j.store.metadata(1)
    monkeypatch.setattr(O, "_spark_partition_id", lambda: 1)
    spec = O.TaskSpec(
        operator_name="op", store_uri=j.store.uri, processor=_Sum(), backend_kind=kind,
        key_type="int64", key_column="k", event_time_column=None, max_parallelism=MAXP,
        num_partitions=N, batch_id=2, prev_version=1, prev_attempt=meta["attempt"],
        attempt="a2", watermark_ms=None, is_flush=False, output_schema=_Sum.output_schema,
        prev_writers=frozenset(meta["writers"]),
        freeze_worker_gc=False)  # not the test process: gc.freeze is process-wide
    key = int(_keys_of(1)[0])
    rows = pa.RecordBatch.from_pydict({"k": pa.array([key], pa.int64()),
                                       "v": pa.array([5], pa.int64())})
    out = pa.Table.from_batches(list(spec(iter([rows]))))
    j.owners[1].set_current_key(key)  # the owner that ran partition 1 holds version 1
    expected = (j.owners[1].get_state(ReducingStateDescriptor("sum", "sum", "int64")).get()
                or 0) + 5
    assert out.column("sum").to_pylist() == [expected]
    entry = W._STATE_CACHE[j.key(1)]
    desc = entry.write.result(timeout=30)
    report = j.store.pending(2)[0]["spark_report"]
    assert desc["writer"] == report["writer"]
    assert report["load"] == "standby" and report["standby_cpu_s"] > 0, report


def test_the_standby_leaves_partitions_another_worker_of_the_host_holds(job):
    # With handoff, the next task of such a partition here goes to its holder: a copy would
    # only cost the catch-up. The claim names a live process other than this one (the parent).
    from statecore.spark import handoff

    j = job("native")
    j.micro_batch()
    j.micro_batch()
    path = handoff._claim_path(handoff._base_dir(), j.key(1))
    with open(path, "w") as f:
        f.write(f"{os.getppid()} 1\n")
    try:
        op_key = j.key(0)[:2]
        gen = W._TASKS_STARTED.get(op_key, 0)
        assert W._standby_catch_up(j.store, op_key, j.key(0), 1, gen, j.config(), 1,
                                   wait_s=5.0, handoff=True) == 0
        assert j.take(1, 1) is None
        # Without handoff (or once the claim is gone) the standby restores it as before.
        assert W._standby_catch_up(j.store, op_key, j.key(0), 1, gen, j.config(), 1,
                                   wait_s=5.0, handoff=False) == 1
    finally:
        os.unlink(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_standby_thread_runs_at_the_lowest_priority(monkeypatch):
    # It runs between tasks, while the driver plans the next micro-batch and the other worker's
    # task runs: at their priority it took CPU from them.
    seen = []

    def record(*args, **kwargs):
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    monkeypatch.setattr(W, "_standby_catch_up", record)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    W.start_standby(None, ("s", "op"), ("s", "op", 0), 1, (2, 128, "native", "int64"), 1).join()
    assert seen == [min(19, mine + W.STANDBY_NICE)]
    assert W.STANDBY_NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
