"""Heartbeats of background checkpoint writes and how the driver reads them, without Spark: a
write in flight puts ``pending/V/<writer>.alive`` with a growing beat until it ends (none for a
write shorter than the interval); descriptors and heartbeats do not mix; the driver's wait
(:class:`statecore.spark.PendingBatch`) counts a partition as lost only when its beats stop
(or never came) for the heartbeat timeout after the action, and waits for one that beats.
The end-to-end relaunch on PySpark is tests/test_spark_relaunch.py."""

import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import pytest

from statecore.checkpoint import CheckpointStore
from statecore.errors import InvalidInputError, StateError
from statecore.spark import KeyedProcessor, PendingBatch, StatefulOperator
from statecore.spark.checkpoint_write import checkpoint_in_background, heartbeat_while

INTERVAL = 0.05


class Nothing(KeyedProcessor):
    output_schema = pa.schema([("k", pa.int64())])

    def process_batch(self, batch, ctx):
        return ()


def _beats(store, version):
    return {(h["writer"], h["partition"]): h["beat"] for h in store.heartbeats(version)}


def test_heartbeat_beats_while_in_flight_then_stops(tmp_path):
    store = CheckpointStore(str(tmp_path / "root"))
    done: Future = Future()
    t = heartbeat_while(store, 3, "p1-abc-t0", {"partition": 1, "attempt": "abc"}, INTERVAL, done)
    deadline = time.monotonic() + 30
    while _beats(store, 3).get(("p1-abc-t0", 1), 0) < 3:
        assert time.monotonic() < deadline
        time.sleep(INTERVAL / 2)
    (hb,) = store.heartbeats(3)
    assert hb["version"] == 3 and hb["attempt"] == "abc" and isinstance(hb["time_ms"], int)
    assert store.pending(3) == []  # heartbeats are not descriptors
    done.set_result(None)
    t.join(10)
    assert not t.is_alive()
    last = _beats(store, 3)
    time.sleep(4 * INTERVAL)
    assert _beats(store, 3) == last
    store.clear_pending(3)
    assert store.heartbeats(3) == []
    with pytest.raises(InvalidInputError):
        store.write_heartbeat(3, "p1-abc-t0", {"x": object()})


def test_heartbeat_stops_after_its_limit(tmp_path):
    store = CheckpointStore(str(tmp_path / "root"))
    # The write never ends; the beats do, after max_s (at most one interval late).
    t = heartbeat_while(store, 0, "p0-a-t0", {"partition": 0}, INTERVAL, Future(),
                        max_s=10 * INTERVAL)
    t.join(10)
    assert not t.is_alive()
    assert _beats(store, 0).get(("p0-a-t0", 0), 0) <= 11


def _snap():
    from statecore.backends import create_backend

    b = create_backend("python", key_type="int64", max_parallelism=8)
    return b, b.snapshot(incremental=False)


def test_a_write_shorter_than_the_interval_puts_no_heartbeat(tmp_path):
    store = CheckpointStore(str(tmp_path / "root"))
    backend, snap = _snap()
    report = {"partition": 0, "attempt": "a", "task_attempt": 0}

    def slow_write(store, snap, version, writer):
        fut: Future = Future()

        def run():
            time.sleep(6 * INTERVAL)
            fut.set_result(store.write_snapshot(snap, version, writer=writer))

        threading.Thread(target=run).start()
        return fut

    def fast_write(store, snap, version, writer):
        fut: Future = Future()
        fut.set_result(store.write_snapshot(snap, version, writer=writer))
        return fut

    checkpoint_in_background(store, snap, 0, "p0-a-t0", dict(report), slow_write,
                             heartbeat_interval_s=INTERVAL).result(30)
    assert [h["writer"] for h in store.heartbeats(0)] == ["p0-a-t0"]
    assert [d["writer"] for d in store.pending(0)] == ["p0-a-t0"]
    snap2 = backend.snapshot(incremental=False)
    checkpoint_in_background(store, snap2, 1, "p0-a-t0", dict(report), fast_write,
                             heartbeat_interval_s=10.0).result(30)
    assert store.heartbeats(1) == [] and [d["writer"] for d in store.pending(1)] == ["p0-a-t0"]
    backend.close()


def _pending(tmp_path, n=2, **kw) -> PendingBatch:
    op = StatefulOperator("op", Nothing(), "k", str(tmp_path / "ckpt"), output=str(tmp_path),
                          backend="python", heartbeat_interval_s=INTERVAL,
                          heartbeat_timeout_s=10 * INTERVAL, **kw)
    return PendingBatch(op, 5, "att", n, "int64", False, {}, None, None, time.perf_counter())


def _report(store, version, partition, attempt="att"):
    """A pending descriptor of ``partition`` as a finished write records it."""
    backend, snap = _snap()
    writer = f"p{partition}-{attempt}-t0"
    desc = store.write_snapshot(snap, version, writer=writer)
    snap.release()
    backend.close()
    store.write_pending(version, writer, dict(desc, spark_report={
        "partition": partition, "attempt": attempt, "task_attempt": 0}))


def test_wait_finds_a_partition_without_report_or_heartbeat_lost(tmp_path):
    p = _pending(tmp_path, relaunch_attempts=0, commit_timeout_s=60)
    _report(p.op.store, 5, 0)
    _report(p.op.store, 5, 1, attempt="older")  # another attempt's report does not count
    with pytest.raises(StateError, match=r"partitions \[1\] did not report .*relaunched 0 times"):
        p.wait()
    assert p.lost_partitions == [1]
    assert p.phases["detect_s"] >= p.op.heartbeat_timeout_s


def test_wait_waits_for_a_partition_that_beats(tmp_path):
    p = _pending(tmp_path, relaunch_attempts=0, commit_timeout_s=60)
    store = p.op.store
    _report(store, 5, 0)
    done: Future = Future()
    heartbeat_while(store, 5, "p1-att-t0", {"partition": 1, "attempt": "att"}, INTERVAL, done)
    # Reports after more than two heartbeat timeouts: not lost meanwhile.
    timer = threading.Timer(24 * INTERVAL, lambda: (_report(store, 5, 1), done.set_result(None)))
    timer.start()
    parts = p.wait()
    timer.join()
    assert [r["partition"] for r in parts] == [0, 1] and p.relaunches == 0


def test_wait_relaunches_and_takes_the_new_attempt(tmp_path):
    p = _pending(tmp_path, relaunch_attempts=1, commit_timeout_s=60)
    store = p.op.store
    _report(store, 5, 0)
    calls = []

    def relaunch() -> PendingBatch:
        # What StatefulOperator._launch leaves behind: the new attempt's tasks all reported.
        calls.append(1)
        for i in range(2):
            _report(store, 5, i, attempt="att2")
        fresh = PendingBatch(p.op, 5, "att2", 2, "int64", False, {}, None, None,
                             time.perf_counter())
        return fresh

    p._relaunch = relaunch
    parts = p.wait()
    assert calls == [1] and p.relaunches == 1 and p.lost_partitions == [1]
    assert p.attempt == "att2" and {r["attempt"] for r in parts} == {"att2"}
    assert p.phases["detect_s"] >= p.op.heartbeat_timeout_s


def test_the_late_report_hook_never_delays_the_task_thread(tmp_path, monkeypatch):
    """DELAY_REPORT_ENV (the cluster test's hook) delays the descriptor, on a thread of its
    own, also when the task's thread resolves the output last (it then runs the report)."""
    from statecore.spark.checkpoint_write import DELAY_REPORT_ENV, start_snapshot_write

    monkeypatch.setenv(DELAY_REPORT_ENV, str(10 * INTERVAL))
    store = CheckpointStore(str(tmp_path / "root"))
    backend, snap = _snap()
    output_done: Future = Future()
    report = {"partition": 0}
    done = checkpoint_in_background(store, snap, 0, "p0-a-t0", report, start_snapshot_write,
                                    output_done, heartbeat_interval_s=INTERVAL)
    deadline = time.monotonic() + 30
    while "write_s" not in report:  # the data file is written
        assert time.monotonic() < deadline
        time.sleep(INTERVAL / 2)
    output_done.set_result(True)  # as the task's thread does: returns before the report
    assert not done.done() and store.pending(0) == []
    assert done.result(30)["writer"] == "p0-a-t0"
    assert [d["writer"] for d in store.pending(0)] == ["p0-a-t0"]
    backend.close()
