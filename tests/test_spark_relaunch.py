"""A Python worker lost after its task ended, before its background checkpoint write reported,
on a real local PySpark (local[2]): the driver finds the partition lost (no report, no
heartbeat) within seconds and re-runs the micro-batch under a new attempt id, which commits
the same state and output as an undisturbed run; a write that is slow but alive (its heartbeats
go on) is waited for, not re-run; with ``relaunch_attempts=0`` the loss fails the micro-batch
at once and Spark's replay restores the previous version.

The loss is made by a test hook, :class:`ExitInWrite`, set as the operator's ``_start_write``
(the tests' replacement of the worker-side write, pickled with the tasks): it exists only in
this file and is never active outside it.
"""

import os
import sys
import threading
import time
from concurrent.futures import Future

import pytest

from statecore.errors import StateError
from statecore.spark.checkpoint_write import start_snapshot_write
from test_spark_incremental import (
    CRASH_BATCHES,
    Model,
    _df,
    _model_state,
    _op,
    _rows_of,
    _state,
)

pytestmark = pytest.mark.spark

#: Fast heartbeats, so that a loss is found in about 1.5 s (the defaults are 2 s and 6 s).
HEARTBEAT = dict(heartbeat_interval_s=0.5, heartbeat_timeout_s=1.5)


class ExitInWrite:
    """Test hook (``StatefulOperator._start_write``): the Python worker that writes partition
    ``partition``'s checkpoint first dies (``os._exit``) inside that background write, once
    the micro-batch's Spark job has committed its output (``<output>/batch_id=<version>/
    _SUCCESS`` exists), i.e. after every task of the attempt ended -- a loss Spark does not
    see. The write that creates ``marker`` (O_EXCL, holding the worker's pid) is the one that
    dies, so a relaunch writes normally. Every other write is the real one."""

    def __init__(self, marker: str, output: str, partition: int = 0):
        self.marker = marker
        self.output = output
        self.partition = partition

    def __call__(self, store, snap, version, writer):
        if writer.startswith(f"p{self.partition}-"):
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                done = os.path.join(self.output, f"batch_id={version}", "_SUCCESS")
                fut: Future = Future()
                fut.set_running_or_notify_cancel()

                def die() -> None:
                    deadline = time.monotonic() + 120
                    while not os.path.exists(done) and time.monotonic() < deadline:
                        time.sleep(0.01)
                    os._exit(17)

                threading.Thread(target=die, daemon=True).start()
                return fut
        return start_snapshot_write(store, snap, version, writer)


class SlowWrite:
    """Test hook: every write starts ``seconds`` late (its heartbeats go on meanwhile)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, store, snap, version, writer):
        fut: Future = Future()
        fut.set_running_or_notify_cancel()

        def run() -> None:
            time.sleep(self.seconds)
            try:
                fut.set_result(store.write_snapshot(snap, version, writer=writer))
            except BaseException as exc:
                fut.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return fut


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_undisturbed(spark, root, upto: int):
    from pyspark import cloudpickle

    # The hooks of this module travel to the Python workers by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    op = _op(root, "native")
    model = Model()
    outs = []
    for i in range(upto):
        op(_df(spark, CRASH_BATCHES[i]), i)
        outs.append(model.batch(CRASH_BATCHES[i]))
    return op, model, outs


def test_worker_lost_after_its_task_relaunches_the_micro_batch(spark, tmp_path):
    op, model, _ = _run_undisturbed(spark, tmp_path, 2)
    op.heartbeat_interval_s = HEARTBEAT["heartbeat_interval_s"]
    op.heartbeat_timeout_s = HEARTBEAT["heartbeat_timeout_s"]
    marker = str(tmp_path / "died")
    op._start_write = ExitInWrite(marker, str(tmp_path / "out"))
    rep = op(_df(spark, CRASH_BATCHES[2]), 2)
    # The worker really died, in the first attempt, after its tasks ended.
    pid = int(open(marker).read())
    assert not _pid_alive(pid)
    assert (rep.relaunches, rep.lost_partitions) == (1, [0])
    assert op.store.metadata(2)["relaunches"] == 1
    # Found by its missing heartbeat before commit_timeout_s (300 s), whose expiry would have
    # failed the micro-batch instead.
    assert 0 < rep.phases["detect_s"] < op.commit_timeout_s, rep.phases
    # The relaunch loaded the committed version 1, never the lost attempt's state: its output
    # and state are those of an undisturbed run (a cached copy of the lost attempt would
    # apply batch 2 twice).
    assert _rows_of(str(tmp_path / "out" / "batch_id=2")) == model.batch(CRASH_BATCHES[2])
    assert op.store.metadata(2)["attempt"] != op.store.metadata(1)["attempt"]
    op._start_write = None
    for i in range(3, len(CRASH_BATCHES)):
        r = op(_df(spark, CRASH_BATCHES[i]), i)
        assert r.relaunches == 0
        assert _rows_of(str(tmp_path / "out" / f"batch_id={i}")) == model.batch(CRASH_BATCHES[i])
    assert _state(op.store, len(CRASH_BATCHES) - 1, 80) == _model_state(model, 80)


def test_slow_write_with_heartbeats_is_not_relaunched(spark, tmp_path):
    op, model, _ = _run_undisturbed(spark, tmp_path, 1)
    op.heartbeat_interval_s = HEARTBEAT["heartbeat_interval_s"]
    op.heartbeat_timeout_s = HEARTBEAT["heartbeat_timeout_s"]
    op._start_write = SlowWrite(3 * op.heartbeat_timeout_s)
    rep = op(_df(spark, CRASH_BATCHES[1]), 1)
    assert (rep.relaunches, rep.lost_partitions) == (0, [])
    assert rep.wait_seconds > op.heartbeat_timeout_s  # it did wait past a heartbeat timeout
    assert _rows_of(str(tmp_path / "out" / "batch_id=1")) == model.batch(CRASH_BATCHES[1])


def test_without_relaunches_the_loss_fails_the_micro_batch(spark, tmp_path):
    op, model, _ = _run_undisturbed(spark, tmp_path, 2)
    op.heartbeat_interval_s = HEARTBEAT["heartbeat_interval_s"]
    op.heartbeat_timeout_s = HEARTBEAT["heartbeat_timeout_s"]
    op.relaunch_attempts = 0
    op._start_write = ExitInWrite(str(tmp_path / "died"), str(tmp_path / "out"), partition=1)
    with pytest.raises(StateError, match=r"partitions \[1\] did not report their checkpoint"
                                         r".*relaunched 0 times"):
        op(_df(spark, CRASH_BATCHES[2]), 2)
    assert op.latest_version() == 1  # nothing committed
    # Spark's replay of the micro-batch restores version 1.
    op._start_write = None
    rep = op(_df(spark, CRASH_BATCHES[2]), 2)
    assert rep.relaunches == 0
    assert _rows_of(str(tmp_path / "out" / "batch_id=2")) == model.batch(CRASH_BATCHES[2])
    assert _state(op.store, 2, 80) == _model_state(model, 80)
