"""Helpers shared by the topic modules of the backend conformance suite (and usable by any test):
snapshot dumps and their incremental merge, a tampered snapshot, an aggregate function, Arrow
input wrappers and seeded random Arrow arrays.

Nothing here knows a particular backend; every function takes a backend or a snapshot that
follows :class:`statecore.backends.base.KeyedStateBackend`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from statecore.descriptors import AggregateFunction

__all__ = [
    "AverageAggregate", "StreamOnly", "ArrayOnly", "TamperedSnapshot",
    "snapshot_dump", "dump_backend", "merge_incremental", "metas_by_name",
    "chunked", "sliced", "random_values", "column_in_form",
    "LIST_TYPES", "MAP_TYPES",
]

#: Element types of the list states the collection batch tests exercise (every typed one).
LIST_TYPES = ["int64", "int32", "uint64", "float64", "bool", "string", "binary", "timestamp[ms]",
              "fixed_size_binary[3]"]
#: (user key type, value type) pairs of the map states the collection batch tests exercise:
#: every user key type but pickle (``descriptors.USER_KEY_TYPES``) and every typed value type.
MAP_TYPES = [("int64", "int64"), ("string", "binary"), ("int32", "float64"), ("binary", "string"),
             ("int64", "bool"), ("string", "fixed_size_binary[2]"), ("int32", "uint64"),
             ("binary", "timestamp[us]"), ("int64", "int32")]


class AverageAggregate(AggregateFunction):
    """Mean of the added numbers; accumulator ``[sum, count]`` (mutated in place by ``add``);
    ``None`` before the first value."""

    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        acc[0] += value
        acc[1] += 1
        return acc

    def get_result(self, acc):
        return acc[0] / acc[1] if acc[1] else None


class StreamOnly:
    """Exposes only ``__arrow_c_stream__`` of ``obj`` (what e.g. a polars or nanoarrow object
    offers), so tests do not lean on pyarrow's own types."""

    def __init__(self, obj):
        self.obj = obj

    def __arrow_c_stream__(self, requested_schema=None):
        return self.obj.__arrow_c_stream__(requested_schema)


class ArrayOnly:
    """Exposes only ``__arrow_c_array__`` of ``obj`` (the Arrow C data interface)."""

    def __init__(self, obj):
        self.obj = obj

    def __arrow_c_array__(self, requested_schema=None):
        return self.obj.__arrow_c_array__(requested_schema)


class TamperedSnapshot:
    """A snapshot that hands out ``mangle(keys, values)`` instead of the non-empty entries of
    state ``state`` of ``inner`` (for tests of restores of malformed snapshots). ``mangle``
    takes and returns the two binary Arrow arrays of one key group."""

    def __init__(self, inner, state: str, mangle):
        self._inner, self._state, self._mangle = inner, state, mangle
        for a in ("max_parallelism", "key_group_range", "key_type", "assigner"):
            setattr(self, a, getattr(inner, a))

    def state_metas(self):
        return self._inner.state_metas()

    def entries(self, name, kg):
        keys, vals = self._inner.entries(name, kg)
        return self._mangle(keys, vals) if name == self._state and len(keys) else (keys, vals)

    def release(self):
        pass


def snapshot_dump(snap, key_groups=None) -> dict:
    """``{state_name: {key_group: [(key_bytes, value_bytes), ...]}}`` of every non-empty key group
    of ``snap`` (or of ``key_groups``); rows in the snapshot's order (sorted by key bytes). The
    ``__timers__`` pseudo-state is included. Raises StateError once ``snap`` is released."""
    out = {}
    kgs = list(snap.key_group_range) if key_groups is None else list(key_groups)
    for meta in snap.state_metas():
        per = {}
        for kg in kgs:
            keys, vals = snap.entries(meta["name"], kg)
            if len(keys):
                per[kg] = list(zip(keys.to_pylist(), vals.to_pylist()))
        out[meta["name"]] = per
    return out


def dump_backend(backend) -> dict:
    """:func:`snapshot_dump` of a full snapshot of ``backend`` taken now (and released again)."""
    snap = backend.snapshot()
    try:
        return snapshot_dump(snap)
    finally:
        snap.release()


def merge_incremental(base: dict | None, incremental: dict) -> dict:
    """What a restore of "base run + incremental run" yields, as a :func:`snapshot_dump`: per state
    and key group, the base's entries overwritten by the incremental's (newest wins), a ``None``
    value (tombstone) deleting the key; the ``__timers__`` pseudo-state is taken whole from the
    incremental dump (timers are complete in every snapshot). ``base`` None = the empty state.
    A test helper over dumps; the checkpoint store implements the real merge over runs."""
    base = base or {}
    out = {}
    for name in set(base) | set(incremental):
        if name == "__timers__":
            out[name] = dict(incremental.get(name, base.get(name, {})))
            continue
        merged: dict[int, dict] = {kg: dict(rows) for kg, rows in base.get(name, {}).items()}
        for kg, rows in incremental.get(name, {}).items():
            g = merged.setdefault(kg, {})
            for k, v in rows:
                if v is None:
                    g.pop(k, None)
                else:
                    g[k] = v
        out[name] = {kg: sorted(g.items()) for kg, g in merged.items() if g}
    return out


def metas_by_name(snap) -> dict:
    """``{state_name: meta}`` of ``snap.state_metas()``."""
    return {m["name"]: m for m in snap.state_metas()}


def chunked(arr: pa.Array, cuts) -> pa.ChunkedArray:
    """``arr`` as a ChunkedArray of the same type, cut at the row offsets ``cuts`` (ascending,
    each in ``[0, len(arr)]``; an offset repeated gives an empty chunk)."""
    bounds = [0, *cuts, len(arr)]
    return pa.chunked_array([arr.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], arr.type)


def sliced(arr: pa.Array, pad_value) -> pa.Array:
    """``arr`` as the slice of a longer array (offset != 0) with nulls and ``pad_value`` around
    it, so that readers which ignore the offset or the bounds see the wrong rows."""
    before = pa.array([None, pad_value], arr.type)
    after = pa.array([pad_value, None], arr.type)
    return pa.concat_arrays([before, arr, after]).slice(2, len(arr))


def random_values(type_name: str, n: int, rng: np.random.Generator) -> pa.Array:
    """``n`` random non-null values of the statecore value type ``type_name`` (one of
    :data:`LIST_TYPES`) as its Arrow array, drawn from small domains so that user keys repeat
    (and -0.0 among the float64 values)."""
    small = rng.integers(-4, 5, n)
    if type_name in ("int64", "int32", "uint64"):
        typ = {"int64": pa.int64(), "int32": pa.int32(), "uint64": pa.uint64()}[type_name]
        return pa.array(np.abs(small) if type_name == "uint64" else small, typ)
    if type_name == "float64":
        return pa.array(np.where(small == 0, -0.0, small / 2.0), pa.float64())
    if type_name == "bool":
        return pa.array(small > 0)
    if type_name.startswith("timestamp"):
        return pa.array(small * 1000, pa.timestamp(type_name[10:-1]))
    words = [("é" * int(abs(s)) + "x" * int(s > 0)) for s in small]
    if type_name == "string":
        return pa.array(words, pa.string())
    if type_name == "binary":
        return pa.array([w.encode() for w in words], pa.binary())
    width = int(type_name[len("fixed_size_binary["):-1])
    return pa.array([bytes([int(s) & 0xFF]) * width for s in small], pa.binary(width))


def column_in_form(values, type_, form: str, name: str = "c"):
    """One batch column of ``values`` (Arrow type ``type_``) in the input form ``form``:
    "array", "chunked" (a ChunkedArray of an empty, a sliced and a plain chunk), "stream" (an
    object exposing only ``__arrow_c_stream__`` over such chunks), "table" (a one-column Table
    named ``name`` behind only ``__arrow_c_stream__``: a record-batch stream) or "c_array"
    (only ``__arrow_c_array__`` over a sliced array). Streams can be read once: build one per
    call. Raises ValueError for another form."""
    arr = pa.array(values, type_)
    if form == "array":
        return arr
    if form == "c_array":
        padded = pa.concat_arrays([pa.array(values[:1] * 3, type_), arr]) if values else arr
        return ArrayOnly(padded.slice(3) if values else arr)
    cut = len(arr) // 3
    padded = pa.concat_arrays([pa.array(values[:1] * 2, type_), arr.slice(cut)]) \
        if values else arr
    chunks = [arr.slice(0, 0), arr.slice(0, cut), padded.slice(2) if values else arr]
    ca = pa.chunked_array(chunks, type_)
    if form == "chunked":
        return ca
    if form == "stream":
        return StreamOnly(ca)
    if form == "table":
        return StreamOnly(pa.table({name: ca}))
    raise ValueError(form)
