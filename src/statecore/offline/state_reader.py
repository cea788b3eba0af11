"""One state of one checkpoint version as Arrow record batches, in bounded memory.

What Flink's State Processor API (``SavepointReader.readKeyedState``) and Spark's ``statestore``
data source give their users: the committed state as data, read from the checkpoint without a
running job. The runs of the version are merged newest-wins per key group, as a restore merges
them (:meth:`statecore.checkpoint.CheckpointReader.entries_chunks`), a few key groups at a time,
so memory stays bounded by the chunk size whatever the state's size. Each entry becomes one row:
a value state's value, a reducing or aggregating state's accumulator, one row per list element
(``user_key`` = its sequence number, rows in list order) and one row per map entry
(``user_key`` = the user key). docs/formats.md defines the bytes decoded here.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import pyarrow as pa

from statecore import key_types
from statecore import serializers as S
from statecore.checkpoint import CheckpointStore
from statecore.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidInputError

__all__ = ["state_schema", "read_state"]

#: Rows per record batch :func:`read_state` yields by default.
DEFAULT_BATCH_ROWS = 65_536

_TTL_BYTES = 8


def _key_arrow_type(spec: str) -> pa.DataType:
    return key_types.key_type(spec).arrow_type


def _namespace_arrow_type(namespace_type: str) -> pa.DataType:
    return pa.null() if namespace_type == "void" else _key_arrow_type(namespace_type)


def _value_arrow_type(value_type: str) -> pa.DataType:
    # A pickled value stays its pickle bytes: reading state as data must not run code from it.
    t = S.value_serializer(value_type).arrow_type
    return pa.binary() if t is None else t


def state_schema(meta: dict, key_type: str) -> pa.Schema:
    """The schema of :func:`read_state`'s batches for the state of ``meta`` (a state meta of
    the checkpoint: ``kind``, ``namespace_type``, ``value_type``, ``user_key_type``, ``ttl``)
    with keys of ``key_type``: ``key_group`` int32; ``key`` the key type's Arrow type (a
    struct with fields ``f0``, ``f1``, ... for a multi-column key); ``namespace`` the
    namespace type's (null type for the void namespace); ``user_key`` the map's user key type,
    uint64 (the element's sequence number) for a list state, null type otherwise; ``value``
    the value type's Arrow type (binary holding the pickle bytes for ``pickle`` values);
    ``ttl_timestamp_ms`` int64 (the last-access timestamp of the TTL suffix, milliseconds;
    null without TTL). InvalidInputError for a timer state or an unknown kind."""
    kind = meta.get("kind")
    if kind == "timers":
        raise InvalidInputError(f"state {meta.get('name')!r} holds timers, not keyed state")
    if kind == "map":
        user_key = _key_arrow_type(meta["user_key_type"])
    elif kind == "list":
        user_key = pa.uint64()
    elif kind in ("value", "reducing", "aggregating"):
        user_key = pa.null()
    else:
        raise InvalidInputError(f"state {meta.get('name')!r} has unknown kind {kind!r}")
    return pa.schema([
        ("key_group", pa.int32()),
        ("key", _key_arrow_type(key_type)),
        ("namespace", _namespace_arrow_type(meta["namespace_type"])),
        ("user_key", user_key),
        ("value", _value_arrow_type(meta["value_type"])),
        ("ttl_timestamp_ms", pa.int64()),
    ])


class _Decoder:
    """Encoded (key, value) bytes of one state -> row values (docs/formats.md)."""

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

    def key(self, data: bytes):
        mp = self.max_parallelism
        if self.kind == "map":
            kg, key, ns, ukb = S.split_map_entry_key(data, mp, self.key_ser, self.ns_ser,
                                                     self.user_key_ser)
            return kg, key, ns, self.user_key_ser.deserialize(ukb)
        if self.kind == "list":
            kg, key, ns, seq = S.split_list_entry_key(data, mp, self.key_ser, self.ns_ser)
            return kg, key, ns, int.from_bytes(seq, "big")
        kg, key, ns, _ = S.decode_key(data, mp, self.key_ser, self.ns_ser)
        return kg, key, ns, None

    def value(self, data: bytes) -> Tuple[object, Optional[int]]:
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


def read_state(store, state_name: str, version: Optional[int] = None,
               key_group_range: Optional[Tuple[int, int]] = None,
               batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The entries of state ``state_name`` of checkpoint ``version`` (default: the latest) as
    record batches of :func:`state_schema`, at most ``batch_rows`` rows each, in key-group
    order and, within a key group, in encoded-key order (a list's elements in list order).

    ``store``: a :class:`~statecore.checkpoint.CheckpointStore` or its URI.
    ``key_group_range``: ``(start, end)`` inclusive, to read a part of the key groups (e.g. one
    task's share), clipped to the version's range. Expired TTL entries not yet cleaned up are
    read as stored (their ``ttl_timestamp_ms`` says so). Memory: the decoded runs of a few key
    groups at a time (``CheckpointReader.entries_chunks``), plus one batch.

    Raises, at the call: CheckpointNotFoundError for a root without that version,
    InvalidInputError for an unknown state, a timer state, a bad ``key_group_range`` or
    ``batch_rows``; while iterating: CorruptCheckpointError for a run that cannot be read or an
    entry that does not decode."""
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise InvalidInputError(f"batch_rows must be an int >= 1, got {batch_rows!r}")
    if not isinstance(store, CheckpointStore):
        store = CheckpointStore(store)
    if version is None:
        version = store.latest_version()
        if version is None:
            raise CheckpointNotFoundError(f"no committed checkpoint under {store.uri}")
    reader = store.open(version)
    try:
        metas = {m["name"]: m for m in reader.state_metas()}
        if state_name not in metas:
            raise InvalidInputError(f"checkpoint version {version} has no state {state_name!r} "
                                    f"(states: {sorted(metas)})")
        meta = metas[state_name]
        schema = state_schema(meta, reader.key_type)
        lo, hi = reader.key_group_range.start, reader.key_group_range.end
        if key_group_range is not None:
            try:
                start, end = (int(x) for x in key_group_range)
            except (TypeError, ValueError):
                raise InvalidInputError(
                    f"key_group_range must be (start, end), got {key_group_range!r}") from None
            if start > end:
                raise InvalidInputError(f"key_group_range {key_group_range!r} is empty")
            lo, hi = max(lo, start), min(hi, end)
    except BaseException:
        reader.release()
        raise
    return _batches(reader, meta, schema, lo, hi, batch_rows)


def _batches(reader, meta: dict, schema: pa.Schema, lo: int, hi: int,
             batch_rows: int) -> Iterator[pa.RecordBatch]:
    """:func:`read_state`'s batches; releases ``reader`` when done or closed."""
    name = meta["name"]
    decoder = _Decoder(meta, reader.key_type, reader.max_parallelism)
    rows: list = []
    try:
        for keys, values in (reader.entries_chunks(name, lo, hi) if lo <= hi else ()):
            for kb, vb in zip(keys.to_pylist(), values.to_pylist()):
                try:
                    kg, key, ns, uk = decoder.key(kb)
                    value, ts = decoder.value(vb)
                except InvalidInputError as exc:
                    raise CorruptCheckpointError(
                        f"checkpoint version {reader.version}: state {name!r}: entry "
                        f"{bytes(kb).hex()} does not decode: {exc}") from exc
                rows.append((kg, key, ns, uk, value, ts))
                if len(rows) == batch_rows:
                    yield _batch(rows, schema)
                    rows = []
        if rows:
            yield _batch(rows, schema)
    finally:
        reader.release()


def _batch(rows: list, schema: pa.Schema) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [_column(list(c), f.type) for c, f in zip(cols, schema)], schema=schema)
