"""The worker side of :class:`statecore.spark.StatefulOperator` between tasks: the in-process
cache of partition state and its standby copies.

PySpark reuses Python workers (``spark.python.worker.reuse``, on by default), so a task can
leave its backend in the worker for the next micro-batch instead of restoring it from the
checkpoint store. But the executor hands a task to whichever of its idle Python workers comes
first, so a partition's next task lands on the worker that ran it last only about half the time
with two workers. Each worker therefore keeps:

* the backend of every partition it last ran (:class:`CachedState`), taken again by the
  partition's next task when it is exactly the committed predecessor (:func:`_take_cached`), or
  caught up from an older committed version of it (:func:`take_stale`, the runs committed
  since applied with :meth:`CheckpointStore.open_changes`);
* standby copies (Kafka Streams' standby replicas, fed from the committed incremental runs
  instead of a changelog): after each task a daemon thread waits for the driver's commit and
  brings the worker's copies of the operator's other partitions up to it, restoring more while
  it holds fewer than ``stale_copies`` (:func:`_standby_catch_up`), so that the next task of
  such a partition here is a cache hit off its critical path.

Public API, used by the task (:class:`statecore.spark.task.TaskSpec`): :class:`CachedState`,
:func:`note_task_started`, :func:`holds`, :func:`take_after_standby`, :func:`take_stale`,
:func:`partition_backend`, :func:`put_cached`, :func:`start_standby` and
:func:`clear_state_cache`. The cache, its lock and the standby bookkeeping stay inside this
module.

Exactly-once contract kept here: a cached backend serves a task only when it holds exactly the
version the driver committed as the task's predecessor (same attempt, and its data file among
the committed writers); anything else is closed or only used as the base of a catch-up over
committed runs, so a task never builds on state the driver did not commit.

Everything here runs in the worker process.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from statecore.checkpoint.snapshot_writes import lower_thread_priority
from statecore.errors import CheckpointNotFoundError, StateError
from statecore.key_groups import key_group_range_for_operator
from statecore.spark.handoff import held_elsewhere

__all__ = [
    "CachedState",
    "MAX_CACHED_PARTITIONS",
    "STANDBY_NICE",
    "STANDBY_WAIT_S",
    "clear_state_cache",
    "holds",
    "note_task_started",
    "partition_backend",
    "put_cached",
    "start_standby",
    "take_after_standby",
    "take_stale",
]


@dataclass
class CachedState:
    """A backend kept in the worker process after the task that produced ``version``.

    ``writer``: the writer name of its data file; ``snapshot_id``: the id of the snapshot that
    file was written from (passed to ``notify_checkpoint_complete`` once the driver committed
    ``version`` with this writer, so the next incremental snapshot starts from there);
    ``write``: a Future that resolves when the background write (data file + pending
    descriptor) finished, successfully or not (the backend may be closed only after that);
    ``abandon_after_s``: once the entry is dropped, how long its write may still run before it
    is cancelled (the driver has given up on it by then, see :func:`_close_entry`);
    ``pristine``: the backend holds exactly its data file's state (no TTL background cleanup
    after the snapshot), so it can catch up to a later version (:func:`take_stale`)."""

    version: int
    attempt: str
    num_partitions: int
    max_parallelism: int
    backend_kind: str
    key_type: str
    backend: Any
    writer: Optional[str] = None
    snapshot_id: Optional[int] = None
    write: Optional[Future] = None
    abandon_after_s: float = 600.0
    pristine: bool = True  # no change after the snapshot (a catch-up starts from its run)
    standby_cpu_s: Optional[float] = None  # set when a standby catch-up brought it to version

    def state(self) -> tuple:
        """(version, attempt, n, maxP, kind, key_type): what a task's ``want`` is matched with."""
        return (self.version, self.attempt, self.num_partitions, self.max_parallelism,
                self.backend_kind, self.key_type)

    def config(self) -> tuple:
        """(n, maxP, kind, key_type): what a catch-up to a later version must match."""
        return self.state()[2:]


_STATE_CACHE: Dict[tuple, CachedState] = {}
_CACHE_LOCK = threading.Lock()
# Cache keys whose entry a standby catch-up has taken out to work on, and the Event it sets when
# the entry is back (or dropped); see _standby_catch_up.
_STANDBY_BUSY: Dict[tuple, threading.Event] = {}
# Tasks started in this process per (store uri, operator): a standby catch-up still waiting for
# its commit when a later task started gives up (that version was not committed in time).
_TASKS_STARTED: Dict[tuple, int] = {}


def note_task_started(op_key: tuple) -> int:
    """Count a task of operator ``op_key`` = (store uri, operator name) started in this process
    and return the new count. A standby catch-up started by an earlier task gives up once the
    count moved past the one it started with (its version was not committed in time)."""
    with _CACHE_LOCK:
        n = _TASKS_STARTED[op_key] = _TASKS_STARTED.get(op_key, 0) + 1
    return n


def _close_entry(entry: CachedState) -> None:
    """Close ``entry``'s backend, after its background write finished (a native snapshot being
    written reads the backend's maps). A write still running ``abandon_after_s`` later is
    cancelled (``cancel_write``: stops the serializer at its next block, removes the temporary
    file, releases the snapshot), so a write stuck on slow storage cannot keep a dropped
    backend's memory for the life of the worker. By then the driver, which waits at most
    ``commit_timeout_s`` after the sink's action, has failed that micro-batch anyway. (A write
    blocked inside a filesystem call cannot be interrupted; it is cancelled when the call
    returns.)"""
    write = entry.write
    if write is None or write.done():
        entry.backend.close()
        return
    write.add_done_callback(lambda _f: entry.backend.close())

    def abandon() -> None:
        cancel = getattr(write, "cancel_write", None)
        if not write.done() and cancel is not None:
            cancel()

    timer = threading.Timer(entry.abandon_after_s, abandon)
    timer.daemon = True
    timer.start()
    write.add_done_callback(lambda _f: timer.cancel())


def clear_state_cache() -> None:
    """Close and forget every backend cached in this process (tests; memory pressure). Backends
    with a background checkpoint write in flight are closed when it finishes."""
    with _CACHE_LOCK:
        entries = list(_STATE_CACHE.values())
        _STATE_CACHE.clear()
    for e in entries:
        _close_entry(e)


def _take_cached(key: tuple, want: tuple, committed_writers: Optional[frozenset],
                 commit_id: Optional[str] = None) -> Optional[CachedState]:
    """Remove and return the cache entry for ``key`` if it holds exactly ``want`` =
    (version, attempt, n, maxP, kind, key_type) and its data file is one the driver committed
    (``committed_writers``; None = not recorded, older checkpoints). An older pristine entry
    stays cached (a catch-up base for :func:`take_stale`); any other non-matching entry is
    closed. Taking the entry out before mutating it means a task that fails midway can never
    leave a half-updated backend labelled with the old version. On a hit the backend is told
    that its snapshot of that version is complete, which moves its incremental base there;
    ``commit_id`` (the committed manifest's, None when not recorded) becomes its base commit id,
    so the store refuses to chain its next incremental run onto another commit of the version."""
    with _CACHE_LOCK:
        entry = _STATE_CACHE.get(key)
        if entry is None:
            return None
        hit = entry.state() == want and (committed_writers is None
                                         or entry.writer in committed_writers)
        if not hit and entry.version < want[0] and entry.pristine:
            return None
        del _STATE_CACHE[key]
    if not hit:
        _close_entry(entry)
        return None
    if entry.write is not None and entry.write.exception() is not None:
        # Committed means its pending descriptor exists, written after the data file and the
        # snapshot's release, so this only waits for the Future's bookkeeping to settle.
        entry.backend.close()
        return None
    if entry.snapshot_id is not None:
        entry.backend.notify_checkpoint_complete(entry.snapshot_id, entry.version,
                                                 commit_id=commit_id)
    return entry


def holds(key: tuple, want: tuple) -> bool:
    """Whether this worker holds ``key`` = (store uri, operator, partition) at exactly ``want``
    = (version, attempt, n, maxP, backend kind, key type), or a standby here is working on it:
    its task then runs here (no handoff). Does not take the entry."""
    with _CACHE_LOCK:
        if key in _STANDBY_BUSY:
            return True
        e = _STATE_CACHE.get(key)
        return e is not None and e.state() == want


def take_stale(key: tuple, store, version: int, config: tuple, kg_range):
    """Remove the cached backend for ``key`` when it holds an older committed version of the
    partition with the same ``config`` = (n, maxP, kind, key_type) and its data file is the base
    of a plain incremental chain up to ``version`` (:meth:`CheckpointStore.open_changes`).
    Returns ``(backend, changes)`` to apply with ``backend.apply_changes(changes)``, or None
    (an unusable entry is closed). The driver committed the entry's file if ``version``'s
    manifest lists it."""
    with _CACHE_LOCK:
        entry = _STATE_CACHE.get(key)
        if entry is None or entry.version >= version or not entry.pristine or entry.writer is None \
                or entry.config() != config:
            return None
        del _STATE_CACHE[key]
    changes = None
    try:
        # Not waiting: a committed entry's write has finished, while the write of an attempt
        # the driver gave up on (a worker that never reported) may never finish.
        write = entry.write
        if write is None or (write.done() and write.exception() is None):
            changes = store.open_changes(version, store.run_path(entry.version, entry.writer),
                                         kg_range.start, kg_range.end)
    except (CheckpointNotFoundError, StateError, OSError):
        changes = None
    if changes is None:
        _close_entry(entry)
        return None
    return entry.backend, changes


#: Cached partitions per worker process beyond which the oldest are closed.
MAX_CACHED_PARTITIONS = 32


def put_cached(key: tuple, entry: CachedState, stale_copies: int = 0) -> None:
    """Cache ``entry`` for ``key``; close entries that can no longer serve: of the other
    partitions of the same operator at an older version (the next micro-batch needs this version
    or a newer one; an older copy only as a catch-up base) all but the ``stale_copies`` newest
    pristine ones, and the oldest entries beyond :data:`MAX_CACHED_PARTITIONS`."""
    closing = []
    with _CACHE_LOCK:
        old = _STATE_CACHE.pop(key, None)
        if old is not None:
            closing.append(old)
        older = [k for k, e in _STATE_CACHE.items()
                 if k[:2] == key[:2] and e.version < entry.version]
        bases = sorted((k for k in older if _STATE_CACHE[k].pristine),
                       key=lambda k: _STATE_CACHE[k].version)
        keep = set(bases[max(len(bases) - stale_copies, 0):])
        for k in older:
            if k not in keep:
                closing.append(_STATE_CACHE.pop(k))
        _STATE_CACHE[key] = entry
        while len(_STATE_CACHE) > MAX_CACHED_PARTITIONS:
            closing.append(_STATE_CACHE.pop(next(iter(_STATE_CACHE))))
    for e in closing:
        if e.backend is not entry.backend:
            _close_entry(e)


def _await_standby(key: tuple, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) while a standby catch-up works on the entry of ``key``."""
    with _CACHE_LOCK:
        ev = _STANDBY_BUSY.get(key)
    if ev is not None:
        ev.wait(timeout_s)


def take_after_standby(key: tuple, want: tuple, committed_writers: Optional[frozenset],
                       timeout_s: float, commit_id: Optional[str] = None
                       ) -> Optional[CachedState]:
    """:func:`_take_cached` once no standby works on ``key``'s entry: one in flight (the
    previous task of this worker started it) ends within the time of a catch-up and leaves a
    cache hit. A standby that took the entry just after the first look is waited for once more.
    Each wait lasts at most ``timeout_s`` seconds; ``commit_id`` as for :func:`_take_cached`.
    Returns the entry, taken out of the cache
    (its backend now told that its snapshot of ``want``'s version is complete), or None when
    this worker does not hold exactly ``want`` with a committed data file (the caller then
    catches up or restores)."""
    for _ in range(2):
        _await_standby(key, timeout_s)
        hit = _take_cached(key, want, committed_writers, commit_id)
        with _CACHE_LOCK:
            retry = hit is None and key in _STANDBY_BUSY
        if not retry:
            return hit
    return hit


def _writer_of(writers, partition: int) -> Optional[str]:
    """The committed writer name of ``partition`` (``p<i>-<attempt>-t<n>``) in ``writers``."""
    prefix = f"p{partition}-"
    return next((w for w in writers if w.startswith(prefix)), None)


#: Seconds a standby catch-up waits for the driver's commit before it gives up.
STANDBY_WAIT_S = 60.0
# Added to the standby thread's nice value (Linux): the catch-up runs while the driver plans the
# next micro-batch and the other workers' tasks run; at the workers' own priority it takes CPU
# from them and lengthens Spark's time between micro-batches, at the lowest it fills idle CPU,
# and a task that needs the copy first waits for it (_await_standby) while its own thread is
# idle anyway.
STANDBY_NICE = 19


def partition_backend(kind: str, key_type: str, max_parallelism: int, num_partitions: int,
                      partition: int, **options):
    """An empty backend (``kind`` "python" or "native", keys of ``key_type``) for operator index
    ``partition`` of ``num_partitions``: Spark key-group assignment, Flink's
    ``KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex`` range of that index.
    ``options`` go to the backend (``memory_budget`` and ``checkpoint``: the tiered mode).
    Errors: :func:`statecore.backends.create_backend`."""
    from statecore.backends import create_backend

    return create_backend(kind, key_type=key_type, max_parallelism=max_parallelism,
                          key_group_range=key_group_range_for_operator(
                              max_parallelism, num_partitions, partition),
                          assigner="spark", **options)


def _standby_candidates(op_key: tuple, own: tuple, version: int) -> List[tuple]:
    """Cache keys of this operator's other partitions held at a committed version below
    ``version``, unchanged since (pristine): what a standby catch-up can bring to ``version``."""
    with _CACHE_LOCK:
        return [k for k, e in _STATE_CACHE.items()
                if k[:2] == op_key and k != own and e.version < version and e.pristine
                and e.writer is not None]


def _standby_replace(key: tuple, make: Callable) -> bool:
    """Take ``key``'s cache entry (or None) out of the cache, marked busy (``_STANDBY_BUSY``: a
    task that needs it waits), and put ``make(entry)`` back in its place: a new entry, the same
    one, or None. An entry that is not put back is closed; so is the new one when a task cached
    ``key`` meanwhile, and the old one when ``make`` raised (it may be half-updated). Returns
    True when a new entry went in. Skips (False) a key another standby is working on."""
    _await_standby(key, STANDBY_WAIT_S)
    with _CACHE_LOCK:
        if key in _STANDBY_BUSY:
            return False
        entry = _STATE_CACHE.pop(key, None)
        busy = _STANDBY_BUSY[key] = threading.Event()
    new = None
    try:
        new = make(entry)
    except Exception:  # noqa: BLE001 -- a copy that cannot be brought up to date is dropped
        new = None
    finally:
        with _CACHE_LOCK:
            placed = new is not None and key not in _STATE_CACHE
            if placed:
                _STATE_CACHE[key] = new
            del _STANDBY_BUSY[key]
        busy.set()
    # A caught-up copy is a new entry around the same backend: close each backend once.
    if entry is not None and not (placed and new.backend is entry.backend):
        _close_entry(entry)
    if new is not None and not placed and (entry is None or new.backend is not entry.backend):
        _close_entry(new)
    return placed and new is not entry


def _standby_catch_up(store, op_key: tuple, own: tuple, version: int, generation: int,
                      config: tuple, copies: int, wait_s: float = STANDBY_WAIT_S,
                      handoff: bool = False) -> int:
    """Keep this worker's copies of the operator's other partitions current (Kafka Streams'
    standby replicas, fed from the committed incremental runs instead of a changelog).

    Waits until the driver committed ``version`` (polling :meth:`CheckpointStore.is_committed`
    from 5 ms, growing 1.25x to 100 ms), then brings every copy this worker keeps
    (:func:`_standby_candidates`) up to it with ``apply_changes``, and when it keeps fewer than
    ``copies`` (the operator's ``stale_copies``) restores more partitions of ``config`` = (n,
    maxP, backend kind, key type) at ``version``, the next indices after its own first. The
    partition's next task in this worker, if PySpark hands it here, is then a cache hit (``load
    = "standby"``) instead of a catch-up or restore on the task's critical path. Runs in a daemon
    thread of the worker between its tasks (:func:`_standby_replace` keeps each copy out of the
    cache while it works on it). Gives up when ``version`` is not committed within ``wait_s`` or
    a later task of this operator started in this process first (``generation``: ``version``
    failed or is being replayed). A copy that cannot be caught up (compacted chain, a failed or
    unfinished write, any error) is closed, and the task restores as it would without standby.
    With ``handoff``, partitions that another live worker of this host claims at ``version``
    are left alone (:func:`statecore.spark.handoff.held_elsewhere`): their next task here is
    handed to that worker. Returns the copies caught up or restored."""
    delay, deadline = 0.005, time.monotonic() + wait_s
    while not store.is_committed(version):
        if time.monotonic() >= deadline or _TASKS_STARTED.get(op_key, 0) != generation:
            return 0
        time.sleep(delay)
        delay = min(delay * 1.25, 0.1)
    meta = store.metadata(version)
    writers = meta.get("writers") or ()

    def committed(partition: int, backend, t_cpu: float) -> Optional[CachedState]:
        writer = _writer_of(writers, partition)
        if writer is None:
            return None
        n, mp, kind, key_type = config
        return CachedState(version, meta["attempt"], n, mp, kind, key_type, backend,
                            writer=writer, standby_cpu_s=time.thread_time() - t_cpu)

    def catch_up(partition: int, entry: Optional[CachedState]) -> Optional[CachedState]:
        t_cpu = time.thread_time()
        if entry is None or entry.version >= version or not entry.pristine:
            return entry
        if entry.config() != config:
            return None
        if entry.write is not None and not entry.write.done():
            return entry  # not settled: a later catch-up may still use it
        if entry.write is not None and entry.write.exception() is not None:
            return None
        kg = key_group_range_for_operator(entry.max_parallelism, entry.num_partitions, partition)
        changes = store.open_changes(version, store.run_path(entry.version, entry.writer),
                                     kg.start, kg.end)
        if changes is None:
            return None
        try:
            entry.backend.apply_changes(changes)
        finally:
            changes.release()
        return committed(partition, entry.backend, t_cpu)

    def restore(partition: int):
        def make(entry: Optional[CachedState]) -> Optional[CachedState]:
            if entry is not None:
                return entry  # a task cached it meanwhile
            t_cpu = time.thread_time()
            backend = partition_backend(config[2], config[3], config[1], config[0], partition)
            try:
                store.restore(backend, version, operator_index=partition,
                              parallelism=config[0])
                new = committed(partition, backend, t_cpu)
            except BaseException:
                backend.close()
                raise
            if new is None:
                backend.close()
            return new
        return make

    def elsewhere(key: tuple) -> bool:
        return handoff and held_elsewhere(key, version)

    done = 0
    for key in _standby_candidates(op_key, own, version):
        if not elsewhere(key):
            done += _standby_replace(key, lambda e, q=key[2]: catch_up(q, e))
    n = config[0]
    for i in range(1, n):
        with _CACHE_LOCK:
            held = sum(1 for k in list(_STATE_CACHE) + list(_STANDBY_BUSY)
                       if k[:2] == op_key and k != own)
        if held >= copies:
            break
        key = op_key + ((own[2] + i) % n,)
        with _CACHE_LOCK:
            free = key not in _STATE_CACHE and key not in _STANDBY_BUSY
        if free and not elsewhere(key):
            done += _standby_replace(key, restore(key[2]))
    return done


def start_standby(store, op_key: tuple, own: tuple, version: int, config: tuple,
                  copies: int, handoff: bool = False) -> threading.Thread:
    """Start :func:`_standby_catch_up` in a daemon thread at nice + ``STANDBY_NICE`` and return
    the thread. ``op_key`` = (store uri, operator), ``own`` = the cache key of the partition the
    calling task ran, ``version`` = the version that task wrote, ``config`` = (n, maxP, backend
    kind, key type), ``copies`` = the operator's ``stale_copies``; ``handoff``: skip partitions
    another live worker of this host holds. Call it after :func:`note_task_started` of that
    task: a later task start makes the catch-up give up."""
    args = (store, op_key, own, version, _TASKS_STARTED.get(op_key, 0), config, copies)

    def run() -> None:
        lower_thread_priority(STANDBY_NICE)
        _standby_catch_up(*args, handoff=handoff)

    t = threading.Thread(target=run, name=f"statecore-standby-{op_key[1]}", daemon=True)
    t.start()
    return t
