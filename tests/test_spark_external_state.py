"""The Spark operator on external keyed state (``state_store=``, a real ``redis-server`` and a
real PostgreSQL server): a micro-batch is an epoch. Tasks pre-commit, the driver writes a
metadata-only manifest and commits after the sink; a replayed micro-batch discards its
uncommitted epoch or, committed, has no state effects; rescaling moves no data; a reader
outside the job sees committed epochs only."""

import os
import signal
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import ExternalStoreUnavailableError, InvalidInputError, StateError
from statecore.external import read_committed, read_committed_epoch, wal_keys
from statecore.spark import KeyedProcessor, StatefulOperator
from support.postgres_server import postgres_server  # noqa: F401  (fixture)
from support.redis_server import redis_server, redis_server_aof  # noqa: F401  (fixtures)

pytestmark = pytest.mark.spark

MAXP = 64
NS = "tests/counts"
OUT = pa.schema([("kind", pa.string()), ("k", pa.int64()), ("count", pa.int64()),
                 ("ts", pa.int64())])


@pytest.fixture(params=["redis", "postgres"])
def store_server(request):
    """A running server of each external store (``.url``, ``.kill()``, ``.start()``): Redis
    with its AOF (``appendfsync always``), PostgreSQL (a SIGKILLed server keeps what it
    acknowledged)."""
    return request.getfixturevalue("redis_server_aof" if request.param == "redis"
                                   else "postgres_server")


def _by_value():
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Count(KeyedProcessor):
    """Per key a running count; an event-time timer at ``t + 10`` per row, reported when it
    fires (``timer``) or at the final flush (``flush``)."""

    output_schema = OUT

    def open(self, ctx):
        self.count = ctx.backend.get_state(ValueStateDescriptor("count", "int64", default=0))

    def process_batch(self, batch, ctx):
        out = []
        rows = sorted(zip(batch.column("k").to_pylist(), batch.column("t").to_pylist()))
        for i, (k, t) in enumerate(rows):
            ctx.backend.set_current_key(k)
            self.count.update(self.count.value() + 1)
            ctx.backend.timers.register_event_time_timer(t + 10)
            if i + 1 == len(rows) or rows[i + 1][0] != k:
                out.append(("count", k, self.count.value(), None))
        if out:
            yield _batch(out)

    def _fire(self, ctx, wm, kind):
        out = []
        for ts, k, _ in ctx.backend.timers.advance_watermark(wm):
            ctx.backend.set_current_key(k)
            out.append((kind, k, self.count.value(), ts))
        if out:
            yield _batch(out)

    def on_watermark(self, ctx, watermark_ms):
        return self._fire(ctx, watermark_ms, "timer")

    def flush(self, ctx):
        return self._fire(ctx, 2**63 - 1, "flush")


def _batch(rows):
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(cols, OUT.types)],
                                      schema=OUT)


class Model:
    """Count under the operator's watermark rule, in plain Python."""

    def __init__(self):
        self.count, self.timers, self.wm = {}, set(), None

    def batch(self, rows):
        out = set()
        for k, t in rows:
            self.count[k] = self.count.get(k, 0) + 1
            self.timers.add((t + 10, k))
        out |= {("count", k, self.count[k], None) for k in {r[0] for r in rows}}
        if self.wm is not None:
            for ts, k in sorted(x for x in self.timers if x[0] <= self.wm):
                self.timers.discard((ts, k))
                out.add(("timer", k, self.count[k], ts))
        if rows:
            m = max(t for _, t in rows)
            self.wm = m if self.wm is None else max(self.wm, m)
        return out

    def flush(self):
        out = {("flush", k, self.count[k], ts) for ts, k in self.timers}
        self.timers.clear()
        return out


BATCHES = [
    [(k, 100 + k) for k in range(40)],
    [(k, 120 + k) for k in range(20, 60)] + [(3, 101)],
    [],
    [(k, 200) for k in range(0, 90, 3)],
    [(k, 230 + k) for k in range(50, 70)],
]


def _op(tmp_path, server, backend="native", parallelism=2, processor=None, **kw):
    _by_value()
    if backend == "native":
        pytest.importorskip("statecore.backends.native")
    return StatefulOperator("counts", processor or Count(), "k", str(tmp_path / "ckpt"),
                            output=str(tmp_path / "out"), parallelism=parallelism,
                            max_parallelism=MAXP, backend=backend, event_time_column="t",
                            state_store=server.url, state_namespace=NS, **kw)


def _df(spark, rows):
    return spark.createDataFrame(rows, "k bigint, t bigint")


def _rows(tmp_path, version):
    path = tmp_path / "out" / f"batch_id={version}"
    if not path.is_dir():
        return set()
    return {tuple(r.values()) for r in pq.read_table(str(path), schema=OUT).to_pylist()}


def _committed_counts(url):
    c = read_committed(url, NS, "count")
    return c.epoch, dict(zip(c.table.column("key").to_pylist(),
                             c.table.column("value").to_pylist()))


def _expected_counts():
    """{epoch: {key: count}} after each micro-batch of BATCHES."""
    m, out = Model(), {}
    for i, rows in enumerate(BATCHES):
        m.batch(rows)
        out[i] = dict(m.count)
    return out


@pytest.mark.parametrize("store,backend", [("redis", "native"), ("redis", "python"),
                                           ("postgres", "native")])
def test_micro_batches_are_epochs_and_rescale_moves_no_data(spark, tmp_path, request, store,
                                                            backend):
    server = request.getfixturevalue("redis_server" if store == "redis" else "postgres_server")
    want = _expected_counts()
    seen, errors, stop = [], [], threading.Event()

    def reader():
        # Outside the job: every read is one committed epoch, never a pre-committed one.
        while not stop.is_set():
            try:
                epoch, counts = _committed_counts(server.url)
            except InvalidInputError:
                continue  # nothing committed yet
            except Exception as exc:  # reported by the assertion below
                errors.append(exc)
                return
            seen.append(epoch)
            if epoch in want and counts != want[epoch]:
                errors.append(AssertionError(f"epoch {epoch}: {counts} != {want[epoch]}"))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    op = _op(tmp_path, server, backend, state_store_timeout_s=60)
    model = Model()
    try:
        for i, rows in enumerate(BATCHES):
            op.parallelism = (2, 3, 1, 2, 3)[i]
            rep = op(_df(spark, rows), i)
            assert (rep.version, rep.rows, rep.skipped) == (i, len(rows), False)
            assert _rows(tmp_path, i) == model.batch(rows), f"micro-batch {i}"
            assert _committed_counts(server.url) == (i, want[i])
            manifest = op.store.manifest(i)
            assert manifest["metadata"]["watermark_ms"] == model.wm
            assert manifest["metadata"]["state_store"] == {"namespace": NS}
            # A metadata-only manifest: the epoch's logs, no data files, no keyed state.
            ext = manifest["external"]
            assert (ext["store"], ext["namespace"], ext["epoch"]) == (store, NS, i)
            assert ext["base_epoch"] == (None if i == 0 else i - 1)
            assert len(ext["logs"]) == op.parallelism
            assert manifest["files"] == [] and manifest["states"] == []
            assert wal_keys(server.url, NS, i) == []  # applied and deleted
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors[:3]
    assert set(seen) <= set(want) and seen
    # The same parallelism twice in a row (batches 3 -> 4 ran with 2 then 3; 0 -> 1 too):
    # a new parallelism opens fresh backends that read through from the store.
    loads = [op.store.metadata(i)["loads"] for i in range(2, 5)]
    assert all(set(x) <= {"external", "cache"} for x in loads)
    # A replay of the latest committed micro-batch has no state effects and keeps its output.
    before = _rows(tmp_path, 4)
    rep = op(_df(spark, BATCHES[4]), 4)
    assert rep.skipped and _rows(tmp_path, 4) == before
    assert _committed_counts(server.url) == (4, want[4])
    op.parallelism = 2
    rep = op.flush(spark)
    assert rep.version == 5 and _rows(tmp_path, 5) == model.flush()
    assert read_committed_epoch(server.url, NS) == 5
    assert op.flush(spark) is None
    # No data files in the checkpoint: the manifests are all there is.
    assert not list((tmp_path / "ckpt").rglob("*.sckp"))


def test_uncommitted_epoch_is_discarded_when_the_batch_runs_again(spark, tmp_path,
                                                                  store_server):
    server = store_server
    want = _expected_counts()
    op = _op(tmp_path, server, "native", parallelism=2)
    op(_df(spark, BATCHES[0]), 0)
    # Micro-batch 1 runs up to the tasks' pre-commits and reports; the driver then dies
    # (nothing is committed): its logs are in the store, invisible to readers.
    pending = op.start(_df(spark, BATCHES[1]), 1)
    pending.wait()
    assert len(wal_keys(server.url, NS, 1)) == 2
    assert _committed_counts(server.url) == (0, want[0])
    # The restarted driver (a new operator object) runs micro-batch 1 with another
    # parallelism: the first attempt's logs are discarded, not applied.
    again = _op(tmp_path, server, "native", parallelism=3)
    again(_df(spark, BATCHES[1]), 1)
    assert _committed_counts(server.url) == (1, want[1])
    assert wal_keys(server.url, NS, 1) == []
    for i in (2, 3):
        again(_df(spark, BATCHES[i]), i)
    assert _committed_counts(server.url) == (3, want[3])


def test_store_and_checkpoint_must_belong_together(spark, tmp_path, store_server):
    op = _op(tmp_path / "a", store_server, "python")
    op(_df(spark, BATCHES[0]), 0)
    # Another checkpoint on the same namespace: the store is ahead of it.
    other = _op(tmp_path / "b", store_server, "python")
    with pytest.raises(StateError, match="another checkpoint"):
        other(_df(spark, BATCHES[0]), 0)
    # An in-memory operator on the external checkpoint (and back) is refused.
    mem = StatefulOperator("counts", Count(), "k", str(tmp_path / "a" / "ckpt"),
                           output=str(tmp_path / "a" / "out"), parallelism=2,
                           max_parallelism=MAXP, backend="python", event_time_column="t")
    with pytest.raises(InvalidInputError, match="external store"):
        mem(_df(spark, BATCHES[1]), 1)
    with pytest.raises(InvalidInputError, match="state_store") as e:
        StatefulOperator("counts", Count(), "k", str(tmp_path), output=str(tmp_path),
                         state_store="mysql://user:secret@x/y")
    assert "secret" not in str(e.value)
    with pytest.raises(InvalidInputError, match="state_store"):
        StatefulOperator("counts", Count(), "k", str(tmp_path), output=str(tmp_path),
                         state_namespace="x")
    for bad in (0, -1.0, float("nan"), "10", True):
        with pytest.raises(InvalidInputError, match="state_store_timeout_s"):
            StatefulOperator("counts", Count(), "k", str(tmp_path), output=str(tmp_path),
                             state_store=store_server.url, state_store_timeout_s=bad)


def test_store_down_fails_the_batch_and_a_restart_finishes_it(spark, tmp_path, store_server):
    server = store_server
    want = _expected_counts()
    op = _op(tmp_path, server, "native", parallelism=2)
    for i in (0, 1):
        op(_df(spark, BATCHES[i]), i)
    # The server dies between the tasks' pre-commits and the driver's commit: the manifest
    # (the commit decision) is written, the store's commit fails with a clear error.
    pending = op.start(_df(spark, BATCHES[2]), 2)
    pending.wait()
    server.kill()
    with pytest.raises(ExternalStoreUnavailableError, match="committing epoch 2"):
        pending.commit()
    # Down at the start of a micro-batch: nothing runs.
    with pytest.raises(ExternalStoreUnavailableError, match="unreachable"):
        op(_df(spark, BATCHES[2]), 2)
    server.start()  # every acknowledged write is kept, the logs of epoch 2 included
    assert read_committed_epoch(server.url, NS) == 1
    # The restarted driver finishes the decided commit; Spark's replay of 2 has nothing to do.
    again = _op(tmp_path, server, "native", parallelism=2)
    assert again(_df(spark, BATCHES[2]), 2).skipped
    assert _committed_counts(server.url) == (2, want[2])
    for i in (3, 4):
        again(_df(spark, BATCHES[i]), i)
    assert _committed_counts(server.url) == (4, want[4])


class CountThenHold(Count):
    """Count, except that the first task to claim ``hold_dir`` applies its rows, writes its
    Python worker's pid to ``hold_dir/pid`` and waits there (at most ``hold_s``) to be killed:
    a task killed mid-epoch, its changes only in the worker's memory."""

    def __init__(self, hold_dir, hold_s=120.0):
        self.hold_dir, self.hold_s = hold_dir, hold_s

    def process_batch(self, batch, ctx):
        out = list(super().process_batch(batch, ctx))
        try:
            fd = os.open(os.path.join(self.hold_dir, "claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            yield from out
            return
        os.close(fd)
        tmp = os.path.join(self.hold_dir, "pid.tmp")
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, os.path.join(self.hold_dir, "pid"))
        time.sleep(self.hold_s)
        raise RuntimeError("the held task was not killed")


def test_a_task_killed_mid_epoch_then_the_batch_runs_again(spark, tmp_path, store_server):
    server = store_server
    want, model = _expected_counts(), Model()
    op = _op(tmp_path, server, "native", parallelism=2)
    op(_df(spark, BATCHES[0]), 0)
    assert _rows(tmp_path, 0) == model.batch(BATCHES[0])
    # Micro-batch 1: one task applies its rows and is SIGKILLed (its Python worker) before
    # it pre-commits; the other may have pre-committed. The micro-batch fails.
    hold = tmp_path / "hold"
    hold.mkdir()
    killed = _op(tmp_path, server, "native", parallelism=2, processor=CountThenHold(str(hold)))
    failure = []
    run = threading.Thread(target=lambda: _record_failure(
        failure, lambda: killed(_df(spark, BATCHES[1]), 1)), daemon=True)
    run.start()
    deadline = time.monotonic() + 90
    while not (hold / "pid").exists():
        assert time.monotonic() < deadline and run.is_alive(), (
            f"the held task never started: {failure}")
        time.sleep(0.05)
    os.kill(int((hold / "pid").read_text()), signal.SIGKILL)
    run.join(120)
    assert not run.is_alive() and failure, "the micro-batch did not fail"
    assert _committed_counts(server.url) == (0, want[0])
    # The restarted driver runs micro-batch 1 again (another parallelism): the killed
    # attempt left nothing visible, nothing is counted twice.
    again = _op(tmp_path, server, "native", parallelism=3)
    for i in range(1, len(BATCHES)):
        again(_df(spark, BATCHES[i]), i)
        assert _rows(tmp_path, i) == model.batch(BATCHES[i]), f"micro-batch {i}"
        assert _committed_counts(server.url) == (i, want[i])
        assert wal_keys(server.url, NS, i) == []


def _record_failure(failures, fn):
    try:
        fn()
    except Exception as exc:  # the test asserts that there was one
        failures.append(exc)


@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_operator_state_is_committed_with_the_epochs_across_rescales(spark, tmp_path, request,
                                                                      store):
    """ctx.operator_state on an external store behaves as on in-memory state
    (tests/test_spark_operator_state.py, whose processor and expectations this reuses): each
    partition's even-split list, union list and broadcast state come back for its operator
    index, redistributed when the parallelism changes; kept backends included."""
    from pyspark import cloudpickle

    import test_spark_operator_state as ref

    cloudpickle.register_pickle_by_value(ref)
    server = request.getfixturevalue(f"{store}_server")
    op = StatefulOperator("tasks", ref.TaskLog(), "k", str(tmp_path / "ckpt"),
                          output=str(tmp_path / "out"), parallelism=2, max_parallelism=MAXP,
                          state_store=server.url, state_namespace="tests/operator-state")
    parallelisms = [2, 2, 3, 1, 4, 2]
    lists, union = None, None
    for b, n in enumerate(parallelisms):
        op.parallelism = n
        op(spark.createDataFrame([(k, 1) for k in range(b * 3)], "k bigint, v bigint"), b)
        got = pq.read_table(str(tmp_path / "out" / f"batch_id={b}"),
                            schema=ref.SCHEMA).to_pylist()
        got = sorted(got, key=lambda r: r["partition"])
        assert [r["partition"] for r in got] == list(range(n)), f"micro-batch {b}"
        new_lists = []
        for i, r in enumerate(got):
            own = [] if lists is None else ref._split(lists, n, i)
            assert r["own"] == own, f"micro-batch {b}, partition {i}"
            assert r["union"] == ([] if union is None else union)
            assert r["rules_batch"] == (None if b == 0 else b - 1)
            new_lists.append(own + [b * 100 + i])
        lists, union = new_lists, [b * 100 + i for i in range(n)]
    assert read_committed_epoch(server.url, "tests/operator-state") == len(parallelisms) - 1
    op.close()
