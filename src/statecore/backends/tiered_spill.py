"""Spill runs of the tiered mode: the changed entries that do not fit the memory budget,
written to local data files until a completed checkpoint holds them (docs/tiered.md
"Spill").

After Flink 2.0's ForSt, whose memtables flush to local SST files that a checkpoint later
uploads: when the entries changed since the attached version alone exceed the budget, the
:class:`~statecore.backends.tiered.TieredBackend` writes every change since its maps'
change-tracking base -- values and tombstones -- as one *spill run* (the checkpoint data-file
format, docs/formats.md "Data file", an incremental run: NULL values are tombstones), then
moves the maps' base to that spill snapshot, so the spilled entries are clean and evictable.

* **Every keyed state** spills: values and accumulators, a list's chunks and a map's user keys,
  with their tombstones.
* **Reads** consult memory, then the spill runs newest first, then the attached version: a
  spill run's value or tombstone decides a key (:meth:`SpillRuns.lookup`). A list or map memory
  does not hold is loaded whole: the attached version's entries under its prefix with each
  spill run's over them, oldest to newest, a tombstone deleting (:meth:`SpillRuns.
  prefix_entries`).
* **Snapshots** taken while spill runs exist merge them under memory's changes, newest wins,
  tombstones kept (:class:`SpilledSnapshot`): the published run lists every change since the
  attached version, as it would have without spilling.
* **Retirement.** When a checkpoint completes, the spill runs its snapshot merged are retired
  (the version now holds them); a retired run's file is deleted once no snapshot still being
  written reads it.
* **Crash safety.** Spill files live in a private local directory and no manifest ever names
  one: a crash at any point leaves the store's committed versions untouched, and the files
  are garbage. :meth:`SpillRuns.close` removes them on an orderly close; a process that died
  leaves its directory, which the next tiered backend to spill under the same parent removes:
  each directory holds a lock file that its owner keeps locked (``fcntl.flock``, released by
  the kernel when the process ends, whatever its PID namespace), so a directory whose lock can
  be taken has no live owner.

Thread contract: the backend's thread writes, looks up and retires; a snapshot's background
write reads the runs it pinned through readers of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import tempfile
import threading
from bisect import bisect_left
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore.checkpoint.format import (
    COMPRESSION,
    DEFAULT_BLOCK_TARGET_BYTES,
    DataFileReader,
    plan_file,
    queue_payloads,
    write_data_file_from_blocks,
)
from statecore.checkpoint.lookup import (
    KeySequence,
    encoded_key_groups,
    prefix_mask,
    prefix_range,
    prefixes_by_length,
)
from statecore.checkpoint.readers import merge_newest_wins
from statecore.errors import CheckpointIOError

__all__ = ["SpillRun", "SpillRuns", "SpilledSnapshot", "DECODED_CACHE_BYTES"]

#: Bytes of decoded (state, key group) entries of the spill runs kept for the backend's lookups
#: (least recently used dropped first): per-record reads, and ``apply_to_all_keys`` walking a
#: key group, ask the same (state, key group) of a run again and again.
DECODED_CACHE_BYTES = 4 << 20


class SpillRun:
    """One spill run: the data file at ``path`` (an incremental run of the keyed states
    ``states`` that it holds entries of), ``seq`` (1, 2, ... in writing order), ``entries``
    (values and tombstones) and ``file_bytes``."""

    def __init__(self, path: str, seq: int, states: frozenset, entries: int, file_bytes: int):
        self.path, self.seq, self.states = path, seq, states
        self.entries, self.file_bytes = entries, file_bytes
        self._reader: DataFileReader | None = None
        self._pins = 0
        self._retired = False
        self._lock = threading.Lock()

    def open_reader(self) -> DataFileReader:
        """A new reader of the file (the caller closes it)."""
        return DataFileReader(pa.OSFile(self.path, "rb"), self.path)

    def reader(self) -> DataFileReader:
        """The backend thread's reader of the file, opened at first use."""
        if self._reader is None:
            self._reader = self.open_reader()
        return self._reader

    def pin(self) -> None:
        with self._lock:
            self._pins += 1

    def unpin(self) -> None:
        with self._lock:
            self._pins -= 1
            gone = self._retired and not self._pins
        if gone:
            self._delete()

    @property
    def pinned(self) -> bool:
        """Whether a snapshot being written reads the run."""
        return self._pins > 0

    def retire(self) -> None:
        """The run is held by a completed checkpoint: delete its file once unpinned."""
        with self._lock:
            self._retired = True
            gone = not self._pins
        if gone:
            self._delete()

    def _delete(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


_DIR_PREFIX = "statecore-spill-"
_LOCK_NAME = ".owner.lock"


def remove_abandoned_spill_dirs(parent_dir: str | None = None) -> int:
    """Remove the spill directories under ``parent_dir`` (None: the system's temporary
    directory) whose owner process has ended: those whose lock file can be locked. A directory
    without a lock file (being created, or not ours) is left alone. Returns how many were
    removed; never raises for a directory it cannot read or remove."""
    parent = parent_dir if parent_dir is not None else tempfile.gettempdir()
    removed = 0
    for d in glob.glob(os.path.join(glob.escape(parent), _DIR_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(d, _LOCK_NAME), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # a live owner holds it
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed += not os.path.exists(d)
        finally:
            os.close(fd)
    return removed


class SpillRuns:
    """The spill runs of one tiered backend, oldest first, in a private directory created under
    ``parent_dir`` (None: the system's temporary directory) at the first spill, after removing
    the directories of ended processes there (:func:`remove_abandoned_spill_dirs`), their blocks
    stored with ``compression`` (``format.CODECS``)."""

    def __init__(self, parent_dir: str | None = None, compression: str = COMPRESSION):
        self.parent_dir = parent_dir
        self.compression = compression
        self.dir: str | None = None
        self._lock_fd: int | None = None
        self.runs: list[SpillRun] = []
        self._seq = 0
        self._decoded: OrderedDict = OrderedDict()  # (seq, state, kg) -> (keys, values)
        self._decoded_bytes = 0

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest run written (0: none yet)."""
        return self._seq

    def holds(self, state_name: str) -> bool:
        """Whether a live run holds entries of ``state_name``."""
        return any(state_name in r.states for r in self.runs)

    def write(self, snap, state_names: list) -> SpillRun | None:
        """Write the changes since the maps' base that ``snap`` (a
        :class:`~statecore.backends.native.NativeSnapshot` taken incremental) lists as a new
        run holding the keyed states ``state_names``; None when they had no change. The file
        is written under a temporary name and renamed when complete. CheckpointIOError when
        the directory or file cannot be written (nothing changes then)."""
        seq = self._seq + 1
        try:
            if self.dir is None:
                self._make_dir()
            path = os.path.join(self.dir, f"spill-{seq:06d}.data")
            tmp = path + ".tmp"
            try:
                with pa.OSFile(tmp, "wb") as out:
                    summary = _write_changes(out, snap, seq, self.compression)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
                raise
        except OSError as exc:
            raise CheckpointIOError(
                f"cannot write a spill run under {self.parent_dir or tempfile.gettempdir()!r}: "
                f"{exc}") from exc
        held = {name: n for name, n in summary.entries.items() if n and name in state_names}
        if not held:
            os.remove(tmp)
            return None
        os.replace(tmp, path)
        self._seq = seq
        run = SpillRun(path, seq, frozenset(held), sum(held.values()), summary.size)
        self.runs.append(run)
        return run

    def _make_dir(self) -> None:
        if self.parent_dir is not None:
            os.makedirs(self.parent_dir, exist_ok=True)
        remove_abandoned_spill_dirs(self.parent_dir)
        d = tempfile.mkdtemp(prefix=_DIR_PREFIX, dir=self.parent_dir)
        fd = os.open(os.path.join(d, _LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            shutil.rmtree(d, ignore_errors=True)
            raise
        self.dir, self._lock_fd = d, fd

    def lookup(self, state_name: str, keys: pa.Array, prefix_width: int):
        """Point lookups of the encoded keys ``keys`` (``pa.binary()``) of ``state_name`` in the
        runs, newest first: ``(seq, values)``, a numpy int64 array (per key the sequence number
        of the newest run holding its value or tombstone, 0 for none) and a ``pa.binary()``
        array (the value; NULL for a tombstone or a key no run holds). One read of the (state,
        key group) per run and key group asked."""
        n = len(keys)
        runs = [r for r in reversed(self.runs) if state_name in r.states]
        seq = np.zeros(n, dtype=np.int64)
        if not runs or not n:
            return seq, pa.nulls(n, pa.binary())
        kgs = encoded_key_groups(keys, prefix_width)
        out: list = [None] * n
        for kg in np.unique(kgs):
            rows = np.flatnonzero(kgs == kg)
            for r in runs:
                rk, rv = self._entries_of(r, state_name, int(kg))
                if not len(rk):
                    continue
                idx = pc.index_in(keys.take(pa.array(rows)), value_set=rk)
                hit = idx.is_valid().to_numpy(zero_copy_only=False)
                if not hit.any():
                    continue
                for row, v in zip(rows[hit], rv.take(idx.filter(pa.array(hit))).to_pylist()):
                    seq[row] = r.seq
                    out[row] = v
                rows = rows[~hit]
                if not len(rows):
                    break
        return seq, pa.array(out, pa.binary())

    def lookup_one(self, state_name: str, key: bytes, kg: int) -> tuple[int, bytes | None]:
        """:meth:`lookup` of the one encoded key ``key`` (bytes) of key group ``kg``, for the
        per-record reads: ``(seq, value)`` (``value`` None for a tombstone or a key no run
        holds; ``seq`` 0 for none), by a binary search over each run's sorted keys of the key
        group, newest run first."""
        for r in reversed(self.runs):
            if state_name not in r.states:
                continue
            rk, rv = self._entries_of(r, state_name, kg)
            if not len(rk):
                continue
            keys = KeySequence(rk)
            i = bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return r.seq, rv[i].as_py()
        return 0, None

    def prefix_entries(self, state_name: str, prefixes: list, prefix_width: int
                       ) -> tuple[pa.Array, pa.Array]:
        """``(keys, values)`` (``pa.binary()``, sorted by key): every entry of ``state_name``
        the runs hold under each encoded-key prefix of ``prefixes`` (bytes, each ``key-group
        prefix | key | namespace``: a list's chunks or a map's user keys, docs/formats.md "List
        state", "Map state"; each once), merged newest-wins over the runs with the tombstones
        kept (NULL values), to be merged over the attached version's entries. One read of the
        (state, key group) per run and key group asked (through the decoded cache)."""
        runs = [r for r in reversed(self.runs) if state_name in r.states]
        if not runs or not prefixes:
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        by_kg: dict = {}
        for p in sorted(prefixes):
            by_kg.setdefault(int.from_bytes(p[:prefix_width], "big"), []).append(p)
        parts = []
        for r in runs:
            ks, vs = [], []
            for kg, pre in by_kg.items():
                rk, rv = self._entries_of(r, state_name, kg)
                n = len(rk)
                if not n:
                    continue
                if 4 * len(pre) * n.bit_length() >= n:
                    # Many prefixes: the whole group's keys matched against them in Arrow.
                    mask = prefix_mask(rk, prefixes_by_length(pre))
                    ks.append(rk.filter(mask))
                    vs.append(rv.filter(mask))
                    continue
                # A few prefixes: each one's range of the sorted keys by binary search.
                for p in pre:
                    lo, hi = prefix_range(rk, p)
                    if hi > lo:
                        ks.append(rk.slice(lo, hi - lo))
                        vs.append(rv.slice(lo, hi - lo))
            if ks:
                parts.append((pa.concat_arrays(ks), pa.concat_arrays(vs)))
        return merge_newest_wins(parts, keep_tombstones=True)

    def _entries_of(self, run: SpillRun, state_name: str, kg: int):
        """``run``'s decoded entries of (``state_name``, ``kg``), through the decoded cache."""
        key = (run.seq, state_name, kg)
        got = self._decoded.get(key)
        if got is not None:
            self._decoded.move_to_end(key)
            return got
        got = run.reader().entries(state_name, kg)
        size = got[0].nbytes + got[1].nbytes
        if size <= DECODED_CACHE_BYTES:
            self._decoded[key] = got
            self._decoded_bytes += size
            while self._decoded_bytes > DECODED_CACHE_BYTES:
                _, (k, v) = self._decoded.popitem(last=False)
                self._decoded_bytes -= k.nbytes + v.nbytes
        return got

    def key_groups(self, state_name: str, start: int, end: int) -> set:
        """The key groups of ``[start, end]`` in which a live run holds entries of
        ``state_name`` (from the runs' block tables, nothing decoded)."""
        out: set = set()
        for r in self.runs:
            if state_name in r.states:
                kgs, _ = r.reader().raw_bytes(state_name, start, end)
                out.update(kgs.tolist())
        return out

    def entries(self, state_name: str, kg: int, runs: list, readers: dict
                ) -> list[tuple[pa.Array, pa.Array]]:
        """``(keys, values)`` of ``state_name`` in ``kg`` of each of ``runs`` that holds the
        state, newest first, read through ``readers`` (``{seq: DataFileReader}``, opened as
        needed)."""
        parts = []
        for r in reversed(runs):
            if state_name not in r.states:
                continue
            rd = readers.get(r.seq)
            if rd is None:
                rd = readers[r.seq] = r.open_reader()
            parts.append(rd.entries(state_name, kg))
        return parts

    def retire_through(self, seq: int) -> int:
        """Retire the runs of sequence numbers <= ``seq`` (a completed checkpoint holds them);
        returns how many."""
        old = [r for r in self.runs if r.seq <= seq]
        self.runs = [r for r in self.runs if r.seq > seq]
        for r in old:
            r.retire()
        for key in [k for k in self._decoded if k[0] <= seq]:
            k, v = self._decoded.pop(key)
            self._decoded_bytes -= k.nbytes + v.nbytes
        return len(old)

    def close(self) -> None:
        """Retire every run and remove the directory; while a snapshot being written still
        reads a run, its file goes with the snapshot's release and the empty directory
        stays."""
        pinned = any(r.pinned for r in self.runs)
        self.retire_through(self._seq)
        if self.dir is not None and not pinned:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock_fd is not None and not pinned:
            os.close(self._lock_fd)
        # A directory left for a pinned run's last reader stays locked until this process
        # ends: only then may another backend remove it.
        self._lock_fd = None
        self.dir = None


def _write_changes(out, snap, seq: int, compression: str):
    """Write the changes since the maps' base that the incremental NativeSnapshot ``snap``
    lists as one incremental data file into ``out``, its blocks encoded by the native
    serializer (as an asynchronous checkpoint write encodes them) with ``compression``;
    returns the WriteSummary."""
    from statecore import _native

    plan = plan_file(snap, seq, "spill", DEFAULT_BLOCK_TARGET_BYTES, True,
                     compression=compression)
    ser = _native.SnapshotBlockSerializer(snap.block_sources(), plan.start, plan.end,
                                          plan.prefix, plan.block_target_bytes, True,
                                          queue_payloads(plan.block_target_bytes),
                                          codec=plan.codec)
    ser.start()
    try:
        return write_data_file_from_blocks(out, snap, ser, version=seq, writer="spill",
                                           incremental=True, compression=compression)
    finally:
        ser.cancel()


class SpilledSnapshot:
    """A snapshot of a tiered backend taken while spill runs exist: the
    :class:`~statecore.backends.native.NativeSnapshot` ``inner`` with each keyed state's
    entries of a key group merged over the spill runs ``runs`` (newest wins, tombstones kept
    in an incremental snapshot, dropped in a full one): what ``inner`` would list had nothing
    been spilled. ``entries`` reads the runs through readers of its own (the write may run in
    another thread); the runs stay pinned until :meth:`release`. It offers no native block
    sources, so the writer serializes it through :meth:`entries`."""

    def __init__(self, inner, runs: list, spills: SpillRuns, keyed: set):
        self._inner, self._runs, self._spills = inner, list(runs), spills
        self._keyed = keyed
        self._readers: dict = {}
        self._lock = threading.Lock()
        for r in self._runs:
            r.pin()
        self._released = False
        for name in ("max_parallelism", "key_group_range", "key_type", "assigner",
                     "snapshot_id", "incremental", "base_version", "base_commit_id"):
            setattr(self, name, getattr(inner, name))

    @property
    def ttl_expired(self) -> dict:
        return self._inner.ttl_expired

    @property
    def spill_seq(self) -> int:
        """The newest spill run merged (0: none)."""
        return max((r.seq for r in self._runs), default=0)

    def state_metas(self) -> list:
        return self._inner.state_metas()

    def table_versions(self) -> dict:
        return self._inner.table_versions()

    def entries(self, state_name: str, key_group: int):
        """As :meth:`NativeSnapshot.entries`, the spill runs merged under memory's changes."""
        if state_name not in self._keyed or key_group not in self.key_group_range:
            return self._inner.entries(state_name, key_group)
        with self._lock:
            parts = [self._inner.changes_since_base(state_name, key_group)]
            parts += self._spills.entries(state_name, key_group, self._runs, self._readers)
        keys, values = merge_newest_wins(parts, keep_tombstones=True)
        if not self.incremental and values.null_count:
            live = values.is_valid()
            keys, values = keys.filter(live), values.filter(live)
        return keys, values

    def release(self) -> None:
        """Idempotent: releases ``inner``, closes this snapshot's readers and unpins the runs."""
        self._inner.release()
        with self._lock:
            if self._released:
                return
            self._released = True
            readers, self._readers = self._readers, {}
        for rd in readers.values():
            rd.close()
        for r in self._runs:
            r.unpin()
