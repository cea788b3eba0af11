"""Data files as older versions or buggy writers made them, for tests: the bytes a snapshot
writes, and those bytes with the footer's metadata rewritten and every checksum recomputed
(docs/formats.md "Data file": footer = u32 meta length | meta JSON | tables; the trailer's first
32 bytes are checksummed into it)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from statecore.checkpoint import format as fmt
from statecore.key_groups import KeyGroupRange

__all__ = ["data_file_bytes", "rewrite_footer_meta", "data_file_of_format", "RowsSnapshot",
           "ReaderSnapshot", "DataFileLayout"]


class RowsSnapshot:
    """A full (or ``incremental``) snapshot of int64 keys (Spark assigner) over given rows of one
    state: ``rows[kg] = {encoded key: stored value bytes, or None for a tombstone}``, the state
    described by ``meta``; for writing data files of layouts no current backend writes."""

    def __init__(self, rows, meta, max_parallelism, incremental=False):
        self.max_parallelism = max_parallelism
        self.key_group_range = KeyGroupRange(0, max_parallelism - 1)
        self.key_type = "int64"
        self.assigner = "spark"
        self.incremental = incremental
        self.snapshot_id = 1
        self.rows = rows
        self.meta = meta

    def state_metas(self):
        return [dict(self.meta)]

    def entries(self, name, kg):
        items = sorted(self.rows.get(kg, {}).items())
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self):
        pass


class ReaderSnapshot:
    """A full snapshot of int64 keys (Spark assigner) read through ``reader`` (a
    ``DataFileReader``): what a restore of that file reads."""

    def __init__(self, reader, max_parallelism):
        self.reader = reader
        self.max_parallelism = max_parallelism
        self.key_group_range = KeyGroupRange(0, max_parallelism - 1)
        self.key_type = "int64"
        self.assigner = "spark"

    def state_metas(self):
        return self.reader.state_metas()

    def entries(self, name, kg):
        return self.reader.entries(name, kg)


def data_file_bytes(snap, version: int, writer: str = "p0"):
    """``(bytes, WriteSummary)`` of the data file ``fmt.write_data_file`` writes for ``snap``."""

    class Out:
        def __init__(self):
            self.parts = []

        def write(self, b):
            self.parts.append(bytes(b))

    out = Out()
    summary = fmt.write_data_file(out, snap, version=version, writer=writer)
    return b"".join(out.parts), summary


def rewrite_footer_meta(raw: bytes, edit, trailer_version: int = fmt.FORMAT_VERSION):
    """``(bytes, footer xxh64)``: data file ``raw`` with its footer metadata (a dict) passed
    through ``edit`` (which changes it in place) and the trailer saying ``trailer_version``,
    footer and trailer checksums recomputed: what a writer of that version, or a buggy one,
    would have written."""
    foff, flen = struct.unpack_from("<QQ", raw, len(raw) - fmt.TRAILER_SIZE)
    footer = raw[foff:foff + flen]
    (mlen,) = struct.unpack_from("<I", footer, 0)
    meta = json.loads(footer[4:4 + mlen])
    edit(meta)
    mb = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    footer = struct.pack("<I", len(mb)) + mb + footer[4 + mlen:]
    fsum = fmt.xxh64(footer)
    head = fmt.TRAILER.pack(foff, len(footer), fsum, trailer_version, 0, 0, fmt.MAGIC)[:32]
    trailer = fmt.TRAILER.pack(foff, len(footer), fsum, trailer_version, 0, fmt.xxh64(head),
                               fmt.MAGIC)
    return raw[:foff] + footer + trailer, fsum


def without_lookup_tables(raw: bytes) -> bytes:
    """A format-6 data file ``raw`` without its Bloom filters and block keys (docs/formats.md
    "Filters and block keys"): the layout of formats 2 to 5, with the trailer still saying 6
    (footer and trailer checksums recomputed)."""
    foff, flen = struct.unpack_from("<QQ", raw, len(raw) - fmt.TRAILER_SIZE)
    footer = raw[foff:foff + flen]
    (mlen,) = struct.unpack_from("<I", footer, 0)
    n_blocks, n_index = struct.unpack_from("<QQ", footer, 4 + mlen)
    fixed = 4 + mlen + 16 + n_blocks * fmt.BLOCK_DTYPE.itemsize + n_index * fmt.INDEX_DTYPE.itemsize
    filters = np.frombuffer(footer, fmt.FILTER_DTYPE, count=n_index, offset=fixed)
    data_end = foff - int(filters["length"].astype(np.int64).sum())
    footer = footer[:fixed]
    fsum = fmt.xxh64(footer)
    head = fmt.TRAILER.pack(data_end, len(footer), fsum, 6, 0, 0, fmt.MAGIC)[:32]
    return (raw[:data_end] + footer
            + fmt.TRAILER.pack(data_end, len(footer), fsum, 6, 0, fmt.xxh64(head), fmt.MAGIC))


def data_file_of_format(snap, format_version: int) -> bytes:
    """The bytes of a data file of ``snap`` as data file format ``format_version`` wrote it (the
    trailer's and the meta's version; the layout of blocks and footer is the same from format 2
    to 5, what changed is how states lay out their entries; format 6 added the filters and block
    keys, which older formats lack)."""
    raw, _ = data_file_bytes(snap, 1)
    if format_version < fmt.LOOKUP_FORMAT_VERSION:
        raw = without_lookup_tables(raw)

        def edit(meta):
            meta.update(format_version=format_version)
            meta.pop("bloom_bits_per_key", None)
    else:
        def edit(meta):
            meta.update(format_version=format_version)
    return rewrite_footer_meta(raw, edit, trailer_version=format_version)[0]


class DataFileLayout:
    """Where the parts of the data file at ``path`` (a local file, read once) lie: ``blocks``
    and ``index`` (copies of its block table and key-group index rows), ``states`` (names),
    ``size``, ``filters_at`` (the first byte after the blocks: the Bloom filters of format 6),
    ``footer_at``. For tests that damage a byte and check what the error names."""

    def __init__(self, path):
        with pafs.LocalFileSystem().open_input_file(str(path)) as f:
            r = fmt.DataFileReader(f, str(path))
            try:
                self.blocks = r._blocks.copy()
                self.index = r._index_rows.copy()
                self.states = list(r.state_names)
                self.size = r.size
                self.footer_at = r.size - fmt.TRAILER_SIZE - r.footer_length
            finally:
                r.close()
        self.filters_at = int(self.blocks[-1]["offset"]) + int(self.blocks[-1]["stored_length"])
        self._owners = {}  # block number -> (state name, key group)
        for rec in self.index:
            first = int(rec["first_block"])
            for b in range(first, first + int(rec["block_count"])):
                self._owners[b] = (self.states[int(rec["state"])], int(rec["key_group"]))
        self._starts = self.blocks["offset"].astype(np.int64)

    def block_at(self, pos: int):
        """``(state name, key group, block number)`` of the block whose stored bytes hold byte
        ``pos``, or None when no block does."""
        b = int(np.searchsorted(self._starts, pos, "right")) - 1
        if b < 0 or pos >= int(self._starts[b]) + int(self.blocks[b]["stored_length"]):
            return None
        return self._owners[b] + (b,)

    def assert_names_the_damage(self, msg: str, pos: int) -> None:
        """Assert that ``msg``, the error of a read of the file with byte ``pos`` damaged (not
        in a Bloom filter), names what holds it: the block's state, key group and number and
        its checksum; the header's magic; the trailer or footer."""
        owner = self.block_at(pos)
        if owner is not None:
            name, kg, b = owner
            assert f"state {name!r} key group {kg} block {b}" in msg, (pos, msg)
            assert "checksum" in msg
        elif pos < fmt.HEADER_SIZE:
            assert "magic" in msg
        elif pos >= self.size - fmt.TRAILER_SIZE:
            assert "trailer" in msg or "footer" in msg, (pos, msg)
        else:
            assert "footer" in msg, (pos, msg)
