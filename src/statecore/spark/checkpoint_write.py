"""The asynchronous part of a task's checkpoint: writing the snapshot's data file in the
background, then recording the task's pending descriptor.

Exactly-once contract kept here (task side): a task *pre-commits*. Its data file
``data/<batch_id>/<writer>.sckp`` and then its pending descriptor
``pending/<batch_id>/<writer>.json`` (the write's descriptor plus the task's counters as
``spark_report``) are written, and nothing else: the version becomes visible only when the
driver commits it (:meth:`statecore.spark.PendingBatch.commit`). The pending descriptor is
recorded only once both the data file is complete and Spark took all of the task's output, so a
task whose output was cut short never reports; a failed write records a descriptor carrying an
``error`` instead, so the driver fails the micro-batch at once rather than at its timeout.
Every Spark task attempt has its own writer name, so one attempt's descriptor never pairs with
another attempt's bytes.

Liveness: while the write is in flight, a heartbeat ``pending/<batch_id>/<writer>.alive``
(partition, attempt, task attempt, host, pid and a beat counter) is put every
``heartbeat_interval_s``, the first one an interval after the write started (so a write that
ends sooner costs nothing). The driver tells a slow write (its beats go on) from one whose
process died after its task ended (no beat within its timeout): it re-runs the micro-batch
instead of waiting for ``commit_timeout_s`` (:class:`statecore.spark.PendingBatch`). Files, not
a call to the driver, so it works alike under Spark Connect and on object stores.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import Future
from typing import Callable, Dict, Optional

from statecore.errors import StateError

__all__ = ["checkpoint_in_background", "start_snapshot_write", "heartbeat_while",
           "DELAY_REPORT_ENV"]

#: Test hook, never set outside tests: seconds the background write sleeps before recording its
#: pending descriptor (heartbeats go on meanwhile), which makes the window between a task's end
#: and its report wide enough for a test to kill the executor in it
#: (``tests/test_spark_cluster.py``, ``spark.executorEnv``).
DELAY_REPORT_ENV = "STATECORE_TEST_DELAY_REPORT_S"


def heartbeat_while(store, version: int, writer: str, body: Dict, interval_s: float,
                    done: Future, max_s: Optional[float] = None) -> threading.Thread:
    """Until ``done`` resolves, put ``body`` plus ``beat`` (1, 2, ...) and ``time_ms`` (the
    writer's wall clock, for people; the driver only looks at ``beat`` changing) as the
    heartbeat of ``writer`` at ``version`` (:meth:`CheckpointStore.write_heartbeat`) every
    ``interval_s`` seconds, the first one an interval from now, for at most ``max_s`` seconds
    (None: no limit; past the driver's ``commit_timeout_s`` nobody reads them, and a write
    that hangs must not beat forever). Runs in a daemon thread (a worker that exits takes it
    along: then the beats stop, as they should) and returns it. A failed put is skipped: the
    driver then sees the write as lost sooner, which costs a re-run, never correctness."""
    stop = threading.Event()
    done.add_done_callback(lambda _f: stop.set())

    until = None if max_s is None else time.monotonic() + max_s

    def run() -> None:
        beat = 0
        while not stop.wait(interval_s):
            if until is not None and time.monotonic() > until:
                return
            beat += 1
            try:
                store.write_heartbeat(version, writer, dict(
                    body, beat=beat, time_ms=time.time_ns() // 1_000_000))
            except Exception:  # noqa: BLE001 -- see the docstring
                pass

    t = threading.Thread(target=run, name=f"statecore-heartbeat-{writer}", daemon=True)
    t.start()
    return t


def start_snapshot_write(store, snap, version: int, writer: str) -> Future:
    """Start writing ``snap`` as the data file of ``writer`` at ``version``; the Future resolves
    to the descriptor of :meth:`CheckpointStore.write_snapshot` (or its exception). Uses the
    store's own ``write_snapshot_async`` when it has one, else a plain non-daemon thread (a
    Python interpreter that exits normally finishes it first). Does not release ``snap`` (the
    caller does once the write ended): releasing map snapshots key group by key group as they
    are encoded (``release_snapshot=True``) makes the owner thread slower during the write, not
    faster (the benchmark case ``throughput_during_snapshot`` compares the two)."""
    native_async = getattr(store, "write_snapshot_async", None)
    if native_async is not None:
        # At the store's default nice 10 the write yields to everything else on a busy machine,
        # but the driver waits for it right after the action: it is on the micro-batch's
        # critical path, not background work.
        return native_async(snap, version, writer, nice=0)
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def run():
        try:
            fut.set_result(store.write_snapshot(snap, version, writer=writer))
        except BaseException as exc:  # handed to the Future's consumer
            fut.set_exception(exc)

    threading.Thread(target=run, name=f"statecore-write-{writer}", daemon=False).start()
    return fut


def checkpoint_in_background(store, snap, version: int, writer: str, report: dict,
                             start_write: Callable, output_done: Optional[Future] = None,
                             heartbeat_interval_s: Optional[float] = None,
                             heartbeat_max_s: Optional[float] = None) -> Future:
    """The asynchronous part of a task's checkpoint: write ``snap``'s data file, release the
    snapshot, then record the pending descriptor (``report`` as its ``spark_report``).
    ``snap`` None: a report without a data file (a task whose keyed state is in an external
    store); ``start_write`` then resolves to the bare ``{"version", "writer"}``. When the
    write fails, a pending descriptor carrying ``report["error"]`` is recorded instead, so the
    driver fails the micro-batch at once rather than at its timeout. ``output_done``
    (optional): a Future the task resolves to True once Spark took all of its output, False when
    the output was cut short; the descriptor waits for it and nothing is recorded after False
    (the returned Future then fails with StateError). Returns a Future that resolves (to the
    descriptor, or with the exception) once all of that is done. Adds ``write_s`` (seconds from
    the call to the end of the data file write) to ``report``.

    ``start_write(store, snap, version, writer)`` starts the data file write and returns its
    Future (:func:`start_snapshot_write`, or a test's replacement). The returned Future carries
    ``cancel_write``, which stops a running native write (used when a dropped cache entry's
    write outlives the driver's timeout). ``heartbeat_interval_s`` (> 0, optional): put a
    heartbeat while all of this is in flight, for at most ``heartbeat_max_s`` seconds
    (:func:`heartbeat_while`; ``report``'s partition, attempt and task attempt, this host and
    process)."""
    done: Future = Future()
    done.set_running_or_notify_cancel()
    t_start = time.perf_counter()
    if heartbeat_interval_s:
        heartbeat_while(store, version, writer, {
            "partition": report.get("partition"), "attempt": report.get("attempt"),
            "task_attempt": report.get("task_attempt"), "host": socket.gethostname(),
            "pid": os.getpid()}, heartbeat_interval_s, done, heartbeat_max_s)
    if output_done is None:
        output_done = Future()
        output_done.set_result(True)
    lock = threading.Lock()
    arrivals = [0]

    def finish(write: Future) -> None:
        if not output_done.result():
            done.set_exception(StateError(
                f"checkpoint {writer} of version {version}: the task's output was cut short; "
                "not reported"))
            return
        delay = os.environ.get(DELAY_REPORT_ENV)
        if delay:
            # The test hook reports later, never on the task's own thread (which runs this
            # when the write ended before Spark took the output): the task must end first.
            def late() -> None:
                time.sleep(float(delay))
                record(write)

            threading.Thread(target=late, name=f"statecore-late-{writer}", daemon=True).start()
            return
        record(write)

    def record(write: Future) -> None:
        try:
            desc = write.result()
            store.write_pending(version, writer, dict(desc, spark_report=report))
            done.set_result(desc)
        except BaseException as exc:
            try:
                store.write_pending(version, writer, {
                    "version": version, "writer": writer,
                    "spark_report": dict(report, error=f"{type(exc).__name__}: {exc}")})
            except BaseException:
                pass  # the driver's timeout reports it
            done.set_exception(exc)

    def written(_write: Future) -> None:
        # The snapshot pins copy-on-write memory: released as soon as its bytes are out.
        report["write_s"] = time.perf_counter() - t_start
        if snap is not None:
            snap.release()

    def arrive(_f: Future) -> None:
        # The data file and the task's output, in either order; the second records.
        with lock:
            arrivals[0] += 1
            last = arrivals[0] == 2
        if last:
            finish(write)

    try:
        write = start_write(store, snap, version, writer)
    except BaseException as exc:
        write = Future()
        write.set_exception(exc)
    # SnapshotWriteFuture.cancel stops a running write; a plain Future's cancel is a no-op then.
    done.cancel_write = write.cancel
    write.add_done_callback(written)
    write.add_done_callback(arrive)
    output_done.add_done_callback(arrive)
    return done

