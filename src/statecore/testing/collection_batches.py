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
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import (
    LIST_TYPES,
    MAP_TYPES,
    chunked,
    dump_backend,
    merge_incremental,
    random_values,
    snapshot_dump,
)
from statecore.ttl import ManualClock, StateTtlConfig

_KEYS = 50
_ROWS = 9000  # > 2 x 4096: chunks of the chunked batches are read in place by native kernels


class CollectionBatchConformance(ConformanceBase):
    """List and map state batch writes: ``ListState.append_batch`` and ``MapState.put_batch``
    against the reference backend, between snapshots, with TTL, and with bad input."""

    def _batches(self, seed: int):
        """Three batches of keys: a plain one, a sliced one and a chunked one (the values are
        chunked elsewhere by the callers, at other boundaries)."""
        rng = np.random.default_rng(seed)
        keys = pa.array(rng.integers(0, _KEYS, _ROWS + 7), pa.int64())
        return rng, [(keys.slice(0, 40), None), (keys.slice(7, _ROWS), None),
                     (chunked(keys.slice(7, _ROWS), [4500]), [4200, 8000])]

    @pytest.mark.parametrize("element_type", LIST_TYPES)
    def test_append_batch_differential(self, element_type):
        b, ref = self.backend_pair()
        for be in (b, ref):
            st = be.get_state(ListStateDescriptor("l", element_type))
            rng, batches = self._batches(11)
            for keys, value_cuts in batches:
                vals = random_values(element_type, len(keys), rng)
                if value_cuts:
                    vals = chunked(vals, value_cuts)
                st.append_batch(keys, vals)
            # list<T> rows: several elements, empty and null lists, in one batch.
            n = 300
            flat = random_values(element_type, 3 * n, rng)
            offsets = np.concatenate([[0], np.sort(rng.integers(0, 3 * n, n - 1)), [3 * n]])
            mask = pa.array(rng.random(n) < 0.1)
            lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, mask=mask)
            st.append_batch(pa.array(rng.integers(0, _KEYS, n), pa.int64()), lists)
        assert dump_backend(b) == dump_backend(ref)

    @pytest.mark.parametrize("user_key_type,value_type", MAP_TYPES)
    def test_put_batch_differential(self, user_key_type, value_type):
        b, ref = self.backend_pair()
        for be in (b, ref):
            st = be.get_state(MapStateDescriptor("m", user_key_type, value_type))
            rng, batches = self._batches(12)
            for keys, cuts in batches:
                uks = random_values(user_key_type, len(keys), rng)
                vals = random_values(value_type, len(keys), rng)
                if cuts:
                    uks, vals = chunked(uks, cuts[:1]), chunked(vals, cuts[1:])
                st.put_batch(keys, uks, vals)
        assert dump_backend(b) == dump_backend(ref)

    def test_collection_batches_between_held_and_incremental_snapshots(self):
        """Batches between snapshots: every held snapshot keeps its contents while later batches
        grow the same lists and splice the same maps (copy-on-write of blobs a snapshot shares),
        every incremental snapshot merged over its base equals the full snapshot taken with it,
        and both backends list the same incremental bytes."""
        b, ref = self.backend_pair()
        listed = []
        for be in (b, ref):
            lst = be.get_state(ListStateDescriptor("l", "string"))
            m = be.get_state(MapStateDescriptor("m", "int64", "string"))
            rng = np.random.default_rng(14)
            got, held, base = [], [], None
            for step in range(6):
                n = 700
                keys = pa.array(rng.integers(0, _KEYS, n), pa.int64())
                lst.append_batch(keys, random_values("string", n, rng))
                m.put_batch(keys, random_values("int64", n, rng), random_values("string", n, rng))
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
        b = self.new_backend(ttl_clock=clocks[0])
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128,
                                          ttl_clock=clocks[1])
        for be, clock in ((b, clocks[0]), (ref, clocks[1])):
            lst = be.get_state(ListStateDescriptor("l", "string").enable_time_to_live(cfg))
            m = be.get_state(MapStateDescriptor("m", "int64", "int64").enable_time_to_live(cfg))
            rng = np.random.default_rng(13)
            for step in range(4):
                clock.set(5 + 400 * step)  # later batches see earlier elements expire
                keys = pa.array(rng.integers(0, 10, 200), pa.int64())
                lst.append_batch(keys, random_values("string", 200, rng))
                m.put_batch(keys, random_values("int64", 200, rng),
                            random_values("int64", 200, rng))
            got.append(dump_backend(be))
        assert got[0] == got[1]

    def test_collection_batch_errors_in_a_later_chunk_change_nothing(self):
        b = self.new_backend()
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        keys = pa.array(np.arange(_ROWS) % _KEYS, pa.int64())
        ints = pa.array(np.arange(_ROWS), pa.int64())
        lst.append_batch(keys, ints)
        m.put_batch(keys, pa.array([str(i % 7) for i in range(_ROWS)]), ints)
        before = dump_backend(b)
        bad_ints = pa.array([*range(_ROWS - 1), None], pa.int64())
        bad_uks = pa.array([str(i) for i in range(_ROWS - 1)] + [None], pa.string())
        ck = chunked(keys, [4500])
        bad_calls = [
            lambda: lst.append_batch(ck, chunked(bad_ints, [4500])),
            lambda: lst.append_batch(ck, chunked(ints.cast(pa.int32()), [4500])),
            lambda: lst.append_batch(ck, ints.slice(1)),
            lambda: m.put_batch(ck, chunked(bad_uks, [4000]), chunked(ints, [6000])),
            lambda: m.put_batch(ck, pa.array([str(i) for i in range(_ROWS)]), bad_ints),
            lambda: m.put_batch(ck, ints, ints),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert dump_backend(b) == before
