"""Point lookups into the runs of a committed checkpoint version: :class:`RunLookup` answers
"what is the stored value of these encoded keys" from the data files themselves, reading at most
one block per key per run, with a bounded cache of decoded blocks (natively
``NativeBlockCache``, else :class:`BlockCache`).

For a key of key group ``kg`` the runs are those of the version's chain for ``kg``
(statecore.checkpoint.runs, the chains :class:`~statecore.checkpoint.readers.CheckpointReader`
merges), newest first: the newest run holding the key decides -- a value is the answer, a
tombstone (incremental runs) means absent -- and a full run ends the chain. In a run of format 6
(docs/formats.md "Filters and block keys") the key is first probed in the Bloom filter of its
(state, key group), so an absent key costs no block read unless the filter errs (about 1% at 10
bits per key); a key the filter passes is searched in the one block whose key range can hold it
(the footer's last key of every block, binary search). A run of format 1 to 5 has neither: the
whole (state, key group) is read and decoded as one cached unit.

A batch proceeds in steps: each step finds, for every key still undecided, the candidate block
of its next run (per run one native call: filter probe and block-key search, RunRouter), then
decides the keys found; keys not found move on to their next run. With the extension, a step's
per-block and per-key work is native (run_lookup.h ``LookupStep``): the keys grouped by block,
the blocks probed in the native block cache (block_cache.h ``NativeBlockCache``: opened
payloads by (file, block), LRU within the cache budget, thread-safe) and the missing ones
planned as coalesced reads, each read's blocks checked (XXH64, payload structure, last key
against the footer's), decompressed and cached, and the keys searched in their payloads in
place (no per-entry decode), all with the GIL released. Over local files one native call does
the whole step (``LookupStep.run``): the blocks cut into chunks of at most ``open_bytes /
(threads + 1)`` decoded bytes (default :data:`OPEN_BYTES`), each chunk probed, read (``pread``),
opened and searched start to end by one of the native fetch threads or by the calling thread,
with no barrier between chunks. Files read through ``pyarrow.fs`` go in rounds of at most half
of ``open_bytes``: per read, on a small thread pool, one ranged read and one native open call;
then one native search of the round's keys on the calling thread while the fetch threads read
and open the next round (two rounds open at once: hence half of ``open_bytes`` each). Python
runs per step or per read at most, never per block or per key. Without the extension, and for
files of format 1 to 5, the same rounds run in Python over a :class:`BlockCache` of Arrow
arrays. Blocks the cache does not keep are released as soon as their chunk or the round after
next is done (one round at a time without the extension): a batch of uniform keys over a large
state would otherwise hold about every block of the runs decompressed at once, and the
allocator would keep those pages after the batch.

A run's filters are read when a batch first needs them: the filters of the key groups the batch
reaches in that run and not read before, in one ranged read (they are stored in key-group
order), each checked against its XXH64, and kept while the lookup is open: about
``bits_per_key / 8`` bytes per entry, outside the block cache's budget. So the first lookup
after an attach reads one key group's filters, not the whole state's.

:meth:`RunLookup.prefix_entries` (whole lists and maps) fetches the candidate blocks of all
its prefixes and runs in the same rounds, through the same cache (so point and prefix lookups
share blocks) and threads, and selects the entries under the prefixes with Arrow kernels over
the opened blocks in place. :meth:`RunLookup.lookup_one` serves one key with one native call per
run (route, cache probe, search) and a read and an open only for a block not cached."""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore.checkpoint.blocks import (
    bloom_probe,
    decode_stored_block,
    key_hashes,
    native_decode_blocks,
    xxh64,
)
from statecore.checkpoint.format import (
    KIND_FULL,
    KIND_INCREMENTAL,
    key_group_prefix_bytes,
    range_bounds,
)
from statecore.checkpoint.runs import plan_chains
from statecore.errors import CheckpointIOError, CorruptCheckpointError, InvalidInputError
from statecore.operator_state import is_operator_state_meta

__all__ = ["BlockCache", "RunLookup", "DEFAULT_CACHE_BYTES", "FETCH_THREADS", "OPEN_BYTES",
           "encoded_key_groups", "prefixes_by_length", "prefix_mask", "prefix_range"]

#: Default budget of a lookup's block cache, in decoded bytes.
DEFAULT_CACHE_BYTES = 64 << 20
#: Threads fetching and decoding the blocks of one batch.
FETCH_THREADS = 4
#: With the extension, missing blocks of one file at most this many bytes apart are fetched by
#: one ranged read (the bytes between them read and dropped), after RocksDB's and ForSt's
#: coalesced reads: on an object store a request costs far more than 128 KiB of transfer, and
#: locally one read and one native call per range replace a read, a call and a thread task per
#: block, which cost more than decompressing it.
COALESCE_GAP_BYTES = 128 << 10
#: The same for local files, which the extension reads itself (pread on the fetch threads,
#: no Python per read): a system call costs about as much as copying a few KiB, and reading
#: the gaps of a batch of keys spread over a large file would read the whole file.
LOCAL_COALESCE_GAP_BYTES = 8 << 10
#: ... up to this many bytes per read, so that a batch's blocks are several tasks the fetch
#: threads share.
MAX_READ_BYTES = 4 << 20
#: Default bound of the decoded bytes of the blocks one lookup holds open at once beyond its
#: cache (RunLookup ``open_bytes``): a batch's candidate blocks are opened and searched in
#: rounds of at most this many bytes, so that a large batch of uniform keys over a large state
#: does not decompress every block of the runs at once.
OPEN_BYTES = 8 << 20


try:
    from statecore._native import ONE_FILTERED as _ONE_FILTERED
    from statecore._native import ONE_MISSING as _ONE_MISSING
    from statecore._native import ONE_NOT_FOUND as _ONE_NOT_FOUND
    from statecore._native import ONE_PAST as _ONE_PAST
    from statecore._native import ONE_TOMBSTONE as _ONE_TOMBSTONE
    from statecore._native import ONE_VALUE as _ONE_VALUE
    from statecore._native import LookupStep as _LookupStep
    from statecore._native import NativeBlockCache
    from statecore._native import NativeFetchPool as _NativeFetchPool
    from statecore._native import RunBlocks as _RunBlocks
    from statecore._native import RunRouter as _RunRouter
    from statecore._native import lookup_chain_one as _lookup_chain_one
    from statecore._native import lookup_in_blocks as _native_lookup_in_blocks
    from statecore._native import lookup_in_payloads as _native_lookup_in_payloads
    from statecore._native import merge_newest_wins as _native_merge_newest_wins
except ImportError:
    _native_lookup_in_blocks = _native_lookup_in_payloads = _lookup_chain_one = None
    _RunRouter = _native_merge_newest_wins = NativeBlockCache = _RunBlocks = _LookupStep = None
    _NativeFetchPool = None

#: Per data file name, its id in the native block caches: one numbering for the process, so a
#: cache handed from one lookup to the next (the tiered mode re-attaching) names a file as
#: every lookup does.
_FILE_IDS: dict[str, int] = {}


def _file_id(name: str) -> int:
    return _FILE_IDS.setdefault(name, len(_FILE_IDS))


def _lookup_in_blocks(blocks: list, which: np.ndarray, needles: pa.Array
                      ) -> tuple[np.ndarray, pa.Array]:
    """``(rows, values)``: each needle's row in its block ``blocks[which[i]]`` (``(keys,
    values)`` pairs, keys ascending and unique) or -1, and its value (NULL where not found or a
    tombstone). Natively a binary search per needle with the GIL released; else Arrow's
    hash-based ``index_in`` over the blocks (keys are unique within a file's state, so a key is
    in its own block or in none)."""
    if _native_lookup_in_blocks is not None:
        return _native_lookup_in_blocks(blocks, which, needles)
    keys = pa.concat_arrays([k for k, _ in blocks])
    values = pa.concat_arrays([v for _, v in blocks])
    at = pc.fill_null(pc.index_in(needles, value_set=keys), -1).to_numpy().astype(np.int64)
    starts = np.concatenate(([0], np.cumsum([len(k) for k, _ in blocks])[:-1])).astype(np.int64)
    rows = np.where(at >= 0, at - starts[which], -1)
    return rows, values.take(pa.array(np.maximum(at, 0), mask=at < 0))


def _block_bytes(keys: pa.Array, values: pa.Array) -> int:
    return int(keys.nbytes) + int(values.nbytes)


def encoded_key_groups(keys: pa.BinaryArray, prefix_width: int) -> np.ndarray:
    """The key group of each encoded key of ``keys`` (``pa.binary()``): its big-endian
    ``prefix_width``-byte (1 or 2) key-group prefix (docs/formats.md "Encoded key"), as int64,
    one per key. InvalidInputError for a key shorter than its prefix."""
    n = len(keys)
    bufs = keys.buffers()
    off = np.frombuffer(bufs[1], np.int32)[keys.offset:keys.offset + n + 1].astype(np.int64)
    if n and bool(np.any(np.diff(off) < prefix_width)):
        raise InvalidInputError(
            f"an encoded key is shorter than its {prefix_width}-byte key-group prefix")
    data = np.frombuffer(bufs[2], np.uint8) if n else np.zeros(0, np.uint8)
    kgs = data[off[:-1]].astype(np.int64)
    if prefix_width == 2:
        kgs = (kgs << 8) | data[off[:-1] + 1]
    return kgs


def _successor(prefix: bytes) -> bytes | None:
    """The least byte string greater than every string that starts with ``prefix`` (its last
    byte below 0xff incremented, the 0xff bytes after it dropped), or None when there is none
    (``prefix`` all 0xff bytes)."""
    p = prefix.rstrip(b"\xff")
    return p[:-1] + bytes([p[-1] + 1]) if p else None


def _payload_entries(payload: np.ndarray, has_validity: bool) -> tuple[pa.Array, pa.Array]:
    """``(keys, values)`` ``pa.binary()`` arrays over an opened block payload
    (docs/formats.md "Block payload": entry count, key offsets, value offsets, key data, value
    data, validity of incremental runs' tombstones), without a copy: they keep ``payload``
    alive. The payload was checked when opened (``open_blocks``)."""
    buf = pa.py_buffer(payload)
    n = int(payload[:4].view("<u4")[0])
    ko, vo, kd = 4, 4 + 4 * (n + 1), 4 + 8 * (n + 1)
    klen = int(payload[vo - 4:vo].view("<u4")[0])
    vlen = int(payload[kd - 4:kd].view("<u4")[0])
    vd = kd + klen
    end = vd + vlen
    validity = buf.slice(end) if has_validity and end < len(payload) else None
    keys = pa.Array.from_buffers(pa.binary(), n, [None, buf.slice(ko, 4 * (n + 1)),
                                                  buf.slice(kd, klen)])
    values = pa.Array.from_buffers(pa.binary(), n, [validity, buf.slice(vo, 4 * (n + 1)),
                                                    buf.slice(vd, vlen)])
    return keys, values


class KeySequence:
    """The values of a ``pa.binary()`` array as a read-only sequence of bytes, for
    :func:`bisect.bisect_left` over sorted keys (a block's, a run's key group) without
    converting them all."""

    def __init__(self, keys: pa.Array):
        bufs = keys.buffers()
        self._n = len(keys)
        self._off = np.frombuffer(bufs[1], np.int32)[keys.offset:keys.offset + self._n + 1]
        self._data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        return bytes(self._data[int(self._off[i]):int(self._off[i + 1])])


def prefixes_by_length(prefixes) -> list[tuple[int, pa.Array]]:
    """``[(length, pa.binary() prefixes of that length)]``, lengths ascending, of the encoded-key
    prefixes ``prefixes`` (bytes; each once): the form :func:`prefix_mask` takes."""
    by_len: dict[int, list] = {}
    for p in prefixes:
        by_len.setdefault(len(p), []).append(p)
    return [(cut, pa.array(ps, pa.binary())) for cut, ps in sorted(by_len.items())]


def prefix_mask(keys: pa.Array, wanted: list) -> pa.BooleanArray:
    """Per key of ``keys`` (``pa.binary()``, any order) whether it starts with one of the
    prefixes ``wanted`` (:func:`prefixes_by_length`): each key's first bytes looked up in the
    prefixes of each length, with Arrow kernels over the whole array."""
    mask = None
    for cut, ps in wanted:
        hit = pc.is_in(pc.binary_slice(keys, 0, cut), value_set=ps)
        mask = hit if mask is None else pc.or_(mask, hit)
    return mask


def prefix_range(keys: pa.Array, prefix: bytes) -> tuple[int, int]:
    """``(lo, hi)``: the rows of ``keys`` (``pa.binary()``, ascending, no NULL) that start with
    ``prefix``, by two binary searches (``prefix`` and its successor) without converting the
    keys; ``lo == hi`` when none does."""
    seq = KeySequence(keys)
    lo = bisect_left(seq, prefix)
    succ = _successor(prefix)
    return lo, (len(seq) if succ is None else bisect_left(seq, succ, lo=lo))


def _merge_newest(parts: list) -> tuple[pa.BinaryArray, pa.BinaryArray]:
    """``(keys, values)`` sorted by key, without tombstones: per key the entry of the first
    part holding it (``parts``: ``(depth, keys, values)``, newest run first, each part's keys
    ascending, NULL values tombstones) -- natively ``merge_newest_wins``, else with a dict. One
    part comes back as given (its tombstones dropped): it may be a view of a cached block."""
    if not parts:
        return pa.array([], pa.binary()), pa.array([], pa.binary())
    if len(parts) == 1:  # one run's keys: nothing to merge
        _, k, v = parts[0]
        if v.null_count:
            live = pc.is_valid(v)
            k, v = k.filter(live), v.filter(live)
        return k, v
    if _native_merge_newest_wins is not None:
        return _native_merge_newest_wins([(k, v) for _, k, v in parts])
    found: dict[bytes, Any] = {}
    for _, k, v in parts:
        for key, value in zip(k.to_pylist(), v.to_pylist()):
            found.setdefault(key, value)
    ordered = sorted(key for key, value in found.items() if value is not None)
    return pa.array(ordered, pa.binary()), pa.array([found[k] for k in ordered], pa.binary())


class BlockCache:
    """Decoded blocks, least recently used first out, holding at most ``budget`` bytes (each
    block counted by the memory it holds: what :meth:`put` is told, by default its Arrow
    buffers' bytes). A block is ``(keys, values)`` Arrow arrays, or ``(payload, None)``: a
    checked, decompressed block payload (docs/formats.md "Block payload", a numpy uint8 array)
    that the native lookups search in place. A block larger than the budget is never kept.
    Counts ``hits`` and ``misses`` of :meth:`get`. Not thread-safe: one lookup's thread uses
    it."""

    def __init__(self, budget: int):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise InvalidInputError(f"cache budget must be an int >= 0 bytes, got {budget!r}")
        self.budget = budget
        self.used = 0
        self.hits = 0
        self.misses = 0
        #: always 0: no admission test here (the native cache's, block_cache.h, refuses blocks)
        self.rejected = 0
        self._items: OrderedDict[Any, tuple[pa.Array, pa.Array, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key) -> tuple[pa.Array, pa.Array] | None:
        """``(keys, values)`` of the cached block ``key`` (now the most recently used), or None."""
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item[0], item[1]

    def put(self, key, keys: pa.Array, values: pa.Array, size: int | None = None) -> None:
        """Keep a decoded block of ``size`` bytes (default: its arrays' buffer bytes), evicting
        the least recently used ones to stay within budget."""
        if size is None:
            size = _block_bytes(keys, values)
        if size > self.budget or key in self._items:
            return
        while self.used + size > self.budget:
            _, (_, _, s) = self._items.popitem(last=False)
            self.used -= s
        self._items[key] = (keys, values, size)
        self.used += size


class _RunFile:
    """What a lookup keeps of one open data file for one state: its key-group index rows by key
    group, and -- read on the first lookup of each key group, so that opening a run costs no
    read proportional to its size -- its filters (format 6) and block keys."""

    def __init__(self, data, state: str, start: int, end: int, fd: int | None = None):
        self.data = data
        self.state = state
        #: an OS file descriptor of the data file (local files; the lookup owns it), or None
        self.fd = fd
        rows, pos = data.index_rows(state)
        keep = (rows["key_group"] >= start) & (rows["key_group"] <= end)
        rows, pos = rows[keep], pos[keep]
        self.rows = {int(r["key_group"]): r for r in rows}
        self.tables = data.lookup_tables()
        #: per key group its filter's record in the footer's filter table (format 6)
        self._filter_rows = ({} if self.tables is None else
                             {int(r["key_group"]): f for r, f in zip(rows, self.tables[0][pos])})
        self.filters: dict[int, tuple[memoryview, int]] = {}
        # Per key group: last keys (objects), for the lookups without the extension (the
        # native ones search the footer's block keys in place).
        self.block_keys: dict[int, np.ndarray] = {}
        #: first block of each key group's record, ascending, and those key groups
        self.first_blocks = rows["first_block"].astype(np.int64)
        self.kg_list = rows["key_group"].astype(np.int64)
        self.block_counts = rows["block_count"].astype(np.int64)
        #: decoded bytes of every block of the file, by block number
        self.raw_lengths = (None if self.tables is None else
                            data.block_rows(0, len(self.tables[1]) - 1)["raw_length"])
        #: format 6, for prefix searches: the last key of every block of the state in key
        #: order (the key groups' blocks one after another), each one's block number, and
        #: where each key group's blocks start in that order
        self._state_keys: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        #: With the extension (format 6): routes a batch's keys to their candidate blocks in
        #: one native call (filters given to it as they are read).
        self.router = None
        #: With the extension (format 6): the file's block table and block keys for the
        #: native lookup steps, cache probes and block opens (:class:`RunLookup`).
        self.blocks = None
        if self.tables is not None and _RunRouter is not None:
            self.router = _RunRouter(start, end, self.kg_list, self.first_blocks,
                                     rows["block_count"], self.tables[1], self.tables[2])
        if self.tables is not None and _RunBlocks is not None:
            koff = self.tables[1]
            self.blocks = _RunBlocks(_file_id(data.name), data.block_rows(0, len(koff) - 1),
                                     koff, self.tables[2], data.kind == KIND_INCREMENTAL)

    def ensure_filters(self, kgs) -> int:
        """Read the filters of the key groups ``kgs`` (ints, or an int array; repeats allowed)
        not read yet, in one ranged read
        over the span they lie in (filters are stored in key-group order), checking each
        against its XXH64 (and, without the extension, take their block keys from the footer);
        returns the bytes read. CorruptCheckpointError on a mismatch (no filter of the read
        kept), CheckpointIOError when the read fails."""
        if len(self.filters) == len(self._filter_rows):
            return 0
        if isinstance(kgs, np.ndarray):
            kgs = np.unique(kgs).tolist()
        want = sorted({kg for kg in kgs if kg in self._filter_rows and kg not in self.filters})
        if not want:
            return 0
        sel = [self._filter_rows[kg] for kg in want]
        lo = min(int(f["offset"]) for f in sel)
        hi = max(int(f["offset"]) + int(f["length"]) for f in sel)
        raw = memoryview(self.data.read_range(lo, hi - lo, f"filters of state {self.state!r}"))
        got = {}
        for kg, f in zip(want, sel):
            a = int(f["offset"]) - lo
            filt = raw[a:a + int(f["length"])]
            if xxh64(filt) != int(f["xxh64"]):
                raise CorruptCheckpointError(
                    f"checkpoint data file {self.data.name}: state {self.state!r} key group "
                    f"{kg}: Bloom filter checksum mismatch")
            got[kg] = (filt, int(f["hashes"]))
        self.filters.update(got)
        if self.router is not None:
            for kg, (filt, k) in got.items():
                self.router.set_filter(kg, filt, k)
        else:
            for kg in want:
                self.last_keys(kg)
        return hi - lo

    def last_keys(self, kg: int) -> np.ndarray:
        """The footer's last key (bytes objects, ascending) of each block of key group
        ``kg``'s record (format 6), kept while the lookup is open."""
        got = self.block_keys.get(kg)
        if got is None:
            _, koff, kdata = self.tables
            r = self.rows[kg]
            first, count = int(r["first_block"]), int(r["block_count"])
            ends = koff[first:first + count + 1].tolist()
            got = np.empty(count, dtype=object)
            got[:] = [bytes(kdata[a:e]) for a, e in zip(ends[:-1], ends[1:])]
            self.block_keys[kg] = got
        return got

    def prefix_blocks(self, prefixes: np.ndarray, succ: np.ndarray, kgs: np.ndarray
                      ) -> np.ndarray:
        """The blocks (int64, with repeats) of this state (format 6) that can hold keys
        starting with any of ``prefixes`` (bytes objects, of the key groups ``kgs``; ``succ``
        their :func:`_successor`): for each, by the footer's last key of each block of its key
        group, the first block whose last key is >= the prefix through the first whose last
        key is >= its successor (the first that ends past the prefix's keys), or the key
        group's last block. One search over the state's block keys for all prefixes: blocks
        are stored by key group, then key (docs/formats.md "Blocks"), so the state's block
        keys taken key group after key group are ascending."""
        if self._state_keys is None:
            _, koff, kdata = self.tables
            blocks = np.concatenate([np.arange(f, f + c, dtype=np.int64) for f, c in
                                     zip(self.first_blocks.tolist(),
                                         self.block_counts.tolist())] or [np.zeros(0, np.int64)])
            starts, ends = koff[blocks].tolist(), koff[blocks + 1].tolist()
            last = np.empty(len(blocks), dtype=object)
            last[:] = [bytes(kdata[a:e]) for a, e in zip(starts, ends)]
            row_start = np.concatenate(([0], np.cumsum(self.block_counts)[:-1])).astype(np.int64)
            self._state_keys = (last, blocks, row_start)
        last, block_of, row_start = self._state_keys
        r = np.minimum(np.searchsorted(self.kg_list, kgs), max(len(self.kg_list) - 1, 0))
        held = (self.kg_list[r] == kgs) if len(self.kg_list) else np.zeros(len(kgs), bool)
        prefixes, succ, r = prefixes[held], succ[held], r[held]
        row_end = (row_start + self.block_counts)[r]
        lo = np.searchsorted(last, prefixes, side="left").astype(np.int64)
        hi = row_end - 1
        has_succ = np.array([x is not None for x in succ], dtype=bool)
        if bool(has_succ.any()):
            hi[has_succ] = np.minimum(np.searchsorted(last, succ[has_succ], side="left"),
                                      hi[has_succ])
        keep = lo < row_end
        lo, hi = lo[keep], hi[keep]
        if not len(lo):
            return np.zeros(0, np.int64)
        n = hi - lo + 1
        first = np.repeat(lo - np.concatenate(([0], np.cumsum(n)[:-1])), n)
        return block_of[first + np.arange(int(n.sum()), dtype=np.int64)]

    def key_group_of_block(self, block: int) -> tuple[int, int]:
        """``(key group, position of the block among the key group's blocks)``."""
        i = int(np.searchsorted(self.first_blocks, block, side="right")) - 1
        return int(self.kg_list[i]), block - int(self.first_blocks[i])

    def block_what(self, block: int) -> str:
        """``state '<name>' key group <kg>`` of ``block``, for error messages."""
        kg, _ = self.key_group_of_block(block)
        return f"state {self.state!r} key group {kg}"


def _open_local(path: str | None) -> int | None:
    """An OS file descriptor (read-only) of ``path`` (an operating-system path, or None), or
    None when it is None or cannot be opened: the lookup then reads through the data file
    reader, whose open already checked the file."""
    if path is None:
        return None
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


class RunLookup:
    """Point lookups of encoded keys in the runs of one committed checkpoint version (module
    docstring), for the key groups ``[start, end]`` (inclusive; default the version's range).

    ``reader``: the version's :class:`~statecore.checkpoint.readers.CheckpointReader`
    (``CheckpointStore.open(version)``), which opens and checks the data files against the
    manifest; the lookup does not release it. ``cache_bytes``: the block cache's budget in
    decoded bytes. ``threads``: fetch threads. ``open_bytes``: the most decoded bytes of blocks
    a batch opens at once (module docstring), >= 1.

    ``stats`` (dict of ints): ``blocks_read`` and ``bytes_read`` (blocks fetched from storage
    and the bytes of their reads -- with the extension, the gaps between blocks one read
    coalesces included -- plus ``filter_bytes`` of filters read), ``filter_negatives`` (key, run
    pairs the filter ruled out), ``filter_false_positives`` (pairs the filter passed whose run
    did not hold the key), ``range_negatives`` (pairs outside every block's key range),
    ``cache_hits`` / ``cache_misses``, ``lookups`` (keys asked), ``peak_open_bytes`` (the most
    decoded bytes a batch held open at once, cached blocks included: at most ``open_bytes``, or
    with the extension ``threads + 1`` of the largest blocks (local files) or two (others) when
    one is larger than a chunk or half a round).
    InvalidInputError for a bad ``cache_bytes``, ``threads`` or ``open_bytes``. Usable as a
    context manager; :meth:`close` stops the fetch threads.
    """

    def __init__(self, reader, key_groups=None, *, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 threads: int = FETCH_THREADS, open_bytes: int = OPEN_BYTES):
        self.reader = reader
        manifest = reader.manifest
        start, end = range_bounds(key_groups if key_groups is not None
                                  else manifest["key_group_range"])
        vs, ve = (int(x) for x in manifest["key_group_range"])
        if end >= start and (start < vs or end > ve):
            raise InvalidInputError(
                f"key groups [{start}, {end}] are outside the range [{vs}, {ve}] of checkpoint "
                f"version {reader.version}")
        self.start, self.end = start, end
        self.prefix = key_group_prefix_bytes(int(manifest["max_parallelism"]))
        self._segments = plan_chains(manifest["files"], (start, end), CorruptCheckpointError,
                                     f"manifest of version {reader.version}")
        self._metas = {m["name"]: m for m in manifest["states"]}
        #: Decoded blocks: with the extension a NativeBlockCache of format-6 blocks and, once a
        #: file of format 1 to 5 is read, a BlockCache of its (state, key group) units beside
        #: it, the budget split in half between them (:meth:`_unit_cache`); without the
        #: extension one BlockCache of both.
        self.cache = BlockCache(cache_bytes) if NativeBlockCache is None else \
            NativeBlockCache(cache_bytes)
        self._cache_bytes = cache_bytes
        self._units: BlockCache | None = None
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInputError(f"threads must be an int >= 1, got {threads!r}")
        if isinstance(open_bytes, bool) or not isinstance(open_bytes, int) or open_bytes < 1:
            raise InvalidInputError(f"open_bytes must be an int >= 1, got {open_bytes!r}")
        self.open_bytes = open_bytes
        self._threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="statecore-lookup")
        #: Reads of local format-6 files run on native threads (fetch_pool.h); others on _pool.
        self._native_pool = _NativeFetchPool(threads) if _NativeFetchPool is not None else None
        self._files: dict[tuple[str, str], _RunFile] = {}
        #: data file path -> an OS file descriptor (local files of format 6; None: remote or
        #: not openable, read through the data file reader)
        self._fds: dict[str, int | None] = {}
        self._chain_memo: dict[str, tuple[list[int], list]] = {}
        #: (state, key group) -> its runs for lookup_one's native path, or None (_native_chain)
        self._one_chains: dict[tuple[str, int], tuple | None] = {}
        #: run path -> its file id in the native block cache, per format-6 file opened here or
        #: by the lookups whose cache this one took (:meth:`take_cache`)
        self._file_ids: dict[str, int] = {}
        self.stats = {"lookups": 0, "blocks_read": 0, "bytes_read": 0, "filter_bytes": 0,
                      "filter_negatives": 0, "filter_false_positives": 0,
                      "range_negatives": 0, "peak_open_bytes": 0}

    def __enter__(self) -> "RunLookup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the fetch threads and drop the cache and filters (idempotent)."""
        self._pool.shutdown(wait=True)
        if self._native_pool is not None:
            self._native_pool.close()
        self._files.clear()
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()
        self.cache = type(self.cache)(self._cache_bytes)
        self._units = None

    def statistics(self) -> dict:
        """:attr:`stats` with the caches' ``cache_hits``, ``cache_misses``, ``cache_rejected``
        (blocks the native cache's admission test refused) and ``cache_bytes`` (decoded bytes
        held now)."""
        caches = [self.cache] + ([self._units] if self._units is not None else [])
        return dict(self.stats, cache_hits=sum(c.hits for c in caches),
                    cache_misses=sum(c.misses for c in caches),
                    cache_rejected=sum(c.rejected for c in caches),
                    cache_bytes=sum(c.used for c in caches))

    def _unit_cache(self) -> BlockCache:
        """The BlockCache of the blocks the native cache does not take: all of them without
        the extension, else the (state, key group) units of files of format 1 to 5, with half
        the budget (the native cache keeps the other half)."""
        if NativeBlockCache is None:
            return self.cache
        if self._units is None:
            half = self._cache_bytes // 2
            self.cache.set_budget(self._cache_bytes - half)
            self._units = BlockCache(half)
        return self._units

    def _run_file(self, run: dict, state: str) -> _RunFile:
        key = (run["path"], state)
        rf = self._files.get(key)
        if rf is None:
            data = self.reader.data_file(run)
            fd = None
            if data.lookup_tables() is not None and _RunBlocks is not None:
                fd = self._fds.get(run["path"], -1)
                if fd == -1:
                    fd = self._fds[run["path"]] = _open_local(self.reader.local_path(run))
            rf = _RunFile(data, state, self.start, self.end, fd)
            self._files[key] = rf
            if rf.blocks is not None:
                self._file_ids[run["path"]] = rf.blocks.file_id
        return rf

    def take_cache(self, previous: "RunLookup") -> None:
        """Use the block cache of ``previous``, a lookup of an earlier version of the same
        checkpoint store in this process (the tiered mode re-attaching after a checkpoint or a
        compaction): the blocks of the data files this lookup's version still lists stay (their
        keys name immutable files), the others are dropped. Why: the runs a compaction replaced
        are never asked for again, and in the native cache their blocks' admission counts would
        make it refuse the new runs' blocks (block_cache.h) until ageing fades them. Over the
        same key groups, the files both versions list also move over open, with what was read
        of them (footer, filters, block tables; CheckpointReader.adopt_open_files) and their
        descriptors: a re-attach then reads only the new runs, not the footers and filters of
        the whole state again. ``previous`` is to be closed next."""
        paths = {run["path"] for run in self.reader.manifest["files"]}
        self.cache = previous.cache
        self._file_ids = {p: i for p, i in previous._file_ids.items() if p in paths}
        if NativeBlockCache is not None and isinstance(self.cache, NativeBlockCache):
            self.cache.retain_files(self._file_ids.values())
        if (previous.start, previous.end) != (self.start, self.end):
            return
        moved = self.reader.adopt_open_files(previous.reader)
        for key in [k for k in previous._files if k[0] in moved]:
            self._files[key] = previous._files.pop(key)
        for path in moved & previous._fds.keys():
            self._fds[path] = previous._fds.pop(path)

    def _chains(self, state: str) -> list[tuple[int, int, list[dict]]]:
        """Per segment, the runs whose entries of ``state`` make its state (newest first, down
        to the first full run; timers and operator states from the newest run alone)."""
        meta = self._metas[state]
        complete = meta.get("kind") == "timers" or is_operator_state_meta(meta)
        out = []
        for a, b, chain in self._segments:
            runs = []
            for r in (chain[:1] if complete else chain):
                if state not in r["states"]:
                    if r["kind"] == KIND_FULL:
                        break
                    continue
                runs.append(r)
            out.append((a, b, runs))
        return out

    def _key_groups(self, keys: pa.BinaryArray) -> np.ndarray:
        kgs = encoded_key_groups(keys, self.prefix)
        bad = (kgs < self.start) | (kgs > self.end)
        if bool(np.any(bad)):
            raise InvalidInputError(
                f"encoded key {int(np.nonzero(bad)[0][0])} has key group "
                f"{int(kgs[bad][0])}, outside the lookup's key groups [{self.start}, "
                f"{self.end}]")
        return kgs

    def lookup_batch(self, state_name: str, encoded_keys) -> pa.BinaryArray:
        """The stored value (``pa.binary()``; "Values", "TTL suffix" of docs/formats.md, as the
        data files hold them) of each encoded key (docs/formats.md "Encoded key": key-group
        prefix | key | namespace [| user key]) of ``encoded_keys`` (a ``pa.binary()`` array
        without nulls) in ``state_name``, NULL where the version holds none (never written,
        removed, or shadowed by a tombstone). Expired TTL values come back as stored: the
        caller applies its clock. Raises InvalidInputError for an unknown state, a key shorter
        than its key-group prefix or of a key group outside the lookup's range;
        CorruptCheckpointError naming the file, state, key group (and block) for a block,
        filter or footer that fails its checks; CheckpointIOError when a read fails."""
        if state_name not in self._metas:
            raise InvalidInputError(
                f"checkpoint version {self.reader.version} has no state {state_name!r}")
        keys = encoded_keys.combine_chunks() if isinstance(encoded_keys,
                                                           pa.ChunkedArray) else encoded_keys
        if not isinstance(keys, pa.Array) or not (pa.types.is_binary(keys.type)
                                                  or pa.types.is_large_binary(keys.type)):
            raise InvalidInputError("encoded_keys must be a pyarrow binary array")
        if pa.types.is_large_binary(keys.type):
            keys = keys.cast(pa.binary())
        if keys.null_count:
            raise InvalidInputError("encoded_keys must not contain nulls")
        n = len(keys)
        self.stats["lookups"] += n
        if n == 0:
            return pa.array([], pa.binary())
        kgs = self._key_groups(keys)
        hashes = key_hashes(keys)
        objkeys = None  # the keys as bytes, for the block-key search without the extension
        if _RunRouter is None:
            objkeys = np.empty(n, dtype=object)
            objkeys[:] = keys.to_pylist()
        take_part = np.full(n, -1, dtype=np.int64)  # which hit part holds the key's value
        take_row = np.zeros(n, dtype=np.int64)
        parts: list[pa.Array] = []
        chains = self._chains(state_name)
        seg_starts = np.array([a for a, _, _ in chains], dtype=np.int64)
        seg_of = np.searchsorted(seg_starts, kgs, side="right") - 1
        chain_len = np.array([len(runs) for _, _, runs in chains], dtype=np.int64)
        pos = np.zeros(n, dtype=np.int64)  # per key: its next run in its chain
        live = np.arange(n)
        while len(live):
            routed: dict[str, list] = {}  # path -> [run file, [key arrays], [block arrays]]
            # Segments and depths are small non-negative ints: bincount finds the ones
            # present in one pass, where np.unique sorts or hashes every key's.
            for s in np.flatnonzero(np.bincount(seg_of[live])):
                runs = chains[int(s)][2]
                in_seg = live[seg_of[live] == s]
                for depth in np.flatnonzero(np.bincount(pos[in_seg])):
                    if depth >= len(runs):
                        continue  # no run left: absent
                    mine = in_seg[pos[in_seg] == depth]
                    rf = self._run_file(runs[int(depth)], state_name)
                    self._candidates(rf, mine, keys, kgs, hashes, objkeys, pos, routed)
            routed = {p: e for p, e in routed.items() if sum(len(i) for i in e[1])}
            native = [e for e in routed.values() if e[0].blocks is not None]
            if native:
                self._native_step(native, keys, take_part, take_row, parts, pos)
            for chunk in self._open_rounds({p: e for p, e in routed.items()
                                            if e[0].blocks is None}):
                self._search_round(chunk, keys, take_part, take_row, parts, pos)
            live = np.nonzero((take_part < 0) & (pos < chain_len[seg_of]))[0]
        return self._assemble(n, take_part, take_row, parts)

    def _native_step(self, routed: list, keys: pa.BinaryArray, take_part: np.ndarray,
                     take_row: np.ndarray, parts: list, pos: np.ndarray) -> None:
        """One step of a batch over format-6 files with the extension (``routed``:
        ``[run file, [key arrays], [block arrays]]`` per file, :meth:`_candidates`), each key
        answered by a native LookupStep in its candidate block: local files in one native call
        (:meth:`_native_run`), others in rounds whose reads go through the files' readers
        (:meth:`_native_rounds`). A hit records its value (``take_part``, ``take_row``,
        ``parts``), a miss moves the key on (``pos``)."""
        fds = [rf.fd for rf, _, _ in routed]
        local = all(fd is not None for fd in fds)
        step = _LookupStep(self.cache, self.open_bytes if local else max(1, self.open_bytes // 2),
                           LOCAL_COALESCE_GAP_BYTES if local else COALESCE_GAP_BYTES,
                           MAX_READ_BYTES)
        files = []
        for rf, idxs, blks in routed:
            step.add(rf.blocks, np.concatenate(idxs), np.concatenate(blks))
            files.append(rf)
        step.set_keys(keys)
        if local:
            self._native_run(step, files, fds, take_part, take_row, parts, pos)
        else:
            self._native_rounds(step, files, keys, take_part, take_row, parts, pos)

    def _native_run(self, step, files: list, fds: list, take_part: np.ndarray,
                    take_row: np.ndarray, parts: list, pos: np.ndarray) -> None:
        """A step over local files in one native call (:meth:`LookupStep.run`): its blocks in
        chunks of at most ``open_bytes / (threads + 1)`` decoded bytes, each chunk probed in
        the cache, its missing blocks read (coalesced positional reads), opened (checks,
        decompression, cache insert) and its keys searched by one of the native fetch threads
        or by this thread, with no barrier between chunks (so at most ``open_bytes`` open at
        once, or ``threads + 1`` blocks when one is larger than a chunk); then every key
        decided at once. CheckpointIOError when a read fails, CorruptCheckpointError when a
        file ends inside a read or for a bad block (not cached), naming the file, state and
        key group (and block)."""
        failed = step.run(self._native_pool, fds, self._threads)
        counts = step.counts()
        self.stats["blocks_read"] += counts["blocks_read"]
        self.stats["bytes_read"] += counts["bytes_read"]
        self.stats["peak_open_bytes"] = max(self.stats["peak_open_bytes"],
                                            counts["peak_open_bytes"])
        if failed is not None:
            (f, offset, length, first), what, why = failed
            rf = files[f]
            if what == "read":
                raise CheckpointIOError(
                    f"checkpoint data file {rf.data.name}: cannot read {rf.block_what(first)} "
                    f"({length} bytes at {offset}): {why}")
            if what == "short":
                raise CorruptCheckpointError(
                    f"checkpoint data file {rf.data.name}: {rf.block_what(first)}: {length} "
                    f"bytes at {offset} run past the file's end ({why})")
            raise CorruptCheckpointError(
                f"checkpoint data file {rf.data.name}: {rf.block_what(what)} block {what}: "
                f"{why}")
        idx, rows, vals = step.results()
        self._decide(idx, rows, vals, True, take_part, take_row, parts, pos)

    def _native_rounds(self, step, files: list, keys: pa.BinaryArray, take_part: np.ndarray,
                       take_row: np.ndarray, parts: list, pos: np.ndarray) -> None:
        """A step over files read through their readers (remote stores): the LookupStep takes
        the blocks in rounds of at most half of ``open_bytes`` decoded bytes, probes the cache
        and plans each round's missing blocks as coalesced reads; per read one ranged read and
        one native open (checks, decompression, cache insert, and the search of each opened
        block's keys while the block is in that core's cache) on the fetch threads; then one
        native search of the cached blocks' keys and the gathering of the round's values on
        this thread, while the fetch threads read and open the next round (two round slots, so
        at most ``open_bytes`` open at once, or two blocks when one is larger than half of
        it)."""
        slot = 0
        if not step.next_round(slot):
            return
        # Nothing to overlap the first round's reads with: a lone read runs on this thread.
        pending = self._start_reads(step, slot, files, inline=True)
        try:
            while pending is not None:
                self._finish_reads(pending)
                pending = None
                ahead = 1 - slot
                if step.next_round(ahead):
                    pending = self._start_reads(step, ahead, files)
                    self.stats["peak_open_bytes"] = max(
                        self.stats["peak_open_bytes"],
                        step.round_bytes(slot) + step.round_bytes(ahead))
                else:
                    self.stats["peak_open_bytes"] = max(self.stats["peak_open_bytes"],
                                                        step.round_bytes(slot))
                idx, rows, vals = step.search(keys, slot)
                self._decide(idx, rows, vals, True, take_part, take_row, parts, pos)
                slot = ahead
        finally:
            if pending is not None:  # an error left a round's reads in flight: let them end
                wait(pending)

    def _start_reads(self, step, slot: int, files: list, inline: bool = False) -> list:
        """Submit the reads of round ``slot`` of a LookupStep, one task per read on the fetch
        threads (:meth:`_read_range`); with ``inline`` a round of one read is read on this
        thread instead (a hand-off to a thread costs more than it saves when nothing overlaps
        it). The futures, for :meth:`_finish_reads`."""
        reads = step.ranges(slot)
        if inline and len(reads) == 1:
            done: Future = Future()
            try:
                done.set_result(self._read_range(step, 0, files, reads[0], slot))
            except Exception as exc:  # raised by _finish_reads, as a thread's would be
                done.set_exception(exc)
            return [done]
        return [self._pool.submit(self._read_range, step, r, files, read, slot)
                for r, read in enumerate(reads)]

    def _finish_reads(self, futures: list) -> None:
        """Wait for the reads :meth:`_start_reads` submitted (every one, before an error
        leaves) and count them; raise what a read met (:meth:`_read_range`)."""
        wait(futures)
        for nblocks, nbytes in [f.result() for f in futures]:
            self.stats["blocks_read"] += nblocks
            self.stats["bytes_read"] += nbytes

    def _decide(self, idx: np.ndarray, rows: np.ndarray, vals: pa.Array, filtered: bool,
                take_part: np.ndarray, take_row: np.ndarray, parts: list,
                pos: np.ndarray) -> None:
        """Decide the keys ``idx`` searched in a round: those found (``rows`` >= 0) take their
        value from ``vals`` (``take_part``, ``take_row``, ``parts``), the others move on to
        their next run (``pos``), counted as the filter's false positives when ``filtered``
        (format 6: the filter sent them to this run)."""
        hit = rows >= 0
        if bool(np.any(hit)):
            take_part[idx[hit]] = len(parts)
            take_row[idx[hit]] = np.nonzero(hit)[0]
            parts.append(vals)
        miss = idx[~hit]
        if len(miss):
            if filtered:
                self.stats["filter_false_positives"] += len(miss)
            pos[miss] += 1

    @staticmethod
    def _read_range(step, r: int, files: list, read: tuple, slot: int = 0) -> tuple[int, int]:
        """Fetch thread: read ``r`` of a LookupStep's round in ``slot`` (``read``: ``(file,
        offset, length, first block, blocks)``) with one positional read, its blocks opened
        into the cache natively; ``(blocks, bytes read)``. CorruptCheckpointError naming the
        file, state, key group and block of a bad block (not cached); CheckpointIOError when
        the read fails."""
        f, offset, length, first, count = read
        rf = files[f]
        raw = rf.data.read_range(offset, length, rf.block_what(first))
        bad, why = step.open_range(r, raw, slot)
        if bad is not None:
            raise CorruptCheckpointError(
                f"checkpoint data file {rf.data.name}: {rf.block_what(bad)} block {bad}: {why}")
        return count, length

    def _key_group_of(self, key: bytes) -> int:
        """:meth:`_key_groups` of one encoded key (bytes), with its errors."""
        if len(key) < self.prefix:
            raise InvalidInputError(
                f"an encoded key is shorter than its {self.prefix}-byte key-group prefix")
        kg = key[0] if self.prefix == 1 else (key[0] << 8) | key[1]
        if kg < self.start or kg > self.end:
            raise InvalidInputError(
                f"encoded key 0 has key group {kg}, outside the lookup's key groups "
                f"[{self.start}, {self.end}]")
        return kg

    def lookup_one(self, state_name: str, encoded_key: bytes) -> bytes | None:
        """:meth:`lookup_batch` of the one encoded key ``encoded_key`` (bytes), for per-record
        reads: its stored value (bytes), or None where the version holds none. The same runs,
        filters, block cache and statistics, on the calling thread -- no thread pool, no
        batch arrays: the key's Bloom filter probed first in each run, its block found by a
        binary search over the footer's block keys, taken from the cache or read and opened,
        and searched in place. Same errors as :meth:`lookup_batch` (InvalidInputError also
        for a key that is not bytes)."""
        if state_name not in self._metas:
            raise InvalidInputError(
                f"checkpoint version {self.reader.version} has no state {state_name!r}")
        if not isinstance(encoded_key, (bytes, bytearray, memoryview)):
            raise InvalidInputError(f"an encoded key must be bytes, got {type(encoded_key)!r}")
        key = bytes(encoded_key)
        kg = self._key_group_of(key)
        self.stats["lookups"] += 1
        chain = self._native_chain(state_name, kg)
        if chain is not None:
            return self._native_chain_one(chain, key, kg)
        needle = hashes = None
        for run in self._runs_of(state_name, kg):
            rf = self._run_file(run, state_name)
            row = rf.rows.get(kg)
            if row is None:
                continue
            if rf.router is not None and rf.blocks is not None:
                found, value = self._native_one(rf, key, kg)
                if found:
                    return value
                continue
            if rf.tables is None:
                b = -1 - kg
            else:
                n = rf.ensure_filters((kg,))
                self.stats["filter_bytes"] += n
                self.stats["bytes_read"] += n
                if hashes is None:
                    hashes = np.array([xxh64(key)], np.uint64)
                filt, k = rf.filters[kg]
                if not bool(bloom_probe(filt, k, hashes)[0]):
                    self.stats["filter_negatives"] += 1
                    continue
                b = self._block_of(rf, row, key)
                if b < 0:
                    self.stats["range_negatives"] += 1
                    continue
            bid = (rf.data.name, state_name, b)
            got = self._cached(rf, bid, b)
            if got is None:
                got = self._fetch_one(bid, rf, b)
            if needle is None:
                needle = pa.array([key], pa.binary())
            which = np.zeros(1, np.int64)
            if got[1] is None:  # a payload opened natively (_read_group)
                rows, vals = _native_lookup_in_payloads(
                    [got[0]], rf.data.kind == KIND_INCREMENTAL, which, needle)
            else:
                rows, vals = _lookup_in_blocks([got], which, needle)
            if int(rows[0]) >= 0:
                return vals[0].as_py()  # None: a tombstone
            if rf.tables is not None:
                self.stats["filter_false_positives"] += 1
        return None

    def _native_chain(self, state: str, kg: int) -> tuple | None:
        """``(run files, (RunBlocks, RunRouter) pairs)`` of the runs of key group ``kg``'s chain
        for ``state`` that hold entries of it, newest first, their filters of ``kg`` read; None
        when one of them is not served natively (a file before format 6, no extension), and
        :meth:`lookup_one` goes run by run. Kept per (state, key group): the runs of a lookup
        do not change."""
        memo = (state, kg)
        if memo in self._one_chains:
            return self._one_chains[memo]
        rfs = []
        for run in self._runs_of(state, kg):
            rf = self._run_file(run, state)
            if kg not in rf.rows:
                continue
            if rf.router is None or rf.blocks is None or _lookup_chain_one is None:
                rfs = None
                break
            if kg not in rf.filters:
                n = rf.ensure_filters((kg,))
                self.stats["filter_bytes"] += n
                self.stats["bytes_read"] += n
            rfs.append(rf)
        chain = None if rfs is None else (rfs, [(rf.blocks, rf.router) for rf in rfs])
        self._one_chains[memo] = chain
        return chain

    def _native_chain_one(self, chain: tuple, key: bytes, kg: int) -> bytes | None:
        """:meth:`lookup_one` over a :meth:`_native_chain`: one native call walks the runs
        (:func:`statecore._native.lookup_chain_one`) until one holds the key or its block is
        not cached; that block is read and opened here and the walk goes on below it when the
        block does not hold the key."""
        rfs, pairs = chain
        st = self.stats
        i = 0
        while True:
            i, found, got, filtered, past, false_positives = _lookup_chain_one(
                pairs, self.cache, key, kg, i)
            st["filter_negatives"] += filtered
            st["range_negatives"] += past
            st["filter_false_positives"] += false_positives
            if i >= len(pairs):
                return None
            if found == _ONE_MISSING:
                found, got = self._open_search(rfs[i], got, key)
                if found == _ONE_NOT_FOUND:
                    st["filter_false_positives"] += 1
                    i += 1
                    continue
            return got  # a value, or None for a tombstone

    def _open_search(self, rf: _RunFile, b: int, key: bytes) -> tuple:
        """Read block ``b`` of ``rf`` (not cached), open it into the cache and search ``key``
        in it: ``RunBlocks.open_search_one``'s ``(outcome, value)``; CorruptCheckpointError for
        a bad block."""
        offset, length = rf.blocks.block_span(b, b)
        st = self.stats
        raw_length = int(rf.raw_lengths[b])
        if raw_length > st["peak_open_bytes"]:
            st["peak_open_bytes"] = raw_length
        raw = self._read_one(rf, b, offset, length)
        st["blocks_read"] += 1
        st["bytes_read"] += length
        found, got = rf.blocks.open_search_one(self.cache, raw, offset, b, key)
        if found < 0:
            raise CorruptCheckpointError(
                f"checkpoint data file {rf.data.name}: {rf.block_what(b)} block {b}: {got}")
        return found, got

    def _native_one(self, rf: _RunFile, key: bytes, kg: int) -> tuple[bool, bytes | None]:
        """:meth:`lookup_one` in one format-6 run with the extension: routed, probed in the
        cache and searched in one native call; a block not cached read with one positional
        read and opened natively. ``(decided, value)``: decided when the run holds the key
        (its value, or None for a tombstone)."""
        if kg not in rf.filters:
            n = rf.ensure_filters((kg,))
            self.stats["filter_bytes"] += n
            self.stats["bytes_read"] += n
        found, got = rf.blocks.lookup_one(rf.router, self.cache, key, kg)
        if found == _ONE_MISSING:
            found, got = self._open_search(rf, got, key)
        if found == _ONE_VALUE or found == _ONE_TOMBSTONE:
            return True, got
        if found == _ONE_FILTERED:
            self.stats["filter_negatives"] += 1
        elif found == _ONE_PAST:
            self.stats["range_negatives"] += 1
        elif found == _ONE_NOT_FOUND:
            self.stats["filter_false_positives"] += 1
        return False, None

    @staticmethod
    def _read_one(rf: _RunFile, b: int, offset: int, length: int):
        """The ``length`` file bytes of block ``b`` at ``offset``: one ``os.pread`` of a local
        file's descriptor, else the data file reader's positional read. CheckpointIOError when
        the read fails, CorruptCheckpointError when the file ends inside it, naming the file,
        state and key group."""
        if rf.fd is None:
            return rf.data.read_range(offset, length, rf.block_what(b))
        try:
            raw = os.pread(rf.fd, length, offset)
        except OSError as exc:
            raise CheckpointIOError(
                f"checkpoint data file {rf.data.name}: cannot read {rf.block_what(b)} "
                f"({length} bytes at {offset}): {exc}") from exc
        if len(raw) != length:
            raise CorruptCheckpointError(
                f"checkpoint data file {rf.data.name}: {rf.block_what(b)}: {length} bytes at "
                f"{offset} run past the file's end (got {len(raw)})")
        return raw

    def _runs_of(self, state: str, kg: int) -> list[dict]:
        """The runs of key group ``kg``'s chain for ``state`` (:meth:`_chains`), newest
        first; the chains kept per state (the manifest does not change)."""
        got = self._chain_memo.get(state)
        if got is None:
            chains = self._chains(state)
            got = self._chain_memo[state] = ([a for a, _, _ in chains], chains)
        starts, chains = got
        return chains[bisect_left(starts, kg + 1) - 1][2]

    @staticmethod
    def _block_of(rf: _RunFile, row, key: bytes) -> int:
        """The block of ``rf``'s (state, key group) ``row`` whose key range can hold ``key``
        (the first whose footer last key is >= it), or -1 past the last one."""
        _, koff, kdata = rf.tables
        first, count = int(row["first_block"]), int(row["block_count"])
        lo, hi = first, first + count
        while lo < hi:
            mid = (lo + hi) // 2
            if bytes(kdata[int(koff[mid]):int(koff[mid + 1])]) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < first + count else -1

    def _fetch_one(self, bid, rf: _RunFile, b: int) -> tuple:
        """Read, check and open one block on the calling thread (:meth:`_read_group`), count
        it and offer it to the cache; its ``(keys, values)``."""
        self.stats["peak_open_bytes"] = max(self.stats["peak_open_bytes"],
                                            int(self._decoded_sizes(rf, np.array([b]))[0]))
        (_, keys, values, nread, size), = self._read_group([(bid, rf, b)])
        self.stats["blocks_read"] += 1
        self.stats["bytes_read"] += nread
        if rf.blocks is None:  # the native open cached it
            self._unit_cache().put(bid, keys, values, size)
        return keys, values

    def _open_rounds(self, routed: dict):
        """The candidate blocks of one step of a batch (``routed``: :meth:`_candidates`) in
        rounds of at most ``open_bytes`` decoded bytes (a block larger than that alone), so
        that a batch never holds more blocks open than that beyond the cache: yields per round
        ``[(run file, blocks (ascending), key indices, which, decoded bytes)]``, key
        ``idx[i]`` to be searched in ``blocks[which[i]]``. Blocks of one file stay adjacent,
        in block order, so that :meth:`_coalesce` still merges their reads."""
        chunk: list = []
        held = 0
        for rf, idxs, blks in routed.values():
            idx, blk = np.concatenate(idxs), np.concatenate(blks)
            order = np.argsort(blk, kind="stable")
            idx, blk = idx[order], blk[order]
            ub, which = np.unique(blk, return_inverse=True)
            which = which.astype(np.int64).reshape(-1)
            sizes = self._decoded_sizes(rf, ub)
            a = 0
            while a < len(ub):
                fit = np.cumsum(sizes[a:])
                e = a + int(np.searchsorted(fit, self.open_bytes - held, side="right"))
                if e == a:
                    if chunk:  # the next block does not fit: this round is full
                        yield chunk
                        chunk, held = [], 0
                        continue
                    e = a + 1
                s, t = (int(x) for x in np.searchsorted(which, [a, e]))
                size = int(sizes[a:e].sum())
                chunk.append((rf, ub[a:e], idx[s:t], which[s:t] - a, size))
                held += size
                a = e
        if chunk:
            yield chunk

    @staticmethod
    def _decoded_sizes(rf: _RunFile, ub: np.ndarray) -> np.ndarray:
        """Decoded bytes (int64) of the blocks ``ub`` (ascending, of one file) per the block
        table's raw lengths; a whole (state, key group) ``-1 - kg`` of a file of format 1 to 5
        the sum of its blocks'."""
        if len(ub) and int(ub[0]) >= 0:
            first = int(ub[0])
            rows = rf.data.block_rows(first, int(ub[-1]) - first + 1)
            return rows["raw_length"][ub - first].astype(np.int64)
        out = np.zeros(len(ub), np.int64)
        for j, b in enumerate(ub.tolist()):
            row = rf.rows[-1 - b]
            out[j] = int(rf.data.block_rows(int(row["first_block"]),
                                            int(row["block_count"]))["raw_length"].sum())
        return out

    def _cached(self, rf: _RunFile, bid, b: int) -> tuple | None:
        """Block ``b`` of ``rf`` (block id ``bid``) from its cache (:meth:`_unit_cache`, or
        with the extension the native cache of format-6 blocks: ``(payload, None)``), or
        None."""
        if rf.blocks is None:
            return self._unit_cache().get(bid)
        payload = self.cache.get(rf.blocks.file_id, b)
        return None if payload is None else (payload, None)

    def _round_blocks(self, chunk: list) -> dict:
        """``{(file name, state, block): opened block}`` of every block of one round
        (:meth:`_open_rounds`): from the cache, the others fetched together (:meth:`_fetch`);
        the round's decoded bytes counted into ``peak_open_bytes``."""
        blocks, missing = {}, []
        for rf, ub, _, _, _ in chunk:
            for b in ub.tolist():
                bid = (rf.data.name, rf.state, b)
                got = self._cached(rf, bid, b)
                if got is None:
                    missing.append((bid, rf, b))
                else:
                    blocks[bid] = got
        blocks.update(self._fetch(missing))
        self.stats["peak_open_bytes"] = max(self.stats["peak_open_bytes"],
                                            sum(c[4] for c in chunk))
        return blocks

    def _search_round(self, chunk: list, keys: pa.BinaryArray, take_part: np.ndarray,
                      take_row: np.ndarray, parts: list, pos: np.ndarray) -> None:
        """Open the blocks of one round (:meth:`_open_rounds`, files without the native
        step: no extension, or format 1 to 5; from the cache or fetched) and search its keys:
        a hit records its value (``take_part``, ``take_row``, ``parts``), a miss moves the key
        on to its next run (``pos``). The blocks the cache does not keep are released on
        return."""
        blocks = self._round_blocks(chunk)
        for rf, ub, idx, which, _ in chunk:
            got = [blocks[(rf.data.name, rf.state, b)] for b in ub.tolist()]
            needles = keys.take(pa.array(idx))
            rows, vals = _lookup_in_blocks(got, which, needles)
            self._decide(idx, rows, vals, rf.tables is not None, take_part, take_row, parts,
                         pos)

    def prefix_entries(self, state_name: str, prefixes) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """``(keys, values)`` (``pa.binary()``, sorted by key, no NULL): every entry the version
        holds under each encoded-key prefix of ``prefixes`` (bytes, each ``key-group prefix |
        key | namespace``: a list's chunks or a map's user keys, docs/formats.md "List state",
        "Map state"), newest-wins over the runs of the prefix's chain as
        :meth:`lookup_batch` (a tombstone hides the older runs' entry of its key). The Bloom
        filters hash whole keys and cannot rule a prefix out, so each run's candidate blocks
        come from the footer's block keys: the first block whose last key is >= the prefix,
        and each next one while the previous block's last key still starts with it (a file of
        format 1 to 5: the whole (state, key group)). The candidate blocks of all prefixes and
        runs are fetched as :meth:`lookup_batch` fetches its blocks: in rounds of at most
        ``open_bytes`` decoded bytes, those not in the block cache read together on the fetch
        threads (adjacent blocks of a file in one read) and checked and opened natively with
        the GIL released; each round's entries under the prefixes are selected with Arrow
        kernels over the opened blocks in place, and the runs' selections merged newest-wins
        (``merge_newest_wins``). Blocks are cached as the point lookups cache them, so either
        reuses the other's. Errors as :meth:`lookup_batch`."""
        if state_name not in self._metas:
            raise InvalidInputError(
                f"checkpoint version {self.reader.version} has no state {state_name!r}")
        pre = list(dict.fromkeys(bytes(p) for p in prefixes))
        if not pre:
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        if len(pre) == 1:  # a per-record load: no batch arrays, no thread
            return self._prefix_entries_one(state_name, pre[0], self._key_group_of(pre[0]))
        kgs = self._key_groups(pa.array(pre, pa.binary()))
        routed = self._prefix_candidates(state_name, pre, kgs)
        wanted = prefixes_by_length(pre)
        parts: list[tuple[int, pa.Array, pa.Array]] = []  # (depth, keys, values)
        for chunk in self._open_rounds(routed):
            parts += self._select_round(chunk, wanted)
        parts.sort(key=lambda t: t[0])  # newest run first; a sort by depth alone is stable
        return _merge_newest(parts)

    def _prefix_entries_one(self, state_name: str, prefix: bytes, kg: int
                            ) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """:meth:`prefix_entries` of one prefix (of key group ``kg``) on the calling thread,
        as :meth:`lookup_one` serves one key: per run its candidate blocks found by binary
        searches over the footer's block keys, each from the cache or read and opened
        (:meth:`_fetch_one`), the prefix's range of its keys found by binary search."""
        succ = _successor(prefix)
        parts = []
        for depth, run in enumerate(self._runs_of(state_name, kg)):
            rf = self._run_file(run, state_name)
            row = rf.rows.get(kg)
            if row is None:
                continue
            if rf.tables is None:
                blocks = [-1 - kg]
            else:
                last = rf.last_keys(kg)
                lo = bisect_left(last, prefix)
                hi = len(last) - 1 if succ is None else min(bisect_left(last, succ, lo=lo),
                                                            len(last) - 1)
                first = int(row["first_block"])
                blocks = range(first + lo, first + hi + 1)
            incremental = rf.data.kind == KIND_INCREMENTAL
            for b in blocks:
                bid = (rf.data.name, state_name, b)
                got = self._cached(rf, bid, b)
                if got is None:
                    got = self._fetch_one(bid, rf, b)
                keys, values = _payload_entries(got[0], incremental) if got[1] is None else got
                a, e = prefix_range(keys, prefix)
                if e > a:
                    parts.append((depth, keys.slice(a, e - a), values.slice(a, e - a)))
        return _merge_newest(parts)

    def _prefix_candidates(self, state_name: str, pre: list, kgs: np.ndarray) -> dict:
        """The candidate blocks of the prefixes ``pre`` (key groups ``kgs``) in every run of
        their chains (:meth:`prefix_entries`), in the form :meth:`_open_rounds` takes:
        ``{(depth, path): [run file, [depth per block], [blocks]]}`` (``depth``: the run's
        place in its chain, 0 the newest)."""
        chains = self._chains(state_name)
        seg_starts = np.array([a for a, _, _ in chains], dtype=np.int64)
        seg_of = np.searchsorted(seg_starts, kgs, side="right") - 1
        objpre = np.empty(len(pre), dtype=object)
        objpre[:] = pre
        succ = np.empty(len(pre), dtype=object)
        succ[:] = [_successor(p) for p in pre]
        order = np.lexsort((kgs, seg_of))
        routed: dict = {}
        segs, starts = np.unique(seg_of[order], return_index=True)
        for s, mine in zip(segs.tolist(), np.split(order, starts[1:])):
            for depth, run in enumerate(chains[s][2]):
                rf = self._run_file(run, state_name)
                if rf.tables is None:  # format 1-5: the whole (state, key group) is the unit
                    blocks = np.array([-1 - kg for kg in np.unique(kgs[mine]).tolist()
                                       if kg in rf.rows], np.int64)
                else:
                    blocks = rf.prefix_blocks(objpre[mine], succ[mine], kgs[mine])
                if len(blocks):
                    ub = np.unique(blocks)
                    routed[(depth, rf.data.name)] = [rf, [np.full(len(ub), depth, np.int64)],
                                                     [ub]]
        return routed

    def _select_round(self, chunk: list, wanted: list) -> list:
        """Open the blocks of one round (:meth:`_open_rounds` over
        :meth:`_prefix_candidates`: from the cache or fetched) and select their entries under
        the prefixes ``wanted`` (``[(length, pa.binary() prefixes of that length)]``):
        ``[(depth, keys, values)]``, one part per run file (keys ascending; NULL values are
        tombstones), copies: the blocks the cache does not keep are released on return."""
        blocks = self._round_blocks(chunk)
        ks, vs, bounds = [], [], []  # bounds: (depth, first row, end row) per run file
        rows = 0
        for rf, ub, idx, _, _ in chunk:
            incremental = rf.data.kind == KIND_INCREMENTAL
            first = rows
            # Key order: ascending blocks; whole key groups -1 - kg of an old file descending.
            for b in (ub.tolist() if ub[0] >= 0 else ub[::-1].tolist()):
                got = blocks[(rf.data.name, rf.state, b)]
                k, v = _payload_entries(got[0], incremental) if got[1] is None else got
                ks.append(k)
                vs.append(v)
                rows += len(k)
            bounds.append((int(idx[0]), first, rows))
        keys = pa.concat_arrays(ks) if len(ks) > 1 else ks[0]
        values = pa.concat_arrays(vs) if len(vs) > 1 else vs[0]
        mask = prefix_mask(keys, wanted).to_numpy(zero_copy_only=False)
        out = []
        for depth, a, e in bounds:
            sel = np.flatnonzero(mask[a:e])
            if len(sel):
                take = pa.array(sel + a)
                out.append((depth, keys.take(take), values.take(take)))
        return out

    def _candidates(self, rf: _RunFile, mine: np.ndarray, keys, kgs, hashes, objkeys, pos,
                    routed: dict) -> None:
        """Route the keys ``mine`` (all in one run ``rf``, one segment) to their candidate
        block (``routed[path]``: key indices and block numbers, ``-1 - kg`` for the whole
        (state, key group) of a file without block keys), or past the run (``pos`` + 1) when
        the run cannot hold them. With the extension a run of format 6 routes them in one
        native call (:class:`_RunFile` ``router``); else, and for older files, per key group:
        its filter probed, its block keys searched (``objkeys``, the keys as bytes)."""
        entry = routed.get(rf.data.name)
        if entry is None:
            entry = routed[rf.data.name] = [rf, [], []]
        if rf.router is not None:  # format 6 with the extension: one native call
            n = rf.ensure_filters(kgs[mine])
            self.stats["filter_bytes"] += n
            self.stats["bytes_read"] += n
            blocks, negatives, past = rf.router.route(keys, mine, kgs, hashes)
            self.stats["filter_negatives"] += negatives
            self.stats["range_negatives"] += past
            out = blocks < 0
            pos[mine[out]] += 1
            entry[1].append(mine[~out])
            entry[2].append(blocks[~out])
            return
        order = np.argsort(kgs[mine], kind="stable")
        mine = mine[order]
        gk = kgs[mine]
        cuts = np.flatnonzero(np.diff(gk)) + 1
        if rf.tables is not None:
            n = rf.ensure_filters(int(kg) for kg in np.unique(gk))
            self.stats["filter_bytes"] += n
            self.stats["bytes_read"] += n
        for grp in np.split(mine, cuts):
            kg = int(kgs[grp[0]])
            row = rf.rows.get(kg)
            if row is None:  # the run holds no entry of this (state, key group)
                pos[grp] += 1
                continue
            if rf.tables is None:  # format 1-5: the whole (state, key group) is the unit
                entry[1].append(grp)
                entry[2].append(np.full(len(grp), -1 - kg, dtype=np.int64))
                continue
            filt, k = rf.filters[kg]
            maybe = bloom_probe(filt, k, hashes[grp])
            neg = grp[~maybe]
            if len(neg):
                self.stats["filter_negatives"] += len(neg)
                pos[neg] += 1
            grp = grp[maybe]
            count = int(row["block_count"])
            b = np.searchsorted(rf.block_keys[kg], objkeys[grp], side="left")
            past = b == count  # after the last key of the group
            if bool(np.any(past)):
                self.stats["range_negatives"] += int(past.sum())
                pos[grp[past]] += 1
            entry[1].append(grp[~past])
            entry[2].append(b[~past] + int(row["first_block"]))

    def _fetch(self, missing: list) -> dict:
        """Read, check and decode the blocks ``missing`` (``(block id, run file, block)``;
        block ``-1 - kg``: the whole (state, key group) of a file without block keys), adjacent
        blocks of a file in one read, on the fetch threads; each goes into the cache. Returns
        ``{block id: (keys, values)}``."""
        out: dict = {}
        if not missing:
            return out
        groups: list[list] = []
        for item in sorted(missing, key=lambda m: (m[0][0], m[2])):
            _, rf, b = item
            last = groups[-1][-1] if groups else None
            if (last is not None and b >= 0 and last[1] is rf and last[2] + 1 == b
                    and rf.blocks is None):
                groups[-1].append(item)
            else:
                groups.append([item])
        groups = self._coalesce(groups)
        # A whole (state, key group) of an old file is read through the file's position
        # (DataFileReader.entries), which one thread at a time may move: those on this thread;
        # so is a lone group (a per-record load), which a thread would only hand back.
        alone = len(groups) == 1
        futures = [self._pool.submit(self._read_group, g) for g in groups
                   if g[0][2] >= 0 and not alone]
        done = [self._read_group(g) for g in groups if g[0][2] < 0 or alone]
        wait(futures)  # every read finished before one error leaves the fetch
        for got in done + [f.result() for f in futures]:
            for bid, keys, values, nread, size in got:
                self.stats["blocks_read"] += 1
                self.stats["bytes_read"] += nread
                out[bid] = (keys, values)
                if values is not None:  # a payload (values None) the native open cached
                    self._unit_cache().put(bid, keys, values, size)
        return out

    @staticmethod
    def _coalesce(singles: list) -> list:
        """The groups ``singles`` (sorted by file and block) with the one-block groups of
        format-6 files opened natively merged into groups of blocks of one file that one ranged
        read fetches: each block within COALESCE_GAP_BYTES of the previous one, a group's
        bytes within MAX_READ_BYTES (or one block). Other groups come back as they are."""
        out: list[list] = []
        i = 0
        while i < len(singles):
            _, rf, b = singles[i][0]
            j = i
            while (j < len(singles) and singles[j][0][1] is rf and singles[j][0][2] >= 0
                   and rf.blocks is not None and len(singles[j]) == 1):
                j += 1
            if j == i:  # a whole (state, key group) of an old file, or blocks read together
                out.append(singles[i])
                i += 1
                continue
            bs = np.array([g[0][2] for g in singles[i:j]], np.int64)
            rows = rf.data.block_rows(int(bs[0]), int(bs[-1] - bs[0]) + 1)[bs - bs[0]]
            starts = rows["offset"].astype(np.int64).tolist()
            ends = (rows["offset"].astype(np.int64) + rows["stored_length"]).tolist()
            first = 0
            for k in range(1, j - i + 1):
                if (k == j - i or starts[k] - ends[k - 1] > COALESCE_GAP_BYTES
                        or ends[k] - starts[first] > MAX_READ_BYTES):
                    out.append([g[0] for g in singles[i + first:i + k]])
                    first = k
            i = j
        return out

    def _read_group(self, group: list) -> list:
        """Fetch thread: the blocks of ``group`` (consecutive blocks of one file, or one old
        file's (state, key group)) checked and decoded: ``[(block id, keys, values, stored
        bytes read, bytes the decoded block holds)]`` -- natively (format 6) ``keys`` the
        block's payload and ``values`` None, already in the native cache."""
        bid, rf, b = group[0]
        data = rf.data
        incremental = data.kind == KIND_INCREMENTAL
        if b < 0:
            before = data.bytes_read
            keys, values = data.entries(rf.state, -1 - b)
            return [(bid, keys, values, data.bytes_read - before, None)]
        if rf.blocks is not None:
            # One read and one native call for the group (blocks of one file, not necessarily
            # adjacent: _coalesce): each block checked and decompressed into a payload of its
            # own, kept in the native cache and searched in place (no per-entry decode).
            bs = np.array([g[2] for g in group], np.int64)
            lo, length = rf.blocks.block_span(b, int(bs[-1]))
            hi = lo + length
            raw = data.read_range(lo, length, rf.block_what(b))
            payloads, bad, why = rf.blocks.open_into(self.cache, raw, lo, bs)
            if bad is not None:
                gb = group[bad][2]
                raise CorruptCheckpointError(
                    f"checkpoint data file {data.name}: {rf.block_what(gb)} block {gb}: {why}")
            # The read's bytes (gaps between the blocks included) count with the first block.
            return [(gbid, payload, None, hi - lo if j == 0 else 0, len(payload))
                    for j, ((gbid, _, _), payload) in enumerate(zip(group, payloads))]
        blocks = data.block_rows(b, len(group))
        lo = int(blocks["offset"][0])
        hi = int(blocks["offset"][-1]) + int(blocks["stored_length"][-1])
        raw = data.read_range(lo, hi - lo, rf.block_what(b))
        out = []
        for j, (gbid, _, gb) in enumerate(group):
            blk = blocks[j:j + 1]
            kg, nth = rf.key_group_of_block(gb)
            what = (f"checkpoint data file {data.name}: state {rf.state!r} key group {kg} "
                    f"block {gb}")
            n, raw_length = int(blk["entries"][0]), int(blk["raw_length"][0])
            if native_decode_blocks is not None:
                keys, values, bad, why = native_decode_blocks(raw, blk, lo, incremental)
                if bad is not None:
                    raise CorruptCheckpointError(f"{what}: {why}")
                # Its allocations: offsets, key and value data of raw_length each, validity.
                size = 8 * (n + 1) + 2 * max(raw_length, 1) + max((n + 7) // 8, 1)
            else:
                size = raw_length  # arrays over the decompressed payload
                stored = raw.slice(int(blk["offset"][0]) - lo, int(blk["stored_length"][0]))
                keys, values = decode_stored_block(
                    stored, int(blk["raw_length"][0]), int(blk["entries"][0]),
                    int(blk["xxh64"][0]), what, has_validity=incremental)
            if len(keys) == 0 or keys[len(keys) - 1].as_py() != rf.last_keys(kg)[nth]:
                raise CorruptCheckpointError(f"{what}: last key differs from the footer's")
            out.append((gbid, keys, values, int(blk["stored_length"][0]), size))
        return out

    @staticmethod
    def _assemble(n: int, take_part: np.ndarray, take_row: np.ndarray, parts: list) -> pa.Array:
        """The batch's result: key ``i``'s value is row ``take_row[i]`` of
        ``parts[take_part[i]]`` (NULL for a tombstone), NULL where ``take_part[i] < 0``."""
        if not parts:
            return pa.nulls(n, pa.binary())
        values = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        starts = np.concatenate(([0], np.cumsum([len(p) for p in parts])[:-1])).astype(np.int64)
        found = take_part >= 0
        take = np.where(found, starts[np.maximum(take_part, 0)] + take_row, 0)
        return values.take(pa.array(take, mask=~found))
