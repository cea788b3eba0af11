"""Readers of committed versions: :class:`CheckpointReader` (the state of a version) and
:class:`ChangesReader` (the changes of a version on top of one of its runs).

A reader is a lazy StateSnapshot (docs/architecture.md): it holds the version's manifest and
opens a data file only when a (state, key group) needs it, reading exactly that byte range
unless :meth:`CheckpointReader.prefetch` fetched a key-group range at once. For a key group it
merges the runs of the chain (statecore.checkpoint.runs) newest-wins per key
(:func:`merge_newest_wins`): a tombstone deletes, the result holds no tombstones (a
ChangesReader keeps each key's newest tombstone, as a NULL value). Timers (the state of kind
``timers``) and operator states (:mod:`statecore.operator_state`) are complete in every run, so
they come from the newest run of the chain alone.

Readers never write: runs are immutable once their manifest references them, so a reader needs
no lock. Every data file is checked against its manifest entry (size, footer checksum, key-group
range, kind) when opened.
"""

from __future__ import annotations

import operator
import os
import threading
import time
from bisect import bisect_right
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore.checkpoint.format import (
    KIND_FULL,
    KIND_INCREMENTAL,
    LIST_ENTRIES_FORMAT_VERSION,
    DataFileReader,
    StoredBlocks,
    make_key_group_range,
)
from statecore.checkpoint.layout import CheckpointRoot
from statecore.checkpoint.runs import plan_chains
from statecore.checkpoint.verify import check_entries
from statecore.descriptors import stored_format
from statecore.errors import (
    CheckpointError,
    CheckpointIOError,
    CorruptCheckpointError,
    InvalidInputError,
)
from statecore.operator_state import OperatorStateWriter, is_operator_state_meta

__all__ = ["CheckpointReader", "ChangesReader", "open_changes", "merge_newest_wins", "CHUNK_BYTES"]

#: Decoded bytes per (keys, values) pair of :meth:`CheckpointReader.entries_chunks`: well below
#: the 2 GiB an Arrow binary array holds, large enough that a partition is a handful of pairs.
CHUNK_BYTES = 256 << 20

#: A remote store's (not local files') prefetch: pieces of this many stored bytes, read by
#: REMOTE_FETCH_THREADS threads, and entries_chunks pairs of at most REMOTE_CHUNK_BYTES
#: decoded bytes, so that decoding the first pieces overlaps the download of the rest
#: (DataFileReader.prefetch; a run fetched whole: DataFileReader's ``fetch_pool``, and
#: docs/deploy.md "Checkpoints on object storage" for the size).
REMOTE_PIECE_BYTES = 16 << 20
REMOTE_FETCH_THREADS = 4
#: Seconds the opening of a data file (on an object store one round trip, a HEAD request) must
#: take for the footer's piece to be asked for alongside the others' first ones instead of
#: before them (DataFileReader's ``tail_first``): a store that far away bounds each
#: connection's rate (AWS's "Best Practices Design Patterns: Optimizing Amazon S3
#: Performance": one connection per 85-90 MB/s), and the pieces in flight together move more
#: than loading the footer's piece during the next one's download wins; a store nearer than
#: that answers too fast for it (docs/deploy.md "Checkpoints on object storage").
REMOTE_FAR_OPEN_S = 0.010
REMOTE_CHUNK_BYTES = 16 << 20

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _fetch_pool() -> ThreadPoolExecutor:
    """The process's pool of remote-prefetch threads, created on first use (and again in a
    forked child, which inherits the object but not its threads: PySpark forks its Python
    workers from a daemon)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(REMOTE_FETCH_THREADS,
                                                     thread_name_prefix="statecore-fetch"))
        return _pool[1]

# Not pa.array([]): pyarrow's first pa.array call imports pandas (its pandas shim), which would
# make `import statecore` slow.
_EMPTY = (pa.nulls(0, pa.binary()), pa.nulls(0, pa.binary()))


class _TailCachedFile:
    """An object-store input file (pyarrow ``RandomAccessFile`` interface, as
    :class:`~statecore.checkpoint.format.DataFileReader` uses it) whose last
    :attr:`TAIL_BYTES` bytes are fetched with one ranged read on first use. Opening a data file
    reads its header, trailer and footer: three requests to an object store, where each costs a
    round trip, become one for a file that fits (the Spark operator's per-partition runs are
    mostly small) and two otherwise. Other reads go to the file."""

    TAIL_BYTES = 1 << 20

    def __init__(self, file):
        self._file = file
        self._size = file.size()
        self._tail: bytes | None = None
        self._tail_start = max(0, self._size - self.TAIL_BYTES)

    def size(self) -> int:
        return self._size

    def read_at(self, nbytes: int, offset: int):
        if offset < self._tail_start:
            return self._file.read_at(nbytes, offset)
        if self._tail is None:
            self._tail = self._file.read_at(self._size - self._tail_start, self._tail_start)
        lo = offset - self._tail_start
        return self._tail[lo:lo + nbytes]

    def seek(self, position: int, whence: int = 0):
        return self._file.seek(position, whence)

    def readinto(self, buf):
        return self._file.readinto(buf)

    def close(self) -> None:
        self._tail = None
        self._file.close()


def _native_merge():
    """``statecore._native.merge_newest_wins``, or None without the native extension."""
    try:
        from statecore._native import merge_newest_wins
    except ImportError:
        return None
    return merge_newest_wins


def merge_newest_wins(parts: list[tuple[pa.Array, pa.Array]], native: bool = True,
                      keep_tombstones: bool = False) -> tuple[pa.Array, pa.Array]:
    """Merge ``(keys, values)`` pairs (``pa.binary()`` arrays) given newest first, each sorted by
    key: per key the newest value wins, NULL (tombstone) values delete. Returns sorted binary
    arrays without NULLs; with ``keep_tombstones`` (a change set, :class:`ChangesReader`) the
    newest tombstone of a key stays, as a NULL value. Pairs without entries are skipped; with
    none left both arrays are empty.

    Several runs go through the native k-way merge when the extension is there (``native``;
    it also checks that each run's keys are strictly ascending, InvalidInputError otherwise):
    sorting their concatenation here is the largest part of a restore over an incremental chain.
    """
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return _EMPTY
    merge = _native_merge() if native and len(parts) > 1 else None
    if merge is not None:
        return merge(parts, keep_tombstones)
    if len(parts) == 1:
        keys, values = parts[0]
    else:
        keys = pa.concat_arrays([k for k, _ in parts])
        values = pa.concat_arrays([v for _, v in parts])
        rank = np.concatenate([np.full(len(k), i, dtype=np.int32)
                               for i, (k, _) in enumerate(parts)])
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
    """Lazy StateSnapshot (docs/architecture.md) over one committed version of a checkpoint
    root (what ``CheckpointStore.open`` returns).

    ``root``: the :class:`~statecore.checkpoint.layout.CheckpointRoot` the manifest's paths are
    relative to; ``manifest``: the version's validated manifest; ``segments``: its chains
    (statecore.checkpoint.runs.plan_chains; default: planned from the manifest);
    ``on_release``: called once by the first :meth:`release` (the store unpins the reader's
    files there, statecore.checkpoint.pins).

    Attributes: ``version``, ``commit_id`` (the manifest's: tells this commit of the version
    apart from any other, None for versions committed before commit ids existed),
    ``max_parallelism``, ``key_type``, ``assigner``,
    ``key_group_range`` (the version's inclusive range, ``.start``/``.end``), ``metadata``
    (user dict), ``manifest``, ``incremental`` (False: entries are complete, without
    tombstones), ``remote`` (the root is not on local OS files: every read is a round trip,
    and :meth:`prefetch` fetches in parallel pieces). ``entries`` merges the runs of the key
    group newest-wins (module docstring) and reads exactly the blocks of one (state, key group)
    per run unless :meth:`prefetch` fetched them. Usable as a context manager; :meth:`release`
    is idempotent.
    """

    incremental = False

    _keep_tombstones = False

    def __init__(self, root: CheckpointRoot, version: int, manifest: dict,
                 segments: list | None = None, on_release=None):
        self._root = root
        self._on_release = on_release
        self.remote = not root.is_local
        self.version = version
        self.commit_id = manifest.get("commit_id")
        self.manifest = manifest
        self.max_parallelism = int(manifest["max_parallelism"])
        self.key_type = manifest["key_type"]
        self.assigner = manifest["assigner"]
        self.key_group_range = make_key_group_range(*manifest["key_group_range"])
        self.metadata = manifest["metadata"]
        self._metas = [dict(m) for m in manifest["states"]]
        self._names = {m["name"] for m in self._metas}
        self._metas_by_name = {m["name"]: m for m in self._metas}
        # States complete in every run: read from the newest run of a chain alone.
        self._timer_states = {m["name"] for m in self._metas
                              if m.get("kind") == "timers" or is_operator_state_meta(m)}
        self._bytes_released = 0
        self._segments = segments if segments is not None else plan_chains(
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

    def local_path(self, run: dict) -> str | None:
        """The operating-system path of ``run``'s data file (a manifest ``files`` entry) when
        the version's root is on local OS files, else None (a remote store)."""
        return self._root.os_path(run["path"])

    def data_file(self, run: dict) -> DataFileReader:
        """The open :class:`~statecore.checkpoint.format.DataFileReader` of ``run`` (a manifest
        ``files`` entry), opened on first use and checked against the manifest. Raises
        CheckpointError after :meth:`release`, CorruptCheckpointError when the file is missing,
        cannot be opened or disagrees with the manifest."""
        return self._data_file(run, None)

    def _data_file(self, run: dict, fetch_pool) -> DataFileReader:
        """:meth:`data_file`; with ``fetch_pool``, a file opened here is fetched whole, in
        pieces of about :data:`REMOTE_PIECE_BYTES` (DataFileReader's ``fetch_pool``)."""
        if self._released:
            raise CheckpointError(f"reader of checkpoint version {self.version} was released")
        reader = self._open_files.get(run["path"])
        if reader is None:
            reader = self._open_files[run["path"]] = self._open_data_file(run, fetch_pool)
        return reader

    def _open_data_file(self, run: dict, fetch_pool) -> DataFileReader:
        """``run``'s data file opened and checked against the manifest (:meth:`data_file`),
        not kept: safe from any thread."""
        path = self._root.path(run["path"])
        try:
            t = time.monotonic()
            handle = self._root.fs.open_input_file(path)
            far = time.monotonic() - t >= REMOTE_FAR_OPEN_S
            if not self._root.atomic_rename and fetch_pool is None:
                handle = _TailCachedFile(handle)
        except FileNotFoundError:
            raise CorruptCheckpointError(
                f"checkpoint data file {path} of version {self.version} is missing") from None
        except OSError as exc:
            raise CheckpointIOError(
                f"checkpoint data file {path} of version {self.version} cannot be opened: "
                f"{exc}") from exc
        reader = DataFileReader(handle, path, expected_size=run["size"],
                                expected_footer_xxh64=int(run["footer_xxh64"], 16),
                                fetch_pool=fetch_pool, piece_bytes=REMOTE_PIECE_BYTES,
                                fetch_lanes=REMOTE_FETCH_THREADS, tail_first=not far)
        mine = (self.max_parallelism, self.key_type, self.assigner,
                list(run["key_group_range"]), run["kind"])
        theirs = (reader.max_parallelism, reader.key_type, reader.assigner,
                  [reader.key_group_start, reader.key_group_end], reader.kind)
        if mine != theirs:
            reader.close()
            raise CorruptCheckpointError(
                f"checkpoint data file {path}: footer says {theirs}, the manifest {mine}")
        # Entries are found by the footer's state positions: a footer whose states differ
        # from the manifest's (renamed, reordered, another format) would read the wrong
        # state's entries.
        footer_metas = reader.state_metas()
        if [m.get("name") for m in footer_metas] != list(run["states"]):
            reader.close()
            raise CorruptCheckpointError(
                f"checkpoint data file {path}: footer holds states "
                f"{[m.get('name') for m in footer_metas]}, the manifest lists "
                f"{list(run['states'])}")
        for m in footer_metas:
            ours = self._metas_by_name.get(m["name"])
            if ours is None or stored_format(ours) != stored_format(m):
                reader.close()
                raise CorruptCheckpointError(
                    f"checkpoint data file {path}: state {m['name']!r} is {m} in the "
                    f"footer but {ours} in the manifest")
        return reader

    def prefetch(self, start: int, end: int, *, wait: bool = False) -> int:
        """Fetch the blocks of key groups ``[start, end]`` ∩ this version's range, for later
        :meth:`entries` calls: one ranged read per run that those key groups need, or, on a
        remote store (not local files), pieces of about :data:`REMOTE_PIECE_BYTES` read in
        parallel by a pool of :data:`REMOTE_FETCH_THREADS` threads while the caller goes on
        (:meth:`DataFileReader.prefetch`); there a run not opened yet whose whole key-group range
        is asked for is fetched whole as it is opened (header, blocks, filters and footer in
        those pieces; DataFileReader's ``fetch_pool``: its last piece first, the others in file
        order, and several such runs opened at once). ``wait=True`` returns only once every
        piece arrived (raising the first read error: CheckpointIOError,
        CorruptCheckpointError). Returns the bytes covered (of the key groups' blocks)."""
        spans: dict[str, list] = {}
        for a, b, chain in self._segments:
            lo, hi = max(a, start), min(b, end)
            if lo > hi:
                continue
            for r in chain:
                sp = spans.setdefault(r["path"], [r, lo, hi])
                sp[1], sp[2] = min(sp[1], lo), max(sp[2], hi)
        pool = None if self._root.is_local else _fetch_pool()
        # A run read for all its key groups is fetched whole as it is opened: one request (per
        # piece) instead of its header, its tail and then its blocks, each a round trip; only
        # its Bloom filters are read in vain.
        whole = [r for r, lo, hi in spans.values()
                 if pool is not None and r["path"] not in self._open_files
                 and lo <= r["key_group_range"][0] and hi >= r["key_group_range"][1]]
        if len(whole) > 1:
            self._open_at_once(whole, pool)
        whole_paths = {r["path"] for r in whole}
        covered = 0
        for r, lo, hi in spans.values():
            covered += self._data_file(r, pool if r["path"] in whole_paths else None).prefetch(
                lo, hi, pool=pool, chunk_bytes=REMOTE_PIECE_BYTES)
        if wait:
            for r, _, _ in spans.values():
                self.data_file(r).wait_prefetched()
        return covered

    def _open_at_once(self, runs: list, pool) -> None:
        """Open ``runs`` (not open yet) fetching each whole, the openings -- each a read of the
        file's last piece -- run by ``pool`` at once (a chain's runs: one round trip for all).
        The first error (in ``runs`` order) is raised once all openings ended; the files that
        opened are kept (closed by :meth:`release`)."""
        if self._released:
            raise CheckpointError(f"reader of checkpoint version {self.version} was released")
        futures = [pool.submit(self._open_data_file, r, pool) for r in runs]
        wait_futures(futures)
        for r, f in zip(runs, futures):
            if f.exception() is None:
                self._open_files[r["path"]] = f.result()
        for f in futures:
            if f.exception() is not None:
                raise f.exception()

    def drop_prefetched(self) -> None:
        """Forget the bytes :meth:`prefetch` fetched (later reads read again)."""
        for r in self._open_files.values():
            r.drop_prefetched()

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

    def operator_state_writers(self) -> list[OperatorStateWriter]:
        """One :class:`~statecore.operator_state.OperatorStateWriter` per writer of this
        version -- the runs of the highest ``seq`` with a non-empty key-group range (a
        version's own runs, or compaction's replacements of them, which keep their ranges) --
        ordered by key-group range, which is operator index order. Each reads its operator
        states from its own run (the range's first key group), only when asked; element
        counts come from the manifest (``entries``), so nothing is read here."""
        top = max((r["seq"] for r in self.manifest["files"]), default=0)
        runs = sorted((r for r in self.manifest["files"] if r["seq"] == top
                       and r["key_group_range"][1] >= r["key_group_range"][0]),
                      key=lambda r: r["key_group_range"][0])
        out = []
        for r in runs:
            metas = {n: self._metas_by_name[n] for n in r["states"]
                     if is_operator_state_meta(self._metas_by_name[n])}
            start = r["key_group_range"][0]
            out.append(OperatorStateWriter(
                metas, self.max_parallelism, tuple(r["key_group_range"]),
                lambda name, r=r, start=start: self._own_entries(r, name, start),
                counts=dict(r.get("entries", {})),
                where=f"checkpoint version {self.version}, run {r['path']!r}"))
        return out

    def _own_entries(self, run: dict, name: str, key_group: int):
        keys, values = self.data_file(run).entries(name, key_group)
        if values.null_count:
            raise CorruptCheckpointError(
                f"checkpoint version {self.version}, run {run['path']!r}: operator state "
                f"{name!r} holds tombstones")
        return keys, values

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
        """``read(data file reader)`` of each of ``runs`` merged newest-wins (empty arrays when
        none holds an entry); a merge that finds a run out of order raises
        CorruptCheckpointError naming the version, state, ``where`` and the runs."""
        parts = [read(self.data_file(r)) for r in runs]
        try:
            return merge_newest_wins(parts, keep_tombstones=self._keep_tombstones)
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"checkpoint version {self.version}: state {state_name!r} {where}: "
                f"runs {[r['path'] for r in runs]}: {exc}") from exc

    def entries_chunks(self, state_name: str, start: int, end: int,
                       max_bytes: int | None = None
                       ) -> Iterator[tuple[pa.BinaryArray, pa.BinaryArray]]:
        """The entries of ``state_name`` in key groups ``[start, end]`` ∩ this version's range
        as a few large ``(keys, values)`` pairs instead of one per key group: each pair is what
        :meth:`entries` returns for consecutive key groups, concatenated in key-group order (so
        sorted by key bytes, the prefix being big-endian), merged newest-wins over the runs
        of the key groups' chain in one pass (each run decoded with one native call for them
        all, :meth:`DataFileReader.entries_range`). A pair covers whole key groups and holds at
        most ``max_bytes`` of decoded blocks (summed over the runs) unless one key group alone
        holds more (default :data:`CHUNK_BYTES`, :data:`REMOTE_CHUNK_BYTES` on a remote store:
        smaller pairs let decoding overlap a parallel :meth:`prefetch`). Timer states are read
        key group by key group (their newest run only). Errors as :meth:`entries`; a state not
        in the version yields nothing."""
        for runs, c_lo, c_hi in self._chunks(state_name, start, end, max_bytes):
            keys, values = self._merged(
                state_name, runs, lambda f: f.entries_range(state_name, c_lo, c_hi),
                f"key groups {c_lo}..{c_hi}")
            if len(keys):
                yield keys, values

    def _chunks(self, state_name: str, start: int, end: int, max_bytes: int | None):
        """``(runs, c_lo, c_hi)`` per chunk of :meth:`entries_chunks`: the runs of a chain that
        hold ``state_name`` (newest first) and the chunk's key groups; nothing for a state not
        in the version."""
        if state_name not in self._names:
            return
        if max_bytes is None:
            max_bytes = CHUNK_BYTES if self._root.is_local else REMOTE_CHUNK_BYTES
        for a, b, chain in self._segments:
            lo, hi = max(a, start), min(b, end)
            runs = self._runs_holding(state_name, chain) if lo <= hi else []
            if not runs:
                continue
            for c_lo, c_hi in self._chunk_bounds(state_name, runs, lo, hi, max_bytes):
                yield runs, c_lo, c_hi

    def run_chunks(self, state_name: str, start: int, end: int, max_bytes: int | None = None
                   ) -> Iterator[list[tuple[pa.BinaryArray, pa.BinaryArray]]]:
        """The entries of ``state_name`` in key groups ``[start, end]`` ∩ this version's range
        as the runs hold them, not merged: per chunk of consecutive key groups (cut as
        :meth:`entries_chunks` cuts them), a list of ``(keys, values)`` pairs, one per run
        holding entries there, oldest run first, each what
        :meth:`DataFileReader.entries_range` gives (sorted by key bytes; in an incremental
        run a NULL value is a tombstone). Upserting the pairs in that order into empty state,
        a NULL value removing its key, gives :meth:`entries_chunks`' pair of the chunk (newest
        wins, as Flink's incremental restore applies its changelog onto the base): a restore
        loads the oldest run into empty maps and applies the newer ones instead of merging
        them. Unlike :meth:`entries_chunks`, this does not check that a run's keys are
        strictly ascending (an entry repeated in a run would win over its earlier copy).
        ``max_bytes``: as :meth:`entries_chunks`. Errors as :meth:`entries`; a state not in the
        version yields nothing."""
        for runs, c_lo, c_hi in self._chunks(state_name, start, end, max_bytes):
            parts = []
            for r in reversed(runs):
                k, v = self.data_file(r).entries_range(state_name, c_lo, c_hi)
                if len(k):
                    parts.append((k, v))
            if parts:
                yield parts

    def run_blocks(self, state_name: str, start: int, end: int, max_bytes: int | None = None,
                   *, as_fetched: bool = False) -> Iterator[list[StoredBlocks]]:
        """:meth:`run_chunks` undecoded: per chunk of consecutive key groups (cut as
        :meth:`entries_chunks` cuts them), one
        :class:`~statecore.checkpoint.format.StoredBlocks` per run holding blocks of
        ``state_name`` there, oldest run first -- the stored bytes a caller decodes and loads
        itself (the native restore, ``statecore._native.load_blocks``), each checked there
        as :meth:`entries` checks it. Only for a state whose layout is current in every run
        (``DataFileReader.converts``: map and list states of older formats are not);
        InvalidInputError otherwise. Errors as :meth:`entries`; a state not in the version
        yields nothing.

        ``as_fetched``: for a caller to whom the order of the chunks does not matter (each
        covers other key groups; a restore): chunks are also cut where a run's prefetched
        pieces meet (``DataFileReader.piece_cuts``) and come in the order their pieces
        arrive (``DataFileReader.pieces``), the first one in key-group order whose bytes are
        all here, so that loading what arrived overlaps the download of the rest; a piece
        that failed is raised when its chunk comes. Every prefetched piece of the runs read
        arrived (``DataFileReader.wait_prefetched``: a header checked as its piece arrives
        included) before the last chunk is yielded."""
        if not as_fetched:
            for runs, c_lo, c_hi in self._chunks(state_name, start, end, max_bytes):
                parts = self._stored_parts(state_name, runs, c_lo, c_hi)
                if parts:
                    yield parts
            return
        files: dict = {}  # path: (its DataFileReader, its piece_cuts)
        chunks = []  # (runs, first key group, last key group, the pieces they need)
        for runs, c_lo, c_hi in self._chunks(state_name, start, end, max_bytes):
            at = set()
            for r in runs:
                if r["path"] not in files:
                    f = self.data_file(r)
                    files[r["path"]] = (f, f.piece_cuts())
                at.update(g for g in files[r["path"]][1] if c_lo < g <= c_hi)
            bounds = [c_lo] + sorted(at) + [c_hi + 1]
            for a, b in zip(bounds[:-1], bounds[1:]):
                need = [f for r in runs for f in self.data_file(r).pieces(state_name, a, b - 1)]
                chunks.append((runs, a, b - 1, need))
        while chunks:
            ready = next((i for i, c in enumerate(chunks) if all(f.done() for f in c[3])), None)
            if ready is None:
                wait_futures({f for c in chunks for f in c[3] if not f.done()},
                             return_when=FIRST_COMPLETED)
                continue
            runs, c_lo, c_hi, _ = chunks.pop(ready)
            parts = self._stored_parts(state_name, runs, c_lo, c_hi)
            if not chunks:
                for f, _ in files.values():
                    f.wait_prefetched()
            if parts:
                yield parts

    def _stored_parts(self, state_name: str, runs: list, c_lo: int, c_hi: int
                      ) -> list[StoredBlocks]:
        """:meth:`run_blocks`' list for one chunk: ``runs`` (newest first) taken oldest first."""
        parts = []
        for r in reversed(runs):
            f = self.data_file(r)
            if f.converts(state_name):
                raise InvalidInputError(
                    f"state {state_name!r} of checkpoint data file {f.name} is stored in "
                    "an older format's layout: read it with run_chunks")
            got = f.stored_blocks(state_name, c_lo, c_hi)
            if got is not None:
                parts.append(got)
        return parts

    def key_group_entries(self, state_name: str, start: int, end: int
                          ) -> tuple[np.ndarray, np.ndarray]:
        """``(key_groups, entries)`` (int64 arrays, ascending key groups): per key group of
        ``[start, end]`` ∩ this version's range where a run :meth:`entries` reads holds
        ``state_name``, the most stored entries (tombstones included) one of those runs holds
        there -- from the runs' key-group indexes, nothing decoded: about the entries a restore
        loads, for pre-sizing. Empty for a state not in the version."""
        most: dict[int, int] = {}
        if state_name in self._names:
            for a, b, chain in self._segments:
                lo, hi = max(a, start), min(b, end)
                if lo > hi:
                    continue
                for r in self._runs_holding(state_name, chain):
                    kgs, _, n = self.data_file(r).stored_sizes(state_name, lo, hi)
                    for kg, c in zip(kgs.tolist(), n.tolist()):
                        most[kg] = max(most.get(kg, 0), c)
        kgs = np.array(sorted(most), np.int64)
        return kgs, np.array([most[k] for k in kgs.tolist()], np.int64)

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
                kgs, _ = self.data_file(r).raw_bytes(state_name, lo, hi)
                out.update(kgs.tolist())
        return sorted(out)

    def _chunk_bounds(self, state_name: str, runs: list, lo: int, hi: int, max_bytes: int):
        """``[(start, end)]`` tiling ``[lo, hi]`` so that each holds at most ``max_bytes`` of
        ``runs``' decoded blocks of ``state_name`` (a key group alone may hold more)."""
        sizes = np.zeros(hi - lo + 1, np.int64)
        for r in runs:
            kgs, raw = self.data_file(r).raw_bytes(state_name, lo, hi)
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

    def verify(self) -> None:
        """Read and check every block of every run of the version (checksums, structure, entry
        and tombstone counts against the manifest, and every entry as a restore would check it:
        :func:`statecore.checkpoint.verify.check_entries`), then the merged view of every
        (state, key group). Raises CorruptCheckpointError on the first problem."""
        for f in self.manifest["files"]:
            start, end = f["key_group_range"]
            data = self.data_file(f)
            data.verify_filters()  # the Bloom filters of format 6, which restores never check
            got = {name: 0 for name in f["states"]}
            tombs = {name: 0 for name in f["states"]}
            where = f"checkpoint data file {self._root.path(f['path'])}"
            for kg in range(start, end + 1):
                for name in f["states"]:
                    keys, vals = data.stored_entries(name, kg)
                    check_entries(where, self._metas_by_name[name], kg, keys, vals,
                                  self.max_parallelism, self.key_type,
                                  f["kind"] == KIND_INCREMENTAL,
                                  data.format_version >= LIST_ENTRIES_FORMAT_VERSION)
                    got[name] += len(vals)
                    tombs[name] += vals.null_count
            want_t = {n: f.get("tombstones", {}).get(n, 0) for n in f["states"]}
            if got != f["entries"] or tombs != want_t:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self._root.path(f['path'])}: entry counts {got} "
                    f"(tombstones {tombs}) differ from the manifest's {f['entries']} "
                    f"({want_t})")
        for m in self.state_metas():
            for kg in self.key_group_range:
                self.entries(m["name"], kg)

    @property
    def bytes_read(self) -> int:
        """Bytes read from the version's data files so far (footers, prefetched key-group
        ranges, blocks), those of files closed by :meth:`release` included."""
        return self._bytes_released + sum(r.bytes_read for r in self._open_files.values())

    def adopt_open_files(self, other: "CheckpointReader") -> set:
        """Take over the data files ``other`` -- a reader of another version under the same
        root object, not released -- has open and this version lists with the same manifest
        entry (path, size, footer checksum, kind, key-group range): data files are immutable,
        so what ``other`` read and checked of them holds here. They then belong to this reader
        (closed by its :meth:`release`, not ``other``'s). Returns the paths taken over. Why: a
        tiered backend re-attaches to every version it checkpoints, and reopening the files
        the versions share (footers, filters) would cost each re-attach time proportional to
        the state (RunLookup.take_cache)."""
        if other._root is not self._root or other._released or self._released:
            return set()
        theirs = {r["path"]: r for r in other.manifest["files"]}
        taken = set()
        for run in self.manifest["files"]:
            path = run["path"]
            old = theirs.get(path)
            if (path in self._open_files or path not in other._open_files or old is None
                    or any(old.get(k) != run.get(k) for k in
                           ("size", "footer_xxh64", "kind", "key_group_range"))):
                continue
            self._open_files[path] = other._open_files.pop(path)
            taken.add(path)
        return taken

    def release(self) -> None:
        """Close the data files opened so far (idempotent); later reads raise CheckpointError."""
        self._released = True
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release()
        files, self._open_files = self._open_files, {}
        for r in files.values():
            self._bytes_released += r.bytes_read
            r.close()


class ChangesReader(CheckpointReader):
    """The changes of a version on top of one of its runs (:func:`open_changes`): a
    StateSnapshot-like reader whose chains hold only the runs newer than the *base run*, all
    incremental. :meth:`entries` merges them newest-wins and keeps each key's newest tombstone as
    a NULL value; timers come from the newest run (complete in every run). ``base_seq``: the
    base run's ``seq``; ``runs``: the runs applied, oldest first."""

    _keep_tombstones = True

    def __init__(self, root: CheckpointRoot, version: int, manifest: dict, base_seq: int,
                 segments: list):
        super().__init__(root, version, manifest, segments)
        self.base_seq = base_seq
        seen = {r["path"]: r for _, _, chain in segments for r in chain}
        self.runs = sorted(seen.values(), key=lambda r: r["seq"])


def open_changes(root: CheckpointRoot, version: int, manifest: dict, base_path: str,
                 start: int, end: int) -> ChangesReader | None:
    """A :class:`ChangesReader` over the runs that ``version``'s chains (``manifest``: its
    validated manifest) hold above the run ``base_path`` for key groups ``[start, end]``, or
    None when that is not a plain sequence of incremental runs -- the base run is not in every
    chain of the range (compacted away, or another base), or a newer run is full (a full run has
    no tombstones for what it dropped). Semantics: ``CheckpointStore.open_changes``."""
    segments = []
    base_seq = None
    for a, b, chain in plan_chains(manifest["files"], (start, end), CorruptCheckpointError,
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
    return ChangesReader(root, version, manifest, base_seq, segments)
