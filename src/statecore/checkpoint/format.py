"""statecore checkpoint data files (``.sckp``, format version 6; version 1 to 5 files are
still read, their map states (format 1, 2) converted to the per-entry layout and their list
states (1 to 4) to the chunked layout: :class:`DataFileReader`): the
writers (:func:`write_data_file`, :func:`write_data_file_from_blocks`) and the
random-access reader (:class:`DataFileReader`).

One data file holds one *run*: the snapshot of one writer (one Spark task / one backend) for one
checkpoint version, either *full* or *incremental* (removals as tombstones). It is written
sequentially (so it can be streamed to an object store) and read with ranged reads (so a restore
fetches only the byte ranges of the key groups it owns), after Flink's key-group-partitioned heap
snapshots (``KeyGroupRangeOffsets``) and Parquet's footer + trailer. The block codec is
:mod:`statecore.checkpoint.blocks`.

Byte layout (header, blocks, Bloom filters, footer with the block table, key-group index, filter
table and block keys, trailer)
and what readers check: docs/formats.md "Data file". Readers raise
:class:`statecore.errors.CorruptCheckpointError` naming the file (and the state, key group and
block where it applies) on any violation.
"""

from __future__ import annotations

import json
import struct
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statecore import buffer_pool
from statecore import serializers as S
from statecore.checkpoint.blocks import (  # the block codec, re-exported (__all__)
    CODEC_LZ4,
    CODEC_NONE,
    CODECS,
    DEFAULT_BLOOM_BITS_PER_KEY,
    LZ4_ACCELERATION,
    MAX_BLOOM_BITS_PER_KEY,
    bloom_filter_of_keys,
    bloom_hashes,
    compress_block,
    cut_points,
    decode_block,
    decode_stored_block,
    encode_block,
    encode_stored,
    inflate_stored,
    native_decode_blocks,
    native_verify_blocks,
    xxh64,
)
from statecore.errors import (
    CheckpointIOError,
    CorruptCheckpointError,
    InvalidInputError,
    StateMigrationError,
)
from statecore.key_groups import KeyGroupRange

__all__ = [
    "MAGIC", "FORMAT_VERSION", "READABLE_FORMAT_VERSIONS", "MAP_ENTRIES_FORMAT_VERSION",
    "LIST_ENTRIES_FORMAT_VERSION", "LIST_CHUNKS_FORMAT_VERSION", "LOOKUP_FORMAT_VERSION",
    "FILTER_DTYPE", "DEFAULT_BLOOM_BITS_PER_KEY",
    "KIND_FULL", "KIND_INCREMENTAL",
    "HEADER_SIZE", "TRAILER", "TRAILER_SIZE", "DEFAULT_BLOCK_TARGET_BYTES",
    "check_block_target_bytes", "COMPRESSION", "CODECS", "CODEC_LZ4",
    "CODEC_NONE", "check_compression", "encode_stored", "inflate_stored",
    "MAX_KEY_GROUPS", "BLOCK_DTYPE", "INDEX_DTYPE", "CHUNK_TARGET_BYTES", "LZ4_ACCELERATION",
    "compress_block", "native_decode_blocks", "xxh64", "encode_block", "decode_block",
    "decode_stored_block", "cut_points", "key_group_prefix_bytes", "make_key_group_range",
    "range_bounds", "check_state_meta", "WriteSummary", "FilePlan", "plan_file",
    "write_data_file", "write_data_file_from_blocks", "write_data_file_serialized",
    "SERIALIZE_WINDOW_BYTES", "DataFileReader", "StoredBlocks",
]

MAGIC = b"SCKGDAT1"
FORMAT_VERSION = 6
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4, 5, 6)
#: The first format version whose map states hold one entry per user key (docs/formats.md
#: "Map state"); older files hold one whole-map value per (key, namespace).
MAP_ENTRIES_FORMAT_VERSION = 3
#: The first format version whose list states' entry keys end in a sequence number
#: (docs/formats.md "List state"): one entry per element in format 4; older files hold one
#: whole-list value per (key, namespace).
LIST_ENTRIES_FORMAT_VERSION = 4
#: The first format version whose list states hold chunks of elements (docs/formats.md "List
#: state").
LIST_CHUNKS_FORMAT_VERSION = 5
#: The first format version with a Bloom filter per (state, key group) and the last key of every
#: block (docs/formats.md "Data file", "Filters and block keys"): point lookups read at most one
#: block per run; older files are read whole per (state, key group).
LOOKUP_FORMAT_VERSION = 6
KIND_FULL = "full"
KIND_INCREMENTAL = "incremental"
HEADER_SIZE = len(MAGIC)
TRAILER = struct.Struct("<QQQIIQ8s")
TRAILER_SIZE = TRAILER.size  # 48
DEFAULT_BLOCK_TARGET_BYTES = 64 * 1024
#: The default ``compression`` of data files (:data:`CODECS` lists every one).
COMPRESSION = "lz4.block"
MAX_KEY_GROUPS = 32768  # Flink's upper bound on max parallelism (KeyGroupRangeAssignment)

#: Records of the footer's block table (32 bytes) and key-group index (40 bytes), and the trailer
#: (48 bytes): docs/formats.md "Data file".
BLOCK_DTYPE = np.dtype(
    [("offset", "<u8"), ("stored_length", "<u4"), ("raw_length", "<u4"), ("entries", "<u4"),
     ("codec", "<u4"), ("xxh64", "<u8")]
)
INDEX_DTYPE = np.dtype(
    [("key_group", "<u4"), ("state", "<u4"), ("first_block", "<u4"), ("block_count", "<u4"),
     ("offset", "<u8"), ("length", "<u8"), ("entries", "<u8")]
)
#: Filter table records of format-6 footers (24 bytes), one per key-group index record.
FILTER_DTYPE = np.dtype(
    [("offset", "<u8"), ("length", "<u4"), ("hashes", "<u4"), ("xxh64", "<u8")]
)
assert BLOCK_DTYPE.itemsize == 32 and INDEX_DTYPE.itemsize == 40 and TRAILER_SIZE == 48
assert FILTER_DTYPE.itemsize == 24

_BAD_HEADER = "bad magic in header (not a statecore checkpoint data file)"
_U32 = struct.Struct("<I")
_U64x2 = struct.Struct("<QQ")
_INT32_MAX = 2**31 - 1

#: Stored bytes the asynchronous writer gathers per chunk (one write, one GIL round trip).
CHUNK_TARGET_BYTES = 1 << 20
#: Payload bytes a native serializer's queue holds at least (:func:`queue_payloads`).
QUEUE_BYTES = 256 << 10


def queue_payloads(block_target_bytes: int, at_least: int = 4) -> int:
    """The queue length (payloads, >= ``at_least``) of a native serializer cutting blocks of
    ``block_target_bytes``: at least :data:`QUEUE_BYTES` of them, so that its producer and
    consumer threads trade many small blocks per wake-up (snapshot_writer.h) rather than one
    or two."""
    return max(at_least, QUEUE_BYTES // max(1, block_target_bytes))


#: Key and value bytes :func:`write_data_file_serialized` hands to one native serializer at
#: once (a window of key groups): what it holds copied besides the snapshot's own arrays.
SERIALIZE_WINDOW_BYTES = 16 << 20


def key_group_prefix_bytes(max_parallelism: int) -> int:
    """Width in bytes (1 or 2) of the key-group prefix of encoded keys (docs/formats.md "Encoded
    key"; Flink ``CompositeKeySerializationUtils``)."""
    return 1 if max_parallelism <= 128 else 2


def make_key_group_range(start: int, end: int) -> KeyGroupRange:
    """The :class:`statecore.key_groups.KeyGroupRange` for inclusive ``[start, end]``
    (``end < start`` gives ``KeyGroupRange.EMPTY``)."""
    return KeyGroupRange(start, end) if end >= start else KeyGroupRange.EMPTY


def range_bounds(kg_range: Any) -> tuple[int, int]:
    """``(start, end)`` (inclusive) of a key-group range object with ``.start``/``.end``, or of a
    2-sequence. Raises InvalidInputError for anything else."""
    try:
        if hasattr(kg_range, "start") and hasattr(kg_range, "end"):
            start, end = int(kg_range.start), int(kg_range.end)
        else:
            start, end = (int(x) for x in kg_range)
    except Exception as exc:
        raise InvalidInputError(f"not a key-group range: {kg_range!r}") from exc
    return start, end


# ---------------------------------------------------------------------------------------------
# Writer


def _as_binary(arr: Any, what: str, allow_nulls: bool = False) -> pa.BinaryArray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not isinstance(arr, pa.Array):
        raise InvalidInputError(f"{what} must be a pyarrow binary array, got {type(arr).__name__}")
    if pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.binary())
    if not pa.types.is_binary(arr.type):
        raise InvalidInputError(f"{what} must be a pyarrow binary array, got type {arr.type}")
    if arr.null_count and not allow_nulls:
        raise InvalidInputError(f"{what} must not contain nulls")
    return arr


def _offsets_and_data(arr: pa.BinaryArray) -> tuple[np.ndarray, memoryview]:
    """Zero-based int32 offsets (n + 1) and the data bytes spanned by a binary array."""
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype="<i4", count=n + 1, offset=arr.offset * 4)
    start, stop = int(offsets[0]), int(offsets[-1])
    data = memoryview(bufs[2])[start:stop] if bufs[2] is not None else memoryview(b"")
    return offsets - offsets[0], data


@dataclass
class WriteSummary:
    """What :func:`write_data_file` wrote: sizes in bytes, counts, and the footer checksum."""

    size: int
    footer_xxh64: int
    blocks: int
    raw_bytes: int
    stored_bytes: int
    entries: dict[str, int]
    key_groups_nonempty: int
    meta: dict
    kind: str = KIND_FULL
    tombstones: dict[str, int] | None = None


def _check_sorted_and_prefixed(keys: pa.BinaryArray, koff: np.ndarray, kdata, kg: int,
                               prefix: int, state: str) -> None:
    n = len(keys)
    lengths = np.diff(koff)
    if bool(np.any(lengths < prefix)):
        raise InvalidInputError(
            f"state {state!r} key group {kg}: an encoded key is shorter than its {prefix}-byte "
            "key-group prefix")
    raw = np.frombuffer(kdata, dtype=np.uint8)
    starts = koff[:-1]
    got = raw[starts].astype(np.int64)
    if prefix == 2:
        got = (got << 8) | raw[starts + 1]
    if bool(np.any(got != kg)):
        bad = int(got[np.nonzero(got != kg)[0][0]])
        raise InvalidInputError(
            f"state {state!r}: entries(…, {kg}) returned a key with key-group prefix {bad}")
    if n > 1:
        import pyarrow.compute as pc

        ordered = pc.all(pc.less(keys.slice(0, n - 1), keys.slice(1))).as_py()
        if not ordered:
            raise InvalidInputError(
                f"state {state!r} key group {kg}: keys are not strictly ascending by bytes")


def write_data_file(
    out,
    snap: Any,
    *,
    version: int,
    writer: str,
    block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
    incremental: bool | None = None,
    check_stop=None,
    bloom_bits_per_key: int = DEFAULT_BLOOM_BITS_PER_KEY,
    compression: str = COMPRESSION,
) -> WriteSummary:
    """Stream the snapshot ``snap`` (StateSnapshot read interface, docs/architecture.md) into the
    writable binary stream ``out`` (anything with ``write(bytes)``) as one data file
    (docs/formats.md "Data file").

    ``incremental``: write an incremental run (NULL values are tombstones); ``None`` takes
    ``getattr(snap, "incremental", False)``. Reads ``snap.entries(name, kg)`` once per state per
    key group of ``snap.key_group_range``, ascending. Raises InvalidInputError when the snapshot
    breaks its contract: metas not JSON-able or without a unique ``name``, arrays not binary /
    of different lengths / with null keys (or null values in a full snapshot), keys not strictly
    ascending, or a key whose key-group prefix is not ``kg``. Does not call ``snap.release()``.
    ``bloom_bits_per_key`` (1 to 64): the size of each (state, key group)'s Bloom filter.
    ``compression`` (:data:`CODECS`): how the blocks are stored, ``"lz4.block"`` or ``"none"``
    (larger files whose blocks a reader copies instead of decompressing).
    ``check_stop()`` (optional) is called before each (state, key group) and raises to abort
    (the asynchronous writer's cancellation).
    """
    plan = plan_file(snap, version, writer, block_target_bytes, incremental, bloom_bits_per_key,
                     compression)
    asm = _Assembler(out, plan)
    for kg in range(plan.start, plan.end + 1):
        for si, name in enumerate(plan.names):
            if check_stop is not None:
                check_stop()
            keys, values, koff, kdata, voff, vdata = _checked_entries(snap, plan, name, kg)
            if not len(keys):
                continue
            valid = None
            tomb = 0
            if plan.incremental:
                valid = values.is_valid().to_numpy(zero_copy_only=False)
                tomb = values.null_count
            cuts = cut_points(koff, voff, plan.block_target_bytes)
            for a, b in zip(cuts[:-1], cuts[1:]):
                ko, vo = koff[a:b + 1], voff[a:b + 1]
                payload = encode_block(ko - ko[0], kdata[int(ko[0]):int(ko[-1])],
                                       vo - vo[0], vdata[int(vo[0]):int(vo[-1])],
                                       None if valid is None else valid[a:b])
                asm.add_block(kg, si, payload, b - a,
                              bytes(kdata[int(koff[b - 1]):int(koff[b])]))
            asm.end_group(kg, si, tomb, bloom_filter_of_keys(keys, plan.bloom_bits_per_key))
    return asm.finish()


@dataclass
class FilePlan:
    """Header-level facts of one data file, shared by the synchronous and asynchronous writers:
    the footer ``meta`` (docs/formats.md "Data file"), the state ``names`` in file order, the
    inclusive key-group range ``start``..``end`` (``0, -1`` = empty), the key-group ``prefix``
    width in bytes, whether the run is ``incremental`` and its ``kind``, the uncompressed
    ``block_target_bytes``, the Bloom filters' ``bloom_bits_per_key`` and the blocks' ``codec``
    (:data:`CODECS`, from the meta's ``compression``)."""

    meta: dict
    names: list
    start: int
    end: int
    prefix: int
    incremental: bool
    kind: str
    block_target_bytes: int
    bloom_bits_per_key: int = DEFAULT_BLOOM_BITS_PER_KEY
    codec: int = CODECS[COMPRESSION]


def check_compression(compression) -> str:
    """``compression`` when it names a block codec of :data:`CODECS` (``"lz4.block"``,
    ``"none"``); InvalidInputError otherwise."""
    if not isinstance(compression, str) or compression not in CODECS:
        raise InvalidInputError(
            f"compression must be one of {sorted(CODECS)}, got {compression!r}")
    return compression


def check_block_target_bytes(block_target_bytes) -> int:
    """``block_target_bytes`` (the uncompressed size a data file's blocks are cut at, bytes)
    when it is an int >= 1; InvalidInputError otherwise."""
    if (isinstance(block_target_bytes, bool) or not isinstance(block_target_bytes, int)
            or block_target_bytes < 1):
        raise InvalidInputError(
            f"block_target_bytes must be a positive int, got {block_target_bytes!r}")
    return block_target_bytes


def plan_file(snap: Any, version: int, writer: str, block_target_bytes: int,
              incremental: bool | None,
              bloom_bits_per_key: int = DEFAULT_BLOOM_BITS_PER_KEY,
              compression: str = COMPRESSION) -> FilePlan:
    """Check the header facts of the snapshot ``snap`` (max parallelism, key-group range, state
    metas) and build the :class:`FilePlan` of its data file for ``version`` and ``writer``
    (``incremental=None``: ``getattr(snap, "incremental", False)``). Reads no entries.
    Raises InvalidInputError as documented in :func:`write_data_file`."""
    if incremental is None:
        incremental = bool(getattr(snap, "incremental", False))
    kind = KIND_INCREMENTAL if incremental else KIND_FULL
    check_block_target_bytes(block_target_bytes)
    check_compression(compression)
    if (isinstance(bloom_bits_per_key, bool) or not isinstance(bloom_bits_per_key, int)
            or not 1 <= bloom_bits_per_key <= MAX_BLOOM_BITS_PER_KEY):
        raise InvalidInputError(
            f"bloom_bits_per_key must be an int in [1, {MAX_BLOOM_BITS_PER_KEY}], got "
            f"{bloom_bits_per_key!r}")
    max_par = int(snap.max_parallelism)
    if not 1 <= max_par <= MAX_KEY_GROUPS:
        raise InvalidInputError(f"max_parallelism must be in [1, {MAX_KEY_GROUPS}], got {max_par}")
    start, end = range_bounds(snap.key_group_range)
    if end >= start and (start < 0 or end >= max_par):
        raise InvalidInputError(
            f"key-group range [{start}, {end}] is outside [0, {max_par - 1}]")
    if end < start:
        start, end = 0, -1
    metas = [dict(m) for m in snap.state_metas()]
    names = [m.get("name") for m in metas]
    if any(not isinstance(nm, str) for nm in names) or len(set(names)) != len(names):
        raise InvalidInputError(f"state metas need unique string names, got {names!r}")
    meta = {
        "format_version": FORMAT_VERSION, "version": int(version), "writer": str(writer),
        "max_parallelism": max_par, "key_type": str(snap.key_type),
        "assigner": str(snap.assigner), "key_group_range": [start, end], "states": metas,
        "compression": compression, "block_target_bytes": block_target_bytes, "kind": kind,
        "bloom_bits_per_key": bloom_bits_per_key,
    }
    try:
        json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"state metas are not JSON-serializable: {exc}") from exc
    return FilePlan(meta=meta, names=names, start=start, end=end,
                     prefix=key_group_prefix_bytes(max_par), incremental=bool(incremental),
                     kind=kind, block_target_bytes=block_target_bytes,
                     bloom_bits_per_key=bloom_bits_per_key, codec=CODECS[compression])


class _Assembler:
    """Writes header, compressed blocks, footer and trailer of one data file (docs/formats.md
    "Data file") from block payloads (or stored blocks) given in file order, and keeps the block
    table, the key-group index and the counts."""

    def __init__(self, out, plan: FilePlan):
        self.out = out
        self.plan = plan
        self.pos = 0
        self.blocks: list[tuple] = []
        self.index: list[tuple] = []
        self.filters: list[bytes] = []  # one per index record
        self.last_keys: list[bytes] = []  # one per block
        self.counts = {nm: 0 for nm in plan.names}
        self.tombstones = {nm: 0 for nm in plan.names}
        self.raw_total = 0
        self.nonempty_kgs = 0
        self._group_first: tuple[int, int] | None = None  # (first block, first offset)
        self._group_entries = 0
        self._last_kg = None
        self._pending: list = []
        self.emit(MAGIC)

    def emit(self, data) -> None:
        """Append the small ``data`` (header, footer, trailer): held back and written with the
        next blocks or by :meth:`finish`, since every write of a background writer retakes the
        GIL (write_data_file_from_blocks)."""
        self._pending.append(data)
        self.pos += len(data)

    def write_stored(self, data) -> None:
        """Write stored block bytes already accounted for by :meth:`add_stored` (after what
        :meth:`emit` held back, in one write)."""
        if self._pending:
            self._pending.append(data)
            data = b"".join(self._pending)
            self._pending = []
        self.out.write(data)

    def add_block(self, kg: int, si: int, payload, entries: int, last_key: bytes) -> None:
        """Encode (the plan's codec), checksum and write one payload of the current (state
        ``si``, key group ``kg``) group, whose last encoded key is ``last_key``."""
        stored = encode_stored(payload, self.plan.codec)
        self.add_stored(len(stored), len(payload), entries, xxh64(stored), last_key)
        self.write_stored(stored)

    def add_stored(self, stored_length: int, raw_length: int, entries: int, digest: int,
                   last_key: bytes) -> None:
        """Account for one stored block of the current group at the current position; the caller
        writes its bytes (lengths in bytes, ``digest``: XXH64 of the stored bytes, ``last_key``:
        the block's last encoded key)."""
        self.last_keys.append(bytes(last_key))
        if self._group_first is None:
            self._group_first = (len(self.blocks), self.pos)
            self._group_entries = 0
        self.blocks.append((self.pos, stored_length, raw_length, entries, self.plan.codec,
                            digest))
        self.raw_total += raw_length
        self._group_entries += entries
        self.pos += stored_length

    def end_group(self, kg: int, si: int, tombstones: int, bloom: bytes) -> None:
        """Close the blocks of (state ``si``, key group ``kg``): one key-group index record, and
        ``bloom`` its Bloom filter (:func:`statecore.checkpoint.blocks.bloom_filter`)."""
        if self._group_first is None:
            return
        self.filters.append(bytes(bloom))
        first_block, first_offset = self._group_first
        n = self._group_entries
        self.index.append((kg, si, first_block, len(self.blocks) - first_block, first_offset,
                           self.pos - first_offset, n))
        name = self.plan.names[si]
        self.counts[name] += n
        self.tombstones[name] += tombstones
        if kg != self._last_kg:
            self.nonempty_kgs += 1
            self._last_kg = kg
        self._group_first = None

    def finish(self) -> WriteSummary:
        """Bloom filters, footer (meta with the tombstone counts, block table, index, filter
        table, block keys) and trailer."""
        meta = self.plan.meta
        stored_total = self.pos - HEADER_SIZE
        k = bloom_hashes(self.plan.bloom_bits_per_key)
        ftable = np.zeros(len(self.filters), dtype=FILTER_DTYPE)
        for i, f in enumerate(self.filters):
            ftable[i] = (self.pos, len(f), k, xxh64(f))
            self.emit(f)
        key_offsets = np.zeros(len(self.last_keys) + 1, dtype="<u4")
        if self.last_keys:
            key_offsets[1:] = np.cumsum([len(x) for x in self.last_keys])
        meta["tombstones"] = self.tombstones
        try:
            meta_bytes = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:  # pragma: no cover - checked by plan_file
            raise InvalidInputError(f"state metas are not JSON-serializable: {exc}") from exc
        footer = b"".join((
            _U32.pack(len(meta_bytes)), meta_bytes, _U64x2.pack(len(self.blocks), len(self.index)),
            np.array(self.blocks, dtype=BLOCK_DTYPE).tobytes(),
            np.array(self.index, dtype=INDEX_DTYPE).tobytes(),
            ftable.tobytes(), key_offsets.tobytes(), b"".join(self.last_keys),
        ))
        footer_offset = self.pos
        footer_sum = xxh64(footer)
        self.emit(footer)
        head = TRAILER.pack(footer_offset, len(footer), footer_sum, FORMAT_VERSION, 0, 0,
                            MAGIC)[:32]
        self.emit(TRAILER.pack(footer_offset, len(footer), footer_sum, FORMAT_VERSION, 0,
                               xxh64(head), MAGIC))
        self.out.write(b"".join(self._pending))
        self._pending = []
        return WriteSummary(size=self.pos, footer_xxh64=footer_sum, blocks=len(self.blocks),
                            raw_bytes=self.raw_total, stored_bytes=stored_total,
                            entries=self.counts, key_groups_nonempty=self.nonempty_kgs, meta=meta,
                            kind=self.plan.kind, tombstones=self.tombstones)


def write_data_file_from_blocks(out, snap: Any, serializer, *, version: int, writer: str,
                                block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
                                incremental: bool | None = None, check_stop=None,
                                chunk_bytes: int = CHUNK_TARGET_BYTES,
                                bloom_bits_per_key: int = DEFAULT_BLOOM_BITS_PER_KEY,
                                compression: str = COMPRESSION) -> WriteSummary:
    """Write the data file of ``snap`` like :func:`write_data_file`, taking the blocks from
    ``serializer`` (``statecore._native.SnapshotBlockSerializer``, already started, built over
    the same snapshot, range, states order, block target, kind and the codec of
    ``compression``) instead of ``snap.entries``.
    Produces byte-identical files. The serializer compresses and checksums the blocks without
    the GIL and hands them over in chunks of about ``chunk_bytes`` stored bytes (with each
    block's last key and each (state, key group)'s Bloom filter, built with the serializer's
    bits per key, which ``bloom_bits_per_key`` must repeat), one ``write``
    each: this thread takes the GIL back once per chunk, not several times per block (each take
    can wait a switch interval while another thread runs Python). ``check_stop()``: called once
    per chunk, raises to abort. Raises what the serializer raises (InvalidInputError for a
    snapshot breaking its contract, ``concurrent.futures.CancelledError``) and the stream's
    errors."""
    plan = plan_file(snap, version, writer, block_target_bytes, incremental, bloom_bits_per_key,
                     compression)
    asm = _Assembler(out, plan)
    _drain(asm, plan, serializer, chunk_bytes, check_stop)
    return asm.finish()


def _drain(asm: "_Assembler", plan: FilePlan, serializer, chunk_bytes: int,
           check_stop=None) -> None:
    """Write every chunk of the started ``serializer`` through ``asm`` (blocks of the groups of
    ``plan``'s file, each group whole within the serializer's output)."""
    nstates = len(plan.names)
    tomb = 0
    while True:
        if check_stop is not None:
            check_stop()
        chunk = serializer.next_chunk(chunk_bytes)
        if chunk is None:
            break
        for (kg, si, entries, tombstones, last, stored, raw, digest), (last_key, bloom) in zip(
                chunk.blocks, chunk.lookup):
            if not plan.start <= kg <= plan.end or not 0 <= si < nstates:
                raise InvalidInputError(
                    f"serializer produced a block of key group {kg}, state {si} outside the file")
            asm.add_stored(stored, raw, entries, digest, last_key)
            tomb += tombstones
            if last:
                asm.end_group(kg, si, tomb, bloom)
                tomb = 0
        asm.write_stored(chunk)


def write_data_file_serialized(out, snap: Any, *, version: int, writer: str,
                               block_target_bytes: int = DEFAULT_BLOCK_TARGET_BYTES,
                               incremental: bool | None = None,
                               chunk_bytes: int = CHUNK_TARGET_BYTES,
                               bloom_bits_per_key: int = DEFAULT_BLOOM_BITS_PER_KEY,
                               window_bytes: int = SERIALIZE_WINDOW_BYTES,
                               compression: str = COMPRESSION) -> WriteSummary:
    """Write the data file of ``snap`` exactly as :func:`write_data_file` does (byte-identical,
    same reads of ``snap.entries``, same checks and errors), but have the extension's
    ``SnapshotBlockSerializer`` cut, encode, compress and checksum the blocks and build the
    Bloom filters on its own thread without the GIL: the entries of about ``window_bytes`` key
    and value bytes (whole key groups) at a time are read here and handed over as its
    in-memory sources, and this thread takes the GIL back once per chunk of about
    ``chunk_bytes`` stored bytes. What a writer on a background thread (compaction) should use,
    so that it leaves the GIL to the threads processing records; ``write_data_file`` runs
    Python per block. Raises ImportError without the extension."""
    from statecore import _native

    plan = plan_file(snap, version, writer, block_target_bytes, incremental, bloom_bits_per_key,
                     compression)
    asm = _Assembler(out, plan)
    kg = plan.start
    while kg <= plan.end:
        first, held = kg, 0
        groups: dict[str, dict] = {name: {} for name in plan.names}
        while kg <= plan.end and (kg == first or held < window_bytes):
            for name in plan.names:
                keys, values = _checked_entries(snap, plan, name, kg)[:2]
                if len(keys):
                    groups[name][kg] = (keys, values)
                    held += keys.nbytes + values.nbytes
            kg += 1
        serializer = _native.SnapshotBlockSerializer(
            [(name, None, False, 0, groups[name]) for name in plan.names], first, kg - 1,
            plan.prefix, plan.block_target_bytes, plan.incremental,
            queue_blocks=queue_payloads(plan.block_target_bytes),
            bloom_bits_per_key=plan.bloom_bits_per_key, codec=plan.codec)
        serializer.start()
        del groups
        _drain(asm, plan, serializer, chunk_bytes)
    return asm.finish()


def _checked_entries(snap: Any, plan: FilePlan, name: str, kg: int) -> tuple:
    """``snap.entries(name, kg)`` of ``plan``'s file checked against the writers' contract
    (:func:`write_data_file`), a tombstone's value slot emptied (an Arrow NULL slot may still
    span bytes; tombstones store none, the NULL stays): ``(keys, values, key offsets, key data,
    value offsets, value data)`` (:func:`_offsets_and_data`; empty arrays and None offsets and
    data when the group is empty)."""
    keys, values = snap.entries(name, kg)
    keys = _as_binary(keys, f"keys of state {name!r} key group {kg}")
    values = _as_binary(values, f"values of state {name!r} key group {kg}",
                        allow_nulls=plan.incremental)
    if len(values) != len(keys):
        raise InvalidInputError(
            f"state {name!r} key group {kg}: {len(keys)} keys but {len(values)} values")
    if not len(keys):
        return keys, values, None, None, None, None
    if plan.incremental and values.null_count:
        import pyarrow.compute as pc

        valid = values.is_valid()
        filled = pc.if_else(valid, values, pa.scalar(b"", pa.binary()))
        off = filled.offset
        bitmap = np.packbits(np.concatenate([np.zeros(off, bool),
                                             valid.to_numpy(zero_copy_only=False)]),
                             bitorder="little")
        bufs = filled.buffers()
        values = pa.Array.from_buffers(pa.binary(), len(filled),
                                       [pa.py_buffer(bitmap), bufs[1], bufs[2]],
                                       null_count=values.null_count, offset=off)
    koff, kdata = _offsets_and_data(keys)
    voff, vdata = _offsets_and_data(values)
    if int(koff[-1]) > _INT32_MAX or int(voff[-1]) > _INT32_MAX:
        raise InvalidInputError(f"state {name!r} key group {kg}: more than 2 GiB of bytes")
    _check_sorted_and_prefixed(keys, koff, kdata, kg, plan.prefix, name)
    return keys, values, koff, kdata, voff, vdata


# ---------------------------------------------------------------------------------------------
# Reader


def check_state_meta(m) -> None:
    """Raise ValueError naming what is wrong when ``m`` is not a state meta as data files and
    manifests hold them (docs/formats.md): an object with a non-empty string ``name``, string
    ``kind`` and ``namespace_type``, a string ``value_type`` unless it describes timers, and
    ``ttl`` an object when present."""
    if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
        raise ValueError(f"a state meta is not an object with a name: {m!r}")
    for f in ("kind", "namespace_type"):
        if not isinstance(m.get(f), str):
            raise ValueError(f"state {m['name']!r}: {f} is not a string: {m.get(f)!r}")
    if m["kind"] != "timers" and not isinstance(m.get("value_type"), str):
        raise ValueError(f"state {m['name']!r}: value_type is not a string")
    if m.get("ttl") is not None and not isinstance(m["ttl"], dict):
        raise ValueError(f"state {m['name']!r}: ttl is not an object")


class StoredBlocks:
    """The stored (checksummed, compressed) blocks of one state over a range of key groups of
    one data file, undecoded, for a caller that decodes them itself
    (:meth:`DataFileReader.stored_blocks`; ``statecore._native.load_blocks`` restores them
    into a table). Attributes: ``data`` (a buffer: the file's bytes from offset ``base``),
    ``blocks`` (their block-table rows, ``BLOCK_DTYPE``, file order, offsets from the file
    start), ``key_groups`` (int32, the key group of each block), ``incremental`` (the run's
    payloads carry tombstones), ``picks`` (int64, each block's index in the file's block
    table)."""

    __slots__ = ("_reader", "state", "data", "base", "blocks", "key_groups", "incremental",
                 "picks")

    def __init__(self, reader: "DataFileReader", state: str, data, base: int,
                 blocks: np.ndarray, key_groups: np.ndarray, picks: np.ndarray):
        self._reader = reader
        self.state = state
        self.data = data
        self.base = base
        self.blocks = blocks
        self.key_groups = key_groups
        self.incremental = reader.kind == KIND_INCREMENTAL
        self.picks = picks

    def key_group_of(self, i: int) -> int:
        """The key group of ``blocks[i]``."""
        return int(self.key_groups[i])

    def corrupt(self, i: int, why: str) -> CorruptCheckpointError:
        """The error for ``blocks[i]`` found damaged (``why``), naming the file, state, key group
        and block as :meth:`DataFileReader.entries` does."""
        return CorruptCheckpointError(
            f"checkpoint data file {self._reader.name}: state {self.state!r} key group "
            f"{self.key_group_of(i)} block {int(self.picks[i])}: {why}")


class DataFileReader:
    """Random-access reader of one data file through a ``pyarrow.NativeFile`` opened for reading.

    ``name`` is used in error messages. ``expected_size`` (bytes) and ``expected_footer_xxh64``,
    when given (from the manifest), are checked too. Opening reads 3 byte ranges: the header
    magic, the trailer and the footer; :meth:`entries` reads exactly the blocks of one
    (state, key group). All violations raise CorruptCheckpointError naming ``name``.

    With ``fetch_pool`` (a ``concurrent.futures.Executor``) opening fetches the whole file
    instead, in ``round(size / piece_bytes)`` pieces (at least one), and keeps them as
    prefetched bytes (:meth:`prefetch`): the header, trailer and footer are checked from them
    and later block reads use them. For a caller that reads all of the file's blocks (a
    restore of its whole key-group range) on a store where every request is a round trip, one
    request per piece replaces a header read, a tail read and a key-group read, at the price
    of the Bloom filters' bytes, which such a caller does not need. The pieces are of equal
    size; the last (the footer's, and the blocks before it) is read by the opening thread:
    nothing can be decoded without the footer. The others are read in file order by at most
    ``fetch_lanes`` tasks of the pool (one per two pieces), each as soon as the one before it
    in its lane arrived, so that they arrive a few at a time, in file order, and a caller
    decoding what arrived (:meth:`pieces`, :meth:`piece_cuts`) overlaps the download of the
    rest. With ``tail_first`` (the default) the lanes start once the footer's piece arrived,
    so that it arrives first, alone, and its key groups load while the others download; else
    they start before it is asked for, and it downloads alongside their first pieces, for a
    store whose connections each move a bounded rate after a long round trip (docs/deploy.md
    "Checkpoints on object storage"). The first piece's task checks the header. Read errors of
    the pieces surface as the opening's (CheckpointIOError, CorruptCheckpointError), or at a
    later read that needs the piece or at :meth:`wait_prefetched`.
    """

    #: Format 6 (set from the footer): the Bloom filters' bits per key and their bytes in the
    #: file; files of format 1 to 5 have no filters.
    bloom_bits_per_key: int | None = None
    filter_bytes = 0

    def __init__(self, file, name: str, expected_size: int | None = None,
                 expected_footer_xxh64: int | None = None, *, fetch_pool=None,
                 piece_bytes: int = 32 << 20, fetch_lanes: int = 1, tail_first: bool = True):
        self.name = name
        self._file = file
        #: ``(lo, hi, bytes)`` of prefetched ranges, ascending; ``bytes`` a pa.Buffer or, for a
        #: parallel prefetch, the Future of one.
        self._prefetched: list[tuple[int, int, Any]] = []
        self._count_lock = threading.Lock()
        #: Bytes read from the file so far (footer, prefetched ranges and blocks).
        self.bytes_read = 0
        try:
            self._open(expected_size, expected_footer_xxh64, fetch_pool, piece_bytes,
                       fetch_lanes, tail_first)
        except Exception:
            self.drop_prefetched()  # no piece read may outlive the file
            file.close()
            raise

    def _fail(self, msg: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint data file {self.name}: {msg}")

    def _read(self, offset: int, length: int, what: str) -> pa.Buffer:
        if length < buffer_pool.MIN_BYTES or not hasattr(self._file, "readinto"):
            return self._read_at(offset, length, what)
        # Into reused memory (statecore.buffer_pool says why): a catch-up's key-group range.
        try:
            buf = buffer_pool.take(length)
            self._file.seek(offset)
            got = self._file.readinto(buf)
        except OSError as exc:
            raise self._io_error(what, offset, length, exc) from exc
        return self._counted(pa.py_buffer(buf[:got]), offset, length, what)

    def _read_at(self, offset: int, length: int, what: str) -> pa.Buffer:
        """:meth:`_read` for any thread: one positional read (``read_at`` keeps no file
        position, so reads of several threads do not interfere), into fresh memory."""
        try:
            data = self._file.read_at(length, offset)
        except OSError as exc:
            raise self._io_error(what, offset, length, exc) from exc
        return self._counted(data, offset, length, what)

    def _io_error(self, what: str, offset: int, length: int, exc: OSError) -> CheckpointIOError:
        return CheckpointIOError(
            f"checkpoint data file {self.name}: cannot read {what} ({length} bytes at "
            f"{offset}): {exc}")

    def _counted(self, data, offset: int, length: int, what: str) -> pa.Buffer:
        if not isinstance(data, pa.Buffer):
            data = pa.py_buffer(data)
        with self._count_lock:
            self.bytes_read += data.size
        if data.size != length:
            raise self._fail(f"truncated: {what} needs {length} bytes at {offset}, got {data.size}")
        return data

    def _open(self, expected_size, expected_footer_xxh64, fetch_pool, piece_bytes,
              fetch_lanes, tail_first) -> None:
        size = self._file.size()
        self.size = size
        if expected_size is not None and size != expected_size:
            raise self._fail(f"size is {size} bytes, the manifest says {expected_size} (truncated "
                             "or overwritten)")
        if size < HEADER_SIZE + TRAILER_SIZE:
            raise self._fail(f"truncated: {size} bytes is shorter than header + trailer")
        pieces = 1 if fetch_pool is None else max(1, round(size / piece_bytes))
        tail = size - size // pieces
        def read_footer_piece():
            # Read here, not by the pool: an opening in one of the pool's threads (several runs
            # opened at once) must not wait for the pool.
            self._prefetched.append((tail, size, self._read_at(tail, size - tail,
                                                               "the whole file")))

        if fetch_pool is not None and tail_first:
            read_footer_piece()
        if tail > 0:
            # Asked for before the footer is checked, which then overlaps their download: cut
            # at equal shares, not at key-group starts (piece_cuts gives a split key group a
            # range of its own).
            cuts = [tail * i // (pieces - 1) for i in range(pieces)]
            self._fetch_in_order(list(zip(cuts[:-1], cuts[1:])), fetch_pool,
                                 max(1, min(fetch_lanes, pieces // 2)))
        if fetch_pool is not None and not tail_first:
            # With the other pieces already on their way (the last range: the order of the
            # prefetched ranges holds).
            read_footer_piece()
        # Through _range: from the piece just read, else read from the file. A header in a
        # later piece is checked as that piece arrives (_fetch_in_order).
        if tail == 0 and self._range(0, HEADER_SIZE, "header").to_pybytes() != MAGIC:
            raise self._fail(_BAD_HEADER)
        trailer = self._range(size - TRAILER_SIZE, TRAILER_SIZE, "trailer").to_pybytes()
        f_off, f_len, f_sum, fmt, flags, t_sum, magic = TRAILER.unpack(trailer)
        if magic != MAGIC:
            raise self._fail("bad magic in trailer (truncated or not a statecore data file)")
        if xxh64(trailer[:32]) != t_sum:
            raise self._fail("trailer checksum mismatch")
        if fmt not in READABLE_FORMAT_VERSIONS:
            raise self._fail(f"unsupported format version {fmt} (this reader reads "
                             f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))})")
        self.format_version = fmt
        if flags != 0:
            raise self._fail(f"unknown trailer flags {flags:#x}")
        if f_off < HEADER_SIZE or f_off + f_len != size - TRAILER_SIZE:
            raise self._fail(f"footer [{f_off}, {f_off + f_len}) does not end at the trailer")
        footer = self._range(f_off, f_len, "footer")
        if xxh64(footer) != f_sum:
            raise self._fail("footer checksum mismatch")
        if expected_footer_xxh64 is not None and f_sum != expected_footer_xxh64:
            raise self._fail("footer checksum differs from the manifest's (file overwritten?)")
        self.footer_xxh64 = f_sum
        self.footer_length = f_len
        self._parse_footer(footer, f_off)

    def _fetch_in_order(self, pieces: list, pool, lanes: int) -> None:
        """Have ``lanes`` tasks of ``pool`` read ``pieces`` (``(lo, hi)`` byte ranges, file
        order), each task taking the next piece not taken yet once its last one arrived; the
        pieces are kept as prefetched bytes (Futures) at once. The task reading offset 0
        checks the header magic (CorruptCheckpointError, kept in that piece's Future)."""
        futures = [Future() for _ in pieces]
        self._prefetched.extend((a, b, f) for (a, b), f in zip(pieces, futures))
        self._prefetched.sort(key=lambda p: p[0])
        todo = iter(list(zip(pieces, futures)))
        lock = threading.Lock()

        def lane() -> None:
            while True:
                with lock:
                    item = next(todo, None)
                if item is None:
                    return
                (a, b), f = item
                if not f.set_running_or_notify_cancel():
                    continue  # dropped (drop_prefetched, close) before it was read
                try:
                    data = self._read_at(a, b - a, "the whole file")
                    if a == 0 and data.slice(0, HEADER_SIZE).to_pybytes() != MAGIC:
                        raise self._fail(_BAD_HEADER)
                except Exception as exc:
                    f.set_exception(exc)
                else:
                    f.set_result(data)

        for _ in range(lanes):
            pool.submit(lane)

    def _parse_footer(self, footer: pa.Buffer, footer_offset: int) -> None:
        fb = footer.to_pybytes()
        try:
            (mlen,) = _U32.unpack_from(fb, 0)
            meta = json.loads(fb[4:4 + mlen].decode("utf-8"))
            n_blocks, n_index = _U64x2.unpack_from(fb, 4 + mlen)
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise self._fail(f"footer is malformed: {exc}") from exc
        tables = 4 + mlen + 16
        fixed = tables + n_blocks * BLOCK_DTYPE.itemsize + n_index * INDEX_DTYPE.itemsize
        if (len(fb) != fixed if self.format_version < LOOKUP_FORMAT_VERSION
                else len(fb) < fixed):
            raise self._fail("footer length does not match its block and index table sizes")
        blocks = np.frombuffer(fb, dtype=BLOCK_DTYPE, count=n_blocks, offset=tables)
        index = np.frombuffer(fb, dtype=INDEX_DTYPE, count=n_index,
                              offset=tables + n_blocks * BLOCK_DTYPE.itemsize)
        try:
            if not isinstance(meta["states"], list):
                raise ValueError("states is not a list")
            for m in meta["states"]:
                check_state_meta(m)
            states = [m["name"] for m in meta["states"]]
            if len(set(states)) != len(states):
                raise ValueError(f"state names are not distinct: {states}")
            kg_start, kg_end = (int(x) for x in meta["key_group_range"])
            self.max_parallelism = int(meta["max_parallelism"])
            self.key_type = meta["key_type"]
            self.assigner = meta["assigner"]
            if meta.get("compression") not in CODECS:
                raise ValueError(f"unknown compression {meta.get('compression')!r}")
            if meta.get("format_version", 1) != self.format_version:
                raise ValueError(f"meta says format version {meta.get('format_version')}, "
                                 f"the trailer {self.format_version}")
            kind = meta.get("kind", KIND_FULL) if self.format_version >= 2 else KIND_FULL
            if kind not in (KIND_FULL, KIND_INCREMENTAL):
                raise ValueError(f"unknown run kind {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise self._fail(f"footer metadata is malformed: {exc}") from exc
        data_end = footer_offset
        if self.format_version >= LOOKUP_FORMAT_VERSION:
            data_end = self._parse_lookup_tables(fb, fixed, meta, n_blocks, index, footer_offset)
        # Blocks must tile [HEADER_SIZE, data_end) so that every stored byte is covered by
        # a checksum; index records must tile the block table in order.
        ends = blocks["offset"].astype(np.int64) + blocks["stored_length"]
        starts = np.concatenate(([HEADER_SIZE], ends[:-1])) if n_blocks else np.zeros(0, np.int64)
        if n_blocks and (bool(np.any(blocks["offset"] != starts))
                         or int(ends[-1]) != data_end):
            raise self._fail("block table does not tile the data region")
        if not n_blocks and data_end != HEADER_SIZE:
            raise self._fail("no blocks but bytes between header and footer")
        codec = CODECS[meta["compression"]]
        other = np.flatnonzero(blocks["codec"] != codec)
        if len(other):
            i = int(other[0])
            raise self._fail(f"block {i} has codec {int(blocks['codec'][i])}, the file's "
                             f"compression {meta['compression']!r} is codec {codec}")
        # Decoding allocates what the block table claims, so bound the claims by what the
        # stored bytes can hold: LZ4 expands at most 255-fold (a sequence of k length bytes
        # of 255 encodes about 255 * k bytes), and every entry takes 8 bytes of offsets.
        raw = blocks["raw_length"].astype(np.int64)
        stored = blocks["stored_length"].astype(np.int64)
        bad = np.nonzero((raw > 255 * stored + 64)
                         | (4 + 8 * blocks["entries"].astype(np.int64) > raw))[0]
        if len(bad):
            i = int(bad[0])
            raise self._fail(f"block {i} claims {int(raw[i])} raw bytes and "
                             f"{int(blocks['entries'][i])} entries from {int(stored[i])} stored "
                             "bytes: more than LZ4 can produce or the payload can hold")
        first = index["first_block"].astype(np.int64)
        count = index["block_count"].astype(np.int64)
        exp_first = np.concatenate(([0], np.cumsum(count)[:-1])) if n_index else first
        if (bool(np.any(first != exp_first)) or int(count.sum()) != n_blocks
                or bool(np.any(count == 0))):
            raise self._fail("key-group index does not tile the block table")
        order = index["key_group"].astype(np.int64) * (1 << 32) + index["state"]
        if n_index > 1 and bool(np.any(np.diff(order) <= 0)):
            raise self._fail("key-group index is not sorted by (key group, state)")
        if n_index and (int(index["state"].max()) >= len(states)
                        or int(index["key_group"].min()) < kg_start
                        or int(index["key_group"].max()) > kg_end):
            raise self._fail("key-group index names a state or key group outside the file")
        if n_index:
            csum_len = np.concatenate(([0], np.cumsum(blocks["stored_length"].astype(np.int64))))
            csum_ent = np.concatenate(([0], np.cumsum(blocks["entries"].astype(np.int64))))
            if (bool(np.any(index["offset"] != blocks["offset"][first]))
                    or bool(np.any(index["length"] != csum_len[first + count] - csum_len[first]))
                    or bool(np.any(index["entries"] != csum_ent[first + count] - csum_ent[first]))):
                raise self._fail("key-group index disagrees with the block table")
        self.meta = meta
        self.kind = kind
        self.state_names = states
        self.key_group_start, self.key_group_end = kg_start, kg_end
        self._blocks = blocks
        self._index = {(int(r["state"]), int(r["key_group"])): i for i, r in enumerate(index)}
        self._index_rows = index

    def _parse_lookup_tables(self, fb: bytes, at: int, meta: dict, n_blocks: int,
                             index: np.ndarray, footer_offset: int) -> int:
        """Parse and check the filter table and block keys of a format-6 footer (``fb[at:]``,
        docs/formats.md "Filters and block keys"); returns where the filters start (the end of
        the blocks). Sets ``bloom_bits_per_key``, ``filter_bytes`` (all filters' bytes) and the
        tables :meth:`lookup_tables` returns."""
        n_index = len(index)
        bpk = meta.get("bloom_bits_per_key")
        if (isinstance(bpk, bool) or not isinstance(bpk, int)
                or not 1 <= bpk <= MAX_BLOOM_BITS_PER_KEY):
            raise self._fail(f"footer metadata is malformed: bloom_bits_per_key {bpk!r}")
        key_at = at + n_index * FILTER_DTYPE.itemsize
        if len(fb) < key_at + 4 * (n_blocks + 1):
            raise self._fail("footer length does not match its filter table and block keys")
        filters = np.frombuffer(fb, dtype=FILTER_DTYPE, count=n_index, offset=at)
        koff = np.frombuffer(fb, dtype="<u4", count=n_blocks + 1, offset=key_at).astype(np.int64)
        data_at = key_at + 4 * (n_blocks + 1)
        if (int(koff[0]) != 0 or bool(np.any(np.diff(koff) < 0))
                or data_at + int(koff[-1]) != len(fb)):
            raise self._fail("footer block keys do not match the footer length")
        lengths = filters["length"].astype(np.int64)
        want = (np.maximum(1, (index["entries"].astype(np.int64) * bpk + 63) // 64) * 8
                if n_index else lengths)
        start = footer_offset - int(lengths.sum())
        starts = start + np.concatenate(([0], np.cumsum(lengths)[:-1])) if n_index else lengths
        if (bool(np.any(filters["offset"].astype(np.int64) != starts))
                or bool(np.any(lengths != want))
                or bool(np.any(filters["hashes"] != bloom_hashes(bpk)))
                or start < HEADER_SIZE):
            raise self._fail("filter table does not tile the filter region with the sizes of "
                             f"{bpk} bits per key")
        self.bloom_bits_per_key = bpk
        self.filter_bytes = int(lengths.sum())
        self._filters = filters
        self._block_keys = (koff, memoryview(fb)[data_at:])
        return start

    def lookup_tables(self):
        """``(filters, key_offsets, key_data)`` of a format-6 file -- the filter table
        (``FILTER_DTYPE`` rows, one per key-group index row), and the last encoded key of
        every block (block ``b``'s is ``key_data[key_offsets[b]:key_offsets[b + 1]]``,
        ``key_offsets`` int64) -- or None for a file of format 1 to 5, which has neither."""
        if self.format_version < LOOKUP_FORMAT_VERSION:
            return None
        koff, kdata = self._block_keys
        return self._filters, koff, kdata

    def verify_filters(self) -> int:
        """Read the Bloom filters of a format-6 file (one ranged read) and check each against
        the XXH64 of its filter table record; returns their bytes (0 for formats 1 to 5).
        CorruptCheckpointError naming the state and key group of a bad one."""
        if self.format_version < LOOKUP_FORMAT_VERSION or not len(self._filters):
            return 0
        lo = int(self._filters["offset"][0])
        raw = memoryview(self._read(lo, self.filter_bytes, "Bloom filters"))
        for r, f in zip(self._index_rows, self._filters):
            a = int(f["offset"]) - lo
            if xxh64(raw[a:a + int(f["length"])]) != int(f["xxh64"]):
                raise self._fail(f"state {self.state_names[int(r['state'])]!r} key group "
                                 f"{int(r['key_group'])}: Bloom filter checksum mismatch")
        return self.filter_bytes

    def index_rows(self, state: str) -> np.ndarray:
        """``(rows, positions)``: the key-group index rows (``INDEX_DTYPE``) of ``state`` in
        key-group order and their positions in the index (int64, the rows of the filter table);
        empty for a state the file does not hold."""
        try:
            si = self.state_names.index(state)
        except ValueError:
            return self._index_rows[:0], np.zeros(0, np.int64)
        pos = np.nonzero(self._index_rows["state"] == si)[0]
        return self._index_rows[pos], pos

    def block_rows(self, first: int, count: int) -> np.ndarray:
        """Rows ``[first, first + count)`` of the block table (``BLOCK_DTYPE``)."""
        return self._blocks[first:first + count]

    def read_range(self, offset: int, length: int, what: str) -> pa.Buffer:
        """``length`` bytes at ``offset`` with one positional read (safe from any thread;
        counted in ``bytes_read``). CheckpointIOError when the read fails,
        CorruptCheckpointError when it comes back short; ``what`` names the bytes in errors."""
        return self._read_at(offset, length, what)

    def state_metas(self) -> list[dict]:
        """State metas recorded by the writer (list of JSON-able dicts, in file order)."""
        return [dict(m) for m in self.meta["states"]]

    def prefetch(self, start: int, end: int, *, pool=None, chunk_bytes: int = 4 << 20) -> int:
        """Fetch the byte range of key groups ``[start, end]`` (all states) and keep it for
        :meth:`entries`. Returns the number of bytes it covers.

        Without ``pool``: one ranged read, now. With ``pool`` (a
        ``concurrent.futures.Executor``): the range is cut at block starts into
        ``round(length / chunk_bytes)`` pieces (at least one) of about equal size that the pool
        reads in parallel; this returns at once and a later read waits only for the pieces it
        needs -- on an object store, where a read is a round trip and one stream rarely fills
        the link, decoding the first pieces overlaps the download of the rest. Read errors
        surface at the read that needs the piece (CheckpointIOError, CorruptCheckpointError) or
        at :meth:`wait_prefetched`. A range already held (an earlier prefetch, or the whole file
        fetched at open: ``fetch_pool``) is not read again."""
        span = self._key_group_span(start, end)
        if span is None:
            return 0
        _, lo, hi = span
        if self._held(lo, hi):
            return hi - lo
        what = f"key groups {start}..{end}"
        if pool is None:
            self._prefetched.append((lo, hi, self._read(lo, hi - lo, what)))
            self._prefetched.sort(key=lambda p: p[0])
        else:
            self._submit_pieces(lo, hi, pool, chunk_bytes, what,
                                self._blocks["offset"].astype(np.int64))
        return hi - lo

    def _submit_pieces(self, lo: int, hi: int, pool, piece_bytes: int, what: str,
                       block_offsets) -> None:
        """Have ``pool`` read ``[lo, hi)`` in ``round((hi - lo) / piece_bytes)`` pieces (at least
        one) of about equal size, kept as prefetched bytes (Futures), submitted in file order.
        With ``block_offsets`` (ascending starts of the blocks, which tile the data region in
        file order) each cut moves to the first block start at or after it, so that no block
        is split."""
        k = max(1, round((hi - lo) / piece_bytes))
        targets = lo + (np.arange(1, k, dtype=np.int64) * (hi - lo)) // k
        if block_offsets is not None:
            idx = np.searchsorted(block_offsets, targets)
            cuts = {int(block_offsets[i]) for i in idx
                    if i < len(block_offsets) and lo < block_offsets[i] < hi}
        else:
            cuts = {int(t) for t in targets}
        bounds = [lo] + sorted(cuts) + [hi]
        for a, b in zip(bounds[:-1], bounds[1:]):
            self._prefetched.append((a, b, pool.submit(self._read_at, a, b - a, what)))
        self._prefetched.sort(key=lambda p: p[0])

    def _held(self, lo: int, hi: int) -> bool:
        """Whether prefetched pieces (arrived or not) cover ``[lo, hi)``."""
        at = lo
        for a, b, _ in self._prefetched:
            if b <= at:
                continue
            if a > at:
                return False
            at = b
            if at >= hi:
                return True
        return at >= hi

    def _key_group_span(self, start: int, end: int):
        """``(index rows, lo, hi)``: the key-group index rows of key groups ``[start, end]``
        (all states) and the byte range ``[lo, hi)`` their blocks fill; None when the file
        holds none of them."""
        rows = self._index_rows
        sel = rows[(rows["key_group"] >= start) & (rows["key_group"] <= end)]
        if not len(sel):
            return None
        return sel, int(sel["offset"].min()), int((sel["offset"] + sel["length"]).max())

    def pieces(self, state: str, start: int, end: int) -> list[Future]:
        """The Futures of the prefetched pieces (of a parallel :meth:`prefetch` or a whole
        fetch) that hold blocks of ``state`` in key groups ``[start, end]``, arrived or not
        ([] when the file holds none of them, or they are held already or not prefetched: a
        read reads them now). A caller reading what arrived first checks ``done()`` or waits
        for them (``concurrent.futures.wait``)."""
        rows = self._rows_of(state, start, end)
        if not len(rows):
            return []
        lo = int(rows["offset"].min())
        hi = int((rows["offset"] + rows["length"]).max())
        return [f for a, b, f in self._prefetched if a < hi and b > lo and isinstance(f, Future)]

    def piece_cuts(self) -> list[int]:
        """Key groups (ascending) where a reader of this file's prefetched pieces starts a new
        range of key groups so that each range's blocks lie within one piece: the first key
        group at a boundary between two pieces, and a key group split by one (a piece of a
        partial :meth:`prefetch` is cut at a block start) gets a range of its own. Empty
        without pieces."""
        rows = self._index_rows
        if len(self._prefetched) < 2 or not len(rows):
            return []
        starts = rows["offset"].astype(np.int64)
        ends = starts + rows["length"].astype(np.int64)
        kgs = rows["key_group"].astype(np.int64)
        edges = {a for a, _, _ in self._prefetched} | {b for _, b, _ in self._prefetched}
        out: set = set()
        for at in edges:
            i = int(np.searchsorted(ends, at, "right"))  # the row holding byte ``at``
            if i >= len(rows) or at <= int(starts[0]):
                continue
            kg = int(kgs[i])
            out.add(kg)
            if int(starts[i]) != at or (i and int(kgs[i - 1]) == kg):
                out.add(kg + 1)
        return sorted(out)

    def wait_prefetched(self) -> None:
        """Return once every piece of a parallel :meth:`prefetch` arrived; raises the first
        read error (CheckpointIOError, CorruptCheckpointError)."""
        for _, _, buf in self._prefetched:
            if isinstance(buf, Future):
                buf.result()

    def drop_prefetched(self) -> None:
        """Forget the bytes :meth:`prefetch` read (later reads read from the file again); reads
        still in flight are cancelled or waited for."""
        pending, self._prefetched = self._prefetched, []
        futures = [b for _, _, b in pending if isinstance(b, Future)]
        for f in futures:
            f.cancel()
        wait(futures)

    def _range(self, offset: int, length: int, what: str) -> pa.Buffer:
        end = offset + length
        parts = []
        at = offset
        for lo, hi, buf in self._prefetched:
            if hi <= at:
                continue
            if lo > at:
                break  # a gap: ranges are sorted by start
            if isinstance(buf, Future):
                buf = buf.result()
            take = min(hi, end) - at
            parts.append(buf.slice(at - lo, take))
            at += take
            if at >= end:
                break
        if at < end:
            return self._read(offset, length, what)
        if len(parts) == 1:
            return parts[0]
        # A read across pieces of a parallel prefetch: one copy.
        return pa.py_buffer(np.concatenate([np.frombuffer(p, dtype=np.uint8) for p in parts]))

    def _whole_layout(self, state: str):
        """The state meta of ``state`` when its entries are in a layout of an older format (a
        map state before format 3 in the whole-map layout, a list state before format 5 in the
        whole-list or per-element layout), else None."""
        for m in self.meta["states"]:
            if m["name"] != state:
                continue
            if m.get("kind") == "map" and self.format_version < MAP_ENTRIES_FORMAT_VERSION:
                return m
            if m.get("kind") == "list" and self.format_version < LIST_CHUNKS_FORMAT_VERSION:
                return m
        return None

    def _as_entries(self, state: str, where: str, keys, values):
        """An older file's map- or list-state ``(keys, values)`` converted to the current
        layout (:func:`statecore.serializers.expand_whole_map_entries` for a whole map; for a
        list :func:`statecore.serializers.chunk_list_entries` over its elements, a whole list's
        expanded by :func:`statecore.serializers.expand_whole_list_entries` first), or as they
        are when the state's layout is current. StateMigrationError for an incremental file: a
        changed whole map or list names neither its added nor its removed entries, and a
        changed element does not say which chunk it went to, so its changes cannot be converted
        (restore a full checkpoint of that format, or compact the version with the release
        that wrote it). CorruptCheckpointError for a value that does not parse."""
        meta = self._whole_layout(state)
        if meta is None or not len(keys):
            return keys, values
        kind = meta["kind"]
        per_element = kind == "list" and self.format_version >= LIST_ENTRIES_FORMAT_VERSION
        if self.kind == KIND_INCREMENTAL:
            layout = "per-element" if per_element else f"whole-{kind}"
            target = "chunk" if kind == "list" else "per-entry"
            raise StateMigrationError(
                f"checkpoint data file {self.name}: {kind} state {state!r} is stored in the "
                f"{layout} layout of format version {self.format_version} in an "
                f"incremental run, which cannot be converted to {target} changes; restore "
                "from a full checkpoint (or compact the version with the release that wrote "
                "it)")
        try:
            if kind == "map":
                k, v = S.expand_whole_map_entries(keys.to_pylist(), values.to_pylist())
            else:
                width = S.value_serializer(meta["value_type"]).fixed_width
                ttl = bool(meta.get("ttl"))
                k, v = keys.to_pylist(), values.to_pylist()
                if not per_element:
                    k, v = S.expand_whole_list_entries(k, v, width, ttl)
                k, v = S.chunk_list_entries(k, v, width, ttl)
        except InvalidInputError as exc:
            raise CorruptCheckpointError(
                f"checkpoint data file {self.name}: {where}: {exc}") from exc
        return pa.array(k, pa.binary()), pa.array(v, pa.binary())

    def entries(self, state: str, key_group: int) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """``(keys, values)`` of ``state`` in ``key_group``, sorted by key bytes; empty arrays when
        the file holds no entry for them. In an incremental file a NULL value is a tombstone.
        A map state of a format 1 or 2 file comes converted to one entry per user key, a list
        state of a format 1 to 4 file to chunks (StateMigrationError for such an incremental
        file, :meth:`_as_entries`).
        The caller checks that ``key_group`` belongs to this file. Raises
        CorruptCheckpointError naming the file, state, key group and block."""
        keys, values = self.stored_entries(state, key_group)
        return self._as_entries(state, f"state {state!r} key group {key_group}", keys, values)

    def stored_entries(self, state: str, key_group: int
                       ) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """:meth:`entries` as the file stores them (a format 1 or 2 file's map states in the
        whole-map layout, a format 1 to 3 file's list states in the whole-list layout, a format
        4 file's one entry per element): what the manifest's entry counts count."""
        try:
            si = self.state_names.index(state)
        except ValueError:
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        i = self._index.get((si, key_group))
        if i is None:
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        rec = self._index_rows[i]
        offset, length = int(rec["offset"]), int(rec["length"])
        where = f"state {state!r} key group {key_group}"
        data = self._range(offset, length, where)
        first = int(rec["first_block"])
        if native_decode_blocks is not None:
            keys, values, bad, why = native_decode_blocks(
                data, self._blocks[first:first + int(rec["block_count"])], offset,
                self.kind == KIND_INCREMENTAL)
            if bad is not None:
                raise CorruptCheckpointError(
                    f"checkpoint data file {self.name}: {where} block {first + bad}: {why}")
            return keys, values
        keys_parts, value_parts = [], []
        for b in range(first, first + int(rec["block_count"])):
            blk = self._blocks[b]
            stored = data.slice(int(blk["offset"]) - offset, int(blk["stored_length"]))
            k, v = decode_stored_block(
                stored, int(blk["raw_length"]), int(blk["entries"]), int(blk["xxh64"]),
                f"checkpoint data file {self.name}: {where} block {b}",
                has_validity=self.kind == KIND_INCREMENTAL, codec=int(blk["codec"]))
            keys_parts.append(k)
            value_parts.append(v)
        if len(keys_parts) == 1:
            return keys_parts[0], value_parts[0]
        return pa.concat_arrays(keys_parts), pa.concat_arrays(value_parts)

    def _rows_of(self, state: str, start: int, end: int) -> np.ndarray:
        """The key-group index rows of ``state`` for key groups ``[start, end]``, in key-group
        order (empty for a state the file does not hold)."""
        try:
            si = self.state_names.index(state)
        except ValueError:
            return self._index_rows[:0]
        rows = self._index_rows
        return rows[(rows["state"] == si) & (rows["key_group"] >= start)
                    & (rows["key_group"] <= end)]

    def raw_bytes(self, state: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """``(key_groups, raw_bytes)`` (int64 arrays, ascending key groups): the uncompressed
        block bytes of ``state`` per non-empty key group in ``[start, end]`` -- what decoding
        them allocates, an upper bound of their keys' plus values' bytes."""
        rows = self._rows_of(state, start, end)
        csum = np.concatenate(([0], np.cumsum(self._blocks["raw_length"].astype(np.int64))))
        first = rows["first_block"].astype(np.int64)
        return (rows["key_group"].astype(np.int64),
                csum[first + rows["block_count"].astype(np.int64)] - csum[first])

    def stored_sizes(self, state: str, start: int, end: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(key_groups, stored_bytes, entries)`` (int64 arrays, ascending key groups) of
        ``state`` per non-empty key group in ``[start, end]``, from the key-group index (nothing
        decoded): the bytes of the key group's blocks in this file (compressed, as stored) and
        its stored entries (tombstones included, the file's own layout)."""
        rows = self._rows_of(state, start, end)
        return (rows["key_group"].astype(np.int64), rows["length"].astype(np.int64),
                rows["entries"].astype(np.int64))

    def entries_range(self, state: str, start: int, end: int
                      ) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        """``(keys, values)`` of ``state`` in key groups ``[start, end]``: what :meth:`entries`
        returns for each of them, concatenated in key-group order (so still sorted by key bytes:
        the key-group prefix is big-endian), decoded in one native call over the blocks of all
        of them (without the native module: key group by key group). Arrow binary arrays hold
        at most 2 GiB of keys or values; a range holding more raises CorruptCheckpointError like
        a key group that does (callers split by :meth:`raw_bytes`). Other errors as
        :meth:`entries`."""
        keys, values = self._entries_range(state, start, end)
        return self._as_entries(state, f"state {state!r} key groups {start}..{end}", keys,
                                values)

    def _entries_range(self, state: str, start: int, end: int
                       ) -> tuple[pa.BinaryArray, pa.BinaryArray]:
        rows = self._rows_of(state, start, end)
        if not len(rows):
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        where = f"state {state!r} key groups {start}..{end}"
        if native_decode_blocks is None:
            parts = [self.stored_entries(state, int(kg)) for kg in rows["key_group"]]
            return (pa.concat_arrays([k for k, _ in parts]),
                    pa.concat_arrays([v for _, v in parts]))
        lo = int(rows["offset"].min())
        hi = int((rows["offset"] + rows["length"]).max())
        data = self._range(lo, hi - lo, where)
        picks = np.concatenate([np.arange(int(f), int(f) + int(c), dtype=np.int64)
                                for f, c in zip(rows["first_block"], rows["block_count"])])
        blocks = self._blocks[picks]
        keys, values, bad, why = native_decode_blocks(data, blocks, lo,
                                                      self.kind == KIND_INCREMENTAL)
        if bad is not None:
            kg = int(np.repeat(rows["key_group"], rows["block_count"])[bad])
            raise CorruptCheckpointError(
                f"checkpoint data file {self.name}: state {state!r} key group {kg} block "
                f"{int(picks[bad])}: {why}")
        return keys, values

    def stored_blocks(self, state: str, start: int, end: int) -> StoredBlocks | None:
        """The stored blocks of ``state`` in key groups ``[start, end]``, read with one ranged
        read (or taken from :meth:`prefetch`'s bytes) and left undecoded, as a
        :class:`StoredBlocks`; None when the file holds none of them. Only for a state whose
        layout is current (:meth:`converts` false): an older layout's entries need converting
        after decoding. CheckpointIOError / CorruptCheckpointError when the read fails."""
        rows = self._rows_of(state, start, end)
        if not len(rows):
            return None
        lo = int(rows["offset"].min())
        hi = int((rows["offset"] + rows["length"]).max())
        data = self._range(lo, hi - lo, f"state {state!r} key groups {start}..{end}")
        counts = rows["block_count"].astype(np.int64)
        picks = np.concatenate([np.arange(int(f), int(f) + int(c), dtype=np.int64)
                                for f, c in zip(rows["first_block"], counts)])
        return StoredBlocks(self, state, data, lo, self._blocks[picks],
                            np.repeat(rows["key_group"].astype(np.int32), counts), picks)

    def converts(self, state: str) -> bool:
        """Whether :meth:`entries` converts ``state``'s stored entries from an older format's
        layout (a map or list state of an older format version)."""
        return self._whole_layout(state) is not None

    def verify_blocks(self, start: int, end: int) -> int:
        """Read the stored blocks of key groups ``[start, end]`` (all states) with one ranged
        read (or from :meth:`prefetch`'s bytes), check each block's XXH64 and decompress it,
        parsing and keeping nothing: the floor under decoding them (native, one thread, GIL
        released; without the native module ``xxhash`` and ``lz4.block``). Returns their
        decompressed bytes. CorruptCheckpointError naming the block on a bad one."""
        span = self._key_group_span(start, end)
        if span is None:
            return 0
        sel, lo, hi = span
        data = self._range(lo, hi - lo, f"key groups {start}..{end}")
        first = int(sel["first_block"].min())
        last = int((sel["first_block"].astype(np.int64) + sel["block_count"]).max())
        blocks = self._blocks[first:last]
        if native_verify_blocks is not None:
            raw, bad, why = native_verify_blocks(data, blocks, lo)
            if bad is None:
                return raw
            raise self._fail(f"key groups {start}..{end} block {first + bad}: {why}")
        raw = 0
        for b, blk in enumerate(blocks):
            stored = data.slice(int(blk["offset"]) - lo, int(blk["stored_length"])).to_pybytes()
            where = f"key groups {start}..{end} block {first + b}"
            if xxh64(stored) != int(blk["xxh64"]):
                raise self._fail(f"{where}: block checksum mismatch")
            try:
                raw += len(inflate_stored(stored, int(blk["raw_length"]), int(blk["codec"]),
                                          where))
            except CorruptCheckpointError as exc:
                raise self._fail(str(exc)) from exc
        return raw

    def close(self) -> None:
        """Close the underlying file and drop prefetched bytes (idempotent); waits for reads of
        a parallel prefetch still in flight."""
        self.drop_prefetched()
        if self._file is not None:
            self._file.close()
            self._file = None
