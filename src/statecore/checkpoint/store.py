"""Checkpoint store: versioned, key-group partitioned, incremental snapshots on any ``pyarrow.fs``
filesystem.

Layout under the root (``V`` = the version as 20 zero-padded decimal digits, so names sort by
version)::

    manifest-V.json              one per committed version, written last and atomically
    data/V/<writer>.sckp         one data file (a *run*) per writer (statecore.checkpoint.format)
    data/V/compacted-s<seq>-<start>-<end>-<12 hex>.sckp   a run written by compaction of V
    pending/V/<writer>.json      optional: a writer's descriptor, for a driver to commit from

A version exists for readers only once its manifest exists. Names of writer runs are
deterministic, so a replayed (re-run) micro-batch rewrites its own files and re-commits its
manifest; compaction outputs carry a random suffix and are never overwritten. Every file is
written atomically: on filesystems with an atomic rename (local disk, HDFS) to a temporary name
in the same directory and then moved (``fs.move``); on object stores (S3, GCS, Azure) a single put
of the complete bytes, which is atomic there.

Runs and versions (architecture.md "Incremental snapshots and checkpoints")
--------------------------------------------------------------------------
A version's manifest lists *runs*: data files, each with a key-group range, a kind (``full``: the
complete state of its key groups; ``incremental``: the changes since the writer's base, removals
as tombstones) and a sequence number ``seq``. ``commit(V, descriptors)`` gives all of V's new runs
(which must tile V's key-group range, as before) ``seq = 1 + max seq of the previous version``
(the highest committed version below V), so seqs increase along the chain of versions; the
manifest of V = the new runs + the runs of the previous version that V still needs. For a key
group ``kg`` the *chain* of a version is its runs covering ``kg`` from the newest (highest seq)
down to and including the newest full one; a run in no chain of V's range is dropped from V's
manifest (a full run makes all older runs of its key groups unnecessary). Runs are shared between
versions by path and never rewritten. A chain without a full run is an error at commit
(``InvalidInputError``: an incremental snapshot needs a committed base) and, in a stored manifest,
corruption. A reader merges a chain newest-wins per (state, key group): a tombstone deletes, the
result holds no tombstones. Timers (the state of kind ``timers``) are complete in every run, so
they come from the newest run of the chain alone.

Asynchronous writes
-------------------
:meth:`CheckpointStore.write_snapshot_async` writes the same file as :meth:`write_snapshot`
(byte-identical) in the background: for native snapshots a C++ thread encodes block payloads
from the copy-on-write map snapshots into a bounded queue (native snapshot_writer.h) while a
Python thread takes them in chunks of about 1 MiB, compressed (LZ4) and checksummed (XXH64) with
the GIL released, and writes each chunk at once; the owner keeps processing. Per chunk, not per
block, the writer needs the GIL once: when the owner runs Python, each time can cost a switch
interval (5 ms). It publishes the file only if not cancelled
(:class:`SnapshotWriteFuture`), so a cancelled or failed write leaves nothing at the final path.

Compaction (crash safety)
-------------------------
``compact(V, max_runs=N)`` looks at V's *top runs* (those of V's own commit: ``seq`` = the
highest in the manifest; they tile V's range). For each top run whose range has a chain longer
than N it writes one full run over the same range, same ``seq`` (the merged chain, tombstones
dropped), as a new file with a unique name; then it atomically replaces ``manifest-V.json`` with a
manifest listing the compacted runs instead (same version, same metadata, runs no chain needs
any more dropped). We chose rewriting V's manifest over recording compaction results for the next
commit because (1) every step is one atomic file operation and the manifest replace is the only
publishing step: a crash before it leaves an unreferenced file (deleted by a later
:meth:`CheckpointStore.retain`), a crash after it leaves a complete manifest; (2) the compacted
manifest restores exactly what the old one did (same merged content), so no version ever changes
what it restores to; (3) the next commit simply starts from V's (compacted) manifest, no side
state to keep consistent. The replace happens only when V's manifest is still the one compaction
read (checksum compared under the store's lock); otherwise (V re-committed meanwhile) the new file
is abandoned. Compaction inputs stay on disk while any retained manifest (e.g. of V+1, committed
before the compaction) references them.

:meth:`CheckpointStore.commit` compacts the committed version automatically when a chain is longer
than the store's ``max_runs`` (default 8; ``None`` disables it), synchronously or, with
``background_compaction=True``, in a background thread (:meth:`CheckpointStore.compact_async`).

TTL compaction filter
---------------------
A state whose TTL config has ``cleanup_in_compaction`` (``query_time_after_num_entries`` N) loses
its expired entries whenever compaction merges its runs (frocksdb's FlinkCompactionFilter on
statecore's suffix layout, ``statecore.ttl.compaction_filter``): expired values are dropped, a
list keeps only its unexpired suffix (fixed-width elements skipped by stride), map entries are
dropped one by one, values too short to hold a timestamp are kept. The time is read from the
store's ``ttl_clock`` once per compaction and again after every N entries (cached in between, as
frocksdb does); event-time TTL uses the version's ``metadata["watermark_ms"]`` (none: nothing
expires). Each run of entries sharing one clock reading is filtered in C++ when the extension is
built (ttl.h ``filter_values``), in Python otherwise, with the same result. The compacted version restores without those entries -- which is what a read would
have done with them -- and the manifest counts them per state (``ttl_compaction_expired``).

Retention deletes manifests of dropped versions first (oldest first, so the committed versions
stay a suffix), then every file under ``data/`` and ``pending/`` that no retained manifest
references, except files of versions at or above the newest retained one (writes of a version
in flight), compaction outputs excepted, and files of a compaction in progress in this process.
The retained manifests are all read and checked before anything is deleted. Commit, compaction
publishing and retention of one store must run in one process (the Spark driver); within it they
are serialized by a lock.

Manifest (UTF-8 JSON object, keys sorted; format_version 2, version-1 manifests are read as
manifests of full runs with ``seq`` 0)::

    {"format": "statecore-checkpoint", "format_version": 2, "version": int, "created_ms": int,
     "max_parallelism": int, "key_type": str, "assigner": str,
     "key_group_range": [start, end],     # inclusive union of the top runs' ranges; (0, -1) = empty
     "states": [state meta, ...],         # union over the runs, by name
     "files": [{"path": "data/V/p0.sckp" (relative to the root), "size": bytes, "writer": str,
                "version": int (the version the run was written for), "seq": int,
                "kind": "full" | "incremental", "key_group_range": [start, end],
                "states": [names], "entries": {name: int (incl. tombstones)},
                "tombstones": {name: int}, "blocks": int, "raw_bytes": int,
                "stored_bytes": int, "key_groups_nonempty": int,
                "footer_xxh64": "16 hex digits"}, ...],          # the runs
     "metadata": {...user metadata...},
     "compacted_ms": int (only after a compaction),
     "checksum_xxh64": "16 hex digits"}   # xxh64 of the canonical JSON of all other keys

Canonical JSON = ``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` (ASCII).
"""

from __future__ import annotations

import json
import operator
import os
import re
import sys
import threading
import time
import uuid
from bisect import bisect_right
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from statecore.checkpoint.format import (
    CHUNK_TARGET_BYTES,
    DEFAULT_BLOCK_TARGET_BYTES,
    FORMAT_VERSION,
    KIND_FULL,
    KIND_INCREMENTAL,
    DataFileReader,
    make_key_group_range,
    _plan_file,
    range_bounds,
    write_data_file,
    write_data_file_from_blocks,
    xxh64,
)
from statecore import serializers as S
from statecore.descriptors import stored_format
from statecore.ttl import CompactionTimeProvider, StateTtlConfig, compaction_filter, wall_clock_ms
from statecore.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidInputError,
)

MANIFEST_FORMAT = "statecore-checkpoint"
MANIFEST_FORMAT_VERSION = 2
_READABLE_MANIFEST_VERSIONS = (1, 2)
DEFAULT_MAX_RUNS = 8
#: Decoded bytes per (keys, values) pair of :meth:`CheckpointReader.entries_chunks`: well below
#: the 2 GiB an Arrow binary array holds, large enough that a partition is a handful of pairs.
CHUNK_BYTES = 256 << 20
_COMPACTED_RE = re.compile(r"^compacted-s\d+-\d+-\d+-[0-9a-f]{12}\.sckp$")
_MANIFEST_RE = re.compile(r"^manifest-(\d{20})\.json$")
_VERSION_DIR_RE = re.compile(r"^\d{20}$")
_WRITER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_OBJECT_STORES = {"s3", "gcs", "abfs"}
_MAX_VERSION = 10**20 - 1


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("ascii")


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= _MAX_VERSION:
        raise InvalidInputError(
            f"checkpoint version must be an int in [0, {_MAX_VERSION}], got {version!r}")
    return version


def _check_writer(writer: Any) -> str:
    if not isinstance(writer, str) or not _WRITER_RE.match(writer):
        raise InvalidInputError(
            f"writer must match {_WRITER_RE.pattern} (it becomes a file name), got {writer!r}")
    return writer


def _check_max_runs(max_runs: Any) -> int:
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise InvalidInputError(f"max_runs must be an int >= 1, got {max_runs!r}")
    return max_runs


def _vdir(version: int) -> str:
    return f"{version:020d}"


def _has_atomic_rename(fs: pafs.FileSystem) -> bool:
    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs.type_name not in _OBJECT_STORES


def _upgraded(body: dict, version: int) -> dict:
    """``body`` (a manifest without its checksum) in the current format: a version-1 manifest's
    runs get ``seq`` 0, kind ``full``, their version and no tombstones. Returns ``body``."""
    if body.get("format_version") == 1:
        for f in body["files"]:
            f.update(seq=0, kind=KIND_FULL, version=version,
                     tombstones={n: 0 for n in f["entries"]})
    body["format_version"] = MANIFEST_FORMAT_VERSION
    return body


class _ValidatedManifests:
    """The bytes of the last manifests that passed :meth:`CheckpointStore.manifest`'s checks,
    by path (process-wide: a Spark worker makes a store per task). A manifest read again with
    the same bytes at the same path -- which names its version -- is only parsed: the checksum
    (a canonical re-serialization) and the structure checks were ~70% of the ~0.5 ms a read of
    the bench's ~10 KB manifests took, and the driver reads ~5 per micro-batch. Different bytes
    (a compaction replaced the manifest, a damaged file) take the full checks. Thread-safe."""

    MAX_ENTRIES = 256

    def __init__(self):
        self._lock = threading.Lock()
        self._raw: dict[str, bytes] = {}

    def seen(self, path: str, raw: bytes) -> bool:
        with self._lock:
            return self._raw.get(path) == raw

    def add(self, path: str, raw: bytes) -> None:
        with self._lock:
            self._raw.pop(path, None)
            self._raw[path] = bytes(raw)
            while len(self._raw) > self.MAX_ENTRIES:
                del self._raw[next(iter(self._raw))]


_VALIDATED_MANIFESTS = _ValidatedManifests()


class CheckpointStore:
    """Versioned checkpoints of StateSnapshots under one root directory of a ``pyarrow.fs``
    filesystem (layout and manifest format: module docstring).

    ``uri_or_path``: a local path (str or ``os.PathLike``) or a URI understood by
    ``pyarrow.fs.FileSystem.from_uri`` (``file:///...``, ``s3://bucket/prefix``, ``hdfs://...``).
    ``filesystem``: a ``pyarrow.fs.FileSystem`` to use instead; ``uri_or_path`` is then a path
    inside it. Versions are ints in ``[0, 10**20)`` (a Spark micro-batch id). Nothing is created
    until the first write.
    ``max_runs``: :meth:`commit` compacts a version whose key groups need more than this many
    runs (int >= 1; ``None`` = never automatically). ``background_compaction``: run that
    compaction in a background thread (:meth:`compact_async`) instead of inside :meth:`commit`.
    ``ttl_clock``: processing-time clock (callable returning ms; default the wall clock) of the
    TTL compaction filter (module docstring "TTL compaction filter").
    Raises InvalidInputError for a bad root, filesystem, ``max_runs`` or ``ttl_clock``.
    """

    def __init__(self, uri_or_path: str | os.PathLike, filesystem: pafs.FileSystem | None = None,
                 *, max_runs: int | None = DEFAULT_MAX_RUNS, background_compaction: bool = False,
                 ttl_clock=None):
        if max_runs is not None:
            _check_max_runs(max_runs)
        if ttl_clock is not None and not callable(ttl_clock):
            raise InvalidInputError(f"ttl_clock must be callable, got {ttl_clock!r}")
        self.ttl_clock = ttl_clock or wall_clock_ms
        self.max_runs = max_runs
        self.background_compaction = bool(background_compaction)
        # Serializes manifest publishing and retention in this process (compaction in a thread).
        self._lock = threading.RLock()
        self._inflight: set[str] = set()  # compaction outputs written but not yet published
        self._executor: ThreadPoolExecutor | None = None
        raw = os.fspath(uri_or_path)
        if not isinstance(raw, str) or not raw:
            raise InvalidInputError(f"checkpoint root must be a non-empty path or URI, got {raw!r}")
        if filesystem is None:
            if "://" in raw:
                try:
                    filesystem, path = pafs.FileSystem.from_uri(raw)
                except (pa.ArrowInvalid, OSError) as exc:
                    raise InvalidInputError(f"cannot open checkpoint URI {raw!r}: {exc}") from exc
            else:
                filesystem, path = pafs.LocalFileSystem(), os.path.abspath(raw)
        else:
            if not isinstance(filesystem, pafs.FileSystem):
                raise InvalidInputError(
                    f"filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}")
            path = pafs.FileSystem.from_uri(raw)[1] if "://" in raw else raw
        self.fs = filesystem
        self.root = path.rstrip("/") or "/"
        self.uri = raw
        self._atomic_rename = _has_atomic_rename(filesystem)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri!r})"

    # ----------------------------------------------------------------------------------- paths

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{rel}" if self.root != "/" else f"/{rel}"

    @staticmethod
    def manifest_name(version: int) -> str:
        """File name (relative to the root) of the manifest of ``version``."""
        return f"manifest-{_vdir(version)}.json"

    @staticmethod
    def data_path(version: int, writer: str) -> str:
        """Path relative to the root of the data file of ``writer`` at ``version``."""
        return f"data/{_vdir(version)}/{writer}.sckp"

    @staticmethod
    def pending_path(version: int, writer: str) -> str:
        """Path relative to the root of the pending descriptor of ``writer`` at ``version``."""
        return f"pending/{_vdir(version)}/{writer}.json"

    # ---------------------------------------------------------------------------------- writes

    def _write_atomic(self, rel: str, produce, before_publish=None) -> Any:
        """Run ``produce(stream)`` and make its bytes appear at ``rel`` all at once.
        ``before_publish()`` (optional) runs after ``produce`` and before the bytes become
        visible; it raises to abandon the write (nothing appears at ``rel``)."""
        final = self._abs(rel)
        parent = final.rsplit("/", 1)[0]
        if not self._atomic_rename:
            buf = pa.BufferOutputStream()
            result = produce(buf)
            data = buf.getvalue()
            if before_publish is not None:
                before_publish()
            with self.fs.open_output_stream(final) as out:
                out.write(data)
            return result
        self.fs.create_dir(parent, recursive=True)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        try:
            with self.fs.open_output_stream(tmp) as out:
                result = produce(out)
            if before_publish is not None:
                before_publish()
            self.fs.move(tmp, final)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise
        return result

    def write_snapshot(self, snap: Any, version: int, writer: str = "p0", *,
                       block_target_bytes: int | None = None) -> dict:
        """Write the data file (run) of ``snap`` (StateSnapshot read interface) for ``version``
        as ``writer`` and return its descriptor: a JSON-able dict to pass to :meth:`commit` (or
        to :meth:`write_pending`). The run is incremental (NULL values = tombstones) when
        ``getattr(snap, "incremental", False)``, else full; the descriptor records ``kind``,
        ``tombstones`` {state: n} and ``snapshot_id`` (``snap.snapshot_id`` or None).
        Writes no manifest: the version stays invisible until committed.
        Re-running with the same (version, writer) atomically replaces the file.

        ``block_target_bytes``: uncompressed block size target (default 64 KiB).
        Raises InvalidInputError for a bad version/writer or a snapshot that breaks its contract
        (see ``format.write_data_file``); filesystem errors propagate as ``OSError``.
        Does not release ``snap``.
        """
        version = _check_version(version)
        writer = _check_writer(writer)
        rel = self.data_path(version, writer)
        kwargs = {} if block_target_bytes is None else {"block_target_bytes": block_target_bytes}
        summary = self._write_atomic(
            rel, lambda out: write_data_file(out, snap, version=version, writer=writer, **kwargs))
        return self._descriptor(snap, version, writer, rel, summary)

    @staticmethod
    def _descriptor(snap: Any, version: int, writer: str, rel: str, summary) -> dict:
        snapshot_id = getattr(snap, "snapshot_id", None)
        meta = summary.meta
        return {
            "format_version": FORMAT_VERSION,
            "version": version,
            "writer": writer,
            "path": rel,
            "size": summary.size,
            "max_parallelism": meta["max_parallelism"],
            "key_type": meta["key_type"],
            "assigner": meta["assigner"],
            "key_group_range": list(meta["key_group_range"]),
            "states": meta["states"],
            "entries": summary.entries,
            "blocks": summary.blocks,
            "raw_bytes": summary.raw_bytes,
            "stored_bytes": summary.stored_bytes,
            "key_groups_nonempty": summary.key_groups_nonempty,
            # TTL cleanup counts of the writing backend since its previous snapshot.
            "ttl_expired": {str(k): int(v) for k, v in (getattr(snap, "ttl_expired", None) or {}).items()},
            "footer_xxh64": f"{summary.footer_xxh64:016x}",
            "kind": summary.kind,
            "tombstones": summary.tombstones,
            "snapshot_id": snapshot_id if isinstance(snapshot_id, int) else None,
        }

    def write_snapshot_async(self, snap: Any, version: int, writer: str = "p0", *,
                             block_target_bytes: int | None = None, release_snapshot: bool = False,
                             queue_blocks: int = 4, nice: int = 10,
                             chunk_bytes: int | None = None) -> "SnapshotWriteFuture":
        """:meth:`write_snapshot` in the background; returns a :class:`SnapshotWriteFuture` whose
        result is the same descriptor, and whose file is byte-identical to the synchronous one.

        Native snapshots (``snap.block_sources``): a C++ thread encodes the block payloads from
        the map snapshots into a queue bounded to ``queue_blocks`` payloads (backpressure), and a
        Python thread takes them in chunks of about ``format.CHUNK_TARGET_BYTES`` stored bytes,
        compressed (LZ4) and checksummed (XXH64) with the GIL released, and writes each chunk
        through ``pyarrow.fs`` in one call: one GIL round trip per chunk instead of several per
        block, each of which can wait a switch interval while the owner runs Python. The owning
        thread keeps reading and writing state meanwhile: the snapshot is copy-on-write
        (state_map.h). Other snapshots (the Python backend's, which
        are materialized at snapshot time) are written by the Python thread alone.

        ``chunk_bytes`` (int >= 1, default ``format.CHUNK_TARGET_BYTES`` = 1 MiB): stored bytes
        gathered per chunk (per write and GIL round trip); memory: about one chunk more.

        ``nice`` (int >= 0): added to the nice value of the writing threads (Linux; others
        ignore it): the write is background work, and on a machine with as many busy threads as
        cores it should yield the CPU to processing. Measured with ``statecore bench --case
        throughput_during_snapshot`` (10M entries, 2 cores, five interleaved runs each): owner
        throughput during the write 0.78 of without at nice 0, 0.85 at nice 10, same write time.

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
        version = _check_version(version)
        writer = _check_writer(writer)
        if isinstance(queue_blocks, bool) or not isinstance(queue_blocks, int) or queue_blocks < 1:
            raise InvalidInputError(f"queue_blocks must be an int >= 1, got {queue_blocks!r}")
        if isinstance(nice, bool) or not isinstance(nice, int) or nice < 0:
            raise InvalidInputError(f"nice must be an int >= 0, got {nice!r}")
        if chunk_bytes is None:
            chunk_bytes = CHUNK_TARGET_BYTES
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise InvalidInputError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")
        target = DEFAULT_BLOCK_TARGET_BYTES if block_target_bytes is None else block_target_bytes
        plan = _plan_file(snap, version, writer, target, None)  # argument errors raise here
        rel = self.data_path(version, writer)
        fut = SnapshotWriteFuture()
        serializer = None
        unpin = None
        sources = getattr(snap, "block_sources", None)
        if callable(sources):
            from statecore import _native

            unpin = snap.pin_for_write()
            try:
                serializer = _native.SnapshotBlockSerializer(
                    sources(), plan.start, plan.end, plan.prefix, plan.block_target_bytes,
                    plan.incremental, queue_blocks, bool(release_snapshot), nice)
                serializer.start()
            except BaseException:
                unpin()
                raise
        fut._serializer = serializer

        def produce(out):
            if serializer is not None:
                return write_data_file_from_blocks(
                    out, snap, serializer, version=version, writer=writer,
                    block_target_bytes=target, check_stop=fut._check_stop,
                    chunk_bytes=chunk_bytes)
            return write_data_file(out, snap, version=version, writer=writer,
                                   block_target_bytes=target, check_stop=fut._check_stop)

        def run() -> None:
            _lower_thread_priority(nice)
            outcome: Any = None
            failed = False
            try:
                summary = self._write_atomic(rel, produce, before_publish=fut._begin_publish)
                outcome = self._descriptor(snap, version, writer, rel, summary)
                finished = getattr(snap, "serializer_finished", None)
                if serializer is not None and callable(finished):
                    finished(serializer.stats())
            except BaseException as exc:  # delivered through the future
                failed, outcome = True, exc
            # Stop the producer and drop its payloads before releasing what it reads.
            with fut._lock:
                ser, fut._serializer = fut._serializer, None
            if ser is not None:
                ser.cancel()
                del ser
            if unpin is not None:
                unpin()
            if release_snapshot or failed:
                try:
                    snap.release()
                except Exception as exc:  # pragma: no cover - release is documented not to fail
                    if not failed:
                        failed, outcome = True, exc
            if failed and fut._stop:
                Future.cancel(fut)
            elif failed:
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

        fut._thread = threading.Thread(target=run, name=f"statecore-write-{writer}-{version}")
        fut._thread.start()
        return fut

    def write_pending(self, version: int, writer: str, descriptor: dict) -> str:
        """Record ``descriptor`` (from :meth:`write_snapshot`) as ``pending/V/<writer>.json`` so a
        driver can :meth:`commit` without collecting descriptors through Spark. Replaces an
        earlier file of the same (version, writer). Returns the path relative to the root.
        Raises InvalidInputError when the descriptor is not JSON-able or names another
        version/writer."""
        version = _check_version(version)
        writer = _check_writer(writer)
        if not isinstance(descriptor, dict) or descriptor.get("version") != version \
                or descriptor.get("writer") != writer:
            raise InvalidInputError(
                f"descriptor must be a dict of version {version} and writer {writer!r}")
        try:
            data = _canonical(descriptor)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"descriptor is not JSON-serializable: {exc}") from exc
        rel = self.pending_path(version, writer)
        self._write_atomic(rel, lambda out: out.write(data))
        return rel

    def pending(self, version: int) -> list[dict]:
        """Descriptors recorded by :meth:`write_pending` for ``version``, sorted by writer
        (empty list when none). Raises CorruptCheckpointError naming a file that is not a JSON
        object."""
        version = _check_version(version)
        base = self._abs(f"pending/{_vdir(version)}")
        infos = self._list(base)
        out = []
        for info in sorted(infos, key=lambda i: i.path):
            if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
                continue
            try:
                with self.fs.open_input_file(info.path) as f:
                    desc = json.loads(f.read().decode("utf-8"))
            except FileNotFoundError:
                continue  # cleared by clear_pending() after the listing
            except (ValueError, UnicodeDecodeError) as exc:
                raise CorruptCheckpointError(
                    f"pending descriptor {info.path} is not valid JSON: {exc}") from exc
            if not isinstance(desc, dict):
                raise CorruptCheckpointError(f"pending descriptor {info.path} is not a JSON object")
            out.append(desc)
        return out

    def clear_pending(self, version: int) -> None:
        """Delete the pending descriptors of ``version`` (a driver calls this before (re)running
        a micro-batch, so descriptors of an earlier attempt with other writers cannot leak into
        its commit)."""
        version = _check_version(version)
        base = self._abs(f"pending/{_vdir(version)}")
        if self.fs.get_file_info(base).type == pafs.FileType.Directory:
            self.fs.delete_dir(base)

    def commit(self, version: int, descriptors: Iterable[dict] | None = None,
               metadata: dict | None = None) -> dict:
        """Make ``version`` visible: check the descriptors and write its manifest, last and
        atomically (replacing the manifest of a replayed version). Returns the manifest (dict).

        The manifest lists the descriptors' runs (``seq`` = 1 + the previous version's highest)
        and the runs of the previous committed version (the highest below ``version``) that the
        new version still needs (module docstring "Runs and versions"). Afterwards, when a key
        group needs more than ``self.max_runs`` runs, the version is compacted (synchronously,
        or in the background with ``background_compaction``); the returned manifest is then the
        compacted one (synchronous case).

        ``descriptors``: from :meth:`write_snapshot`; ``None`` takes :meth:`pending` (version).
        ``metadata``: JSON-able dict stored with the version (e.g. the Spark batch id, watermark).
        Raises InvalidInputError when there are no descriptors, a descriptor is malformed or of
        another version, writers disagree on max parallelism / key type / assigner / a state's
        meta (also with the previous version's runs that are kept), two descriptors overlap in
        key groups, their ranges leave a gap, an incremental run has no full base run for some of
        its key groups in the previous version, or metadata is not a JSON-able dict;
        CorruptCheckpointError (naming the file) when a data file is missing or its size differs
        from its descriptor, or the previous version's manifest is damaged.
        """
        version = _check_version(version)
        if descriptors is None:
            descriptors = self.pending(version)
        descriptors = list(descriptors)
        if not descriptors:
            raise InvalidInputError(f"commit of version {version} without any data file descriptor")
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
        try:
            metadata = json.loads(_canonical(metadata))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"metadata is not JSON-serializable: {exc}") from exc

        files, states, common = [], {}, None
        ttl_expired: dict[str, int] = {}
        for d in descriptors:
            try:
                if d["version"] != version:
                    raise InvalidInputError(
                        f"descriptor of writer {d.get('writer')!r} is of version {d['version']}, "
                        f"not {version}")
                path = d["path"]
                if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/"):
                    raise InvalidInputError(f"descriptor path must be relative to the root: {path!r}")
                start, end = (int(x) for x in d["key_group_range"])
                this = (int(d["max_parallelism"]), str(d["key_type"]), str(d["assigner"]))
                metas = list(d["states"])
                for strategy, n in (d.get("ttl_expired") or {}).items():
                    ttl_expired[str(strategy)] = ttl_expired.get(str(strategy), 0) + int(n)
                kind = d.get("kind", KIND_FULL)
                if kind not in (KIND_FULL, KIND_INCREMENTAL):
                    raise InvalidInputError(f"descriptor of {path!r} has unknown kind {kind!r}")
                entry = {
                    "path": path, "size": int(d["size"]), "writer": _check_writer(d["writer"]),
                    "version": version, "seq": 0, "kind": kind,
                    "key_group_range": [start, end] if end >= start else [0, -1],
                    "states": [m["name"] for m in metas],
                    "entries": {str(k): int(v) for k, v in d["entries"].items()},
                    "tombstones": {str(k): int(v) for k, v in (d.get("tombstones") or {}).items()},
                    "blocks": int(d["blocks"]), "raw_bytes": int(d["raw_bytes"]),
                    "stored_bytes": int(d["stored_bytes"]),
                    "key_groups_nonempty": int(d["key_groups_nonempty"]),
                    "footer_xxh64": f"{int(str(d['footer_xxh64']), 16):016x}",
                }
            except InvalidInputError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InvalidInputError(f"malformed checkpoint descriptor {d!r}: {exc}") from exc
            if common is None:
                common = this
            elif this != common:
                raise InvalidInputError(
                    f"writers disagree on (max_parallelism, key_type, assigner): {common} vs "
                    f"{this} (writer {entry['writer']!r})")
            for m in metas:
                prev = states.setdefault(m["name"], m)
                if prev != m:
                    raise InvalidInputError(
                        f"writers disagree on the meta of state {m['name']!r}: {prev} vs {m}")
            files.append(entry)
        writers = [f["writer"] for f in files]
        if len(set(writers)) != len(writers):
            raise InvalidInputError(f"duplicate writers in commit of version {version}: {writers}")
        union = _union_range(files, version, InvalidInputError, self.root)
        if union[1] >= common[0]:
            raise InvalidInputError(
                f"key-group range {union} is outside max parallelism {common[0]}")
        for f in files:
            info = self.fs.get_file_info(self._abs(f["path"]))
            if info.type != pafs.FileType.File:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self._abs(f['path'])} of version {version} is missing")
            if info.size != f["size"]:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self._abs(f['path'])} is {info.size} bytes, its "
                    f"descriptor says {f['size']}")

        with self._lock:
            prev_version = max((v for v in self.versions() if v < version), default=None)
            prev = self.manifest(prev_version) if prev_version is not None else None
            prev_runs = prev["files"] if prev is not None else []
            seq = 1 + max((r["seq"] for r in prev_runs), default=0)
            for f in files:
                f["seq"] = seq
            where = (f"commit of version {version} on top of version {prev_version}"
                     if prev is not None else f"commit of version {version} (no earlier version)")
            segments = _plan(prev_runs + files, union, InvalidInputError, where)
            used = _ids(segments)
            kept = [r for r in prev_runs if id(r) in used]
            if kept:
                prev_common = (prev["max_parallelism"], prev["key_type"], prev["assigner"])
                if prev_common != common:
                    raise InvalidInputError(
                        f"{where}: (max_parallelism, key_type, assigner) {common} differs from "
                        f"the previous version's {prev_common}, whose runs are still needed")
                prev_metas = {m["name"]: m for m in prev["states"]}
                for r in kept:
                    for name in r["states"]:
                        # The new meta wins (e.g. a new TTL duration, which the compaction
                        # filter then applies) as long as the older runs stay readable with it.
                        m = states.setdefault(name, prev_metas[name])
                        if stored_format(m) != stored_format(prev_metas[name]):
                            raise InvalidInputError(
                                f"{where}: the stored format of state {name!r} changed from "
                                f"{prev_metas[name]} to {m} while runs of the previous version "
                                "are still needed (write full snapshots to change a state)")
            paths = [r["path"] for r in kept + files]
            if len(set(paths)) != len(paths):
                raise InvalidInputError(
                    f"{where}: a descriptor names a data file the previous version still uses "
                    f"as an older run: {sorted(p for p in paths if paths.count(p) > 1)}")
            body = {
                "format": MANIFEST_FORMAT, "format_version": MANIFEST_FORMAT_VERSION,
                "version": version, "created_ms": int(time.time() * 1000),
                "max_parallelism": common[0], "key_type": common[1], "assigner": common[2],
                "key_group_range": list(union), "states": list(states.values()),
                "files": _sort_runs(kept + files), "metadata": metadata,
            }
            if ttl_expired:
                body["ttl_expired"] = ttl_expired
            manifest = self._write_manifest(body)
        if self.max_runs is not None and _max_depth(segments) > self.max_runs:
            if self.background_compaction:
                self.compact_async(version)
            else:
                manifest = self.compact(version)
        return manifest

    def _write_manifest(self, body: dict) -> dict:
        manifest = dict(body, checksum_xxh64=f"{xxh64(_canonical(body)):016x}")
        data = json.dumps(manifest, sort_keys=True, indent=1).encode("ascii")
        self._write_atomic(self.manifest_name(body["version"]), lambda out: out.write(data))
        return manifest

    # ------------------------------------------------------------------------------ compaction

    def compact(self, version: int | None = None, max_runs: int | None = None) -> dict:
        """Compact ``version`` (default: the latest): for every top run (one of the version's own
        commit) whose key groups need more than ``max_runs`` runs (default: the store's
        ``max_runs``, or 1 when that is None), write one full run over the top run's range (the
        merged state, no tombstones) and atomically replace the version's manifest with one
        listing it instead (module docstring "Compaction"). What the version restores to does not
        change. Returns the (possibly unchanged) manifest. Raises CheckpointNotFoundError for an
        unknown version, InvalidInputError for a bad ``max_runs``, CorruptCheckpointError when a
        run cannot be read; filesystem errors propagate (nothing published then)."""
        if max_runs is None:
            max_runs = self.max_runs if self.max_runs is not None else 1
        max_runs = _check_max_runs(max_runs)
        with self._lock:
            if version is None:
                version = self.latest_version()
                if version is None:
                    raise CheckpointNotFoundError(f"no committed checkpoint under {self.uri}")
            version = _check_version(version)
            manifest = self.manifest(version)
        segments = _plan(manifest["files"], manifest["key_group_range"], CorruptCheckpointError,
                         f"manifest of version {version}")
        top_seq = max((r["seq"] for r in manifest["files"]), default=0)
        tops = [r for r in manifest["files"] if r["seq"] == top_seq
                and r["key_group_range"][1] >= r["key_group_range"][0]]
        targets = []
        for t in tops:
            s, e = t["key_group_range"]
            depth = max((len(c) for a, b, c in segments if a <= e and b >= s), default=0)
            if depth > max_runs:
                targets.append(t)
        if not targets:
            return manifest
        written: list[dict] = []
        inflight: list[str] = []
        reader = CheckpointReader(self, version, manifest)
        try:
            for t in targets:
                s, e = t["key_group_range"]
                writer = f"compacted-{s}-{e}"
                rel = f"data/{_vdir(version)}/compacted-s{t['seq']}-{s}-{e}-{uuid.uuid4().hex[:12]}.sckp"
                with self._lock:
                    self._inflight.add(rel)
                    inflight.append(rel)
                reader.prefetch(s, e)
                view = _RangeView(reader, s, e, self._ttl_filters(manifest))
                summary = self._write_atomic(
                    rel, lambda out: write_data_file(out, view, version=version, writer=writer,
                                                     incremental=False))
                written.append({
                    "path": rel, "size": summary.size, "writer": writer, "version": version,
                    "seq": t["seq"], "kind": KIND_FULL, "key_group_range": [s, e],
                    "states": [m["name"] for m in summary.meta["states"]],
                    "entries": summary.entries, "tombstones": summary.tombstones,
                    "blocks": summary.blocks, "raw_bytes": summary.raw_bytes,
                    "stored_bytes": summary.stored_bytes,
                    "key_groups_nonempty": summary.key_groups_nonempty,
                    "footer_xxh64": f"{summary.footer_xxh64:016x}",
                    "replaces": t["path"],
                    "ttl_expired": dict(view.ttl_expired),
                })
                reader._drop_prefetched()
            with self._lock:
                try:
                    current = self.manifest(version)
                except CheckpointNotFoundError:
                    return manifest  # retained away meanwhile: the outputs are orphans
                if current["checksum_xxh64"] != manifest["checksum_xxh64"]:
                    return current  # re-committed meanwhile: publish nothing
                replaced = {w.pop("replaces") for w in written}
                runs = [r for r in manifest["files"] if r["path"] not in replaced] + written
                segs = _plan(runs, manifest["key_group_range"], CorruptCheckpointError,
                             f"compaction of version {version}")
                ids = _ids(segs)
                runs = [r for r in runs if id(r) in ids or r in written]
                body = {k: v for k, v in manifest.items() if k != "checksum_xxh64"}
                expired = dict(body.get("ttl_compaction_expired", {}))
                for w in written:
                    for name, n in w.pop("ttl_expired").items():
                        expired[name] = expired.get(name, 0) + n
                body.update(files=_sort_runs(runs), compacted_ms=int(time.time() * 1000),
                            format_version=MANIFEST_FORMAT_VERSION)
                if expired:
                    body["ttl_compaction_expired"] = expired
                return self._write_manifest(body)
        finally:
            reader.release()
            with self._lock:
                self._inflight.difference_update(inflight)

    def _ttl_filters(self, manifest: dict) -> dict:
        """``{state name: (kind, fixed_width, ttl_ms, CompactionTimeProvider)}`` for the states
        of ``manifest`` whose TTL config has ``cleanup_in_compaction``. Processing-time TTL
        reads :attr:`ttl_clock`; event-time TTL uses the version's recorded watermark
        (``metadata["watermark_ms"]``, which the Spark operator writes) and is skipped when
        there is none."""
        out = {}
        for m in manifest["states"]:
            if not m.get("ttl"):
                continue
            cfg = StateTtlConfig.from_meta(m["ttl"])
            if not cfg.query_time_after_num_entries:
                continue
            if cfg.event_time:
                wm = (manifest.get("metadata") or {}).get("watermark_ms")
                if not isinstance(wm, int) or isinstance(wm, bool):
                    continue
                clock = lambda wm=wm: wm  # noqa: E731 - the watermark does not move here
            else:
                clock = self.ttl_clock
            width = S.value_serializer(m["value_type"]).fixed_width if m["kind"] == "list" else None
            out[m["name"]] = (m["kind"], width, cfg.ttl_ms,
                              CompactionTimeProvider(clock, cfg.query_time_after_num_entries))
        return out

    def compact_async(self, version: int | None = None, max_runs: int | None = None) -> Future:
        """:meth:`compact` in the store's single background thread; returns its Future (whose
        result is the manifest, or the exception :meth:`compact` raised)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="statecore-compaction")
            return self._executor.submit(self.compact, version, max_runs)

    def close(self) -> None:
        """Wait for background compactions and stop their thread (idempotent)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    # ----------------------------------------------------------------------------------- reads

    #: Listings retried when a file vanished between the directory read and its stat.
    _LIST_ATTEMPTS = 8

    def _list(self, base: str, recursive: bool = False) -> list:
        """FileInfos under the absolute path ``base`` (empty when it does not exist).

        Writers publish files by renaming a temporary file, and LocalFileSystem (like others)
        lists a directory by reading its entries and then stat-ing each: a temporary file
        renamed in between makes the whole listing fail with FileNotFoundError. Such a race is
        momentary, so the listing is retried; a persistent error is raised."""
        for attempt in range(self._LIST_ATTEMPTS):
            try:
                return self.fs.get_file_info(
                    pafs.FileSelector(base, allow_not_found=True, recursive=recursive))
            except FileNotFoundError:
                if attempt == self._LIST_ATTEMPTS - 1:
                    raise
                time.sleep(0.001 * (attempt + 1))
        raise AssertionError("unreachable")

    def versions(self) -> list[int]:
        """Committed versions (those with a manifest), ascending. Empty when the root does not
        exist."""
        infos = self._list(self.root)
        out = []
        for info in infos:
            m = _MANIFEST_RE.match(info.base_name)
            if m and info.type == pafs.FileType.File:
                out.append(int(m.group(1)))
        return sorted(out)

    def is_committed(self, version: int) -> bool:
        """True when ``version`` has a manifest (one stat, no listing: what a worker polls while
        it waits for the driver's commit). InvalidInputError for a version that is not an int
        in the range every version takes (as :meth:`manifest`)."""
        version = _check_version(version)
        info = self.fs.get_file_info(self._abs(self.manifest_name(version)))
        return info.type == pafs.FileType.File

    def latest_version(self) -> int | None:
        """The highest committed version, or ``None`` when there is none."""
        vs = self.versions()
        return vs[-1] if vs else None

    def manifest(self, version: int) -> dict:
        """The validated manifest of ``version`` (dict, format: module docstring; a version-1
        manifest comes back upgraded: runs with ``seq`` 0, kind ``full``).
        Raises CheckpointNotFoundError when ``version`` has no manifest; CorruptCheckpointError
        (naming the manifest) when it is not valid JSON, fails its checksum or is malformed
        (incl. overlapping runs of one seq, top runs that do not tile the range, a key group
        without a full run)."""
        version = _check_version(version)
        path = self._abs(self.manifest_name(version))
        try:
            with self.fs.open_input_file(path) as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint version {version} not found under {self.uri} (committed versions: "
                f"{_short(self.versions())})") from None
        if _VALIDATED_MANIFESTS.seen(path, raw):
            # These exact bytes passed every check below at this path (so for this version).
            doc = json.loads(raw)
            body = _upgraded({k: v for k, v in doc.items() if k != "checksum_xxh64"}, version)
            body["checksum_xxh64"] = doc["checksum_xxh64"]
            return body
        try:
            doc = json.loads(raw.decode("ascii"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptCheckpointError(f"manifest {path} is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("checksum_xxh64"), str):
            raise CorruptCheckpointError(f"manifest {path} is not a statecore manifest object")
        body = {k: v for k, v in doc.items() if k != "checksum_xxh64"}
        try:
            ok = int(doc["checksum_xxh64"], 16) == xxh64(_canonical(body))
        except ValueError:
            ok = False
        if not ok:
            raise CorruptCheckpointError(f"manifest {path}: checksum mismatch")
        try:
            if (body["format"] != MANIFEST_FORMAT
                    or body["format_version"] not in _READABLE_MANIFEST_VERSIONS):
                raise ValueError(f"format {body['format']!r} v{body['format_version']}")
            if body["version"] != version:
                raise ValueError(f"it describes version {body['version']}")
            _upgraded(body, version)
            for f in body["files"]:
                if f["path"].startswith("/") or ".." in f["path"].split("/"):
                    raise ValueError(f"file path {f['path']!r} leaves the root")
                int(f["size"]), int(f["footer_xxh64"], 16), range_bounds(f["key_group_range"])
                if f["kind"] not in (KIND_FULL, KIND_INCREMENTAL):
                    raise ValueError(f"run {f['path']!r} has unknown kind {f['kind']!r}")
                if isinstance(f["seq"], bool) or not isinstance(f["seq"], int) or f["seq"] < 0:
                    raise ValueError(f"run {f['path']!r} has a bad seq {f['seq']!r}")
            int(body["max_parallelism"]), range_bounds(body["key_group_range"])
            [m["name"] for m in body["states"]]
            if not isinstance(body["metadata"], dict):
                raise ValueError("metadata is not an object")
        except (KeyError, TypeError, ValueError, AttributeError, InvalidInputError) as exc:
            raise CorruptCheckpointError(f"manifest {path} is malformed: {exc}") from exc
        top_seq = max((f["seq"] for f in body["files"]), default=0)
        by_seq: dict[int, list] = {}
        for f in body["files"]:
            by_seq.setdefault(f["seq"], []).append(f)
        union = None
        for sq, group in by_seq.items():
            # runs of one seq come from one commit: they must not overlap; the top ones tile
            u = _union_range(group, version, CorruptCheckpointError, path) if sq == top_seq \
                else _check_disjoint(group, version, path)
            if sq == top_seq:
                union = u
        if union is None:
            union = (0, -1)
        if list(union) != list(body["key_group_range"]):
            raise CorruptCheckpointError(
                f"manifest {path}: key-group range {body['key_group_range']} is not the union "
                f"{list(union)} of its files")
        _plan(body["files"], union, CorruptCheckpointError, f"manifest {path}")
        body["checksum_xxh64"] = doc["checksum_xxh64"]
        _VALIDATED_MANIFESTS.add(path, raw)
        return body

    def metadata(self, version: int) -> dict:
        """User metadata committed with ``version`` (errors as :meth:`manifest`)."""
        return self.manifest(version)["metadata"]

    def open(self, version: int | None = None) -> "CheckpointReader":
        """A lazy StateSnapshot-like reader of ``version`` (default: the latest). Only the
        manifest is read here; data files are opened and their blocks read on demand.
        Raises CheckpointNotFoundError for an unknown version (or none committed)."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise CheckpointNotFoundError(f"no committed checkpoint under {self.uri}")
        return CheckpointReader(self, version, self.manifest(version))

    def restore(self, backend: Any, version: int | None = None) -> int:
        """``backend.restore(self.open(version))``, reading only the byte ranges of the key
        groups in ``backend.key_group_range`` (one ranged read per run needed there). Releases
        the reader afterwards. Returns the version restored. Errors as :meth:`open` and
        CorruptCheckpointError from the data read."""
        reader = self.open(version)
        try:
            kg_range = getattr(backend, "key_group_range", None)
            if kg_range is not None:
                reader.prefetch(*range_bounds(kg_range))
            backend.restore(reader)
        finally:
            reader.release()
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
        manifest = self.manifest(version)
        segments = []
        base_seq = None
        for a, b, chain in _plan(manifest["files"], (start, end), CorruptCheckpointError,
                                 f"manifest of version {version}"):
            paths = [r["path"] for r in chain]
            if base_path not in paths:
                return None
            newer = chain[:paths.index(base_path)]
            if any(r["kind"] != KIND_INCREMENTAL for r in newer):
                return None
            base_seq = chain[len(newer)]["seq"]
            segments.append((a, b, newer))
        # ``version``'s own runs tile its range, so either every chain has runs above the base
        # (a later version) or none has (the base's own version: nothing to apply).
        if base_seq is None or len({bool(chain) for _, _, chain in segments}) != 1:
            return None
        return ChangesReader(self, version, manifest, base_seq, segments)

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
        m = self.manifest(version)
        entries: dict[str, int] = {s["name"]: 0 for s in m["states"]}
        tombs: dict[str, int] = {s["name"]: 0 for s in m["states"]}
        for f in m["files"]:
            for name, n in f["entries"].items():
                entries[name] = entries.get(name, 0) + n
            for name, n in f.get("tombstones", {}).items():
                tombs[name] = tombs.get(name, 0) + n
        start, end = m["key_group_range"]
        segments = _plan(m["files"], (start, end), CorruptCheckpointError, "describe")
        return {
            "version": m["version"], "root": self.uri, "created_ms": m["created_ms"],
            "compacted_ms": m.get("compacted_ms"),
            "max_parallelism": m["max_parallelism"], "key_type": m["key_type"],
            "assigner": m["assigner"], "key_group_range": [start, end],
            "key_groups": max(0, end - start + 1),
            "key_groups_nonempty": sum(f["key_groups_nonempty"] for f in m["files"]),
            "files": len(m["files"]), "runs": len(m["files"]),
            "bytes": sum(f["size"] for f in m["files"]),
            "bytes_added": sum(f["size"] for f in m["files"] if f["version"] == m["version"]),
            "raw_bytes": sum(f["raw_bytes"] for f in m["files"]),
            "blocks": sum(f["blocks"] for f in m["files"]), "entries": entries,
            "tombstones": tombs, "max_runs_per_key_group": _max_depth(segments),
            "states": m["states"], "metadata": m["metadata"],
            "ttl_expired": dict(m.get("ttl_expired", {})),
            "ttl_compaction_expired": dict(m.get("ttl_compaction_expired", {})),
            "writers": [{k: f[k] for k in ("path", "writer", "key_group_range", "size", "entries")}
                        for f in m["files"]],
            "run_list": [{k: f[k] for k in ("path", "writer", "version", "seq", "kind",
                                            "key_group_range", "size", "entries", "tombstones")}
                         for f in m["files"]],
        }

    def verify(self, version: int) -> dict:
        """Read and check every block of every run of ``version`` (checksums, structure, entry
        and tombstone counts against the manifest), then the merged view of every (state, key
        group). Returns :meth:`describe` (version). Raises CorruptCheckpointError on the first
        problem."""
        reader = self.open(version)
        try:
            for f in reader.manifest["files"]:
                start, end = f["key_group_range"]
                data = reader._data_file(f)
                got = {name: 0 for name in f["states"]}
                tombs = {name: 0 for name in f["states"]}
                for kg in range(start, end + 1):
                    for name in f["states"]:
                        _, vals = data.entries(name, kg)
                        got[name] += len(vals)
                        tombs[name] += vals.null_count
                want_t = {n: f.get("tombstones", {}).get(n, 0) for n in f["states"]}
                if got != f["entries"] or tombs != want_t:
                    raise CorruptCheckpointError(
                        f"checkpoint data file {self._abs(f['path'])}: entry counts {got} "
                        f"(tombstones {tombs}) differ from the manifest's {f['entries']} "
                        f"({want_t})")
            for m in reader.state_metas():
                for kg in reader.key_group_range:
                    reader.entries(m["name"], kg)
        finally:
            reader.release()
        return self.describe(version)

    # ------------------------------------------------------------------------------- retention

    def retain(self, k: int) -> list[int]:
        """Keep the newest ``k`` (>= 1) committed versions: delete older manifests first (oldest
        first), then every data file and pending descriptor that no retained manifest references
        (runs shared with retained versions stay, compaction inputs go once no retained version
        uses them). Files of versions at or above the newest retained one are left alone (they
        may be in flight), except unreferenced compaction outputs; so are outputs of a
        compaction in progress in this process. Returns the versions deleted. Raises
        InvalidInputError for ``k < 1`` and CorruptCheckpointError (deleting nothing) when a
        retained manifest cannot be read. A crash at any point leaves every retained version
        restorable; calling it again finishes the job."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError(f"retain needs k >= 1, got {k!r}")
        with self._lock:
            versions = self.versions()
            if not versions:
                return []
            keep, drop = versions[-k:], versions[:-k]
            referenced = {f["path"] for v in keep for f in self.manifest(v)["files"]}
            referenced |= self._inflight
            for v in drop:
                self.fs.delete_file(self._abs(self.manifest_name(v)))
            newest = keep[-1]
            for top in ("data", "pending"):
                base = self._abs(top)
                infos = self._list(base)
                for d in infos:
                    if d.type != pafs.FileType.Directory or not _VERSION_DIR_RE.match(d.base_name):
                        continue
                    in_flight_dir = int(d.base_name) >= newest
                    files = self._list(d.path, recursive=True)
                    kept_any = False
                    for f in files:
                        if f.type != pafs.FileType.File:
                            continue
                        rel = f"{top}/{d.base_name}/{f.path[len(d.path) + 1:]}"
                        if rel in referenced or (
                                in_flight_dir and not (top == "data"
                                                       and _COMPACTED_RE.match(f.base_name))):
                            kept_any = True
                        else:
                            self.fs.delete_file(f.path)
                    if not kept_any and not in_flight_dir:
                        self.fs.delete_dir(d.path)
            return drop


def _lower_thread_priority(by: int) -> None:
    """Add ``by`` to the calling thread's nice value (Linux applies PRIO_PROCESS with a thread id
    to that thread alone); best effort, a no-op elsewhere or on failure."""
    if by <= 0 or not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError:
        pass


class SnapshotWriteFuture(Future):
    """Future of :meth:`CheckpointStore.write_snapshot_async` (a ``concurrent.futures.Future``).

    Unlike a plain Future, :meth:`cancel` also stops a write that is running: it stops the
    native serializer thread, waits until the writing thread removed its temporary file and
    released the snapshot, and returns True; it returns False when the write already finished or
    is publishing its file. ``running()`` is True while the writing thread works.
    """

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._stop = False
        self._publishing = False
        self._serializer = None
        self._thread: threading.Thread | None = None

    def running(self) -> bool:
        return self._thread is not None and not self.done()

    def cancel(self) -> bool:
        with self._lock:
            if self.done() or self._publishing:
                return False
            self._stop = True
            ser = self._serializer
        if ser is not None:
            ser.cancel()  # wakes the writing thread waiting for the next block
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        return self.cancelled()

    def _check_stop(self) -> None:
        if self._stop:
            raise CancelledError("checkpoint write cancelled")

    def _begin_publish(self) -> None:
        with self._lock:
            if self._stop:
                raise CancelledError("checkpoint write cancelled")
            self._publishing = True


def _short(vs: list[int]) -> str:
    if not vs:
        return "none"
    return ", ".join(map(str, vs)) if len(vs) <= 6 else f"{vs[0]}..{vs[-1]} ({len(vs)} versions)"


def _union_range(files: list[dict], version: int, err, where: str) -> tuple[int, int]:
    """Inclusive union of the files' key-group ranges; raises ``err`` on overlap or gap."""
    spans = sorted((f["key_group_range"][0], f["key_group_range"][1], f["path"])
                   for f in files if f["key_group_range"][1] >= f["key_group_range"][0])
    if not spans:
        return (0, -1)
    for (s0, e0, p0), (s1, e1, p1) in zip(spans, spans[1:]):
        if s1 <= e0:
            raise err(f"{where}: version {version}: files {p0} [{s0}, {e0}] and {p1} [{s1}, {e1}] "
                      f"both claim key group {s1}")
        if s1 != e0 + 1:
            raise err(f"{where}: version {version}: no file holds key groups {e0 + 1}..{s1 - 1}")
    if spans[0][0] < 0:
        raise err(f"{where}: version {version}: negative key group in {spans[0][2]}")
    return (spans[0][0], spans[-1][1])


def _check_disjoint(files: list[dict], version: int, where: str) -> None:
    """Raise CorruptCheckpointError when two runs of one seq overlap (gaps are fine)."""
    spans = sorted((f["key_group_range"][0], f["key_group_range"][1], f["path"])
                   for f in files if f["key_group_range"][1] >= f["key_group_range"][0])
    for (s0, e0, p0), (s1, e1, p1) in zip(spans, spans[1:]):
        if s1 <= e0:
            raise CorruptCheckpointError(
                f"{where}: version {version}: runs {p0} [{s0}, {e0}] and {p1} [{s1}, {e1}] of "
                f"one seq both claim key group {s1}")


def _plan(runs: list[dict], kg_range, err, where: str) -> list[tuple[int, int, list[dict]]]:
    """Split the inclusive ``kg_range`` into segments ``(start, end, chain)`` over which the
    same runs apply; ``chain`` = the runs covering the segment, newest (highest seq) first, down
    to and including the newest full run. Raises ``err`` when a segment has no run or no full
    run (an incremental run without base)."""
    start, end = (int(x) for x in kg_range)
    if end < start:
        return []
    live = [r for r in runs if r["key_group_range"][1] >= r["key_group_range"][0]
            and r["key_group_range"][0] <= end and r["key_group_range"][1] >= start]
    cuts = {start, end + 1}
    for r in live:
        cuts.add(max(r["key_group_range"][0], start))
        cuts.add(min(r["key_group_range"][1], end) + 1)
    cuts = sorted(cuts)
    newest_first = sorted(live, key=lambda r: -r["seq"])
    segments = []
    for a, b1 in zip(cuts, cuts[1:]):
        b = b1 - 1
        chain = []
        for r in newest_first:
            s, e = r["key_group_range"]
            if s <= a and b <= e:
                chain.append(r)
                if r["kind"] == KIND_FULL:
                    break
        if not chain:
            raise err(f"{where}: no run holds key groups {a}..{b}")
        if chain[-1]["kind"] != KIND_FULL:
            raise err(
                f"{where}: incremental run(s) {[r['path'] for r in chain]} have no full base run "
                f"for key groups {a}..{b} (an incremental snapshot needs a committed full one "
                "below it)")
        if segments and segments[-1][2] == chain:
            segments[-1] = (segments[-1][0], b, chain)
        else:
            segments.append((a, b, chain))
    return segments


def _ids(segments) -> set[int]:
    return {id(r) for _, _, chain in segments for r in chain}


def _max_depth(segments) -> int:
    return max((len(c) for _, _, c in segments), default=0)


def _sort_runs(runs: list[dict]) -> list[dict]:
    return sorted(runs, key=lambda f: (-f["seq"], f["key_group_range"][0], f["writer"], f["path"]))


# Not pa.array([]): pyarrow's first pa.array call imports pandas (its pandas shim), which was
# ~0.5 s of `import statecore`.
_EMPTY = (pa.nulls(0, pa.binary()), pa.nulls(0, pa.binary()))


def _native_merge():
    """``statecore._native.merge_newest_wins``, or None without the native extension."""
    try:
        from statecore._native import merge_newest_wins
    except ImportError:
        return None
    return merge_newest_wins


def _merge_newest_wins(parts: list[tuple[pa.Array, pa.Array]], native: bool = True,
                       keep_tombstones: bool = False) -> tuple[pa.Array, pa.Array]:
    """Merge ``(keys, values)`` pairs given newest first (each sorted by key): per key the newest
    value wins, NULL (tombstone) values delete. Returns sorted binary arrays without NULLs.
    Several runs go through the native k-way merge when the extension is there (``native``;
    it also checks that each run's keys are strictly ascending, InvalidInputError otherwise):
    sorting their concatenation here was the largest part of a restore over an incremental
    chain (~110 of ~300 ms for 7 runs, 1.4M rows, 480k entries)."""
    # ``keep_tombstones`` (a change set, ChangesReader): the newest tombstone of a key stays, as
    # a NULL value.
    merge = _native_merge() if native and len(parts) > 1 else None
    if merge is not None:
        return merge(parts, keep_tombstones)
    if len(parts) == 1:
        keys, values = parts[0]
    else:
        keys = pa.concat_arrays([k for k, _ in parts])
        values = pa.concat_arrays([v for _, v in parts])
        rank = np.concatenate([np.full(len(k), i, dtype=np.int32) for i, (k, _) in enumerate(parts)])
        order = pc.sort_indices(pa.table({"k": keys, "r": rank}),
                                sort_keys=[("k", "ascending"), ("r", "ascending")])
        sk = keys.take(order)
        first = np.ones(len(sk), dtype=bool)
        if len(sk) > 1:
            first[1:] = pc.not_equal(sk.slice(1), sk.slice(0, len(sk) - 1)).to_numpy(
                zero_copy_only=False)
        sel = order.filter(pa.array(first))
        keys, values = keys.take(sel), values.take(sel)
    if values.null_count and not keep_tombstones:
        live = values.is_valid()
        keys, values = keys.filter(live), values.filter(live)
    return keys, values


class CheckpointReader:
    """Lazy StateSnapshot (architecture.md) over one committed version of a CheckpointStore.

    Attributes: ``version``, ``max_parallelism``, ``key_type``, ``assigner``,
    ``key_group_range`` (the version's inclusive range, ``.start``/``.end``), ``metadata``
    (user dict), ``manifest``, ``incremental`` (False: entries are complete, without
    tombstones). ``entries`` merges the runs of the key group newest-wins (module docstring)
    and reads exactly the blocks of one (state, key group) per run unless :meth:`prefetch`
    fetched them. Usable as a context manager; :meth:`release` is idempotent.
    """

    incremental = False

    _keep_tombstones = False

    def __init__(self, store: CheckpointStore, version: int, manifest: dict,
                 segments: list | None = None):
        self._store = store
        self.version = version
        self.manifest = manifest
        self.max_parallelism = int(manifest["max_parallelism"])
        self.key_type = manifest["key_type"]
        self.assigner = manifest["assigner"]
        self.key_group_range = make_key_group_range(*manifest["key_group_range"])
        self.metadata = manifest["metadata"]
        self._metas = [dict(m) for m in manifest["states"]]
        self._names = {m["name"] for m in self._metas}
        self._timer_states = {m["name"] for m in self._metas if m.get("kind") == "timers"}
        self._segments = segments if segments is not None else _plan(
            manifest["files"], manifest["key_group_range"], CorruptCheckpointError,
            f"manifest of version {version}")
        self._starts = [a for a, _, _ in self._segments]
        self._open_files: dict[str, DataFileReader] = {}
        self._released = False

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def state_metas(self) -> list[dict]:
        """State metas of the version (JSON-able dicts: name, kind, namespace_type, ...)."""
        return [dict(m) for m in self._metas]

    def _chain_for(self, key_group: int) -> list[dict]:
        i = bisect_right(self._starts, key_group) - 1
        if i < 0 or key_group > self._segments[i][1]:
            raise InvalidInputError(
                f"key group {key_group} is outside the key-group range "
                f"{self.manifest['key_group_range']} of checkpoint version {self.version}")
        return self._segments[i][2]

    def _data_file(self, f: dict) -> DataFileReader:
        if self._released:
            raise CheckpointError(f"reader of checkpoint version {self.version} was released")
        reader = self._open_files.get(f["path"])
        if reader is None:
            path = self._store._abs(f["path"])
            try:
                handle = self._store.fs.open_input_file(path)
            except FileNotFoundError:
                raise CorruptCheckpointError(
                    f"checkpoint data file {path} of version {self.version} is missing") from None
            except OSError as exc:
                raise CorruptCheckpointError(
                    f"checkpoint data file {path} of version {self.version} cannot be opened: "
                    f"{exc}") from exc
            reader = DataFileReader(handle, path, expected_size=f["size"],
                                    expected_footer_xxh64=int(f["footer_xxh64"], 16))
            mine = (self.max_parallelism, self.key_type, self.assigner, list(f["key_group_range"]),
                    f["kind"])
            theirs = (reader.max_parallelism, reader.key_type, reader.assigner,
                      [reader.key_group_start, reader.key_group_end], reader.kind)
            if mine != theirs:
                reader.close()
                raise CorruptCheckpointError(
                    f"checkpoint data file {path}: footer says {theirs}, the manifest {mine}")
            self._open_files[f["path"]] = reader
        return reader

    def prefetch(self, start: int, end: int) -> int:
        """Fetch the blocks of key groups ``[start, end]`` ∩ this version's range with one ranged
        read per run that those key groups need, for later :meth:`entries` calls. Returns the
        bytes read."""
        spans: dict[str, list] = {}
        for a, b, chain in self._segments:
            lo, hi = max(a, start), min(b, end)
            if lo > hi:
                continue
            for r in chain:
                sp = spans.setdefault(r["path"], [r, lo, hi])
                sp[1], sp[2] = min(sp[1], lo), max(sp[2], hi)
        return sum(self._data_file(r).prefetch(lo, hi) for r, lo, hi in spans.values())

    def _drop_prefetched(self) -> None:
        for r in self._open_files.values():
            r._prefetched = []

    def entries(self, state_name: str, key_group: int) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """``(keys, values)`` (``pa.binary()`` arrays, sorted ascending by key bytes, no NULLs) of
        ``state_name`` in ``key_group``: the runs of the key group merged newest-wins, timers
        from the newest run only. Raises InvalidInputError for a state not in
        :meth:`state_metas` or a key group outside ``key_group_range``; CorruptCheckpointError
        when a data file is missing, truncated or fails a checksum."""
        if state_name not in self._names:
            raise InvalidInputError(
                f"checkpoint version {self.version} has no state {state_name!r} "
                f"(states: {sorted(self._names)})")
        try:
            if isinstance(key_group, bool):
                raise TypeError
            key_group = operator.index(key_group)
        except TypeError:
            raise InvalidInputError(f"key group must be an int, got {key_group!r}") from None
        runs = self._runs_holding(state_name, self._chain_for(key_group))
        return self._merged(state_name, runs, lambda f: f.entries(state_name, key_group),
                            f"key group {key_group}")

    def _runs_holding(self, state_name: str, chain: list) -> list:
        """The runs of ``chain`` (newest first) whose entries of ``state_name`` make its state:
        those holding it, down to the first full run; timers from the newest run only (they are
        complete in every run)."""
        if state_name in self._timer_states:
            chain = chain[:1]
        runs = []
        for r in chain:
            if state_name not in r["states"]:
                if r["kind"] == KIND_FULL:
                    break
                continue
            runs.append(r)
        return runs

    def _merged(self, state_name: str, runs: list, read, where: str):
        """``read(data file reader)`` of each of ``runs`` merged newest-wins (``_EMPTY`` when
        none holds an entry); a merge that finds a run out of order raises
        CorruptCheckpointError naming the version, state, ``where`` and the runs."""
        parts = []
        for r in runs:
            k, v = read(self._data_file(r))
            if len(k):
                parts.append((k, v))
        if not parts:
            return _EMPTY
        try:
            return _merge_newest_wins(parts, keep_tombstones=self._keep_tombstones)
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"checkpoint version {self.version}: state {state_name!r} {where}: "
                f"runs {[r['path'] for r in runs]}: {exc}") from exc

    def entries_chunks(self, state_name: str, start: int, end: int,
                       max_bytes: int = CHUNK_BYTES) -> Iterator[tuple[pa.BinaryArray, pa.BinaryArray]]:
        """The entries of ``state_name`` in key groups ``[start, end]`` ∩ this version's range
        as a few large ``(keys, values)`` pairs instead of one per key group: each pair is what
        :meth:`entries` returns for consecutive key groups, concatenated in key-group order (so
        sorted by key bytes, the prefix being big-endian), merged newest-wins over the runs
        of the key groups' chain in one pass (each run decoded with one native call for them
        all, :meth:`DataFileReader.entries_range`). A pair covers whole key groups and holds at
        most ``max_bytes`` of decoded blocks (summed over the runs) unless one key group alone
        holds more. Timer states are read key group by key group (their newest run only).
        Errors as :meth:`entries`; a state not in the version yields nothing."""
        if state_name not in self._names:
            return
        for a, b, chain in self._segments:
            lo, hi = max(a, start), min(b, end)
            runs = self._runs_holding(state_name, chain) if lo <= hi else []
            if not runs:
                continue
            for c_lo, c_hi in self._chunk_bounds(state_name, runs, lo, hi, max_bytes):
                keys, values = self._merged(
                    state_name, runs, lambda f: f.entries_range(state_name, c_lo, c_hi),
                    f"key groups {c_lo}..{c_hi}")
                if len(keys):
                    yield keys, values

    def key_groups_holding(self, state_name: str, start: int, end: int) -> list[int]:
        """The key groups of ``[start, end]`` ∩ this version's range for which a run that
        :meth:`entries` reads holds blocks of ``state_name`` (ascending; from the runs' block
        tables, nothing decoded). :meth:`entries` of any other key group is empty, so a reader
        of a sparse state (timers) can skip those. [] for a state not in the version; errors as
        :meth:`entries` for a missing or unreadable data file."""
        if state_name not in self._names:
            return []
        out: set = set()
        for a, b, chain in self._segments:
            lo, hi = max(a, start), min(b, end)
            if lo > hi:
                continue
            for r in self._runs_holding(state_name, chain):
                kgs, _ = self._data_file(r).raw_bytes(state_name, lo, hi)
                out.update(kgs.tolist())
        return sorted(out)

    def _chunk_bounds(self, state_name: str, runs: list, lo: int, hi: int, max_bytes: int):
        """``[(start, end)]`` tiling ``[lo, hi]`` so that each holds at most ``max_bytes`` of
        ``runs``' decoded blocks of ``state_name`` (a key group alone may hold more)."""
        sizes = np.zeros(hi - lo + 1, np.int64)
        for r in runs:
            kgs, raw = self._data_file(r).raw_bytes(state_name, lo, hi)
            np.add.at(sizes, kgs - lo, raw)
        if int(sizes.sum()) <= max_bytes:
            return [(lo, hi)]
        out, first, acc = [], lo, 0
        for i, n in enumerate(sizes.tolist()):
            if acc and acc + n > max_bytes:
                out.append((first, lo + i - 1))
                first, acc = lo + i, 0
            acc += n
        out.append((first, hi))
        return out

    def release(self) -> None:
        """Close the data files opened so far (idempotent); later reads raise CheckpointError."""
        self._released = True
        files, self._open_files = self._open_files, {}
        for r in files.values():
            r.close()


class ChangesReader(CheckpointReader):
    """The changes of a version on top of one of its runs (:meth:`CheckpointStore.open_changes`):
    a StateSnapshot-like reader whose chains hold only the runs newer than the *base run*, all
    incremental. :meth:`entries` merges them newest-wins and keeps each key's newest tombstone as
    a NULL value; timers come from the newest run (complete in every run). ``base_seq``: the
    base run's ``seq``; ``runs``: the runs applied, oldest first."""

    _keep_tombstones = True

    def __init__(self, store: CheckpointStore, version: int, manifest: dict, base_seq: int,
                 segments: list):
        super().__init__(store, version, manifest, segments)
        self.base_seq = base_seq
        seen = {r["path"]: r for _, _, chain in segments for r in chain}
        self.runs = sorted(seen.values(), key=lambda r: r["seq"])


class _RangeView:
    """Full StateSnapshot of a reader restricted to key groups ``[start, end]`` (what compaction
    writes)."""

    incremental = False

    def __init__(self, reader: CheckpointReader, start: int, end: int, ttl_filters=None):
        self._reader = reader
        self.max_parallelism = reader.max_parallelism
        self.key_type = reader.key_type
        self.assigner = reader.assigner
        self.key_group_range = make_key_group_range(start, end)
        self._ttl = ttl_filters or {}
        self.ttl_expired: dict[str, int] = {}

    def state_metas(self) -> list[dict]:
        return self._reader.state_metas()

    def entries(self, name: str, key_group: int):
        keys, values = self._reader.entries(name, key_group)
        f = self._ttl.get(name)
        if f is None or not len(keys):
            return keys, values
        kind, width, ttl_ms, time_provider = f
        try:
            keys, values, n = compaction_filter(kind, width, ttl_ms, time_provider, keys, values)
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"state {name!r}, key group {key_group}: TTL value layout broken: {exc}") from exc
        if n:
            self.ttl_expired[name] = self.ttl_expired.get(name, 0) + n
        return keys, values

    def release(self) -> None:
        pass
