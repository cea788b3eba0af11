"""Decoding the entries of one state of a checkpoint into Arrow columns: the schema of the
offline readers' batches (:func:`state_schema`), an entry decoder (:class:`EntryDecoder`) and
rows to record batches (:func:`rows_to_batch`). docs/formats.md defines the bytes decoded here.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import pyarrow as pa

from statecore import key_types
from statecore import serializers as S
from statecore.errors import InvalidInputError

__all__ = ["state_schema", "EntryDecoder", "rows_to_batch", "key_arrow_type",
           "value_arrow_type"]

_TTL_BYTES = 8


def key_arrow_type(spec: str) -> pa.DataType:
    """The Arrow type of keys (or user keys, namespaces) of key type ``spec``."""
    return key_types.key_type(spec).arrow_type


def _namespace_arrow_type(namespace_type: str) -> pa.DataType:
    return pa.null() if namespace_type == "void" else key_arrow_type(namespace_type)


def value_arrow_type(value_type: str) -> pa.DataType:
    """The Arrow type the offline readers give values of ``value_type`` (binary: pickle
    bytes)."""
    # A pickled value stays its pickle bytes: reading state as data must not run code from it.
    t = S.value_serializer(value_type).arrow_type
    return pa.binary() if t is None else t


def state_schema(meta: dict, key_type: str) -> pa.Schema:
    """The schema of :func:`read_state`'s batches for the state of ``meta`` (a state meta of
    the checkpoint: ``kind``, ``namespace_type``, ``value_type``, ``user_key_type``, ``ttl``)
    with keys of ``key_type``: ``key_group`` int32; ``key`` the key type's Arrow type (a
    struct with fields ``f0``, ``f1``, ... for a multi-column key); ``namespace`` the
    namespace type's (null type for the void namespace); ``user_key`` the map's user key type,
    uint64 (the element's position in its list, 0 first) for a list state, null type
    otherwise; ``value``
    the value type's Arrow type (binary holding the pickle bytes for ``pickle`` values);
    ``ttl_timestamp_ms`` int64 (the last-access timestamp of the TTL suffix, milliseconds;
    null without TTL). InvalidInputError for a timer state or an unknown kind."""
    kind = meta.get("kind")
    if kind == "timers":
        raise InvalidInputError(f"state {meta.get('name')!r} holds timers, not keyed state")
    if kind == "map":
        user_key = key_arrow_type(meta["user_key_type"])
    elif kind == "list":
        user_key = pa.uint64()
    elif kind in ("value", "reducing", "aggregating"):
        user_key = pa.null()
    else:
        raise InvalidInputError(f"state {meta.get('name')!r} has unknown kind {kind!r}")
    return pa.schema([
        ("key_group", pa.int32()),
        ("key", key_arrow_type(key_type)),
        ("namespace", _namespace_arrow_type(meta["namespace_type"])),
        ("user_key", user_key),
        ("value", value_arrow_type(meta["value_type"])),
        ("ttl_timestamp_ms", pa.int64()),
    ])


class EntryDecoder:
    """Encoded entries of the state of ``meta`` (keys of ``key_type``, key groups of
    ``max_parallelism``) to rows: :meth:`entries` turns sorted ``(key bytes, value bytes)``
    pairs into ``(key_group, key, namespace, user_key, value bytes)`` -- a list chunk
    (docs/formats.md "List state") into one row per element, ``user_key`` its position in the
    list (0 first, counted over the list's chunks in key order) -- and :meth:`value` decodes
    value bytes into ``(value, ttl_timestamp_ms or None)``. Both raise InvalidInputError,
    naming the entry, for bytes that do not decode."""

    def __init__(self, meta: dict, key_type: str, max_parallelism: int):
        self.kind = meta["kind"]
        self.max_parallelism = max_parallelism
        self.key_ser = S.key_serializer(key_type)
        self.ns_ser = S.key_serializer(meta["namespace_type"])
        self.user_key_ser = (S.key_serializer(meta["user_key_type"]) if self.kind == "map"
                             else None)
        self.value_ser = S.value_serializer(meta["value_type"])
        self.pickled = self.value_ser.name == "pickle"
        self.ttl = bool(meta.get("ttl"))

    def entries(self, keys, values) -> Iterator[tuple]:
        """Rows ``(key_group, key, namespace, user_key, value bytes)`` of the sorted pairs
        ``keys``/``values`` (sequences of bytes; every chunk of a list among them, as the
        entries of whole key groups hold them)."""
        mp = self.max_parallelism
        current, pos = None, 0
        for kb, vb in zip(keys, values):
            kb = bytes(kb)
            try:
                if self.kind == "map":
                    kg, key, ns, ukb = S.split_map_entry_key(kb, mp, self.key_ser, self.ns_ser,
                                                             self.user_key_ser)
                    yield kg, key, ns, self.user_key_ser.deserialize(ukb), vb
                elif self.kind == "list":
                    kg, key, ns, _ = S.split_list_entry_key(kb, mp, self.key_ser, self.ns_ser)
                    prefix = kb[:-S.LIST_SEQ_BYTES]
                    if prefix != current:
                        current, pos = prefix, 0
                    _, elements = S.expand_whole_list_entries(
                        [b""], [vb], self.value_ser.fixed_width, self.ttl)
                    for element in elements:
                        yield kg, key, ns, pos, element
                        pos += 1
                else:
                    kg, key, ns, _ = S.decode_key(kb, mp, self.key_ser, self.ns_ser)
                    yield kg, key, ns, None, vb
            except InvalidInputError as exc:
                raise InvalidInputError(f"entry {kb.hex()}: {exc}") from exc

    def value(self, data: bytes) -> Tuple[object, Optional[int]]:
        """``(value, ttl_timestamp_ms or None)`` of a row's value bytes (a pickle value as its
        bytes)."""
        ts = None
        if self.ttl:
            if len(data) < _TTL_BYTES:
                raise InvalidInputError(
                    f"TTL value of {len(data)} bytes lacks its {_TTL_BYTES}-byte timestamp")
            ts = int.from_bytes(data[-_TTL_BYTES:], "big", signed=True)
            data = data[:-_TTL_BYTES]
        return (bytes(data) if self.pickled else self.value_ser.deserialize(data)), ts


def _column(values: list, t: pa.DataType) -> pa.Array:
    if pa.types.is_struct(t):
        names = [f.name for f in t]
        values = [None if v is None else dict(zip(names, v)) for v in values]
    return pa.array(values, type=t)


def rows_to_batch(rows: list, schema: pa.Schema) -> pa.RecordBatch:
    """A record batch of ``schema`` from ``rows`` (tuples in the schema's column order)."""
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [_column(list(c), f.type) for c, f in zip(cols, schema)], schema=schema)
