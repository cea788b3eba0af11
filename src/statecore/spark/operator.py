"""The statecore Structured Streaming operator: keyed state with exactly-once checkpoints for a
Python processor, built from ``foreachBatch`` + ``repartitionById`` + ``mapInArrow``.

This module is the driver side (:class:`StatefulOperator`, :class:`PendingBatch`,
:func:`commit_batches`, :class:`BatchReport`, :func:`parquet_batch_sink`). The task side, which
runs in PySpark's Python workers, is :mod:`statecore.spark.task` (the ``mapInArrow`` function),
:mod:`statecore.spark.checkpoint_write` (its background checkpoint write),
:mod:`statecore.spark.worker_cache` and :mod:`statecore.spark.handoff` (state kept in and moved
between workers) and :mod:`statecore.spark.worker_gc` (worker process tuning).

Each micro-batch and each flush produces one state version ``v``; for a micro-batch ``v`` is the
Spark ``batch_id`` plus the offset of the current run (0 until a non-final flush;
:mod:`statecore.spark.versions` places micro-batches and flushes and records the mapping in
the version's metadata). Below, ``batch_id`` stands for ``v`` where versions are meant.

Exactly-once contract kept by the driver: it commits version ``batch_id`` once, and only after
the sink's action succeeded and every partition of this attempt pre-committed (recorded its
pending descriptor); it commits before ``foreachBatch`` returns; and it never commits a
version whose predecessor ``batch_id - 1`` is not the committed one the tasks loaded. Tasks
only pre-commit; a replayed micro-batch reloads ``batch_id - 1`` and overwrites its own
output (the sink is called with the version, which no other micro-batch or flush shares).

One micro-batch (``StatefulOperator.__call__(df, batch_id)``, used as the ``foreachBatch``
function, or called from one):

1. Driver: read the manifest of version ``batch_id - 1`` (watermark, attempt id); route the
   micro-batch by ``repartitionById(n, op)`` with ``op = (pmod(xxhash64(key), maxP) * n) div
   maxP`` computed in Spark SQL inside the partitioning expression (no key-group column, no
   ``op`` column: the task's Spark partition id is its operator index); ``mapInArrow(task)``;
   hand the result to the sink, whose action runs the tasks. Spark runs the Python function of
   every partition of the shuffle, empty ones included, so every partition checkpoints and
   fires its timers each micro-batch, with or without input. (The end-of-input flush, which
   has no input, routes one *control row* per partition instead: a null key and its index.)
2. Task (partition ``i``, in a Python worker, :class:`statecore.spark.task.TaskSpec`): its
   key-group range is Flink's
   ``computeKeyGroupRangeForOperatorIndex(maxP, n, i)``. State at version ``batch_id - 1`` comes
   from the in-process cache when this worker process produced exactly that committed version
   (same attempt, and its data file is one of the writers the driver committed) for this
   (checkpoint, operator, partition, n, maxP) — PySpark reuses workers, but a partition lands on
   the same worker only about half the time, so after each task a worker also brings its copies
   of other partitions up to the version the driver commits, in the background (``standby``),
   which makes those a cache hit too — else caught up from an older committed copy
   of the partition that this worker kept (``stale_copies``: the runs committed since are
   applied, :meth:`CheckpointStore.open_changes`), and otherwise is restored from the checkpoint
   store (only the key groups of the range, from whichever runs cover them, which is also how a
   restart with another ``n`` re-splits key groups). The processor runs (its output batches
   stream to the sink while it runs). Then the checkpoint, in two parts:

   * synchronous: ``backend.snapshot(incremental=...)`` — O(1) to O(changes), isolated from
     later writes;
   * asynchronous (a background thread of the worker, or the store's ``write_snapshot_async``):
     write the run ``data/<batch_id>/p<i>-<attempt>-t<task attempt>.sckp``, release the
     snapshot, then record the pending descriptor ``pending/<batch_id>/<same writer>.json``
     (descriptor + the task's counters as ``spark_report``; files rather than an accumulator, so
     the commit does not rely on the driver's SparkContext). A failed write records a pending
     descriptor with an ``error`` instead.

   The task returns as soon as the write started, so the write overlaps the rest of the sink's
   work, the other partitions' tasks and the next operator's job. (A worker that Spark does not
   reuse — ``spark.python.worker.reuse=false`` — exits with ``os._exit`` after the task, so there
   the task waits for its write.) Each Spark task attempt writes its own file, so a retried or
   speculative attempt can never pair one attempt's descriptor with another's bytes.
3. Driver, after the sink's action returned (:meth:`PendingBatch.commit`): wait until every
   partition of this attempt recorded its pending descriptor (at most ``commit_timeout_s``;
   a partition whose write is lost -- no report and no heartbeat, see below -- makes it run the
   micro-batch again under a new attempt id, up to ``relaunch_attempts`` times), commit
   version ``batch_id`` (the manifest carries the watermark for the next batch, the attempt id
   and the committed writers), clear the pending descriptors and apply retention
   (``retain_versions``). The store compacts a version whose run chain grew past ``max_runs``.

Incremental checkpoints
-----------------------
Version 0 (no predecessor) is written full. Every later version is incremental: the changes
since the backend's base (tombstones for removals), stored as new runs on top of the previous
version's runs (``checkpoint/store.py`` "Runs and versions"). The base is either the restored
state (a task that restored ``batch_id - 1`` from the store) or, for a backend taken from the
worker cache, its own snapshot of ``batch_id - 1``: the cache entry keeps that snapshot's id and
the task calls ``backend.notify_checkpoint_complete(id)`` once it knows the driver committed
that version with that very data file (``attempt`` and ``writers`` of the manifest) — the
Flink ``notifyCheckpointComplete`` rule: the base moves only to a durable checkpoint. If the
commit never happened (failed batch, replay) the entry does not match and the next task
restores from the store instead, so an incremental run is never relative to an uncommitted one.

Why the driver waits before ``foreachBatch`` returns (exactly-once vs asynchronous writes)
-----------------------------------------------------------------------------------------
Spark records micro-batch ``v`` in its commit log when ``foreachBatch(v)`` returns and never
runs ``v`` again after that. If the operator returned while state ``v`` was still being written,
a crash right then would leave Spark past ``v`` and statecore without version ``v``: batch
``v + 1`` would have no predecessor (or silently miss ``v``'s updates). So version ``v`` is
committed (manifest written) before ``foreachBatch`` returns; what is asynchronous is only the
part between the snapshot and that commit. With several operators in one ``foreachBatch`` (the
demo has two), each :meth:`StatefulOperator.start` runs its sink's action without committing
and :func:`commit_batches` then waits for all of them and commits them at the end, so the
writes of the first operator overlap the second operator's job. A background write that fails
reports its error at once: nothing is committed, ``foreachBatch`` raises, and Spark replays
``v``, which restores ``v - 1``.

A background write whose process died after its task ended (an executor lost between the end
of its tasks and their reports) is a failure Spark cannot see: its job succeeded. While a write
is in flight it puts a heartbeat every ``heartbeat_interval_s``
(:mod:`statecore.spark.checkpoint_write`); the driver counts a partition that neither reported
nor beat for ``heartbeat_timeout_s`` after the action as lost and runs the micro-batch again
(:meth:`PendingBatch.wait`): same version, placement and processing time, a new attempt id, so
the tasks reload ``v - 1`` (a worker cache holds the lost attempt's state under its attempt id,
which no task asks for) and the sink overwrites its output of ``v``. The lost attempt's files
are never committed. Past ``relaunch_attempts`` re-runs, or when a write that still beats does
not report within ``commit_timeout_s``, the micro-batch fails with StateError as above.

A micro-batch replayed after a failure restores ``batch_id - 1`` again and its sink overwrites
its own output, so state and output are exactly-once if the processor is deterministic and the
sink is idempotent per batch id (the default sink overwrites ``OUTPUT/batch_id=N/``).

Flushes: :meth:`StatefulOperator.flush` runs one more version (``latest + 1``) without input.
The final one (the end of all input) calls ``processor.flush`` in every partition and is
committed with ``"final": true``; a finalized checkpoint accepts no further micro-batches. A
non-final one (``final=False``, the end of one run of a scheduled job) runs every partition as a
micro-batch without rows (``on_watermark`` with the watermark the input so far allows, then
``on_processing_time``) and keeps the checkpoint open for the next run. A rerun of either after
its commit is a no-op.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import pyarrow as pa

from statecore.checkpoint.compaction import DEFAULT_SIZE_RATIO, check_size_ratio
from statecore.checkpoint.layout import is_uri, join_uri
from statecore.errors import CheckpointNotFoundError, InvalidInputError, StateError
from statecore.key_groups import check_max_parallelism
from statecore.spark.external_commit import (
    begin_epoch,
    check_state_store,
    check_store_cache,
    close_driver_store,
    commit_version_epoch,
)
from statecore.spark.processor import KeyedProcessor
from statecore.spark.routing import OPERATOR_INDEX_COLUMN, backend_key_type, operator_index_of
from statecore.spark.task import TaskSpec
from statecore.spark.versions import QUERY_ID_PROPERTY, Placement, place_flush, place_micro_batch
from statecore.spark.watermark import next_watermark, parse_watermark_delay
from statecore.spark.worker_cache import clear_state_cache

__all__ = ["StatefulOperator", "PendingBatch", "BatchReport", "commit_batches",
           "parquet_batch_sink", "clear_state_cache", "operator_root", "BROADCAST_MAX_BYTES"]

#: Largest broadcast table a micro-batch takes: bytes of its Arrow IPC stream, which travels
#: with every task of the micro-batch (the task spec is serialized into the Spark plan).
BROADCAST_MAX_BYTES = 64 * 1024 * 1024


def _processor_config(processor) -> Any:
    """``processor.config()`` as canonical JSON data (None when the processor has no config)."""
    import json

    cfg = processor.config() if hasattr(processor, "config") else None
    try:
        return json.loads(json.dumps(cfg, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"processor.config() must return JSON-able data: {exc}") from exc


def _broadcast_payload(broadcast, what: str):
    """``(ipc, meta)`` of a micro-batch's broadcast input, or ``(None, None)`` without one.

    ``broadcast``: a ``pyarrow.Table`` or a Spark DataFrame (classic or Connect), which is
    collected on the driver with ``toArrow()``. ``ipc``: the table, chunks combined, as one
    Arrow IPC stream (what the tasks decode); ``meta``: what the version's metadata records,
    ``{"rows", "bytes", "sha256"}`` (SHA-256 of that stream, schema included). Raises
    InvalidInputError for another type or a stream larger than :data:`BROADCAST_MAX_BYTES`,
    naming its size."""
    if broadcast is None:
        return None, None
    if not isinstance(broadcast, pa.Table):
        to_arrow = getattr(broadcast, "toArrow", None)
        if not callable(to_arrow) or not hasattr(broadcast, "sparkSession"):
            raise InvalidInputError(
                f"{what}: broadcast must be a pyarrow.Table or a Spark DataFrame, got "
                f"{type(broadcast).__name__}")
        broadcast = to_arrow()
    table = broadcast.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    ipc = sink.getvalue().to_pybytes()
    if len(ipc) > BROADCAST_MAX_BYTES:
        raise InvalidInputError(
            f"{what}: the broadcast table ({table.num_rows} rows) is {len(ipc)} bytes as Arrow "
            f"IPC, above the limit of {BROADCAST_MAX_BYTES} bytes (BROADCAST_MAX_BYTES); it "
            "travels with every task: join large tables as input instead")
    meta = {"rows": table.num_rows, "bytes": len(ipc),
            "sha256": hashlib.sha256(ipc).hexdigest()}
    return ipc, meta


def _require_native_backend() -> None:
    """StateError unless the native backend imports here (the driver), naming the way out;
    a driver without it would otherwise fail every task on the workers instead."""
    try:
        import statecore.backends.native  # noqa: F401
    except ImportError as exc:
        raise StateError(
            "backend='native' (the default) needs the compiled extension statecore._native, "
            f"which does not import here ({exc}); install statecore with its extension (pip "
            "install . builds it) or pass backend='python'") from exc


def _installed_roots() -> List[str]:
    """Directories whose modules a Python worker imports by name on any node: the standard
    library and the site-packages of this interpreter (absolute, normalized)."""
    import site
    import sysconfig

    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    try:
        roots.update(site.getsitepackages())
    except AttributeError:  # some virtualenv versions' site module lacks it
        pass
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        roots.add(user)
    return [os.path.realpath(r) for r in roots]


def _needs_shipping(module) -> bool:
    """True when the workers cannot import ``module`` by name: a file module or package that
    is not inside the standard library or a site-packages directory (e.g. a ``.py`` file next
    to the driver script, found through the driver's ``sys.path`` only). ``__main__`` and
    modules without a file are pickled by value by cloudpickle already; statecore itself must
    be installed on the workers anyway."""
    name = module.__name__
    if name == "__main__" or name.split(".")[0] == "statecore":
        return False
    path = getattr(module, "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not any(path.startswith(root + os.sep) for root in _installed_roots())


def _ship_processor_modules(processor) -> List[str]:
    """Make the processor's class reach the Python workers: for each class of its MRO whose
    module the workers cannot import by name (:func:`_needs_shipping`), register the module's
    top-level package (or the module itself) with PySpark's cloudpickle for pickling by value,
    so the class and everything defined beside it travel with the task. Returns the names
    registered. Without pyspark there is nothing to ship to. Raises InvalidInputError when the
    registration is impossible, saying how to ship the module instead (Spark's ``addPyFile``
    or installing it on the workers)."""
    import sys

    try:
        from pyspark import cloudpickle
    except ImportError:
        return []
    shipped: List[str] = []
    for cls in type(processor).__mro__:
        module = sys.modules.get(cls.__module__)
        if module is None or not _needs_shipping(module):
            continue
        top = sys.modules.get(module.__name__.split(".")[0], module)
        target = top if _needs_shipping(top) else module
        if target.__name__ in shipped:
            continue
        try:
            cloudpickle.register_pickle_by_value(target)
        except Exception as exc:
            raise InvalidInputError(
                f"the processor's class {cls.__qualname__} is defined in module "
                f"{module.__name__} ({module.__file__}), which the Spark workers cannot import "
                f"and which cannot be shipped by value ({exc}); ship it with "
                f"spark.sparkContext.addPyFile({module.__file__!r}) (a package: a .zip of it; "
                "under Spark Connect spark.addArtifacts(path, pyfile=True)) or install it on "
                "the workers") from exc
        shipped.append(target.__name__)
    return shipped


def parquet_batch_sink(output_path: str) -> Callable:
    """A sink idempotent per version: overwrite ``<output_path>/batch_id=<N>/`` with Parquet,
    ``N`` the state version the operator passes (the Spark batch id until a non-final flush).

    Spark's file commit protocol makes the directory appear complete or not at all; a replayed
    batch replaces it. Reading ``output_path`` with Spark yields a ``batch_id`` column through
    partition discovery.
    """
    root = output_path.rstrip("/")

    def sink(out_df, batch_id: int) -> None:
        out_df.write.mode("overwrite").parquet(f"{root}/batch_id={int(batch_id)}")

    return sink


@dataclass
class BatchReport:
    """What one committed version cost and produced (driver side).

    ``checkpoint_bytes``: bytes of the data files written for this version (the new runs);
    ``checkpoint_total_bytes``: bytes of every run the committed manifest lists (what a restore
    reads); ``incremental``: every partition wrote an incremental run; ``wait_seconds``: time
    the driver waited for background checkpoint writes after the sink's action; ``seconds``:
    from the start of the micro-batch to its commit; ``ttl_expired``: {TTL cleanup strategy:
    expired values, list elements and map entries removed} over all partitions since their
    previous snapshots (the manifest's ``ttl_expired``).

    Where the time went (seconds, ``time.perf_counter`` differences): ``phases``, on the driver:
    ``plan_s`` (manifest reads, checks, building the plan), ``action_s`` (the sink's action,
    i.e. the Spark job that runs the tasks), ``wait_s`` (= ``wait_seconds``), ``commit_s``
    (manifest, pending cleanup, retention); ``partitions``, one dict per partition from its
    task: ``partition``, ``pid`` (worker process that ran the task), ``load`` ("empty", "cache",
    "handoff", "standby", "catch-up", "checkpoint"; "handoff": the worker Spark gave the task to
    handed it to the worker of its host that held the partition, which ran it on its cache hit,
    see ``StatefulOperator(handoff=)``; "standby": a cache hit on a copy that the worker brought
    up to date between its tasks, see ``StatefulOperator(standby=)``), ``load_s`` (cache take or
    restore, plus ``processor.open``; before the input is read), ``load_cpu_s`` (CPU seconds of
    the thread that restored or caught up; 0 for the other loads), ``restore_bytes`` (bytes the
    restore or catch-up read from the checkpoint's data files: the ranges of the partition's key
    groups in each run, and the runs' footers; 0 for the other loads), ``standby_cpu_s`` (CPU
    seconds the standby spent on that copy, between the tasks; 0 for the other loads),
    ``input_s`` (receiving the routed input; 0 for a processor with ``chunked_input``, whose
    input arrives during ``process_s``), ``process_s``, ``snapshot_s`` (the synchronous
    snapshot), ``task_s`` (task start to snapshot), ``write_s`` (the background data file
    write), ``gc_frozen_objects`` (``gc.get_freeze_count()`` of the worker right after its last
    freeze, 0 without one; see ``freeze_worker_gc``); with ``state_store``, the task's share
    of its cache's counters: ``cache_hits``, ``cache_misses`` (accesses served from the cache
    or reading key groups through), ``cache_key_groups_read``, ``cache_evictions`` (key groups
    evicted; docs/external-state.md "The cache in front").

    The version: ``version`` (the state version committed), ``batch_id`` (the Spark batch id,
    None for a flush), ``flush`` (a flush), ``final`` (the final flush), ``skipped`` (Spark
    replayed a micro-batch committed before the latest flush: nothing ran, the other fields
    come from its version's metadata when retention kept it), ``watermark_ms`` (the committed
    watermark, handed to the next micro-batch), ``processing_time_ms`` (ms since the epoch: the
    processing time the version's processing-time timers fired against; the final flush
    fires none), ``broadcast`` (the broadcast table the version applied, ``{"rows", "bytes",
    "sha256"}`` of its Arrow IPC stream, as the metadata records it; None without one).

    Relaunches (:meth:`PendingBatch.wait`): ``relaunches`` (times the driver re-ran the
    micro-batch because partitions' background writes were lost after their tasks ended; 0
    normally), ``lost_partitions`` (the partitions found lost, over all relaunches); ``phases``
    then also holds ``detect_s`` (driver seconds from the end of an attempt's action to finding
    its partitions lost, summed) and ``relaunch_s`` (the relaunched actions)."""

    operator_name: str
    version: int
    rows: int
    output_rows: int
    state_entries: int
    state_bytes: int
    checkpoint_bytes: int
    watermark_ms: Optional[int]
    seconds: float
    loads: Dict[str, int] = field(default_factory=dict)
    metrics: Dict[str, int] = field(default_factory=dict)
    final: bool = False
    checkpoint_total_bytes: int = 0
    incremental: bool = False
    wait_seconds: float = 0.0
    ttl_expired: Dict[str, int] = field(default_factory=dict)
    phases: Dict[str, float] = field(default_factory=dict)
    partitions: List[Dict[str, Any]] = field(default_factory=list)
    batch_id: Optional[int] = None
    processing_time_ms: Optional[int] = None
    flush: bool = False
    skipped: bool = False
    relaunches: int = 0
    lost_partitions: List[int] = field(default_factory=list)
    broadcast: Optional[Dict[str, Any]] = None


#: Fields of a task's report copied into :attr:`BatchReport.partitions`.
_TASK_TIMINGS = ("partition", "pid", "load", "input_s", "load_s", "load_cpu_s", "standby_cpu_s",
                 "restore_bytes", "process_s", "snapshot_s", "task_s", "write_s",
                 "gc_frozen_objects", "cache_hits", "cache_misses", "cache_key_groups_read",
                 "cache_evictions")


def operator_root(checkpoint: str, name: str) -> str:
    """The checkpoint root of the operator ``name`` under ``checkpoint`` (a local directory,
    made absolute, or a URI): ``checkpoint/name``. A URI may carry a query
    (``s3://bucket/prefix?endpoint_override=...``): the name goes into its path."""
    root = join_uri(os.fspath(checkpoint), name)
    return root if is_uri(root) else os.path.abspath(root)


class StatefulOperator:
    """A keyed, checkpointed Python operator for Structured Streaming micro-batches.

    Args:
        name: operator name; its checkpoint lives in ``<checkpoint>/<name>`` (``[A-Za-z0-9_.-]``).
        processor: a :class:`statecore.spark.KeyedProcessor` (see its module for the contract).
            When its class (or a base class) is defined in a module the Python workers cannot
            import by name (a file outside site-packages, e.g. next to the driver script), the
            module, or its top-level package, is registered with PySpark's cloudpickle to be
            pickled by value, so it reaches the workers without ``PYTHONPATH`` or ``addPyFile``
            (:attr:`shipped_modules` names them). Helpers in other such modules that the
            processor calls are not shipped: put them beside the processor.
        key_column: name of the key column (Spark string, bigint, int, binary, double, boolean,
            timestamp or timestamp_ntz; ``routing.backend_key_type``), or a list of such column
            names for a multi-column key, as ``groupBy(["a", "b"])`` takes them: the key is
            the tuple ``(a, b)`` (backend key type ``struct<ta,tb>``), rows are routed by
            Spark's ``xxhash64(a, b)`` and the processor receives the ordinary columns ``a``
            and ``b`` (``ProcessorContext.keys(batch)`` builds the key array). A struct column
            (``F.struct(a, b).alias("k")``) is the same key, routed the same way, but reaches
            the processor as one struct column. A row whose key (any key column) is null fails
            the micro-batch.
        checkpoint: directory or URI (``pyarrow.fs``) under which the operator checkpoints.
        sink: ``sink(out_df, version)``, idempotent per version (the state version the
            micro-batch or flush commits, unique across runs and flushes; the Spark batch id
            until a non-final flush), running an action that
            evaluates every partition of ``out_df`` (each action re-runs the tasks, so one is
            cheapest; the last one's state wins); default :func:`parquet_batch_sink`
            (``output`` required).
        output: output directory for the default sink.
        parallelism: number of partitions (operator instances) ``n``; may differ between runs
            (rescaling: restores re-split key groups).
        max_parallelism: number of key groups (fixed for the life of the checkpoint).
        backend: ``"native"`` (default: the C++ backend) or ``"python"`` (the pure-Python
            reference backend, same behaviour and checkpoint format, slower;
            ``statecore.backends.create_backend``). ``"native"`` raises StateError at
            construction when the compiled extension does not import on the driver.
        event_time_column: timestamp (or int64 ms) column whose maximum over earlier micro-batches,
            minus ``watermark_delay``, is the watermark handed to the processor; None = no
            watermark.
        watermark_delay: how far rows may arrive behind the largest event time seen (allowed
            lateness, bounded out-of-orderness): the watermark is ``max event time of the
            earlier micro-batches - watermark_delay`` and never moves back, as Spark's
            ``withWatermark(col, delayThreshold)`` and Flink's
            ``WatermarkStrategy.forBoundedOutOfOrderness`` define it. An int (ms), a
            ``datetime.timedelta`` or a string like Spark's (``"10 minutes"``, ``"1 hour"``,
            ``"30 seconds"``, ``"500 milliseconds"``;
            :func:`statecore.spark.watermark.parse_watermark_delay`). Default 0. Rows are not
            dropped for being late: the processor sees every row and ``ctx.watermark_ms``.
            Needs ``event_time_column``. May change between runs; the watermark committed
            before stays the floor.
        retain_versions: committed versions kept (>= 2, so a replay of the latest batch can
            restore its predecessor); older versions' manifests and the runs no kept version
            references are deleted after each commit.
        max_runs: the store compacts a committed version whose key groups need more than this
            many runs (incremental chain length, int >= 1), so restores stay bounded; None =
            never.
        compaction_size_ratio: a compaction merges a chain's incremental runs alone (the full
            run under them kept) while they hold under 1/ratio of its bytes (int >= 1; None =
            every compaction rewrites the whole state of its key groups); see
            ``CheckpointStore``.
        commit_timeout_s: seconds the driver waits, after the sink's action, for every
            partition's background checkpoint write to report (> 0); past it the micro-batch
            fails with StateError and Spark replays it. A write whose heartbeats go on is
            waited for this long; a lost one is not (``relaunch_attempts``).
        relaunch_attempts: times the driver re-runs a micro-batch (or flush) whose partitions'
            background writes were lost after their tasks ended (int >= 0, default 2): same
            version and placement, a new attempt id, the sink called again with the same
            version (so it must be idempotent per version, as for Spark's replays); the lost
            attempt's files are ignored and deleted by retention. A write counts as lost when
            its task ended (the sink's action returned) and it has neither reported nor put a
            heartbeat for ``heartbeat_timeout_s`` (its executor or Python worker died). Past
            the attempts the micro-batch fails with StateError (Spark replays it); 0 fails it
            at the first loss.
        heartbeat_interval_s: seconds between the heartbeats a background write in flight puts
            into the checkpoint (``pending/V/<writer>.alive``, one small put each; > 0,
            default 2; a write that ends sooner puts none).
        heartbeat_timeout_s: seconds without a new heartbeat (or, with none, since the action
            ended) after which the driver counts a write as lost (> ``heartbeat_interval_s``;
            default 3 x ``heartbeat_interval_s``). Too low a value re-runs micro-batches whose
            workers were merely slow to beat (never wrong, only slower).
        ttl_background_key_groups: key groups per partition and micro-batch that TTL background
            cleanup (``StateTtlConfig(cleanup_in_background=True)``) expires right after the
            snapshot (int >= 0; 0 = none).
        stale_copies: partitions of this operator a Python worker keeps besides the one it ran
            last (int >= 0, default 1). PySpark hands a partition to another worker about half
            the time; a worker holding an older committed copy of it catches up by applying the
            runs committed since (``load = "catch-up"``) instead of restoring the whole chain.
            Costs up to that many more partitions' state in memory per worker; 0 = none.
        standby: keep those copies current (default True): after its task a worker waits, in a
            background thread, for the driver's commit of that micro-batch and catches its
            copies of other partitions up to it, restoring the next partitions after its own
            while it holds fewer than ``stale_copies`` (standby replicas, as in Kafka Streams),
            so a partition that moves to this worker finds its state ready (``load =
            "standby"``) instead of catching up or restoring at the start of its task. Costs
            that catch-up CPU every micro-batch in every worker (between its tasks) rather than
            only when a partition moves, and the ``stale_copies`` copies' memory from the
            second micro-batch on rather than after the first moves; False catches up only on
            demand. No effect with ``stale_copies=0``. On by default because a moved
            partition's catch-up or restore then happens between tasks, on otherwise idle CPU
            (the standby thread runs at the lowest priority), instead of on the task's critical
            path. With ``handoff`` it skips the partitions that another live worker of its
            host holds.
        handoff: a task that PySpark gives to a worker other than the one holding its
            partition's state is handed to that worker when it runs on the same host
            (:mod:`statecore.spark.handoff`): the task's worker relays its input and output
            over a Unix domain socket, and the holder runs it on its cached state (``load =
            "handoff"``), so a partition's state stays in one process instead of being copied
            into every worker that runs it. Falls back to loading locally whenever the holder
            is gone or does not hold exactly the previous version. It saves the Python
            workers' CPU (no standby catch-ups of partitions another worker holds) and halves
            the memory of state per host, but the relay copies every row twice and a swap has
            three Python threads share each worker's GIL, so the Spark job itself gets slower
            and wall time is no better; hence off by default.
        freeze_worker_gc: at its first task in a Python worker process, and at a later task
            when modules were imported since, move the objects the worker holds to the
            permanent generation (``gc.freeze``), so that the full
            ``gc.collect()`` PySpark's daemon runs after every task of a reused worker stops
            holding the GIL for tens of ms while the task's checkpoint write needs it (see
            :func:`statecore.spark.worker_gc.freeze_worker_gc`; the task reports
            ``gc_frozen_objects``). It affects the whole
            worker process, the user's other tasks in it included; False leaves the garbage
            collector alone.
        state_store: URL of an external store that keeps the keyed state (Redis:
            ``redis://HOST:PORT/DB``, ``rediss://``, ``unix://``; PostgreSQL:
            ``postgresql://USER@HOST:PORT/DB`` or ``postgres://``, the rest from libpq's
            environment variables such as ``PGPASSWORD``; :mod:`statecore.external`) instead
            of the workers' memory and the checkpoint: a micro-batch (or flush) is an epoch of
            the store, numbered by its version -- tasks pre-commit it, the driver writes the
            version's metadata-only manifest (the operator's metadata and the epoch's
            write-ahead logs, no data files) after the sink and then commits the epoch
            (:mod:`statecore.spark.external_commit`, :mod:`statecore.spark.external_task`).
            The backend in front of the store is ``backend``. A replay of a micro-batch the
            store committed runs nothing (``skipped``). Operator state
            (``ctx.operator_state``) is committed with the epoch as well and redistributed by
            partition index (docs/external-state.md "Operator state"). Not with
            :meth:`bootstrap`. None (default): in memory, checkpointed.
        state_namespace: the keyed state's namespace in the store (default: the operator's
            checkpoint root, ``<checkpoint>/<name>``, made absolute); braces and control
            characters are not allowed.
        state_store_timeout_s: seconds (> 0, default 10) that every connect, command,
            statement and lock wait on the store may take, in the tasks and on the driver
            (the store's ``timeout_s``): a large epoch's commit in PostgreSQL on a busy
            server can need more.
        state_store_cache_entries: the bound, in entries, of each task's cache in front of the
            store (the backends' ``cache_entries``: an int >= 1, default 2,000,000; None: no
            bound). Past it a task evicts key groups equal to the committed state, least
            recently used first, and reads them through again at their next access
            (docs/external-state.md "The cache in front").
        state_store_ttl_sweep_key_groups: key groups of each task's range whose expired TTL
            entries every epoch's commit removes from the store (the backends'
            ``ttl_sweep_key_groups``: an int >= 0, default 16, round robin; 0: none;
            docs/external-state.md "TTL: expiry in the cache and in the store").
            Both need ``state_store``.
        memory_budget: the tiered mode (docs/tiered.md): each task's native backend keeps at
            most this many bytes of key and value in memory (an int, or a string such as
            ``"512MiB"``; :func:`statecore.backends.tiered.parse_bytes`) and reads the rest
            from the operator's committed versions, which it attaches instead of loading; the
            entries changed since the last commit that do not fit are spilled to local files
            until the next commit. A task's backend is then its own cached one (the
            predecessor it wrote, told the committed version) or a fresh attach of the
            committed version: ``stale_copies`` and ``standby`` are not used (a catch-up
            applies changes into memory, which the tiered mode does not do), and
            ``handoff=True`` is refused. Needs ``backend="native"`` and no ``state_store``.
            None (default): the whole state in memory.
        block_target_bytes: the uncompressed size at which the runs of the operator's
            checkpoints (tasks' writes, the driver's compactions) cut their blocks (an int >=
            1, or a string such as ``"16KiB"``; ``CheckpointStore`` ``block_target_bytes``).
            None (default): 4 KiB with ``memory_budget`` (the tiered mode's
            ``TIERED_BLOCK_TARGET_BYTES``), else the store's 64 KiB. Smaller blocks make the
            tiered mode's reads of a large state cheaper and a full restore dearer
            (docs/tiered.md "Block size").
        compression: the block codec of the same runs, ``"lz4.block"`` or ``"none"``
            (``CheckpointStore`` ``compression``; docs/tiered.md "Block codec"). None
            (default): the store's, ``"lz4.block"``.

    Raises InvalidInputError for bad arguments (at construction) and for inputs the contract
    forbids (at run time: null keys, a key column of another type, output not matching the
    schema); StateError when a finalized checkpoint receives more input, when a micro-batch
    comes from another Spark query while a stream is open or maps to a version another
    micro-batch or flush holds (:mod:`statecore.spark.versions`), or when a partition did not
    report; CheckpointNotFoundError when the previous version needed by a micro-batch is gone.
    """

    def __init__(self, name: str, processor: KeyedProcessor,
                 key_column: Union[str, Sequence[str]], checkpoint: str, *,
                 sink: Optional[Callable] = None, output: Optional[str] = None,
                 parallelism: int = 2, max_parallelism: int = 128, backend: str = "native",
                 event_time_column: Optional[str] = None,
                 watermark_delay: Union[int, str, datetime.timedelta, None] = 0,
                 retain_versions: int = 3,
                 max_runs: Optional[int] = 8,
                 compaction_size_ratio: Optional[int] = DEFAULT_SIZE_RATIO,
                 commit_timeout_s: float = 300.0,
                 ttl_background_key_groups: int = 0, stale_copies: int = 1,
                 freeze_worker_gc: bool = True, standby: bool = True, handoff: bool = False,
                 relaunch_attempts: int = 2, heartbeat_interval_s: float = 2.0,
                 heartbeat_timeout_s: Optional[float] = None, state_store: Optional[str] = None,
                 state_namespace: Optional[str] = None, state_store_timeout_s: float = 10.0,
                 state_store_cache_entries: Optional[int] = 2_000_000,
                 state_store_ttl_sweep_key_groups: int = 16,
                 memory_budget: Union[int, str, None] = None,
                 block_target_bytes: Union[int, str, None] = None,
                 compression: Optional[str] = None):
        import re

        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name):
            raise InvalidInputError(f"operator name must match [A-Za-z0-9_.-]+, got {name!r}")
        if not isinstance(processor, KeyedProcessor):
            for hook in ("open", "process_batch", "on_watermark", "flush", "output_schema"):
                if not hasattr(processor, hook):
                    raise InvalidInputError(
                        f"processor lacks {hook!r} (see statecore.spark.KeyedProcessor)")
        if not isinstance(getattr(processor, "output_schema", None), pa.Schema):
            raise InvalidInputError("processor.output_schema must be a pyarrow.Schema")
        if isinstance(key_column, (list, tuple)):
            if not key_column or not all(isinstance(c, str) and c for c in key_column):
                raise InvalidInputError(
                    f"key_column must be a column name or a non-empty list of column names, "
                    f"got {key_column!r}")
            if len(set(key_column)) != len(key_column):
                raise InvalidInputError(f"key_column names a column twice: {key_column!r}")
            # groupBy(["a"]) groups by a alone: a one-name list is that name.
            key_column = key_column[0] if len(key_column) == 1 else list(key_column)
        elif not isinstance(key_column, str) or not key_column:
            raise InvalidInputError(
                f"key_column must be a column name or a non-empty list of column names, got "
                f"{key_column!r}")
        self.max_parallelism = check_max_parallelism(max_parallelism)
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) \
                or not 0 < parallelism <= self.max_parallelism:
            raise InvalidInputError(
                f"parallelism must be an int in [1, max_parallelism={self.max_parallelism}], "
                f"got {parallelism!r}")
        delay_ms = parse_watermark_delay(watermark_delay)
        if delay_ms and event_time_column is None:
            raise InvalidInputError(
                f"watermark_delay={watermark_delay!r} needs event_time_column (the column whose "
                "event times make the watermark)")
        if backend not in ("python", "native"):
            raise InvalidInputError(f"backend must be 'native' or 'python', got {backend!r}")
        if backend == "native":
            _require_native_backend()
        if (isinstance(retain_versions, bool) or not isinstance(retain_versions, int)
                or retain_versions < 2):
            raise InvalidInputError(f"retain_versions must be an int >= 2, got {retain_versions!r}")
        if max_runs is not None and (isinstance(max_runs, bool) or not isinstance(max_runs, int)
                                     or max_runs < 1):
            raise InvalidInputError(f"max_runs must be an int >= 1 or None, got {max_runs!r}")
        check_size_ratio(compaction_size_ratio)
        if isinstance(commit_timeout_s, bool) or not isinstance(commit_timeout_s, (int, float)) \
                or not commit_timeout_s > 0:
            raise InvalidInputError(
                f"commit_timeout_s must be a number > 0, got {commit_timeout_s!r}")
        if isinstance(relaunch_attempts, bool) or not isinstance(relaunch_attempts, int) \
                or relaunch_attempts < 0:
            raise InvalidInputError(
                f"relaunch_attempts must be an int >= 0, got {relaunch_attempts!r}")
        if isinstance(heartbeat_interval_s, bool) \
                or not isinstance(heartbeat_interval_s, (int, float)) \
                or not heartbeat_interval_s > 0:
            raise InvalidInputError(
                f"heartbeat_interval_s must be a number > 0, got {heartbeat_interval_s!r}")
        if heartbeat_timeout_s is None:
            heartbeat_timeout_s = 3 * heartbeat_interval_s
        elif isinstance(heartbeat_timeout_s, bool) \
                or not isinstance(heartbeat_timeout_s, (int, float)) \
                or not heartbeat_timeout_s > heartbeat_interval_s:
            raise InvalidInputError(
                f"heartbeat_timeout_s must be a number > heartbeat_interval_s="
                f"{heartbeat_interval_s!r}, got {heartbeat_timeout_s!r}")
        if isinstance(ttl_background_key_groups, bool) \
                or not isinstance(ttl_background_key_groups, int) \
                or ttl_background_key_groups < 0:
            raise InvalidInputError(
                f"ttl_background_key_groups must be an int >= 0, got {ttl_background_key_groups!r}")
        if isinstance(stale_copies, bool) or not isinstance(stale_copies, int) or stale_copies < 0:
            raise InvalidInputError(f"stale_copies must be an int >= 0, got {stale_copies!r}")
        if not isinstance(freeze_worker_gc, bool):
            raise InvalidInputError(f"freeze_worker_gc must be a bool, got {freeze_worker_gc!r}")
        if not isinstance(standby, bool):
            raise InvalidInputError(f"standby must be a bool, got {standby!r}")
        if not isinstance(handoff, bool):
            raise InvalidInputError(f"handoff must be a bool, got {handoff!r}")
        if memory_budget is not None:
            from statecore.backends.tiered import parse_bytes

            memory_budget = parse_bytes(memory_budget)
            if backend != "native" or state_store is not None or handoff:
                raise InvalidInputError(
                    "memory_budget (the tiered mode) needs backend='native', no state_store "
                    f"and handoff=False; got backend={backend!r}, state_store={state_store!r}, "
                    f"handoff={handoff!r}")
            stale_copies, standby = 0, False
        if block_target_bytes is not None:
            from statecore.backends.tiered import parse_bytes
            from statecore.checkpoint.format import check_block_target_bytes

            block_target_bytes = check_block_target_bytes(
                parse_bytes(block_target_bytes, "block_target_bytes"))
        elif memory_budget is not None:
            from statecore.backends.tiered import TIERED_BLOCK_TARGET_BYTES

            block_target_bytes = TIERED_BLOCK_TARGET_BYTES
        if compression is not None:
            from statecore.checkpoint.format import check_compression

            compression = check_compression(compression)
        if sink is None:
            if output is None:
                raise InvalidInputError(
                    "give either sink= or output= (directory of the default sink)")
            sink = parquet_batch_sink(output)
        #: modules registered for pickling by value so the processor reaches the workers
        self.shipped_modules = _ship_processor_modules(processor)
        self.name = name
        self.processor = processor
        #: the key column's name, or the list of names of a multi-column key
        self.key_column = key_column
        #: the key column names as a tuple (one for a single-column key)
        self.key_columns = (key_column,) if isinstance(key_column, str) else tuple(key_column)
        self.checkpoint = os.fspath(checkpoint)
        self.store_uri = operator_root(self.checkpoint, name)
        #: the external store's URL and namespace of the keyed state (None: in memory)
        self.state_store, self.state_namespace = check_state_store(
            state_store, state_namespace, self.store_uri)
        if (isinstance(state_store_timeout_s, bool)
                or not isinstance(state_store_timeout_s, (int, float))
                or not 0 < state_store_timeout_s < float("inf")):
            raise InvalidInputError(
                f"state_store_timeout_s must be a number > 0, got {state_store_timeout_s!r}")
        #: seconds every connect, statement and lock wait on the external store may take
        self.state_store_timeout_s = float(state_store_timeout_s)
        #: each task's cache bound (entries) and TTL sweep (key groups per commit) on the store
        self.state_store_cache_entries, self.state_store_ttl_sweep_key_groups = (
            check_store_cache(self.state_store, state_store_cache_entries,
                              state_store_ttl_sweep_key_groups))
        self.sink = sink
        self.parallelism = parallelism
        self.backend = backend
        self.event_time_column = event_time_column
        #: the watermark delay (allowed lateness) in ms
        self.watermark_delay_ms = delay_ms
        self.retain_versions = retain_versions
        self.max_runs = max_runs
        self.compaction_size_ratio = compaction_size_ratio
        self.commit_timeout_s = float(commit_timeout_s)
        self.relaunch_attempts = relaunch_attempts
        self.heartbeat_interval_s = float(heartbeat_interval_s)
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.ttl_background_key_groups = ttl_background_key_groups
        self.stale_copies = stale_copies
        self.freeze_worker_gc = freeze_worker_gc
        self.standby = standby
        self.handoff = handoff
        #: bytes of key and value each task's backend holds (the tiered mode), or None
        self.memory_budget = memory_budget
        #: the block size of the operator's runs (bytes), or None: the store's default
        self.block_target_bytes = block_target_bytes
        #: the block codec of the operator's runs, or None: the store's default
        self.compression = compression
        self.reports: List[BatchReport] = []
        self._store = None
        # Tests replace the worker-side write (a Callable like
        # statecore.spark.checkpoint_write.start_snapshot_write).
        self._start_write: Optional[Callable] = None

    def __getstate__(self) -> Dict[str, Any]:
        # Under Spark Connect a foreachBatch function that holds the operator is pickled to the
        # server's Python runner: the store (its lock, its filesystem) is rebuilt there.
        state = dict(self.__dict__)
        state["_store"] = None
        return state

    # -------------------------------------------------------------------------- public API

    @property
    def store(self):
        """The operator's :class:`statecore.checkpoint.CheckpointStore` (one per operator object:
        commit, compaction and retention of a store are serialized by its lock)."""
        from statecore.checkpoint import CheckpointStore

        options = {"max_runs": self.max_runs,
                   "compaction_size_ratio": self.compaction_size_ratio}
        if self.block_target_bytes is not None:
            options["block_target_bytes"] = self.block_target_bytes
        if self.compression is not None:
            options["compression"] = self.compression
        if self._store is None or any(getattr(self._store, k) != v for k, v in options.items()):
            self._store = CheckpointStore(self.store_uri, **options)
        return self._store

    def latest_version(self) -> Optional[int]:
        """Highest committed version (micro-batch id, or the flush version), or None."""
        return self.store.latest_version()

    def _metadata_or_none(self, version: int) -> Optional[Dict[str, Any]]:
        store = self.store
        return store.metadata(version) if version in store.versions() else None

    def _committed_report(self, version: int, batch_id: int) -> BatchReport:
        """The report of a micro-batch committed before the latest flush, replayed by Spark:
        from its version's metadata when retention kept it."""
        meta = self._metadata_or_none(version) or {}
        return BatchReport(
            operator_name=self.name, version=version, rows=int(meta.get("rows", 0)),
            output_rows=int(meta.get("output_rows", 0)),
            state_entries=int(meta.get("state_entries", 0)),
            state_bytes=int(meta.get("state_bytes", 0)), checkpoint_bytes=0,
            watermark_ms=meta.get("watermark_ms"), seconds=0.0, batch_id=batch_id,
            processing_time_ms=meta.get("processing_time_ms"), skipped=True,
            broadcast=meta.get("broadcast"))

    def is_finalized(self) -> bool:
        """True once the end-of-input flush has been committed."""
        store = self.store
        v = store.latest_version()
        return v is not None and bool(store.metadata(v).get("final"))

    def close(self) -> None:
        """Close the driver's connection to the external state store (``state_store``), kept
        from one micro-batch to the next; the next micro-batch or flush opens a new one.
        Nothing for in-memory state. Idempotent."""
        close_driver_store(self)

    def __call__(self, df, batch_id: int) -> BatchReport:
        """``foreachBatch`` entry point: process micro-batch ``batch_id`` of ``df``."""
        return self.process(df, int(batch_id))

    def process(self, df, batch_id: int, *, query_id: Optional[str] = None,
                broadcast=None) -> BatchReport:
        """Run micro-batch ``batch_id`` on DataFrame ``df`` and commit its version
        (:meth:`start` then :meth:`PendingBatch.commit`). See the module docstring for the
        protocol; ``query_id``, ``broadcast``: :meth:`start`; errors: class docstring."""
        return self.start(df, batch_id, query_id=query_id, broadcast=broadcast).commit()

    def start(self, df, batch_id: int, *, query_id: Optional[str] = None,
              broadcast=None) -> "PendingBatch":
        """Run micro-batch ``batch_id`` on ``df`` up to and including the sink's action, without
        committing: returns a :class:`PendingBatch` whose ``commit()`` waits for the background
        checkpoint writes and commits the micro-batch's version. Several operators in one
        ``foreachBatch`` start each and then commit all (:func:`commit_batches`), so the writes
        of one overlap the actions of the others.

        The version is ``batch_id`` plus the offset of the current run
        (:mod:`statecore.spark.versions`): equal to ``batch_id`` until a non-final flush, after
        which the next micro-batch, of the same Spark query or of a new one whose batch ids
        restart at 0, takes the version after the flush. ``query_id``: the Spark query the
        batch belongs to; default the running query's id (Spark's local property
        ``sql.streaming.queryId``, stable across restarts from one Spark checkpoint), None
        outside a streaming query. A replay of a micro-batch committed before the latest
        flush runs nothing and returns a PendingBatch whose report has ``skipped=True``.

        ``broadcast``: the micro-batch's broadcast input (Flink's broadcast stream), a small
        ``pyarrow.Table`` or a Spark DataFrame collected here with ``toArrow()``; every
        partition's task receives it with its spec (no ``SparkContext.broadcast``, so it works
        under Spark Connect too) and calls ``processor.process_broadcast(table, ctx)`` before
        its input rows, partitions without rows included. Its rows, size and SHA-256 go into
        the version's metadata (``broadcast``); a replay of a committed micro-batch with a
        different table (or none where there was one) runs with the new table and warns
        (RuntimeWarning): state stays consistent, but the output the sink overwrites differs
        from what downstream may have read. InvalidInputError when it is neither a Table nor a
        DataFrame, above :data:`BROADCAST_MAX_BYTES` as Arrow IPC, or the processor has no
        ``process_broadcast``. Errors otherwise: class docstring."""
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise InvalidInputError(f"batch_id must be an int >= 0, got {batch_id!r}")
        if query_id is None:
            query_id = self._running_query_id(df)
        elif not isinstance(query_id, str) or not query_id:
            raise InvalidInputError(f"query_id must be a non-empty str or None, got {query_id!r}")
        store = self.store
        latest = store.latest_version()
        place = place_micro_batch(self.name, batch_id, query_id, latest, self._metadata_or_none)
        if place.committed or (self.state_store is not None
                               and begin_epoch(self, place.version)):
            report = self._committed_report(place.version, batch_id)
            self.reports.append(report)
            return PendingBatch.done(self, report)
        field_names = df.schema.fieldNames()
        for c in self.key_columns:
            if c not in field_names:
                raise InvalidInputError(
                    f"operator {self.name}: key column {c!r} not in {field_names}")
        if self.event_time_column is not None and self.event_time_column not in field_names:
            raise InvalidInputError(
                f"operator {self.name}: event-time column {self.event_time_column!r} not in "
                f"{field_names}")
        if len(self.key_columns) == 1:
            key_type = backend_key_type(df.schema[self.key_column].dataType)
        else:
            types = [backend_key_type(df.schema[c].dataType) for c in self.key_columns]
            nested = [c for c, t in zip(self.key_columns, types) if t.startswith("struct")]
            if nested:
                raise InvalidInputError(
                    f"operator {self.name}: key columns {nested} are structs; the columns of a "
                    "multi-column key must be scalar (string, bigint, int, binary, double, "
                    "boolean, timestamp, timestamp_ntz)")
            key_type = "struct<" + ",".join(types) + ">"
        return self._launch(df.sparkSession, df, place, key_type, batch_id=batch_id,
                            broadcast=broadcast)

    def flush(self, spark, *, final: bool = True, broadcast=None) -> Optional[BatchReport]:
        """Flush after the input of a run, exactly once: run version ``latest + 1`` without
        input rows, write its output through the sink under that version and commit it.
        ``spark``: the SparkSession.

        ``final=True`` (default), the end of ALL input: every partition calls
        ``processor.flush`` (no watermark, no ``on_watermark`` or ``on_processing_time``:
        processing-time timers not yet due are not fired, as a Flink streaming job that finishes
        does not fire them (FLINK-14231); ``ctx.processing_time_ms`` is the flush's processing
        time, for a processor that fires them itself) and the version is committed with ``"final":
        true``; the finalized checkpoint refuses every later micro-batch (StateError).

        ``final=False``, the end of one run of a job that runs again on new input (a scheduled
        ``trigger(availableNow=True)`` run over each day's new files): every partition runs as
        in a micro-batch without rows: ``on_watermark`` with the watermark the input so far
        allows (the largest event time seen minus ``watermark_delay``, which no micro-batch
        handed to the processor yet: a micro-batch never moves its own watermark), then
        ``on_processing_time`` with the flush's processing time. Nothing beyond the watermark
        fires, so rows of the next run within ``watermark_delay`` still find their windows
        open. The checkpoint stays open: the next micro-batch, of the same Spark query or of a
        new one (another Spark checkpoint, batch ids from 0), takes the version after the
        flush (:mod:`statecore.spark.versions`).

        Returns None without doing anything when the checkpoint is empty or finalized, or, for
        ``final=False``, when the latest version is a flush already (so a rerun of a finished
        run is a no-op). A flush killed midway (nothing committed) is redone by the next call;
        ``final=True`` after a non-final flush runs the final one. ``broadcast``: a table handed
        to ``process_broadcast`` in every partition before the flush's hooks, as in
        :meth:`start`; without it the flush calls no ``process_broadcast``. InvalidInputError
        when ``final`` is not a bool; ``broadcast`` errors: :meth:`start`."""
        if not isinstance(final, bool):
            raise InvalidInputError(f"final must be a bool, got {final!r}")
        store = self.store
        latest = store.latest_version()
        manifest = store.manifest(latest) if latest is not None else {}
        meta = manifest.get("metadata", {})
        place = place_flush(latest, meta, final)
        if place is None:
            return None
        if self.state_store is not None and begin_epoch(self, place.version):
            return None
        return self._launch(spark, None, place, meta["key_type"], batch_id=None, final=final,
                            prev_meta=meta, prev_commit_id=manifest.get("commit_id"),
                            broadcast=broadcast).commit()

    def bootstrap(self, spark, states: Sequence, *, timers=None,
                  timer_namespace_type: str = "void", watermark_ms: Optional[int] = None,
                  now_ms: Optional[int] = None, memory_bytes: int = 256 * 1024 * 1024) -> dict:
        """Write version 0 of this operator's empty checkpoint from state a batch query
        computed (Spark's ``initialState``, Flink's State Processor API bootstrap), in parallel
        by key-group range (:mod:`statecore.spark.bootstrap`), so that the job starts from it;
        returns the committed manifest.

        ``states``: :class:`statecore.offline.StateInput` (or ``(descriptor, data[,
        namespace_type])``) per state, with the descriptors the processor's ``open`` registers;
        ``data`` a Spark DataFrame or a pyarrow Table whose columns are the key column(s) of the
        operator (or one ``key`` column, as ``spark.read.format("statecore")`` and
        ``statecore.offline.read_state`` give it) and ``namespace``, ``user_key``, ``value``,
        ``ttl_timestamp_ms`` as :mod:`statecore.offline.bootstrap` defines them.
        ``timers``: a DataFrame or Table of timers (the key column(s), ``timestamp_ms``,
        optionally ``namespace``, ``processing_time``). ``watermark_ms``: the watermark the
        first micro-batch gets (and event-time TTL's clock for rows without a TTL timestamp);
        ``now_ms``: processing-time TTL's clock (default: the driver's wall clock).

        The version is committed as a non-final flush without a query id: the next micro-batch
        of any Spark query takes version 1 (:mod:`statecore.spark.versions`). Raises StateError
        when the checkpoint already holds a version, InvalidInputError for bad arguments or
        rows (from the tasks, wrapped by Spark); a failure commits nothing."""
        from statecore.spark.bootstrap import bootstrap_operator

        if self.state_store is not None:
            raise InvalidInputError(
                f"operator {self.name}: bootstrap writes a checkpoint of in-memory state; an "
                "operator with state_store= keeps its keyed state in the store (write it there "
                "with the store's backend instead)")
        metadata = {
            "operator": self.name, "key_column": self.key_column, "backend": self.backend,
            "processor": type(self.processor).__qualname__,
            "processor_config": _processor_config(self.processor),
            "input_watermark_ms": None, "watermark_ms": watermark_ms,
            "processing_time_ms": None, "watermark_delay_ms": self.watermark_delay_ms,
            # The largest event time the watermark implies, as a micro-batch records it.
            "max_event_ms": (None if watermark_ms is None
                             else watermark_ms + self.watermark_delay_ms),
            "rows": 0, "output_rows": 0, "metrics": {}, "loads": {}, "restore_bytes": [],
        }
        return bootstrap_operator(self, spark, states, metadata=metadata, timers=timers,
                                  timer_namespace_type=timer_namespace_type,
                                  watermark_ms=watermark_ms, now_ms=now_ms,
                                  memory_bytes=memory_bytes)

    # ------------------------------------------------------------------------------ internals

    def _running_query_id(self, df) -> Optional[str]:
        """The id of the streaming query whose micro-batch ``df`` is (Spark's local property
        :data:`QUERY_ID_PROPERTY`; None outside a query). Under Spark Connect the
        ``foreachBatch`` function runs on the server without a SparkContext and cannot read it:
        InvalidInputError asks for ``query_id=`` instead."""
        from statecore.spark.session import is_connect_session

        spark = df.sparkSession
        if is_connect_session(spark):
            raise InvalidInputError(
                f"operator {self.name}: under Spark Connect the foreachBatch function cannot "
                "read the running query's id (it runs in a Python process on the server, "
                "without a SparkContext); pass it: op.process(df, batch_id, "
                "query_id=streaming_query_id(CHECKPOINT_LOCATION)) or op.start(df, batch_id, "
                "query_id=...), with statecore.spark.streaming_query_id and the query's "
                "checkpointLocation")
        return spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)

    def _processing_time(self, version: int, prev_meta: Dict[str, Any]) -> int:
        """The version's processing time (ms since the epoch): the one committed with
        ``version`` when this is a replay of a committed micro-batch (so its processing-time
        timers fire as they did), else the driver's wall clock, never below the previous
        version's."""
        store = self.store
        if version in store.versions():
            done = store.metadata(version).get("processing_time_ms")
            if done is not None:
                return int(done)
        now = time.time_ns() // 1_000_000
        prev = prev_meta.get("processing_time_ms")
        return now if prev is None else max(now, int(prev))

    def _check_replayed_broadcast(self, version: int, what: str,
                                  broadcast_meta: Optional[Dict[str, Any]]) -> None:
        """Warn (RuntimeWarning) when ``version`` is committed already (a replay) with another
        broadcast table than ``broadcast_meta`` describes: the replay goes on with the new
        table (state stays a function of version - 1 and the inputs given), but the output
        replacing the committed one differs from it."""
        store = self.store
        if version not in store.versions():
            return
        done = store.metadata(version).get("broadcast")
        if done != broadcast_meta:
            warnings.warn(
                f"operator {self.name}: {what} (version {version}) is a replay of a committed "
                f"version whose broadcast table was {done}, now {broadcast_meta}; it runs "
                "with the new one and its output replaces the committed output",
                RuntimeWarning, stacklevel=4)

    def _control_rows(self, spark, n: int):
        """The DataFrame of the flush's ``n`` control rows (operator index ``i``, a null key of
        NullType), from one partition: they need no parallelism, and each source partition is
        one more task in the shuffle's map stage."""
        from pyspark.sql import functions as F

        return spark.range(0, n, 1, 1).select(
            *[F.lit(None).alias(c) for c in self.key_columns],
            F.col("id").cast("int").alias(OPERATOR_INDEX_COLUMN))

    def _launch(self, spark, df, place: Placement, key_type: str, *, batch_id: Optional[int],
                final: bool = False, prev_meta: Optional[Dict[str, Any]] = None,
                prev_commit_id: Optional[str] = None,
                processing_time_ms: Optional[int] = None, broadcast=None) -> "PendingBatch":
        """Run the tasks of version ``place.version`` up to the sink's action: micro-batch
        ``batch_id`` of ``df``, or (``df`` None) a flush, ``final`` or not; ``prev_meta`` and
        ``prev_commit_id``: the predecessor's metadata and commit id when the caller read its
        manifest already; ``processing_time_ms``: the one an earlier attempt of this version
        used (a relaunch fires the same timers), else chosen here; ``broadcast``:
        :meth:`start`. The PendingBatch returned can run it all again under a new attempt id
        (:meth:`PendingBatch.wait`)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        t0 = time.perf_counter()
        store = self.store
        n, mp = self.parallelism, self.max_parallelism
        is_flush = df is None
        version = place.version
        prev = version - 1 if version > 0 else None
        what = "the flush" if is_flush else f"micro-batch {batch_id}"
        processor_config = _processor_config(self.processor)
        if broadcast is not None and not callable(getattr(self.processor, "process_broadcast",
                                                          None)):
            raise InvalidInputError(
                f"operator {self.name}: {what} has a broadcast table but the processor lacks "
                "process_broadcast (see statecore.spark.KeyedProcessor)")
        broadcast_ipc, broadcast_meta = _broadcast_payload(
            broadcast, f"operator {self.name}: {what}")
        if prev_meta is None:
            prev_meta = {}
        if prev is not None and not prev_meta:
            if prev in store.versions():
                prev_manifest = store.manifest(prev)
                prev_meta = prev_manifest["metadata"]
                prev_commit_id = prev_manifest.get("commit_id")
            elif store.versions():
                raise CheckpointNotFoundError(
                    f"operator {self.name}: {what} (version {version}) needs version {prev} of "
                    f"{store.uri}, which is not committed (have {store.versions()[-5:]}); "
                    "the Spark checkpoint and the statecore checkpoint do not belong together")
            else:
                # Starting empty here would silently lose the state of batches 0..prev.
                raise CheckpointNotFoundError(
                    f"operator {self.name}: {what} needs version {prev} but "
                    f"{store.uri} holds no committed version; the Spark checkpoint is "
                    "older than the statecore checkpoint (use a fresh Spark checkpoint too)")
        if prev_meta:
            if int(prev_meta["max_parallelism"]) != mp:
                raise InvalidInputError(
                    f"operator {self.name}: max_parallelism is fixed for the life of a checkpoint "
                    f"({prev_meta['max_parallelism']}), got {mp}")
            if prev_meta.get("key_type") not in (None, key_type):
                raise InvalidInputError(
                    f"operator {self.name}: key column type {key_type} differs from the "
                    f"checkpoint's {prev_meta['key_type']}")
            if bool(prev_meta.get("state_store")) != (self.state_store is not None):
                raise InvalidInputError(
                    f"operator {self.name}: the checkpoint's keyed state is "
                    f"{'in an external store' if prev_meta.get('state_store') else 'in memory'}"
                    f", this operator keeps it "
                    f"{'in an external store' if self.state_store else 'in memory'}; moving "
                    "state between them is not supported: use a new checkpoint")
            if ("processor_config" in prev_meta
                    and prev_meta["processor_config"] != processor_config):
                raise InvalidInputError(
                    f"operator {self.name}: the processor's configuration "
                    f"{processor_config} differs from the one the checkpoint was built with "
                    f"{prev_meta['processor_config']}; use a new checkpoint")
        # The final flush fires everything through processor.flush; a non-final one gets the
        # watermark the input so far allows, as the micro-batch after it would.
        watermark = None if is_flush and final else prev_meta.get("watermark_ms")
        processing_time = (self._processing_time(version, prev_meta)
                           if processing_time_ms is None else processing_time_ms)
        self._check_replayed_broadcast(version, what, broadcast_meta)
        attempt = uuid.uuid4().hex[:12]

        spec = TaskSpec(
            operator_name=self.name, store_uri=self.store_uri, processor=self.processor,
            backend_kind=self.backend, key_type=key_type,
            key_column=(self.key_column if isinstance(self.key_column, str)
                        else tuple(self.key_column)),
            event_time_column=self.event_time_column, max_parallelism=mp, num_partitions=n,
            batch_id=version, prev_version=prev, prev_attempt=prev_meta.get("attempt"),
            attempt=attempt, watermark_ms=watermark, is_flush=is_flush,
            flush_final=is_flush and final,
            output_schema=self.processor.output_schema,
            prev_writers=(frozenset(prev_meta["writers"]) if "writers" in prev_meta else None),
            prev_commit_id=prev_commit_id,
            start_write=self._start_write, commit_timeout_s=self.commit_timeout_s,
            ttl_background_key_groups=self.ttl_background_key_groups,
            stale_copies=self.stale_copies, freeze_worker_gc=self.freeze_worker_gc,
            standby=self.standby, handoff=self.handoff, processing_time_ms=processing_time,
            heartbeat_interval_s=self.heartbeat_interval_s, broadcast_ipc=broadcast_ipc,
            state_store=self.state_store, state_namespace=self.state_namespace,
            state_store_timeout_s=self.state_store_timeout_s,
            state_store_cache_entries=self.state_store_cache_entries,
            state_store_ttl_sweep_key_groups=self.state_store_ttl_sweep_key_groups,
            memory_budget=self.memory_budget, block_target_bytes=self.block_target_bytes,
            compression=self.compression,
            first_watermark=(watermark is not None
                             and prev_meta.get("input_watermark_ms") is None))

        if is_flush:
            # The flush has no input: its control rows, one per partition, each carrying its
            # index, make the n partitions.
            from pyspark.sql import functions as F

            routed = (self._control_rows(spark, n)
                      .repartitionById(n, F.col(OPERATOR_INDEX_COLUMN))
                      .drop(OPERATOR_INDEX_COLUMN))
        else:
            # Spark runs the Python function of every partition of the shuffle, empty ones
            # included, so the data needs no rows added to make each partition run (unioning
            # in a control row per partition would cost every micro-batch a second input and a
            # larger shuffle). The index is computed inside the partitioning expression (a
            # projection adding it first would be one more Dataset, i.e. one more analysis on
            # the driver every micro-batch) and never shipped: the task knows it from its
            # partition id.
            routed = df.repartitionById(n, operator_index_of(self.key_columns, n, mp))
        out = routed.mapInArrow(spec, from_arrow_schema(self.processor.output_schema))
        t_action = time.perf_counter()
        self.sink(out, version)
        pending = PendingBatch(self, version, attempt, n, key_type, is_flush, prev_meta,
                               watermark, processor_config, t0, processing_time_ms=processing_time,
                               batch_id=batch_id, final=is_flush and final, place=place)
        pending.phases = {"plan_s": t_action - t0, "action_s": time.perf_counter() - t_action}
        pending.broadcast = broadcast_meta

        def relaunch() -> "PendingBatch":
            return self._launch(spark, df, place, key_type, batch_id=batch_id, final=final,
                                prev_meta=prev_meta, prev_commit_id=prev_commit_id,
                                processing_time_ms=processing_time, broadcast=broadcast)

        pending._relaunch = relaunch
        return pending


#: PendingBatch.wait's polling: every _WAIT_POLL_S seconds for the first _WAIT_FINE_S, then
#: growing 1.25x a poll to 0.2 s.
_WAIT_POLL_S = 0.002
_WAIT_FINE_S = 0.25


class PendingBatch:
    """A micro-batch of one operator whose sink action ran but whose version is not committed
    yet (from :meth:`StatefulOperator.start`). The tasks' checkpoint writes may still be in
    flight; :meth:`wait` blocks until every partition of this attempt reported (re-running the
    micro-batch when partitions' writes were lost) and :meth:`commit` then commits the version.
    Not thread-safe; commit at most once."""

    def __init__(self, op: StatefulOperator, version: int, attempt: str, num_partitions: int,
                 key_type: str, is_flush: bool, prev_meta: Dict[str, Any], watermark: Optional[int],
                 processor_config: Any, t0: float, processing_time_ms: Optional[int] = None, *,
                 batch_id: Optional[int] = None, final: bool = False,
                 place: Optional[Placement] = None):
        self.op = op
        self.processing_time_ms = processing_time_ms
        #: the state version this commits
        self.version = version
        #: the Spark batch id (None for a flush)
        self.batch_id = batch_id
        self.final = final
        self.place = place if place is not None else Placement(version, 0, None)
        self.attempt = attempt
        self.num_partitions = num_partitions
        self.key_type = key_type
        self.is_flush = is_flush
        self.prev_meta = prev_meta
        self.watermark = watermark
        self.processor_config = processor_config
        self.t0 = t0
        self.report: Optional[BatchReport] = None
        self._parts: Optional[List[dict]] = None
        self._wait_s = 0.0
        #: driver phase timings so far (see BatchReport.phases); set by StatefulOperator._launch
        self.phases: Dict[str, float] = {}
        #: when the sink's action of the current attempt returned (time.perf_counter): every
        #: task of the attempt had ended by then
        self.action_end = time.perf_counter()
        #: times :meth:`wait` re-ran the micro-batch, and the partitions it found lost
        self.relaunches = 0
        self.lost_partitions: List[int] = []
        # Runs the micro-batch again under a new attempt id and returns its PendingBatch
        # (set by StatefulOperator._launch; None: nothing to re-run).
        self._relaunch: Optional[Callable[[], "PendingBatch"]] = None
        #: the broadcast table's {"rows", "bytes", "sha256"} or None; set by _launch
        self.broadcast: Optional[Dict[str, Any]] = None

    @classmethod
    def done(cls, op: StatefulOperator, report: "BatchReport") -> "PendingBatch":
        """A PendingBatch with nothing to wait for or commit: ``commit()`` returns ``report``
        (a replayed micro-batch committed before the latest flush)."""
        pending = cls(op, report.version, "", 0, "", False, {}, report.watermark_ms,
                      None, time.perf_counter(), report.processing_time_ms,
                      batch_id=report.batch_id)
        pending._parts = []
        pending.report = report
        return pending

    def wait(self, timeout_s: Optional[float] = None) -> List[dict]:
        """Wait until every partition ``0..n-1`` of this attempt recorded its pending descriptor
        and return their reports (with ``descriptor``), by partition. Polls the store's pending
        descriptors every 2 ms for the first 250 ms, then at steps growing by 1.25x to at most
        200 ms: the writes usually end within tens of ms of the action, and the time between the
        last write's end and the poll that sees it adds to every micro-batch, so the first polls
        are dense; a poll lists one directory of the checkpoint, which is cheap.

        Lost writes: every task of the attempt had ended when the sink's action returned, so a
        partition that has not reported and whose write put no new heartbeat
        (``pending/V/<writer>.alive``, :mod:`statecore.spark.checkpoint_write`) for the
        operator's ``heartbeat_timeout_s`` (none at all: since the action ended) is lost -- its
        executor or Python worker died after the task, which Spark does not see, as its job
        succeeded. The heartbeats are read only while partitions are missing, every half
        interval. Then the micro-batch runs again (same version and placement, a new attempt
        id; the lost attempt's files are ignored, retention deletes them), up to the operator's
        ``relaunch_attempts`` times, as Spark re-runs a lost task; staleness is judged by beats
        changing between the driver's own reads, so the hosts' clocks do not matter.

        ``timeout_s``: default the operator's ``commit_timeout_s``, per attempt. Raises
        StateError when a partition's background write reported an error (at once), when
        partitions are lost and the relaunches are used up, or when some partition did not
        report within the timeout while its heartbeats went on: the micro-batch then fails and
        Spark replays it from the previous version. Whatever the sink raises in a relaunch."""
        if self._parts is not None:
            return self._parts
        op = self.op
        timeout = op.commit_timeout_s if timeout_s is None else float(timeout_s)
        t_start = time.perf_counter()
        while True:
            by_part, lost = self._poll(timeout)
            if lost is None:
                break
            now = time.perf_counter()
            self.phases["detect_s"] = self.phases.get("detect_s", 0.0) + now - self.action_end
            self.lost_partitions = sorted(set(self.lost_partitions) | set(lost))
            if self._relaunch is None or self.relaunches >= op.relaunch_attempts:
                raise StateError(
                    f"operator {op.name}: {self._what()}: partitions {lost} did not report "
                    f"their checkpoint: their task ended but their background write neither "
                    f"reported nor put a heartbeat for {op.heartbeat_timeout_s:g} s (their "
                    "worker or executor died, or the sink's action did not evaluate every "
                    "partition of the DataFrame it is given: use a write, not a limit); "
                    f"relaunched {self.relaunches} times (relaunch_attempts="
                    f"{op.relaunch_attempts}). The micro-batch is not committed; Spark replays "
                    "it from the previous version")
            self.relaunches += 1
            fresh = self._relaunch()
            self.attempt = fresh.attempt
            self.action_end = fresh.action_end
            self.phases["relaunch_s"] = (self.phases.get("relaunch_s", 0.0)
                                         + time.perf_counter() - now)
        self._wait_s = time.perf_counter() - t_start
        self._parts = [by_part[i] for i in range(self.num_partitions)]
        return self._parts

    def _poll(self, timeout: float):
        """``(reports by partition, None)`` once every partition of the current attempt
        reported, or ``(None, lost partitions)`` (:meth:`wait`). StateError for a reported
        error or past ``timeout`` seconds."""
        op = self.op
        n = self.num_partitions
        hb_timeout = op.heartbeat_timeout_s
        t_start = time.perf_counter()
        deadline = t_start + timeout
        fine_until = t_start + _WAIT_FINE_S
        delay = _WAIT_POLL_S
        # No partition can be lost before a heartbeat timeout has passed since the action.
        next_check = self.action_end + hb_timeout
        beats: Dict[str, tuple] = {}
        while True:
            by_part: Dict[int, dict] = {}
            for d in op.store.pending(self.version):
                r = d.get("spark_report")
                # Earlier attempts of this batch id (other writers, maybe another n) are ignored.
                if not isinstance(r, dict) or r.get("attempt") != self.attempt:
                    continue
                if r.get("error"):
                    raise StateError(
                        f"operator {op.name}: {self._what()}: the checkpoint write "
                        f"of partition {r.get('partition')} ({d.get('writer')}) failed: "
                        f"{r['error']}; the micro-batch is not committed (Spark replays it "
                        "from the previous version)")
                r = dict(r, descriptor={k: v for k, v in d.items() if k != "spark_report"})
                # Several Spark task attempts of one partition each write their own file; all
                # hold the same state (deterministic processor): the latest attempt wins.
                have = by_part.get(r["partition"])
                if have is None or r.get("task_attempt", 0) > have.get("task_attempt", 0):
                    by_part[r["partition"]] = r
            if sorted(by_part) == list(range(n)):
                return by_part, None
            now = time.perf_counter()
            if now >= next_check:
                lost = self._lost(set(range(n)) - set(by_part), beats, now)
                if lost:
                    return None, lost
                next_check = now + op.heartbeat_interval_s / 2
            if now >= deadline:
                missing = sorted(set(range(n)) - set(by_part))
                raise StateError(
                    f"operator {op.name}: {self._what()}: partitions {missing} did "
                    f"not report their checkpoint within {timeout:g} s after the sink's action "
                    f"(reported: {sorted(by_part)}) and did not count as lost (their "
                    "background writes kept putting heartbeats: writes slower than "
                    "commit_timeout_s; or commit_timeout_s is below heartbeat_timeout_s). The "
                    "micro-batch is not committed; Spark replays it from the previous version")
            time.sleep(min(delay, max(deadline - now, 0.0)))
            if now >= fine_until:
                delay = min(delay * 1.25, 0.2)

    def _lost(self, missing, beats: Dict[str, tuple], now: float) -> List[int]:
        """The partitions of ``missing`` (not reported) whose writes are lost at driver time
        ``now``: no heartbeat of this attempt's writers of the partition changed its ``beat``
        within the heartbeat timeout (none seen: since the action ended). ``beats``: writer ->
        (beat, driver time it was first seen, partition), updated here."""
        hb_timeout = self.op.heartbeat_timeout_s
        for hb in self.op.store.heartbeats(self.version):
            if hb.get("attempt") != self.attempt or not isinstance(hb.get("partition"), int):
                continue
            writer, beat = hb.get("writer"), hb.get("beat")
            seen = beats.get(writer)
            if seen is None or seen[0] != beat:
                beats[writer] = (beat, now, hb["partition"])
        alive = {p for _b, t, p in beats.values() if now - t < hb_timeout}
        if now - self.action_end < hb_timeout:
            return []
        return sorted(p for p in missing if p not in alive)

    def _what(self) -> str:
        return (f"the flush (version {self.version})" if self.is_flush
                else f"micro-batch {self.batch_id} (version {self.version})")

    def commit(self) -> BatchReport:
        """Wait (:meth:`wait`) and commit version :attr:`version`: manifest with the watermark for
        the next micro-batch, the attempt id, the committed writers (the worker caches' key),
        the processor config and counters; then clear the pending descriptors and apply
        retention. Returns the :class:`BatchReport`; a second call returns the same one."""
        if self.report is not None:
            return self.report
        op = self.op
        parts = self.wait()
        t_commit = time.perf_counter()
        store = op.store
        n, mp = self.num_partitions, op.max_parallelism
        batch_max = [r["max_event_ms"] for r in parts if r["max_event_ms"] is not None]
        prev_max = self.prev_meta.get("max_event_ms")
        if "watermark_delay_ms" not in self.prev_meta:
            # A manifest written before the delay existed: its watermark is the max event time.
            prev_max = self.prev_meta.get("watermark_ms")
        max_event = max(batch_max + ([prev_max] if prev_max is not None else []), default=None)
        new_wm = next_watermark(self.prev_meta.get("watermark_ms"),
                                max(batch_max) if batch_max else None, op.watermark_delay_ms)
        metrics: Dict[str, int] = {}
        for r in parts:
            for k, v in r["metrics"].items():
                metrics[k] = metrics.get(k, 0) + v
        loads: Dict[str, int] = {}
        for r in parts:
            loads[r["load"]] = loads.get(r["load"], 0) + 1
        rows = sum(r["rows"] for r in parts)
        out_rows = sum(r["output_rows"] for r in parts)
        entries = sum(r["state_entries"] for r in parts)
        sbytes = sum(r["state_bytes"] for r in parts)
        # A task of external keyed state reports without a data file (no size, no kind).
        ckpt_bytes = sum(r["descriptor"].get("size", 0) for r in parts)
        incremental = all(r["descriptor"].get("kind") == "incremental" for r in parts)
        metadata = {
            "operator": op.name, "batch_id": self.batch_id, "attempt": self.attempt,
            "query_id": self.place.query_id, "batch_offset": self.place.batch_offset,
            "writers": [r["descriptor"]["writer"] for r in parts],
            "num_partitions": n, "max_parallelism": mp, "key_type": self.key_type,
            "key_column": op.key_column, "backend": op.backend,
            "processor": type(op.processor).__qualname__,
            "processor_config": self.processor_config,
            "input_watermark_ms": self.watermark, "watermark_ms": new_wm,
            "processing_time_ms": self.processing_time_ms,
            "max_event_ms": max_event, "watermark_delay_ms": op.watermark_delay_ms,
            "rows": rows, "output_rows": out_rows, "state_entries": entries,
            "state_bytes": sbytes, "checkpoint_bytes": ckpt_bytes, "metrics": metrics,
            "loads": loads, "flush": self.is_flush, "final": self.final,
            "restore_bytes": [int(r.get("restore_bytes", 0)) for r in parts],
            "relaunches": self.relaunches,
            "broadcast": self.broadcast,
        }
        if self.is_flush and "query_id" not in self.prev_meta:
            # A flush after a version that predates query ids closes a stream of any query:
            # it must not pin the stream to "no query" (versions module).
            del metadata["query_id"]
        # A replayed micro-batch re-commits its version: replace on purpose (the operator
        # restored version - 1 for it); newer versions keep the runs they reference.
        descriptors = [r["descriptor"] for r in parts]
        if op.state_store is None:
            manifest = store.commit(self.version, descriptors, metadata, replace=True)
        else:
            prev_epoch = self.version - 1 if self.prev_meta else None
            manifest = commit_version_epoch(op, self.version, parts, prev_epoch, self.key_type,
                                            metadata)
        store.clear_pending(self.version)
        store.retain(op.retain_versions)
        phases = dict(self.phases, wait_s=self._wait_s, commit_s=time.perf_counter() - t_commit)
        self.report = BatchReport(
            operator_name=op.name, version=self.version, rows=rows, output_rows=out_rows,
            state_entries=entries, state_bytes=sbytes, checkpoint_bytes=ckpt_bytes,
            watermark_ms=new_wm, seconds=time.perf_counter() - self.t0, loads=loads,
            metrics=metrics, final=self.final, flush=self.is_flush, batch_id=self.batch_id,
            processing_time_ms=self.processing_time_ms,
            checkpoint_total_bytes=sum(int(f["size"]) for f in manifest["files"]),
            incremental=incremental, wait_seconds=self._wait_s,
            ttl_expired=dict(manifest.get("ttl_expired", {})), phases=phases,
            partitions=[{k: r[k] for k in _TASK_TIMINGS if k in r} for r in parts],
            relaunches=self.relaunches, lost_partitions=list(self.lost_partitions),
            broadcast=self.broadcast)
        op.reports.append(self.report)
        return self.report


def commit_batches(pending: List[PendingBatch]) -> List[BatchReport]:
    """Commit several operators' micro-batches of one ``foreachBatch`` call: first wait until
    every one's checkpoint writes reported (so none is committed when another's failed), then
    commit them in order. Returns their reports, in order. Errors: :meth:`PendingBatch.wait`,
    ``CheckpointStore.commit``. A crash between two commits leaves some operators one version
    ahead; Spark replays the batch and each operator restores ``batch_id - 1`` again."""
    for p in pending:
        p.wait()
    return [p.commit() for p in pending]
