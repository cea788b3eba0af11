"""Incremental checkpoints and asynchronous pre-commit of statecore.spark.StatefulOperator on a
real local PySpark (local[2]).

Checked: a long-running job whose micro-batches touch few of many keys writes runs the size of
the change set (store byte counts), the run chain stays bounded by compaction (``max_runs``),
restoring from every retained version after a crash continues exactly like an uninterrupted
run, rescaling 2 -> 3 on incremental checkpoints, and a background checkpoint write that fails
or never reports fails the micro-batch (nothing committed) so that its replay restores the
previous version.
"""

import os
import shutil
import sys
import time
from collections import Counter
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError, StateError
from statecore.spark import KeyedProcessor, StatefulOperator

pytestmark = pytest.mark.spark

MAXP = 128
REMIND_AFTER = 10
OUT_SCHEMA = pa.schema([("kind", pa.string()), ("k", pa.int64()), ("count", pa.int64()),
                        ("total", pa.int64()), ("ts", pa.int64())])


def _by_value():
    # Test-module classes and functions must travel to the Python workers by value.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Tally(KeyedProcessor):
    """Per key: count and sum of ``v``; a row with ``v < 0`` removes the key's state (so
    incremental runs carry tombstones); an event-time timer at ``t + 10`` per row. Emits a
    ``count`` row per key touched and a ``timer`` row per fired timer."""

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
            if v < 0:
                self.count.clear()
                self.total.clear()
            else:
                self.count.update(self.count.value() + 1)
                self.total.update(self.total.value() + v)
                ctx.backend.timers.register_event_time_timer(t + REMIND_AFTER)
            if i + 1 == len(rows) or rows[i + 1][0] != k:
                out.append(("count", k, self.count.value(), self.total.value(), None))
        if out:
            yield _batch(out)

    def on_watermark(self, ctx, watermark_ms):
        out = []
        for ts, k, _ in ctx.backend.timers.advance_watermark(watermark_ms):
            ctx.backend.set_current_key(k)
            out.append(("timer", k, self.count.value(), self.total.value(), ts))
        if out:
            yield _batch(out)

    def flush(self, ctx):
        return ()


def _batch(rows):
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, OUT_SCHEMA.types)],
                                      schema=OUT_SCHEMA)


class Model:
    """Plain-Python reference of Tally under the operator's watermark rule."""

    def __init__(self):
        self.count, self.total, self.timers, self.wm = {}, {}, set(), None

    def batch(self, rows):
        out, last = set(), {}
        for k, v, t in sorted(rows):
            if v < 0:
                self.count.pop(k, None)
                self.total.pop(k, None)
            else:
                self.count[k] = self.count.get(k, 0) + 1
                self.total[k] = self.total.get(k, 0) + v
                self.timers.add((t + REMIND_AFTER, k))
            last[k] = (self.count.get(k, 0), self.total.get(k, 0))
        out |= {("count", k, c, s, None) for k, (c, s) in last.items()}
        if self.wm is not None:
            for ts, k in sorted(x for x in self.timers if x[0] <= self.wm):
                self.timers.discard((ts, k))
                out.add(("timer", k, self.count.get(k, 0), self.total.get(k, 0), ts))
        if rows:
            m = max(t for _, _, t in rows)
            self.wm = m if self.wm is None else max(self.wm, m)
        return out


def _rows_of(path):
    if not os.path.isdir(path):
        return set()
    t = pq.read_table(path, schema=OUT_SCHEMA)
    return {tuple(r.values()) for r in t.to_pylist()}


def _df(spark, rows):
    return spark.createDataFrame(rows, "k bigint, v bigint, t bigint")


@pytest.fixture(params=["python", "native"])
def backend(request):
    if request.param == "native":
        pytest.importorskip("statecore.backends.native")
    return request.param


def _op(root, backend, name="tally", **kw):
    _by_value()
    return StatefulOperator(name, Tally(), "k", str(root / "ckpt"), output=str(root / "out"),
                            max_parallelism=MAXP, backend=backend, event_time_column="t", **kw)


def _state(store, version, nkeys):
    from statecore.backends import create_backend

    b = create_backend("python", key_type="int64", max_parallelism=MAXP)
    store.restore(b, version)
    keys = pa.array(range(nkeys), pa.int64())
    out = {}
    for name in ("count", "total"):
        st = b.get_state(ValueStateDescriptor(name, "int64", default=0))
        out[name] = st.get_batch(keys).to_pylist()
    out["timers"] = b.timers.num_timers()
    b.close()
    return out


def _model_state(model, nkeys):
    return {"count": [model.count.get(k) for k in range(nkeys)],
            "total": [model.total.get(k) for k in range(nkeys)],
            "timers": len(model.timers)}


def _max_chain(manifest):
    """Longest run chain over the key groups of a manifest (runs covering a key group)."""
    depth = {}
    for f in manifest["files"]:
        s, e = f["key_group_range"]
        for kg in range(s, e + 1):
            depth[kg] = depth.get(kg, 0) + 1
    return max(depth.values())


# ------------------------------------------------------------------------------- the tests

NKEYS = 2000


def _long_job(i):
    """Micro-batch ``i`` of a long-running job: 0 loads NKEYS keys (and as many timers, which
    fire in micro-batch 2), later ones touch 4 keys (one of them removed)."""
    if i == 0:
        return [(k, k, 100) for k in range(NKEYS)]
    touched = [(7 * i + j * 577) % NKEYS for j in range(4)]
    return [(touched[0], -1, 200 + i)] + [(k, i, 200 + i) for k in touched[1:]]


def test_checkpoint_grows_by_the_change_set_not_the_state(spark, tmp_path, backend):
    op = _op(tmp_path, backend, max_runs=3)
    model = Model()
    reports = []
    for i in range(8):
        rows = _long_job(i)
        rep = op(_df(spark, rows), i)
        assert _rows_of(str(tmp_path / "out" / f"batch_id={i}")) == model.batch(rows), i
        reports.append(rep)
        manifest = op.store.manifest(i)
        if i == 0:
            assert not rep.incremental
            assert [f["kind"] for f in manifest["files"]] == ["full", "full"]
        else:
            # Whether a partition's backend came from the worker cache or from the checkpoint,
            # it writes the changes since its base.
            assert rep.incremental, (i, rep.loads)
        # The store's auto-compaction (max_runs=3) keeps every key group's run chain bounded.
        assert _max_chain(manifest) <= 3, i
        # Where the time went: driver phases and one timing dict per partition, whose load
        # sources add up to rep.loads.
        assert set(rep.phases) == {"plan_s", "action_s", "wait_s", "commit_s"}, rep.phases
        assert all(v >= 0 for v in rep.phases.values()) and rep.phases["wait_s"] == rep.wait_seconds
        assert [p["partition"] for p in rep.partitions] == [0, 1]
        for p in rep.partitions:
            assert {"pid", "input_s", "load_s", "load_cpu_s", "standby_cpu_s", "process_s",
                    "snapshot_s", "task_s", "write_s", "gc_frozen_objects"} <= set(p), p
            assert p["task_s"] >= p["input_s"] + p["process_s"] - 1e-6, p
            # Only a restore or a catch-up runs in the load's thread.
            assert (p["load_cpu_s"] > 0) == (p["load"] in ("checkpoint", "catch-up")), p
            # A standby copy was caught up or restored between the tasks (standby=True).
            assert (p["standby_cpu_s"] > 0) == (p["load"] == "standby"), p
            # freeze_worker_gc (default): the worker's objects sit in the permanent generation
            # from its first statecore task on (PySpark's daemon collects after every task).
            assert p["gc_frozen_objects"] > 1000, p
        assert Counter(p["load"] for p in rep.partitions) == Counter(rep.loads)
    full = reports[0].checkpoint_bytes
    assert reports[0].state_bytes > 50_000
    # Timers are complete in every run (docs/architecture.md): version 1 still carries the NKEYS
    # timers of version 0, which fire in micro-batch 2. From then on a run holds ~4 changed
    # entries (one a tombstone) and ~3 timers: a small fraction of the full state.
    for rep in reports[2:]:
        assert rep.checkpoint_bytes * 20 < full, (rep.version, rep.checkpoint_bytes, full)
    # What a restore reads stays bounded too: the chain of the latest version.
    assert reports[-1].checkpoint_total_bytes < 3 * full
    # Written per micro-batch: the change set; the tombstones are in the incremental runs.
    tomb = sum(sum(f["tombstones"].values()) for f in op.store.manifest(7)["files"]
               if f["kind"] == "incremental")
    assert tomb >= 1
    assert _state(op.store, 7, NKEYS) == _model_state(model, NKEYS)
    assert op.store.versions() == [5, 6, 7]  # retain_versions=3


CRASH_BATCHES = [
    [(k, k, 100 + k % 7) for k in range(60)],
    [(k, 1, 120) for k in range(0, 60, 5)],
    [(3, -1, 125), (4, 2, 126), (70, 5, 127)],
    [],
    [(k, 3, 200) for k in range(0, 80, 9)] + [(10, -1, 201)],
    [(1, 1, 300), (70, -1, 301)],
]


def test_restore_from_any_retained_version_after_a_crash(spark, tmp_path, backend):
    ref = _op(tmp_path / "ref", backend)
    ref_out, model = [], Model()
    for i, rows in enumerate(CRASH_BATCHES):
        ref(_df(spark, rows), i)
        ref_out.append(_rows_of(str(tmp_path / "ref" / "out" / f"batch_id={i}")))
        assert ref_out[-1] == model.batch(rows), i
    final = len(CRASH_BATCHES) - 1
    assert _state(ref.store, final, 80) == _model_state(model, 80)

    crashed = _op(tmp_path / "a", backend)
    for i in range(4):
        crashed(_df(spark, CRASH_BATCHES[i]), i)
    retained = crashed.store.versions()
    assert retained == [1, 2, 3]
    src = tmp_path / "a" / "ckpt"
    for v in retained:
        # The process died right after committing v: a copy of the checkpoint without the
        # later manifests (their data files stay, as a crash leaves them), under a new root so
        # no worker cache can serve it: every partition restores v from the store.
        root = tmp_path / f"crash{v}"
        shutil.copytree(src, root / "ckpt")
        for later in retained:
            if later > v:
                os.remove(root / "ckpt" / "tally" / f"manifest-{later:020d}.json")
        op = _op(root, backend)
        assert op.latest_version() == v
        for i in range(v + 1, len(CRASH_BATCHES)):
            rep = op(_df(spark, CRASH_BATCHES[i]), i)
            if i == v + 1:
                assert rep.loads == {"checkpoint": 2}
            assert rep.incremental
            assert _rows_of(str(root / "out" / f"batch_id={i}")) == ref_out[i], (v, i)
        assert _state(op.store, final, 80) == _model_state(model, 80), v


def test_rescale_2_to_3_on_incremental_checkpoints(spark, tmp_path, backend):
    op = _op(tmp_path, backend, parallelism=2)
    model = Model()
    for i, rows in enumerate(CRASH_BATCHES):
        op.parallelism = 2 if i < 3 else 3
        rep = op(_df(spark, rows), i)
        assert _rows_of(str(tmp_path / "out" / f"batch_id={i}")) == model.batch(rows), i
        own = [f for f in op.store.manifest(i)["files"] if f["version"] == i]
        assert len(own) == op.parallelism
        assert rep.incremental == (i > 0)
        if i == 3:
            # The new split cannot come from the worker caches: restored, then incremental on
            # top of runs written with 2 partitions.
            assert rep.loads == {"checkpoint": 3}
            assert {f["kind"] for f in op.store.manifest(i)["files"] if f["version"] < i} == \
                {"full", "incremental"}
            # Each task read the byte ranges of its own key groups and the footers of the runs
            # covering them (at this tiny size the footers are most of it), below the whole.
            prev_bytes = sum(f["size"] for f in op.store.manifest(i - 1)["files"])
            read = [p["restore_bytes"] for p in sorted(rep.partitions,
                                                       key=lambda p: p["partition"])]
            assert op.store.metadata(i)["restore_bytes"] == read
            assert all(0 < b < prev_bytes for b in read), (read, prev_bytes)
            assert sum(read) <= 2 * prev_bytes, (read, prev_bytes)
    final = len(CRASH_BATCHES) - 1
    assert _state(op.store, final, 80) == _model_state(model, 80)
    assert op.store.metadata(final)["num_partitions"] == 3


# ---------------------------------------------------------- failing background checkpoint

def never_reports(store, snap, version, writer):
    """A checkpoint write that hangs in a live worker: its Future never resolves while its
    heartbeats go on, so the driver waits for it until ``commit_timeout_s`` (a worker that
    dies is tests/test_spark_relaunch.py)."""
    return Future()


def fails_to_write(store, snap, version, writer):
    """A checkpoint write that fails (e.g. the filesystem refused it)."""
    fut = Future()
    fut.set_exception(OSError(f"injected write failure for {writer}"))
    return fut


def test_failing_background_write_fails_the_batch_and_the_replay_restores(spark, tmp_path):
    op = _op(tmp_path, "python", commit_timeout_s=2.0)
    model = Model()
    outs = []
    for i in (0, 1):
        op(_df(spark, CRASH_BATCHES[i]), i)
        outs.append(model.batch(CRASH_BATCHES[i]))

    op._start_write = never_reports
    t0 = time.perf_counter()
    with pytest.raises(StateError, match=r"did not report their checkpoint within 2 s"):
        op(_df(spark, CRASH_BATCHES[2]), 2)
    assert time.perf_counter() - t0 < 60
    assert op.latest_version() == 1  # nothing committed: Spark replays batch 2

    op._start_write = fails_to_write
    with pytest.raises(StateError, match="injected write failure"):
        op(_df(spark, CRASH_BATCHES[2]), 2)
    assert op.latest_version() == 1

    # The replay loads committed version 1: a restore, a catch-up of a worker's stale copy of
    # version 0, a worker's cached copy of version 1 itself (one that ran no failed attempt
    # of that partition; "cache" requires the committed attempt), or a copy of version 1 the
    # worker's standby brought up after version 1's commit and no failed attempt took. A cached
    # uncommitted attempt of version 2 would apply batch 2 twice, which the output and state
    # checks below catch.
    op._start_write = None
    rep = op(_df(spark, CRASH_BATCHES[2]), 2)
    assert sum(rep.loads.values()) == 2, rep.loads
    assert set(rep.loads) <= {"checkpoint", "catch-up", "cache", "standby"}, rep.loads
    assert rep.incremental
    assert _rows_of(str(tmp_path / "out" / "batch_id=2")) == model.batch(CRASH_BATCHES[2])
    for i in range(3, len(CRASH_BATCHES)):
        op(_df(spark, CRASH_BATCHES[i]), i)
        assert _rows_of(str(tmp_path / "out" / f"batch_id={i}")) == model.batch(CRASH_BATCHES[i])
    assert _state(op.store, len(CRASH_BATCHES) - 1, 80) == _model_state(model, 80)


def test_handoff_keeps_output_and_state_exact(spark, tmp_path):
    """StatefulOperator(handoff=True): a task PySpark gives to the worker that does not hold its
    partition runs in the one that does (load "handoff"; which tasks move is up to PySpark, so
    this checks the results whichever way each micro-batch went; tests/test_handoff.py forces
    the handoff). Standby copies are skipped for partitions held by the other worker."""
    op = _op(tmp_path, "native", handoff=True)
    model = Model()
    for i in range(6):
        rows = _long_job(i)
        rep = op(_df(spark, rows), i)
        assert _rows_of(str(tmp_path / "out" / f"batch_id={i}")) == model.batch(rows), i
        assert set(rep.loads) <= {"empty", "cache", "handoff", "standby", "catch-up",
                                  "checkpoint"}, rep.loads
    assert _state(op.store, 5, NKEYS) == _model_state(model, NKEYS)


def test_two_operators_commit_after_both_actions(spark, tmp_path):
    """start() runs the sink's action without committing; commit_batches waits for every
    operator's writes first, so a failed write of the second commits neither."""
    from statecore.spark import commit_batches

    a = _op(tmp_path / "a", "python", name="a", commit_timeout_s=2.0)
    b = _op(tmp_path / "b", "python", name="b", commit_timeout_s=2.0)
    df = _df(spark, CRASH_BATCHES[0])
    pa_, pb = a.start(df, 0), b.start(df, 0)
    assert a.latest_version() is None and b.latest_version() is None
    ra, rb = commit_batches([pa_, pb])
    assert (ra.version, rb.version) == (0, 0) and a.latest_version() == b.latest_version() == 0
    assert pa_.commit() is ra  # committing twice returns the same report

    b._start_write = fails_to_write
    df = _df(spark, CRASH_BATCHES[1])
    pa_, pb = a.start(df, 1), b.start(df, 1)
    with pytest.raises(StateError, match="injected write failure"):
        commit_batches([pa_, pb])
    assert a.latest_version() == 0 and b.latest_version() == 0


def test_operator_options_are_validated(tmp_path):
    p = Tally()
    ck = str(tmp_path)
    for kw in ({"max_runs": 0}, {"max_runs": True}, {"compaction_size_ratio": 0},
               {"compaction_size_ratio": 2.5}, {"commit_timeout_s": 0},
               {"commit_timeout_s": "5"}, {"freeze_worker_gc": 1}, {"freeze_worker_gc": None},
               {"relaunch_attempts": -1}, {"relaunch_attempts": 1.0},
               {"relaunch_attempts": True}, {"heartbeat_interval_s": 0},
               {"heartbeat_interval_s": "2"}, {"heartbeat_timeout_s": 2.0},
               {"heartbeat_interval_s": 1, "heartbeat_timeout_s": 0.5}):
        with pytest.raises(InvalidInputError):
            StatefulOperator("x", p, "k", ck, output=ck, **kw)
    op = StatefulOperator("x", p, "k", ck, output=ck, max_runs=None)
    assert op.store.max_runs is None and op.store.compaction_size_ratio == 4
    op = StatefulOperator("x", p, "k", ck, output=ck, compaction_size_ratio=None)
    assert op.store.compaction_size_ratio is None
    assert (op.relaunch_attempts, op.heartbeat_interval_s, op.heartbeat_timeout_s) == (2, 2, 6)
    op = StatefulOperator("x", p, "k", ck, output=ck, heartbeat_interval_s=0.5)
    assert op.heartbeat_timeout_s == 1.5


def _tiered_job(i, nkeys):
    """Micro-batch ``i``: 0 writes every key, later ones touch a tenth of them (one removed)."""
    if i == 0:
        return [(k, k, 100) for k in range(nkeys)]
    touched = sorted({(13 * i + j * 37) % nkeys for j in range(nkeys // 10)})
    return [(touched[0], -1, 200 + i)] + [(k, i, 200 + i) for k in touched[1:]]


def test_tiered_operator_matches_the_model(spark, tmp_path):
    """``memory_budget``: every task's backend is tiered over the operator's store (attached,
    never loaded; a cached one told the committed version), and a budget of a few hundred
    bytes against thousands of bytes of state forces evictions and spills in every task; the
    output and every committed version equal the model's (which the in-memory operator
    matches, above)."""
    pytest.importorskip("statecore.backends.native")
    nkeys, budget = 300, 512
    with pytest.raises(InvalidInputError, match="memory_budget"):
        _op(tmp_path, "python", memory_budget=budget)
    op = _op(tmp_path, "native", memory_budget=budget, block_target_bytes="64B")
    assert op.store.block_target_bytes == 64
    model = Model()
    for i in range(3):
        rows = _tiered_job(i, nkeys)
        rep = op(_df(spark, rows), i)
        assert _rows_of(str(tmp_path / "out" / f"batch_id={i}")) == model.batch(rows), i
        assert _state(op.store, i, nkeys) == _model_state(model, nkeys), i
        assert rep.incremental == (i > 0)
        # No catch-up or standby copies in the tiered mode: its own cached backend or an attach.
        assert set(rep.loads) <= {"cache", "checkpoint", "empty"}, rep.loads
        # Each of the two partitions' backends held at most the budget after its last call.
        assert rep.state_bytes <= 2 * budget, (i, rep.state_bytes)
        # The tasks cut their runs' blocks at the operator's block_target_bytes: a block of
        # more than one entry holds at most 64 payload bytes (and an incremental run's
        # validity bytes); whole key groups of 3 or more entries would not fit.
        with op.store.open(i) as r:
            for run in r.manifest["files"]:
                blocks = r.data_file(run).block_rows(0, run["blocks"])
                assert bool(((blocks["raw_length"] <= 72) | (blocks["entries"] == 1)).all())
