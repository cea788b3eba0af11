"""Checkpoint store: versioned, key-group partitioned, incremental snapshots on any ``pyarrow.fs``
filesystem.

:class:`CheckpointStore` is the front door; the work is done by one collaborator per concern,
each in its own module of ``statecore.checkpoint``:

=====================  ======================================================================
``layout``             the files under a root, their names, listing, atomic publication
``format``             the data file of one run (``.sckp``): blocks, key-group index, footer
``runs``               runs and their chains: which runs a version needs for each key group
``manifests``          the manifest of a version: format, validated reads, atomic writes
``snapshot_writes``    writing a run, synchronously or in the background
``commit``             the commit protocol: descriptors in, a version's manifest out
``compaction``         replacing long chains by full runs (and the TTL compaction filter)
``retention``          keeping the newest versions, deleting what nothing references
``pins``               the runs open readers read, which retention keeps
``readers``            lazy StateSnapshots over a committed version, and change sets
=====================  ======================================================================

The protocol in one paragraph: writers write their runs (data files, immutable once referenced)
and hand their descriptors to one committer (the Spark driver), which writes the version's
manifest last and atomically -- a version exists for readers only once its manifest does.
Compaction publishes by atomically replacing a version's manifest with one that restores the same
state from fewer runs; retention deletes old manifests first, then files no retained manifest
references. Commit, compaction publishing and retention of one root run in one process and are
serialized there by the store's lock.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any, Iterable

import pyarrow.fs as pafs

from statecore.checkpoint.commit import Committer, PendingDescriptors
from statecore.checkpoint.compaction import (
    DEFAULT_SIZE_RATIO,
    Compactor,
    check_max_runs,
    check_size_ratio,
)
from statecore.checkpoint.format import (
    COMPRESSION,
    DEFAULT_BLOCK_TARGET_BYTES,
    check_block_target_bytes,
    check_compression,
    range_bounds,
)
from statecore.checkpoint.layout import (
    CheckpointRoot,
    check_version,
    manifest_name,
    pending_path,
)
from statecore.checkpoint.lease import DEFAULT_TAKEOVER_DELAY_S, Lease
from statecore.checkpoint.manifests import (
    MANIFEST_FORMAT,
    MANIFEST_FORMAT_VERSION,
    ManifestLog,
    describe_manifest,
)
from statecore.checkpoint.pins import ReaderPins
from statecore.checkpoint.readers import CHUNK_BYTES, ChangesReader, CheckpointReader, open_changes
from statecore.checkpoint.retention import Retention
from statecore.checkpoint.snapshot_writes import (
    SnapshotWriteFuture,
    SnapshotWriter,
    lower_thread_priority,
)
from statecore.errors import CheckpointNotFoundError, InvalidInputError
from statecore.ttl import wall_clock_ms

__all__ = [
    "CheckpointStore", "CheckpointReader", "ChangesReader", "SnapshotWriteFuture",
    "DEFAULT_MAX_RUNS", "CHUNK_BYTES", "MANIFEST_FORMAT", "MANIFEST_FORMAT_VERSION",
    "lower_thread_priority",
]

DEFAULT_MAX_RUNS = 8
#: Commits :meth:`CheckpointStore.committed_here` remembers.
COMMITTED_HERE_KEPT = 16


class _StoreManifests:
    """The manifests as a store's collaborators (commit, compaction, retention) see them: the
    interface of :class:`~statecore.checkpoint.manifests.ManifestLog`, with reads going through
    the store's public :meth:`CheckpointStore.versions`, :meth:`~CheckpointStore.latest_version`
    and :meth:`~CheckpointStore.manifest`, so that a subclass or a test overriding one of them
    sees every read of the store; writes and deletes go to the log."""

    def __init__(self, store: "CheckpointStore", log: ManifestLog):
        self._store = store
        self._log = log

    def versions(self) -> list[int]:
        return self._store.versions()

    def latest_version(self) -> int | None:
        return self._store.latest_version()

    def is_committed(self, version: int) -> bool:
        return self._store.is_committed(version)

    def read(self, version: int) -> dict:
        return self._store.manifest(version)

    def write(self, body: dict) -> dict:
        return self._log.write(body)

    def delete(self, version: int) -> None:
        self._log.delete(version)

    def fence(self, what: str) -> None:
        self._log.fence(what)


class CheckpointStore:
    """Versioned checkpoints of StateSnapshots under one root directory of a ``pyarrow.fs``
    filesystem (layout: :mod:`statecore.checkpoint.layout`; manifest format:
    :mod:`statecore.checkpoint.manifests`).

    ``uri_or_path``: a local path (str or ``os.PathLike``) or a URI understood by
    ``pyarrow.fs.FileSystem.from_uri`` (``file:///...``, ``s3://bucket/prefix``, ``hdfs://...``).
    ``filesystem``: a ``pyarrow.fs.FileSystem`` to use instead; ``uri_or_path`` is then a path
    inside it. Versions are ints in ``[0, 10**20)`` (a Spark micro-batch id). Nothing is created
    until the first write.
    ``max_runs``: :meth:`commit` compacts a version whose key groups need more than this many
    runs (int >= 1; ``None`` = never automatically). ``background_compaction``: run that
    compaction in a background thread (:meth:`compact_async`) instead of inside :meth:`commit`.
    ``ttl_clock``: processing-time clock (callable returning ms; default the wall clock) of the
    TTL compaction filter (:mod:`statecore.checkpoint.compaction`).
    ``fencing``: take the root's lease before committing, compacting or deleting, and refuse
    (FencedError) once another driver took it over (:mod:`statecore.checkpoint.lease`); ``None``
    (default) = on for object stores (S3, GCS, Azure: no atomic rename), off elsewhere.
    ``takeover_delay_s``: seconds to wait after taking the lease over from another driver.
    ``block_target_bytes`` (int >= 1): the uncompressed size at which the runs this store
    object writes (snapshots without a ``block_target_bytes`` of their own, compactions) cut
    their blocks (docs/formats.md "Blocks"; default 64 KiB). A point lookup reads and decodes
    one block per run, so smaller blocks serve the tiered mode's lookups of large states
    faster, at the cost of more blocks to open in a full restore (docs/tiered.md "Block
    size"); RocksDB's ``block_size`` (Flink's ``state.backend.rocksdb.block.blocksize``) is
    the same trade-off. Readers need no setting: every block's size is in the file's footer.
    ``compression`` (``"lz4.block"``, the default, or ``"none"``): how the runs this store
    object writes store their blocks (docs/formats.md "Block"). Uncompressed runs take more
    bytes (about twice for small keys and values) but a reader copies a block where it would
    decompress it: the tiered mode's lookups, which open a block per miss, are faster over
    them (docs/tiered.md "Block codec"). Readers need no setting: each file names its codec.
    ``compaction_size_ratio`` (int >= 1, default 4; None: every compaction writes a full run):
    a compaction merges a chain's incremental runs alone (a minor compaction, the full run
    under them kept) while they hold under 1/ratio of that full run's bytes, so that its cost
    follows the bytes changed rather than the state's size (:mod:`statecore.checkpoint.
    compaction`; RocksDB's ``max_bytes_for_level_multiplier`` is the same trade-off: a smaller
    ratio lets more changed bytes gather before the full run is rewritten, so compaction
    writes less and lookups pass more bytes of changes).
    Attributes: ``fs``, ``root`` (path in ``fs``), ``uri`` (as given), ``max_runs``,
    ``background_compaction``, ``ttl_clock``, ``fencing`` (bool), ``block_target_bytes``,
    ``compression``, ``compaction_size_ratio``. Raises InvalidInputError for a bad root,
    filesystem, ``max_runs``, ``ttl_clock``, ``fencing``, ``takeover_delay_s``,
    ``block_target_bytes``, ``compression`` or ``compaction_size_ratio``.
    """

    def __init__(self, uri_or_path: str | os.PathLike, filesystem: pafs.FileSystem | None = None,
                 *, max_runs: int | None = DEFAULT_MAX_RUNS, background_compaction: bool = False,
                 ttl_clock=None, fencing: bool | None = None,
                 takeover_delay_s: float = DEFAULT_TAKEOVER_DELAY_S,
                 block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
                 compaction_size_ratio: int | None = DEFAULT_SIZE_RATIO,
                 compression: str = COMPRESSION):
        self.block_target_bytes = check_block_target_bytes(block_target_bytes)
        self.compression = check_compression(compression)
        self.compaction_size_ratio = check_size_ratio(compaction_size_ratio)
        if max_runs is not None:
            check_max_runs(max_runs)
        if ttl_clock is not None and not callable(ttl_clock):
            raise InvalidInputError(f"ttl_clock must be callable, got {ttl_clock!r}")
        if fencing is not None and not isinstance(fencing, bool):
            raise InvalidInputError(f"fencing must be a bool or None, got {fencing!r}")
        if (isinstance(takeover_delay_s, bool) or not isinstance(takeover_delay_s, (int, float))
                or not 0 <= takeover_delay_s < float("inf")):
            raise InvalidInputError(
                f"takeover_delay_s must be a finite number >= 0, got {takeover_delay_s!r}")
        self.ttl_clock = ttl_clock or wall_clock_ms
        self.max_runs = max_runs
        self.background_compaction = bool(background_compaction)
        self._root = CheckpointRoot(uri_or_path, filesystem)
        self.fs = self._root.fs
        self.root = self._root.root
        self.uri = self._root.uri
        # Serializes manifest publishing and retention in this process (compaction in a thread).
        self._lock = threading.RLock()
        self.fencing = (not self._root.atomic_rename) if fencing is None else fencing
        self._manifests = ManifestLog(
            self._root, Lease(self._root, takeover_delay_s) if self.fencing else None)
        manifests = _StoreManifests(self, self._manifests)
        self._writer = SnapshotWriter(self._root, self.block_target_bytes, self.compression)
        self._pending = PendingDescriptors(self._root)
        self._committer = Committer(self._root, manifests, self._lock)
        self._compactor = Compactor(self._root, manifests, self._lock,
                                    self.block_target_bytes, self.compaction_size_ratio,
                                    self.compression)
        self._pins = ReaderPins()
        self._retention = Retention(
            self._root, manifests, self._lock,
            lambda: self._compactor.in_flight_paths() | self._pins.paths())
        # (version, commit id) of the newest commits of this object (committed_here)
        self._committed_here: deque = deque(maxlen=COMMITTED_HERE_KEPT)
        # backend -> (its base_token, the version that base is): what checkpoint() committed
        self._bases: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri!r})"

    def _abs(self, rel: str) -> str:
        return self._root.path(rel)

    # -------------------------------------------------------------------------------- paths

    @staticmethod
    def manifest_name(version: int) -> str:
        """File name (relative to the root) of the manifest of ``version``."""
        return manifest_name(version)

    def run_path(self, version: int, writer: str) -> str:
        """Path relative to the root of the run ``writer`` wrote for ``version`` as committed in
        ``version``'s manifest (data file names are unique per write, so a replayed writer's
        files are told apart by the manifest). Raises CheckpointNotFoundError when ``version``
        is not committed or its manifest lists no such run, CorruptCheckpointError for a
        damaged manifest."""
        version = check_version(version)
        for f in self.manifest(version)["files"]:
            if f["writer"] == writer and f["version"] == version:
                return f["path"]
        raise CheckpointNotFoundError(
            f"checkpoint version {version} under {self.uri} has no run of writer {writer!r}")

    @staticmethod
    def pending_path(version: int, writer: str) -> str:
        """Path relative to the root of the pending descriptor of ``writer`` at ``version``."""
        return pending_path(version, writer)

    # ------------------------------------------------------------------------------- writes

    def write_snapshot(self, snap: Any, version: int, writer: str = "p0", *,
                       block_target_bytes: int | None = None) -> dict:
        """Write the data file (run) of ``snap`` (StateSnapshot read interface) for ``version``
        as ``writer`` and return its descriptor: a JSON-able dict to pass to :meth:`commit` (or
        to :meth:`write_pending`). The run is incremental (NULL values = tombstones) when
        ``getattr(snap, "incremental", False)``, else full; the descriptor records ``kind``,
        ``tombstones`` {state: n} and ``snapshot_id`` (``snap.snapshot_id`` or None).
        Writes no manifest: the version stays invisible until committed.
        Re-running with the same (version, writer) atomically replaces the file.

        ``block_target_bytes``: uncompressed block size target (default: the store's).
        Raises InvalidInputError for a bad version/writer or a snapshot that breaks its contract
        (see ``format.write_data_file``); filesystem errors propagate as ``OSError``.
        Does not release ``snap``.
        """
        return self._writer.write(snap, version, writer, block_target_bytes=block_target_bytes)

    def write_snapshot_async(self, snap: Any, version: int, writer: str = "p0", *,
                             block_target_bytes: int | None = None, release_snapshot: bool = False,
                             queue_blocks: int | None = None, nice: int = 10,
                             chunk_bytes: int | None = None) -> "SnapshotWriteFuture":
        """:meth:`write_snapshot` in the background; returns a :class:`SnapshotWriteFuture` whose
        result is the same descriptor, and whose file is byte-identical to the synchronous one.

        Native snapshots (``snap.block_sources``): a C++ thread encodes the block payloads from
        the map snapshots into a queue bounded to ``queue_blocks`` payloads (backpressure;
        default ``format.queue_payloads``: 256 KiB of blocks, at least 4), and a
        Python thread takes them in chunks of about ``chunk_bytes`` stored bytes (below),
        compressed (LZ4) and checksummed (XXH64) with the GIL released, and writes each chunk
        through ``pyarrow.fs`` in one call: one GIL round trip per chunk instead of several per
        block, each of which can wait a switch interval while the owner runs Python. The owning
        thread keeps reading and writing state meanwhile: the snapshot is copy-on-write
        (state_map.h). Other snapshots (the Python backend's, which
        are materialized at snapshot time) are written by the Python thread alone.

        ``chunk_bytes`` (int >= 1; default ``format.CHUNK_TARGET_BYTES`` = 1 MiB, on an object
        store ``snapshot_writes.OBJECT_STORE_CHUNK_BYTES`` = 10 MiB, the part size of its
        multipart upload, which sends nothing before a part is full): stored bytes gathered per
        chunk (per write and GIL round trip); memory: about one chunk more.

        ``nice`` (int >= 0): added to the nice value of the writing threads (Linux; others
        ignore it): the write is background work, and on a machine with as many busy threads as
        cores it should yield the CPU to processing.

        ``release_snapshot``: with True the write owns ``snap`` and releases it when it ends;
        native map snapshots are even released key group by key group as they are encoded, so
        the owner stops copying early (do not read ``snap`` yourself then). With False (default)
        the caller releases it after the future succeeded; a ``snap.release()`` while the write
        runs is deferred until the write ends.

        ``future.cancel()`` stops the serializer thread, removes the partial temporary file and
        releases the snapshot (whatever ``release_snapshot`` says: the copy-on-write memory it
        pins is reclaimed); it returns False once the file is being published (the write then
        completes). A failure (filesystem ``OSError``, a snapshot breaking its contract:
        InvalidInputError) becomes the future's exception, with the same cleanup. Nothing appears
        at the final path unless the future succeeds.
        Raises InvalidInputError at once for a bad version, writer, block target or queue size.
        """
        return self._writer.write_async(
            snap, version, writer, block_target_bytes=block_target_bytes,
            release_snapshot=release_snapshot, queue_blocks=queue_blocks, nice=nice,
            chunk_bytes=chunk_bytes)

    def write_pending(self, version: int, writer: str, descriptor: dict) -> str:
        """Record ``descriptor`` (from :meth:`write_snapshot`) as ``pending/V/<writer>.json`` so a
        driver can :meth:`commit` without collecting descriptors through Spark. Replaces an
        earlier file of the same (version, writer). Returns the path relative to the root.
        Raises InvalidInputError when the descriptor is not JSON-able or names another
        version/writer."""
        return self._pending.write(version, writer, descriptor)

    def pending(self, version: int) -> list[dict]:
        """Descriptors recorded by :meth:`write_pending` for ``version``, sorted by writer
        (empty list when none). Raises CorruptCheckpointError naming a file that is not a JSON
        object."""
        return self._pending.read(version)

    def write_heartbeat(self, version: int, writer: str, body: dict) -> str:
        """Record ``body`` as the heartbeat ``pending/V/<writer>.alive`` of ``writer``'s write in
        flight at ``version`` (one small put; replaces the earlier one), so that a driver tells
        a slow write from a lost one (``statecore.spark``). Returns the path relative to the
        root; InvalidInputError when ``body`` is not JSON-able."""
        return self._pending.write_heartbeat(version, writer, body)

    def heartbeats(self, version: int) -> list[dict]:
        """Heartbeats recorded by :meth:`write_heartbeat` for ``version``, sorted by writer
        (unreadable ones left out)."""
        return self._pending.heartbeats(version)

    def clear_pending(self, version: int) -> None:
        """Delete the pending descriptors of ``version`` (a driver calls this before (re)running
        a micro-batch, so descriptors of an earlier attempt with other writers cannot leak into
        its commit)."""
        self._pending.clear(version)

    def commit(self, version: int, descriptors: Iterable[dict] | None = None,
               metadata: dict | None = None, *, replace: bool = False) -> dict:
        """Make ``version`` visible: check the descriptors and write its manifest, last and
        atomically (replacing the manifest of a replayed version). Returns the manifest (dict).

        The manifest lists the descriptors' runs (``seq`` = 1 + the previous version's highest)
        and the runs of the previous committed version (the highest below ``version``) that the
        new version still needs (:mod:`statecore.checkpoint.runs`). Afterwards, when a key
        group needs more than ``self.max_runs`` runs, the version is compacted (synchronously,
        or in the background with ``background_compaction``); the returned manifest is then the
        compacted one (synchronous case).

        ``descriptors``: from :meth:`write_snapshot`; ``None`` takes :meth:`pending` (version).
        ``metadata``: JSON-able dict stored with the version (e.g. the Spark batch id, watermark).
        ``replace``: allow ``version`` to be at or below the latest committed version (a
        replayed micro-batch re-commits its version); without it that is refused, so a stray
        commit cannot replace a committed version. Newer versions are never broken by it: data
        files are never overwritten, and they keep referencing the runs they were committed
        with.
        An incremental run must record the version it is relative to (its descriptor's
        ``base_version``, from the backend's ``base_version``) and that version must be the
        highest committed one below ``version``: otherwise its base is missing or another one,
        and committing it would silently lose changes. When the run also records the commit id
        of its base (``base_commit_id``: the backend restored a reader of this or another store,
        or was told it by ``notify_checkpoint_complete``), it must be that version's
        ``commit_id`` here: a version of another store, or one committed again since, with the
        same number is refused. Every commit gets a new random ``commit_id``; compaction keeps
        it.
        Raises InvalidInputError when there are no descriptors, ``version`` is not above the
        latest committed one without ``replace``, an incremental run's base version is unknown
        or not the previous version (or another commit of it), a descriptor is malformed or of
        another version, writers disagree on max parallelism / key type / assigner / a state's
        meta (also with the previous version's runs that are kept), two descriptors overlap in
        key groups, their ranges leave a gap, an incremental run has no full base run for some of
        its key groups in the previous version, or metadata is not a JSON-able dict;
        CorruptCheckpointError (naming the file) when a data file is missing or its size differs
        from its descriptor, or the previous version's manifest is damaged.
        """
        version = check_version(version)
        if descriptors is None:
            descriptors = self.pending(version)
        result = self._committer.commit(version, descriptors, metadata, replace)
        manifest = result.manifest
        with self._lock:
            self._committed_here.append((version, manifest.get("commit_id")))
        if self.max_runs is not None and result.longest_chain > self.max_runs:
            if self.background_compaction:
                self.compact_async(version)
            else:
                manifest = self.compact(version)
        return manifest

    def commit_external(self, version: int, *, store: str, namespace: str, epoch: int,
                        logs: Iterable[str], base_epoch: int | None, max_parallelism: int,
                        key_type: str, assigner: str, metadata: dict | None = None,
                        replace: bool = False) -> dict:
        """Make ``version`` visible as a metadata-only manifest: the version's keyed state is
        in an external store (``store``, e.g. ``"redis"``; never a URL, which may hold a
        password), namespace ``namespace``, to be committed there as ``epoch`` from the
        write-ahead logs ``logs`` on top of ``base_epoch`` (None: none). No data files, no
        descriptors; written last and atomically like every manifest, so it is the commit
        decision of the store's epoch (statecore.spark.external_commit). Returns the
        manifest. ``max_parallelism``, ``key_type``, ``assigner``, ``metadata`` and
        ``replace`` as in :meth:`commit`. Raises InvalidInputError for bad arguments (also a
        version not above the latest without ``replace``); FencedError when another driver
        holds the lease."""
        return self._committer.commit_external(
            version, (max_parallelism, key_type, assigner),
            {"store": store, "namespace": namespace, "epoch": epoch, "logs": list(logs),
             "base_epoch": base_epoch}, metadata, replace)

    # ------------------------------------------------------------------- one-call checkpoint

    def checkpoint(self, backend: Any, version: int, *, incremental: bool = True,
                   metadata: dict | None = None, writer: str = "p0",
                   replace: bool = False) -> dict:
        """Checkpoint ``backend`` as ``version`` in one call, with the bookkeeping Flink's
        checkpoint coordinator does for the user: snapshot, :meth:`write_snapshot`,
        :meth:`commit` (``metadata`` and ``replace`` as there) with this one descriptor, then
        ``backend.notify_checkpoint_complete`` so that the next incremental snapshot is relative
        to ``version``; the snapshot is released in every case. Returns the committed manifest.

        The snapshot is incremental when ``incremental`` and the backend's base is the state of
        a version this store object committed by ``checkpoint()`` and that version is the
        highest committed one below ``version`` (what :meth:`commit` chains an incremental run
        onto); otherwise it is full -- the first call, after a restore or ``apply_changes``
        (their contents are the base, not a version of this store), after another writer
        committed in between, or after a TTL migration (the backend then takes a full one).
        On any failure (the write, the commit, a filesystem error) the exception propagates and
        the backend's base is unchanged, so the next call lists every change since the last
        successful one; a failed version may be retried or skipped.

        It lives on the store, not the backend, because only the store knows which versions are
        committed (backends know nothing of checkpoints), and a backend's snapshot/notify steps
        stay available for writers coordinated by a driver (the Spark operator: several writers
        per version, one commit); here the backend is the version's only writer (its run must
        satisfy :meth:`commit` alone; errors as there). Raises InvalidInputError for a bad
        version, writer or metadata, StateError when the backend is disposed."""
        version = check_version(version)
        prev = self._bases.get(backend)
        use_incremental = False
        if incremental and prev is not None and prev[0] == backend.base_token:
            below = [v for v in self.versions() if v < version]
            use_incremental = bool(below) and below[-1] == prev[1]
        snap = backend.snapshot(incremental=use_incremental)
        try:
            desc = self.write_snapshot(snap, version, writer)
            manifest = self.commit(version, [desc], metadata, replace=replace)
            backend.notify_checkpoint_complete(snap.snapshot_id, version,
                                               manifest.get("commit_id"))
            self._bases[backend] = (backend.base_token, version)
        finally:
            snap.release()
        return manifest

    # --------------------------------------------------------------------------- compaction

    def compact(self, version: int | None = None, max_runs: int | None = None, *,
                key_groups: tuple[int, int] | None = None) -> dict:
        """Compact ``version`` (default: the latest): for every top run (one of the version's own
        commit) whose key groups need more than ``max_runs`` runs (default: the store's
        ``max_runs``, or 1 when that is None), write one run over the top run's range -- the merged
        changes above the chains' full run when they are small enough (a minor compaction,
        ``compaction_size_ratio``), else the merged state, no tombstones -- and atomically replace
        the version's manifest with one listing it instead, then likewise the manifest of every
        later version whose chains still hold the runs it merged (versions committed while it ran;
        :mod:`statecore.checkpoint.compaction`). ``key_groups`` (inclusive ``(start, end)``): only
        the top runs overlapping these key groups (what one task owns) are looked at, each compacted
        whole. What the version restores to does not change (less the entries the TTL compaction
        filter of a full compaction drops), nor what a later one does. Returns the version's
        (possibly unchanged) manifest. Raises CheckpointNotFoundError for an unknown version,
        InvalidInputError for a bad ``max_runs`` or ``key_groups``, CorruptCheckpointError when a
        run cannot be read; filesystem errors propagate (nothing published then, or the manifests
        published before the error)."""
        if max_runs is None:
            max_runs = self.max_runs if self.max_runs is not None else 1
        if key_groups is not None:
            key_groups = range_bounds(key_groups)
        return self._compactor.compact(version, max_runs, self.ttl_clock, key_groups)

    def compact_async(self, version: int | None = None, max_runs: int | None = None, *,
                      key_groups: tuple[int, int] | None = None) -> Future:
        """:meth:`compact` in the store's single background thread; returns its Future (whose
        result is the manifest, or the exception :meth:`compact` raised)."""
        return self._compactor.submit(
            lambda: self.compact(version, max_runs, key_groups=key_groups))

    def close(self) -> None:
        """Wait for background compactions and stop their thread (idempotent)."""
        self._compactor.close()

    def committed_here(self, version: int, commit_id: str | None) -> bool:
        """True when this store object made the commit ``commit_id`` of ``version`` (one of
        its last :data:`COMMITTED_HERE_KEPT` :meth:`commit` calls). A tiered backend asks its
        store to compact only such versions, so that the compaction publishes under the lock
        and the lease of the commits (docs/tiered.md "Compaction and retention")."""
        with self._lock:
            return (version, commit_id) in self._committed_here

    # -------------------------------------------------------------------------------- reads

    def versions(self) -> list[int]:
        """Committed versions (those with a manifest), ascending. Empty when the root does not
        exist."""
        return self._manifests.versions()

    def is_committed(self, version: int) -> bool:
        """True when ``version`` has a manifest (one stat, no listing: what a worker polls while
        it waits for the driver's commit). InvalidInputError for a version that is not an int
        in the range every version takes (as :meth:`manifest`)."""
        return self._manifests.is_committed(version)

    def latest_version(self) -> int | None:
        """The highest committed version, or ``None`` when there is none."""
        return self._manifests.latest_version()

    def manifest(self, version: int) -> dict:
        """The validated manifest of ``version`` (dict, format:
        :mod:`statecore.checkpoint.manifests`; a version-1 manifest comes back upgraded: runs with
        ``seq`` 0, kind ``full``).
        Raises CheckpointNotFoundError when ``version`` has no manifest; CorruptCheckpointError
        (naming the manifest) when it is not valid JSON, fails its checksum or is malformed
        (incl. overlapping runs of one seq, top runs that do not tile the range, a key group
        without a full run)."""
        return self._manifests.read(version)

    def metadata(self, version: int) -> dict:
        """User metadata committed with ``version`` (errors as :meth:`manifest`)."""
        return self.manifest(version)["metadata"]

    def open(self, version: int | None = None) -> "CheckpointReader":
        """A lazy StateSnapshot-like reader of ``version`` (default: the latest). Only the
        manifest is read here; data files are opened and their blocks read on demand. Until
        the reader is released (or garbage collected) the runs of the manifest it read are
        pinned: :meth:`retain` of this store object keeps them, even once no retained manifest
        references them (statecore.checkpoint.pins).
        Raises CheckpointNotFoundError for an unknown version (or none committed)."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise CheckpointNotFoundError(f"no committed checkpoint under {self.uri}")
        # Read and pinned under the lock retention holds: a retention either ran before (the
        # manifest read is one it kept, with its files) or sees the pins.
        with self._lock:
            manifest = self.manifest(version)
            unpin = self._pins.pin(f["path"] for f in manifest["files"])
        reader = CheckpointReader(self._root, version, manifest, on_release=unpin)
        weakref.finalize(reader, unpin)
        return reader

    def restore(self, backend: Any, version: int | None = None, *,
                stats: dict | None = None, operator_index: int | None = None,
                parallelism: int | None = None) -> int:
        """``backend.restore(self.open(version))``, reading only the byte ranges of the key
        groups in ``backend.key_group_range`` (one ranged read per run needed there; none for a
        backend whose ``attaches_runs`` is true, the tiered mode, which reads the runs in place
        later: docs/tiered.md). With ``operator_index`` and ``parallelism`` (both or neither)
        the backend's operator state is restored too, redistributed from all the version's
        writers for task ``operator_index`` of ``parallelism``
        (``backend.operator_state.restore``). Releases
        the reader afterwards. Returns the version restored; ``stats`` (a dict), when given,
        gets ``bytes_read``: the bytes read from data files (footers included). Errors as
        :meth:`open` and CorruptCheckpointError from the data read; InvalidInputError for
        only one of ``operator_index`` and ``parallelism``."""
        if (operator_index is None) != (parallelism is None):
            raise InvalidInputError("pass operator_index and parallelism together")
        reader = self.open(version)
        ext = reader.manifest.get("external")
        if ext is not None:
            reader.release()
            raise InvalidInputError(
                f"version {reader.version} of {self.uri} keeps its keyed state in an external "
                f"store ({ext['store']} namespace {ext['namespace']!r}, epoch {ext['epoch']}): "
                "there is nothing to restore from the checkpoint; read it with "
                "statecore.external.read_committed or a backend on the store")
        try:
            staged = None
            if operator_index is not None:
                # Staged first and applied last: a bad index, an incompatible operator state or
                # a failed keyed restore changes neither part.
                staged = backend.operator_state.stage_restore(reader, operator_index,
                                                              parallelism)
            kg_range = getattr(backend, "key_group_range", None)
            # A backend that reads the runs in place (the tiered mode, attaches_runs) reads
            # none of them now.
            if kg_range is not None and not getattr(backend, "attaches_runs", False):
                reader.prefetch(*range_bounds(kg_range))
            backend.restore(reader)
            if staged is not None:
                backend.operator_state.apply_restore(staged)
        finally:
            reader.release()
            if stats is not None:
                stats["bytes_read"] = reader.bytes_read
        return reader.version

    def open_changes(self, version: int, base_path: str, start: int, end: int
                     ) -> "ChangesReader | None":
        """What turns the state of the committed run ``base_path`` into ``version``'s state,
        for key groups ``[start, end]`` (inclusive): a :class:`ChangesReader` over the runs that
        ``version``'s chains hold above the base run, or None when that is not a plain sequence
        of incremental runs -- the base run is not in every chain of the range (compacted away,
        or another base), or a newer run is full (a full run has no tombstones for what it
        dropped). A backend that holds exactly the base run's state (its writer's, after the
        driver committed it) reaches ``version`` by applying the reader's entries as upserts and
        removals (``backend.apply_changes``): Flink's incremental restore, done in process. An
        empty reader (``runs == []``) means ``version`` holds that state already. Errors as
        :meth:`open` (unknown version, damaged manifest)."""
        return open_changes(self._root, version, self.manifest(version), base_path, start, end)

    def describe(self, version: int) -> dict:
        """Statistics of ``version`` from its manifest, for inspection: ``files`` / ``runs``
        (number of runs), ``bytes`` (stored size of all its runs), ``bytes_added`` (size of the
        runs written for this version), ``raw_bytes`` (uncompressed block payloads), ``blocks``,
        ``entries`` {state: stored entries over all runs, tombstones included},
        ``tombstones`` {state: n}, ``max_runs_per_key_group`` (longest chain),
        ``key_group_range``, ``key_groups`` (in range), ``key_groups_nonempty`` (summed over
        runs), ``writers`` (per run: path, writer, key_group_range, size, entries), ``run_list``
        (per run: path, writer, version, seq, kind, key_group_range, size, entries,
        tombstones), ``states`` (metas), ``metadata``, ``max_parallelism``, ``key_type``,
        ``assigner``, ``created_ms``, ``compacted_ms`` (None unless compacted),
        ``ttl_expired`` {strategy: expired values/list elements/map entries the writers' TTL
        cleanup removed since their previous snapshot}, ``ttl_compaction_expired`` {state: n
        dropped by the compaction filter}. Errors as :meth:`manifest`."""
        return describe_manifest(self.manifest(version), self.uri)

    def verify(self, version: int) -> dict:
        """Read and check every block of every run of ``version`` (checksums, structure, entry
        and tombstone counts against the manifest), then the merged view of every (state, key
        group). Returns :meth:`describe` (version). Raises CorruptCheckpointError on the first
        problem."""
        reader = self.open(version)
        try:
            reader.verify()
        finally:
            reader.release()
        return self.describe(version)

    # ---------------------------------------------------------------------------- retention

    def retain(self, k: int) -> list[int]:
        """Keep the newest ``k`` (>= 1) committed versions: delete older manifests first (oldest
        first), then every data file and pending descriptor that no retained manifest references
        (runs shared with retained versions stay, compaction inputs go once no retained version
        uses them). Files of versions at or above the newest retained one are left alone (they
        may be in flight), except unreferenced compaction outputs; so are outputs of a
        compaction in progress in this process and the runs of readers this store object opened
        and has not released (:meth:`open`). Returns the versions deleted. Raises
        InvalidInputError for ``k < 1`` and CorruptCheckpointError (deleting nothing) when a
        retained manifest cannot be read. A crash at any point leaves every retained version
        restorable; calling it again finishes the job."""
        return self._retention.retain(k)

