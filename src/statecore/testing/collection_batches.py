"""Conformance tests of the collection batch calls (``ListState.append_batch``,
``MapState.put_batch``) that every backend must pass, mixed into
:class:`statecore.testing.conformance.BackendConformance`.

Differential: seeded random batches (repeated keys within a batch, sliced arrays, chunked arrays
whose chunk boundaries differ between keys and values and whose chunks are large enough to be
read in place, list<T> rows with null and empty lists) go to the backend under test and to the
reference (pure-Python) backend; their snapshots must hold the same bytes. With TTL too (a
manual clock, the same readings for both). Errors: bad input anywhere in a chunked batch raises
InvalidInputError and leaves every state as it was.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statecore.descriptors import ListStateDescriptor, MapStateDescriptor
from statecore.errors import InvalidInputError
from statecore.ttl import ManualClock, StateTtlConfig

_KEYS = 50
_ROWS = 9000  # > 2 x 4096: chunks of the chunked batches are read in place by native kernels


def _values(type_name: str, n: int, rng: np.random.Generator) -> pa.Array:
    """``n`` random non-null values of a statecore type as its Arrow array, drawn from small
    domains so that user keys repeat (and -0.0 among the float64 values)."""
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


def _chunked(arr: pa.Array, cuts) -> pa.ChunkedArray:
    bounds = [0, *cuts, len(arr)]
    return pa.chunked_array([arr.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], arr.type)


def _dump(b) -> dict:
    from statecore.testing.conformance import snapshot_dump

    snap = b.snapshot()
    try:
        return snapshot_dump(snap)
    finally:
        snap.release()


LIST_TYPES = ["int64", "int32", "uint64", "float64", "bool", "string", "binary", "timestamp[ms]",
              "fixed_size_binary[3]"]
# Every user key type but pickle (descriptors.USER_KEY_TYPES) and every typed value type.
MAP_TYPES = [("int64", "int64"), ("string", "binary"), ("int32", "float64"), ("binary", "string"),
             ("int64", "bool"), ("string", "fixed_size_binary[2]"), ("int32", "uint64"),
             ("binary", "timestamp[us]"), ("int64", "int32")]


class CollectionBatchConformance:
    """Mixin (needs ``_backend`` and ``make_reference_backend`` of BackendConformance)."""

    def _pair(self, **kw):
        kw.setdefault("key_type", "int64")
        kw.setdefault("max_parallelism", 128)
        return self._backend(**kw), self.make_reference_backend(**kw)

    def _batches(self, seed: int):
        """Three batches of keys: a plain one, a sliced one and a chunked one (the values are
        chunked elsewhere by the callers, at other boundaries)."""
        rng = np.random.default_rng(seed)
        keys = pa.array(rng.integers(0, _KEYS, _ROWS + 7), pa.int64())
        return rng, [(keys.slice(0, 40), None), (keys.slice(7, _ROWS), None),
                     (_chunked(keys.slice(7, _ROWS), [4500]), [4200, 8000])]

    @pytest.mark.parametrize("element_type", LIST_TYPES)
    def test_append_batch_differential(self, element_type):
        b, ref = self._pair()
        for be in (b, ref):
            st = be.get_state(ListStateDescriptor("l", element_type))
            rng, batches = self._batches(11)
            for keys, value_cuts in batches:
                vals = _values(element_type, len(keys), rng)
                if value_cuts:
                    vals = _chunked(vals, value_cuts)
                st.append_batch(keys, vals)
            # list<T> rows: several elements, empty and null lists, in one batch.
            n = 300
            flat = _values(element_type, 3 * n, rng)
            offsets = np.concatenate([[0], np.sort(rng.integers(0, 3 * n, n - 1)), [3 * n]])
            mask = pa.array(rng.random(n) < 0.1)
            lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, mask=mask)
            st.append_batch(pa.array(rng.integers(0, _KEYS, n), pa.int64()), lists)
        assert _dump(b) == _dump(ref)

    @pytest.mark.parametrize("user_key_type,value_type", MAP_TYPES)
    def test_put_batch_differential(self, user_key_type, value_type):
        b, ref = self._pair()
        for be in (b, ref):
            st = be.get_state(MapStateDescriptor("m", user_key_type, value_type))
            rng, batches = self._batches(12)
            for keys, cuts in batches:
                uks = _values(user_key_type, len(keys), rng)
                vals = _values(value_type, len(keys), rng)
                if cuts:
                    uks, vals = _chunked(uks, cuts[:1]), _chunked(vals, cuts[1:])
                st.put_batch(keys, uks, vals)
        assert _dump(b) == _dump(ref)

    def test_collection_batches_between_held_and_incremental_snapshots(self):
        """Batches between snapshots: every held snapshot keeps its contents while later batches
        grow the same lists and splice the same maps (copy-on-write of blobs a snapshot shares),
        every incremental snapshot merged over its base equals the full snapshot taken with it,
        and both backends list the same incremental bytes."""
        from statecore.testing.conformance import merge_incremental, snapshot_dump

        b, ref = self._pair()
        listed = []
        for be in (b, ref):
            lst = be.get_state(ListStateDescriptor("l", "string"))
            m = be.get_state(MapStateDescriptor("m", "int64", "string"))
            rng = np.random.default_rng(14)
            got, held, base = [], [], None
            for step in range(6):
                n = 700
                keys = pa.array(rng.integers(0, _KEYS, n), pa.int64())
                lst.append_batch(keys, _values("string", n, rng))
                m.put_batch(keys, _values("int64", n, rng), _values("string", n, rng))
                inc, full = be.snapshot(incremental=True), be.snapshot()
                inc_dump, full_dump = snapshot_dump(inc), snapshot_dump(full)
                assert merge_incremental(base, inc_dump) == full_dump
                got.append(inc_dump)
                held.append((full, full_dump))
                if step % 2 == 0:
                    be.notify_checkpoint_complete(inc.snapshot_id)
                    base = full_dump
                inc.release()
            for snap, dump in held:
                assert snapshot_dump(snap) == dump
                snap.release()
            listed.append(got)
        assert listed[0] == listed[1]

    def test_collection_batches_with_ttl_differential(self):
        cfg = StateTtlConfig(1000)
        clocks, got = [ManualClock(5), ManualClock(5)], []
        b = self._backend(ttl_clock=clocks[0])
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128,
                                          ttl_clock=clocks[1])
        for be, clock in ((b, clocks[0]), (ref, clocks[1])):
            lst = be.get_state(ListStateDescriptor("l", "string").enable_time_to_live(cfg))
            m = be.get_state(MapStateDescriptor("m", "int64", "int64").enable_time_to_live(cfg))
            rng = np.random.default_rng(13)
            for step in range(4):
                clock.set(5 + 400 * step)  # later batches see earlier elements expire
                keys = pa.array(rng.integers(0, 10, 200), pa.int64())
                lst.append_batch(keys, _values("string", 200, rng))
                m.put_batch(keys, _values("int64", 200, rng), _values("int64", 200, rng))
            got.append(_dump(be))
        assert got[0] == got[1]

    def test_collection_batch_errors_in_a_later_chunk_change_nothing(self):
        b = self._backend()
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        keys = pa.array(np.arange(_ROWS) % _KEYS, pa.int64())
        ints = pa.array(np.arange(_ROWS), pa.int64())
        lst.append_batch(keys, ints)
        m.put_batch(keys, pa.array([str(i % 7) for i in range(_ROWS)]), ints)
        before = _dump(b)
        bad_ints = pa.array([*range(_ROWS - 1), None], pa.int64())
        bad_uks = pa.array([str(i) for i in range(_ROWS - 1)] + [None], pa.string())
        ck = _chunked(keys, [4500])
        bad_calls = [
            lambda: lst.append_batch(ck, _chunked(bad_ints, [4500])),
            lambda: lst.append_batch(ck, _chunked(ints.cast(pa.int32()), [4500])),
            lambda: lst.append_batch(ck, ints.slice(1)),
            lambda: m.put_batch(ck, _chunked(bad_uks, [4000]), _chunked(ints, [6000])),
            lambda: m.put_batch(ck, pa.array([str(i) for i in range(_ROWS)]), bad_ints),
            lambda: m.put_batch(ck, ints, ints),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert _dump(b) == before
