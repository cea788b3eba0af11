"""Writing runs: the data file of one snapshot, synchronously or in the background.

:meth:`SnapshotWriter.write` and :meth:`SnapshotWriter.write_async` write the same file
(byte-identical) at ``data/V/<writer>.sckp`` (statecore.checkpoint.layout) and return the run's
*descriptor* (:func:`run_descriptor`), the input of the commit (statecore.checkpoint.commit).
Neither writes a manifest: the version stays invisible until committed. A file appears at its
final path only complete (atomic publication); re-running a (version, writer) replaces it.

Asynchronous writes: for native snapshots a C++ thread encodes block payloads from the
copy-on-write map snapshots into a bounded queue (native snapshot_writer.h) while a Python
thread takes them in chunks of about 1 MiB (on an object store: of a multipart upload's part,
:data:`OBJECT_STORE_CHUNK_BYTES`), compressed (LZ4) and checksummed (XXH64) with the GIL
released, and writes each chunk at once; the owner keeps processing. Per chunk, not per
block, the writer needs the GIL once: when the owner runs Python, each time can cost a switch
interval (5 ms). The write publishes the file only if not cancelled
(:class:`SnapshotWriteFuture`), so a cancelled or failed write leaves nothing at the final path.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import CancelledError, Future
from typing import Any

from statecore.checkpoint.format import (
    CHUNK_TARGET_BYTES,
    COMPRESSION,
    DEFAULT_BLOCK_TARGET_BYTES,
    FORMAT_VERSION,
    KIND_INCREMENTAL,
    WriteSummary,
    plan_file,
    queue_payloads,
    write_data_file,
    write_data_file_from_blocks,
)
from statecore.checkpoint.layout import CheckpointRoot, check_version, check_writer, data_path
from statecore.errors import InvalidInputError

__all__ = ["SnapshotWriter", "SnapshotWriteFuture", "run_descriptor", "lower_thread_priority",
           "OBJECT_STORE_CHUNK_BYTES"]

#: Stored bytes per chunk of a background write to an object store, where the data file streams
#: into an upload: the part size of ``pyarrow.fs.S3FileSystem`` output streams (10 MiB; GCS and
#: Azure Blob roots use the same). An S3 stream sends nothing before a part is full, so smaller
#: chunks would not reach the store sooner; they would only make the writing thread take the
#: GIL back more often, and each take can wait a switch interval while the owning thread runs
#: Python.
OBJECT_STORE_CHUNK_BYTES = 10 << 20


def lower_thread_priority(by: int) -> None:
    """Add ``by`` to the calling thread's nice value (Linux applies PRIO_PROCESS with a thread id
    to that thread alone); best effort, a no-op elsewhere, for ``by <= 0`` or on failure."""
    if by <= 0 or not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
    except OSError:
        pass


def run_descriptor(snap: Any, version: int, writer: str, rel: str, summary: WriteSummary) -> dict:
    """The descriptor of the run ``rel`` (path relative to the root) that ``writer`` wrote for
    ``version`` from ``snap``: a JSON-able dict of the file's facts (``path``, ``size`` in
    bytes, ``kind``, ``key_group_range``, ``states``, ``entries``, ``tombstones``, ``blocks``,
    ``raw_bytes``, ``stored_bytes``, ``footer_xxh64`` as 16 hex digits, ...), the writer's TTL
    cleanup counts (``snap.ttl_expired``), ``snapshot_id`` (``snap.snapshot_id`` or None) and,
    for an incremental run, ``base_version``: the checkpoint version its changes are relative
    to (``snap.base_version``, None when the backend does not know it) and ``base_commit_id``,
    the commit id of that version when the backend knows it (``snap.base_commit_id``)."""
    snapshot_id = getattr(snap, "snapshot_id", None)
    base_version = getattr(snap, "base_version", None) if summary.kind == KIND_INCREMENTAL else None
    base_commit_id = (getattr(snap, "base_commit_id", None)
                      if summary.kind == KIND_INCREMENTAL else None)
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
        "ttl_expired": {str(k): int(v)
                        for k, v in (getattr(snap, "ttl_expired", None) or {}).items()},
        "footer_xxh64": f"{summary.footer_xxh64:016x}",
        "kind": summary.kind,
        "tombstones": summary.tombstones,
        "snapshot_id": snapshot_id if isinstance(snapshot_id, int) else None,
        "base_version": (int(base_version) if isinstance(base_version, int)
                         and not isinstance(base_version, bool) else None),
        "base_commit_id": base_commit_id if isinstance(base_commit_id, str) else None,
    }


class SnapshotWriteFuture(Future):
    """Future of ``CheckpointStore.write_snapshot_async`` (a ``concurrent.futures.Future``).

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
        """True while the writing thread works on the write (started, not done)."""
        return self._thread is not None and not self.done()

    def cancel(self) -> bool:
        """Stop the write, waiting until its thread cleaned up; True when the future is then
        cancelled, False when the write already finished or is publishing its file."""
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

    def _take_serializer(self):
        with self._lock:
            ser, self._serializer = self._serializer, None
        return ser

    def _finish(self, outcome: Any, failed: bool) -> None:
        if failed and self._stop:
            Future.cancel(self)
        elif failed:
            self.set_exception(outcome)
        else:
            self.set_result(outcome)


class SnapshotWriter:
    """Writes the runs of snapshots under one :class:`~statecore.checkpoint.layout.CheckpointRoot`
    (what ``CheckpointStore.write_snapshot`` and ``write_snapshot_async`` do; their docstrings
    give the arguments and errors).

    ``chunk_bytes``: the default of :meth:`write_async`'s ``chunk_bytes``, stored bytes per
    chunk: ``format.CHUNK_TARGET_BYTES`` (1 MiB), or :data:`OBJECT_STORE_CHUNK_BYTES` (10 MiB)
    when ``root`` is on an object store (no atomic rename: the file streams into a multipart
    upload)."""

    def __init__(self, root: CheckpointRoot,
                 block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
                 compression: str = COMPRESSION):
        self.root = root
        self.block_target_bytes = block_target_bytes
        self.compression = compression
        self.chunk_bytes = CHUNK_TARGET_BYTES if root.atomic_rename else OBJECT_STORE_CHUNK_BYTES

    def write(self, snap: Any, version: int, writer: str = "p0", *,
              block_target_bytes: int | None = None) -> dict:
        """Write the run of ``snap`` for ``version`` as ``writer``; returns its descriptor."""
        version = check_version(version)
        writer = check_writer(writer)
        rel = data_path(version, writer)
        target = self.block_target_bytes if block_target_bytes is None else block_target_bytes
        summary = self.root.write_atomic(
            rel, lambda out: write_data_file(out, snap, version=version, writer=writer,
                                             block_target_bytes=target,
                                             compression=self.compression),
            streamed=True)
        return run_descriptor(snap, version, writer, rel, summary)

    def write_async(self, snap: Any, version: int, writer: str = "p0", *,
                    block_target_bytes: int | None = None, release_snapshot: bool = False,
                    queue_blocks: int | None = None, nice: int = 10,
                    chunk_bytes: int | None = None) -> SnapshotWriteFuture:
        """:meth:`write` in a background thread; returns its :class:`SnapshotWriteFuture`."""
        version = check_version(version)
        writer = check_writer(writer)
        if queue_blocks is not None and (isinstance(queue_blocks, bool) or
                                         not isinstance(queue_blocks, int) or queue_blocks < 1):
            raise InvalidInputError(f"queue_blocks must be an int >= 1, got {queue_blocks!r}")
        if isinstance(nice, bool) or not isinstance(nice, int) or nice < 0:
            raise InvalidInputError(f"nice must be an int >= 0, got {nice!r}")
        if chunk_bytes is None:
            chunk_bytes = self.chunk_bytes
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise InvalidInputError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")
        target = self.block_target_bytes if block_target_bytes is None else block_target_bytes
        # argument errors raise here
        plan = plan_file(snap, version, writer, target, None, compression=self.compression)
        if queue_blocks is None:
            queue_blocks = queue_payloads(plan.block_target_bytes)
        rel = data_path(version, writer)
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
                    plan.incremental, queue_blocks, bool(release_snapshot), nice,
                    codec=plan.codec)
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
                    chunk_bytes=chunk_bytes, compression=self.compression)
            return write_data_file(out, snap, version=version, writer=writer,
                                   block_target_bytes=target, check_stop=fut._check_stop,
                                   compression=self.compression)

        def run() -> None:
            lower_thread_priority(nice)
            outcome: Any = None
            failed = False
            try:
                summary = self.root.write_atomic(rel, produce, before_publish=fut._begin_publish,
                                                 streamed=True)
                outcome = run_descriptor(snap, version, writer, rel, summary)
                finished = getattr(snap, "serializer_finished", None)
                if serializer is not None and callable(finished):
                    finished(serializer.stats())
            except BaseException as exc:  # delivered through the future
                failed, outcome = True, exc
            # Stop the producer and drop its payloads before releasing what it reads.
            ser = fut._take_serializer()
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
            fut._finish(outcome, failed)

        fut._thread = threading.Thread(target=run, name=f"statecore-write-{writer}-{version}")
        fut._thread.start()
        return fut
