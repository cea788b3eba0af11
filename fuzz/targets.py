"""The fuzz targets (see the package docstring): ``TARGETS = {name: function(bytes)}``.

A target raises only :class:`statecore.errors.StateError` for bad input; bytes that the harness
itself cannot turn into an input (an Arrow IPC stream pyarrow cannot read) are skipped.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow as pa

import statecore
from statecore import serializers as S
from statecore.checkpoint import blocks
from statecore.checkpoint import format as fmt
from statecore.checkpoint.format import DataFileReader
from statecore.checkpoint.manifests import describe_manifest, parse_manifest, signed_manifest
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import StateError
from statecore.key_groups import KeyGroupRange

__all__ = ["TARGETS", "run_one", "with_valid_checksums"]

#: At most this many key groups of a data file are read per input (a forged footer may claim
#: 32768 of them).
MAX_KEY_GROUPS = 64


def with_valid_checksums(data: bytes) -> bytes:
    """``data`` (a mutated data file) with its block, footer and trailer checksums recomputed
    where its trailer and footer still locate them, so that mutations reach the parsers behind
    the checksums."""
    b = bytearray(data)
    if len(b) < fmt.HEADER_SIZE + fmt.TRAILER_SIZE:
        return data
    t_at = len(b) - fmt.TRAILER_SIZE
    f_off, f_len, f_sum, version, flags, _, magic = fmt.TRAILER.unpack_from(b, t_at)
    if fmt.HEADER_SIZE <= f_off and f_off + f_len == t_at and f_len >= 20:
        footer = bytearray(b[f_off:t_at])
        (mlen,) = struct.unpack_from("<I", footer, 0)
        if 4 + mlen + 16 <= len(footer):
            n_blocks, n_index = struct.unpack_from("<QQ", footer, 4 + mlen)
            at = 4 + mlen + 16
            for i in range(min(n_blocks, (len(footer) - at) // fmt.BLOCK_DTYPE.itemsize)):
                rec = at + i * fmt.BLOCK_DTYPE.itemsize
                off, slen = struct.unpack_from("<QI", footer, rec)
                if fmt.HEADER_SIZE <= off and off + slen <= f_off:
                    struct.pack_into("<Q", footer, rec + 24, fmt.xxh64(bytes(b[off:off + slen])))
            # Format 6: the filter table follows the key-group index.
            at += n_blocks * fmt.BLOCK_DTYPE.itemsize + n_index * fmt.INDEX_DTYPE.itemsize
            fsize = fmt.FILTER_DTYPE.itemsize
            for i in range(min(n_index, max(0, len(footer) - at) // fsize)
                           if version >= fmt.LOOKUP_FORMAT_VERSION else 0):
                rec = at + i * fsize
                off, flen = struct.unpack_from("<QI", footer, rec)
                if fmt.HEADER_SIZE <= off and off + flen <= f_off:
                    struct.pack_into("<Q", footer, rec + 16, fmt.xxh64(bytes(b[off:off + flen])))
        b[f_off:t_at] = footer
        f_sum = fmt.xxh64(bytes(footer))
    head = fmt.TRAILER.pack(f_off, f_len, f_sum, version, flags, 0, magic)[:32]
    fmt.TRAILER.pack_into(b, t_at, f_off, f_len, f_sum, version, flags, fmt.xxh64(head), magic)
    return bytes(b)


def data_file(data: bytes) -> None:
    """A data file (``.sckp``, docs/formats.md): open it and read every (state, key group);
    byte 0 odd: the rest gets valid checksums first (:func:`with_valid_checksums`)."""
    if not data:
        return
    data = with_valid_checksums(data[1:]) if data[0] & 1 else data[1:]
    reader = DataFileReader(pa.BufferReader(data), "fuzz.sckp", expected_size=len(data))
    try:
        start = reader.key_group_start
        end = min(reader.key_group_end, start + MAX_KEY_GROUPS - 1)
        for name in reader.state_names:
            for kg in range(start, end + 1):
                reader.entries(name, kg)
            reader.entries_range(name, start, end)
        reader.verify_filters()
        tables = reader.lookup_tables()
        if tables is not None:
            # Every key of a (state, key group) passes its Bloom filter; a forged filter may
            # fail that, which is only a wrong answer, never a crash.
            filters, key_offsets, key_data = tables
            for name in reader.state_names:
                rows, pos = reader.index_rows(name)
                for r, p in zip(rows[:MAX_KEY_GROUPS], pos[:MAX_KEY_GROUPS]):
                    keys, _ = reader.stored_entries(name, int(r["key_group"]))
                    f = filters[p]
                    lo = int(f["offset"])
                    filt = reader.read_range(lo, int(f["length"]), "filter")
                    blocks.bloom_probe(filt, int(f["hashes"]), blocks.key_hashes(keys))
    finally:
        reader.close()


def block(data: bytes) -> None:
    """An uncompressed block payload (docs/formats.md "Block payload"; byte 0 odd: of an
    incremental file), compressed and checksummed as a writer would, decoded by the Python
    reader and the native one: both must agree (the same entries, or both refuse it)."""
    if not data:
        return
    has_validity, payload = bool(data[0] & 1), data[1:]
    entries = struct.unpack_from("<I", payload, 0)[0] if len(payload) >= 4 else 0
    stored = blocks.compress_block(payload)
    row = np.zeros(1, fmt.BLOCK_DTYPE)
    row[0] = (0, len(stored), len(payload), entries, 0, blocks.xxh64(stored))
    try:
        want = blocks.decode_stored_block(stored, len(payload), entries, blocks.xxh64(stored),
                                          "fuzz", has_validity=has_validity)
    except StateError:
        want = None
    if blocks.native_decode_blocks is None:
        return
    keys, values, _, reason = blocks.native_decode_blocks(stored, row, 0, has_validity)
    got = None if reason is not None else (keys, values)
    if (want is None) != (got is None) or (want is not None and (
            not want[0].equals(got[0]) or not want[1].equals(got[1]))):
        raise AssertionError(f"block decoders disagree: python {want!r}, native {got!r} "
                             f"({reason})")


def _resigned_manifest(data: bytes) -> bytes | None:
    """``data`` (a mutated manifest) with its ``checksum_xxh64`` recomputed when it is still a
    JSON object, so that mutations reach the schema checks behind the checksum; None when it is
    not one."""
    try:
        doc = json.loads(data.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    body = {k: v for k, v in doc.items() if k != "checksum_xxh64"}
    try:
        return json.dumps(signed_manifest(body)).encode("ascii")
    except (TypeError, ValueError):
        return None


def manifest(data: bytes) -> None:
    """A manifest of version 1 (docs/formats.md "Checkpoint store and manifests"), as given and
    re-signed."""
    for raw in (data, _resigned_manifest(data)):
        if raw is None:
            continue
        try:
            body = parse_manifest(raw, 1, "fuzz/manifest-1.json")
        except StateError:
            continue
        describe_manifest(body, "fuzz")


#: Descriptor factories (of a state name) of the states the ``stored`` target restores into.
STATES = [
    lambda n: ValueStateDescriptor(n, "string"),
    lambda n: ValueStateDescriptor(n, "int64"),
    lambda n: ValueStateDescriptor(n, "float64"),
    lambda n: ListStateDescriptor(n, "string"),
    lambda n: ListStateDescriptor(n, "int64"),
    lambda n: MapStateDescriptor(n, "string", "int64"),
    lambda n: MapStateDescriptor(n, "int64", "string"),
    lambda n: ValueStateDescriptor(n, "int64").enable_time_to_live(
        statecore.StateTtlConfig(1000)),
    lambda n: ListStateDescriptor(n, "string").enable_time_to_live(
        statecore.StateTtlConfig(1000)),
]


class _OneEntry:
    """A StateSnapshot holding one entry (``key`` -> ``value``) of one state."""

    def __init__(self, backend, meta: dict, key: bytes, value: bytes):
        self.max_parallelism = backend.max_parallelism
        self.key_group_range = KeyGroupRange(0, backend.max_parallelism - 1)
        self.key_type = backend.key_type
        self.assigner = backend.assigner
        self.meta, self.key, self.value = meta, key, value

    def state_metas(self):
        return [dict(self.meta)]

    def entries(self, name, kg):
        if name == self.meta["name"] and self.key[:1] == bytes([kg]):
            return pa.array([self.key], pa.binary()), pa.array([self.value], pa.binary())
        return pa.array([], pa.binary()), pa.array([], pa.binary())

    def release(self):
        pass


def stored(data: bytes) -> None:
    """A stored entry restored into both backends and read back per record and per batch:
    byte 0 picks the state (:data:`STATES`), bytes 1-2 the length of the encoded key (the rest
    of the key bytes follow, then the value bytes)."""
    if len(data) < 3:
        return
    make = STATES[data[0] % len(STATES)]
    (klen,) = struct.unpack_from("<H", data, 1)
    key, value = data[3:3 + klen], data[3 + klen:]
    for kind in ("python", "native"):
        b = statecore.create_backend(kind, key_type="string", max_parallelism=8)
        try:
            descriptor = make("s")
            st = b.get_state(descriptor)
            b.restore(_OneEntry(b, dict(descriptor.meta(), namespace_type="void"), key, value))
            for k in b.keys("s"):
                b.set_current_key(k)
                if isinstance(descriptor, MapStateDescriptor):
                    st.items()
                    st.is_empty()
                elif isinstance(descriptor, ListStateDescriptor):
                    st.get()
                else:
                    st.value()
                if isinstance(descriptor, MapStateDescriptor):
                    continue
                st.get_batch(pa.array([k]))
            snap = b.snapshot()
            snap.release()
        finally:
            b.dispose()


#: (kind, value type, user key type) of the operator states the ``operator_state`` target
#: restores (no pickle: unpickling forged bytes runs code).
OPERATOR_STATES = [("operator_list", "int64", None), ("operator_union_list", "string", None),
                   ("operator_list", "fixed_size_binary[2]", None),
                   ("operator_broadcast", "float64", "string"),
                   ("operator_broadcast", "binary", "int64")]


class _OperatorEntries:
    """A snapshot-like holding the entries of one operator state in key group 0."""

    max_parallelism = 8
    key_group_range = KeyGroupRange(0, 7)
    key_type = "string"
    assigner = "spark"

    def __init__(self, meta: dict, keys: list, values: list):
        self.meta = meta
        pairs = sorted(zip(keys, values))
        self.keys = pa.array([k for k, _ in pairs], pa.binary())
        self.values = pa.array([v for _, v in pairs], pa.binary())

    def state_metas(self):
        return [dict(self.meta)]

    def entries(self, name, kg):
        if name == self.meta["name"] and kg == 0:
            return self.keys, self.values
        return pa.array([], pa.binary()), pa.array([], pa.binary())

    def release(self):
        pass


def operator_state(data: bytes) -> None:
    """Entries of one operator state (docs/formats.md "Operator state") restored into both
    backends' operator state, read back and snapshotted: byte 0 picks the state
    (:data:`OPERATOR_STATES`), then entries as ``u16 key length | key | u16 value length |
    value`` (little-endian), sorted by key as a snapshot lists them."""
    if not data:
        return
    kind, value_type, user_key_type = OPERATOR_STATES[data[0] % len(OPERATOR_STATES)]
    keys, values, pos = [], [], 1
    while pos + 4 <= len(data):
        (klen,) = struct.unpack_from("<H", data, pos)
        key = data[pos + 2:pos + 2 + klen]
        pos += 2 + klen
        if pos + 2 > len(data):
            break
        (vlen,) = struct.unpack_from("<H", data, pos)
        keys.append(key)
        values.append(data[pos + 2:pos + 2 + vlen])
        pos += 2 + vlen
    if len(set(keys)) != len(keys):
        return  # a snapshot's keys are unique; the harness cannot make an input of these
    meta = {"name": "__operator__.o", "kind": kind, "namespace_type": "void",
            "value_type": value_type}
    if user_key_type is not None:
        meta["user_key_type"] = user_key_type
    snap = _OperatorEntries(meta, keys, values)
    for backend in ("python", "native"):
        b = statecore.create_backend(backend, key_type="string", max_parallelism=8)
        try:
            b.operator_state.restore(snap, 0, 1)
            if kind == "operator_broadcast":
                b.operator_state.get_broadcast_state(
                    MapStateDescriptor("o", user_key_type, value_type)).items()
            elif kind == "operator_list":
                b.operator_state.get_list_state("o", value_type).get()
            else:
                b.operator_state.get_union_list_state("o", value_type).get()
            b.snapshot().release()
        finally:
            b.dispose()


def encoded_key(data: bytes) -> None:
    """Encoded keys and timer keys decoded with several key and namespace types."""
    for key_ser, ns_ser in (("string", "void"), ("int64", "int64"), ("binary", "string"),
                            ("struct<int32,string>", "void")):
        for mp in (8, 4096):
            try:
                S.decode_key(data, mp, key_ser, ns_ser)
            except StateError:
                pass
            try:
                S.decode_timer_key(data, mp, key_ser, ns_ser, with_domain=True)
            except StateError:
                pass


def arrow_batch(data: bytes) -> None:
    """An Arrow IPC stream whose columns go through the batch API of both backends as keys
    and values."""
    try:
        table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
        columns = [table.column(i) for i in range(min(4, table.num_columns))]
    except (pa.ArrowException, ValueError, OSError, OverflowError, IndexError):
        return  # the harness cannot make an input of these bytes (UnicodeDecodeError included)
    for kind in ("python", "native"):
        for key_type in ("string", "int64"):
            b = statecore.create_backend(kind, key_type=key_type, max_parallelism=8)
            try:
                states = [b.get_state(ValueStateDescriptor(f"v{t}", t))
                          for t in ("int64", "string", "float64")]
                for keys in columns:
                    for values in columns:
                        if len(values) != len(keys):
                            continue
                        for st in states:
                            try:
                                st.put_batch(keys, values)
                            except StateError:
                                pass
                    try:
                        states[0].get_batch(keys)
                    except StateError:
                        pass
            finally:
                b.dispose()


TARGETS = {
    "data_file": data_file,
    "block": block,
    "manifest": manifest,
    "stored": stored,
    "encoded_key": encoded_key,
    "arrow_batch": arrow_batch,
    "operator_state": operator_state,
}


def run_one(target: str, data: bytes) -> None:
    """Run ``target`` on ``data``; StateError (the package's clear error) is a pass, anything
    else propagates."""
    try:
        TARGETS[target](data)
    except StateError:
        pass
