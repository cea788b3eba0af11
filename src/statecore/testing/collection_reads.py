"""Conformance tests of the collection read and removal batch calls (``ListState.get_batch``,
``MapState.get_batch`` / ``contains_batch`` / ``remove_batch``) and of ``clear_batch`` on every
state kind, that every backend must pass, mixed into
:class:`statecore.testing.conformance.BackendConformance`.

Differential, as collection_batches.py: the same seeded random batches (absent keys and user
keys, repeated rows, sliced arrays, chunked arrays whose chunks are large enough for the native
kernels to read them in place, chunk boundaries of keys and user keys apart) go to the backend
under test and to the reference (pure-Python) backend; every result must be equal, of the same
Arrow type, and the snapshots must hold the same bytes. With TTL (ManualClock, the same readings
for both backends) for every update type / visibility pair: results, snapshots and
``ttl_statistics()`` after every step. Errors: bad input in a later chunk raises
InvalidInputError and leaves every state as it was.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import LIST_TYPES, MAP_TYPES, chunked, dump_backend, random_values
from statecore.ttl import ManualClock, StateTtlConfig

_KEYS = 50
_ROWS = 9000  # > 2 x 4096: the chunks of a chunked batch are read in place by native kernels


def _same(got: pa.Array, want: pa.Array) -> None:
    assert got.type == want.type, (got.type, want.type)
    assert got.equals(want), (got.to_pylist()[:20], want.to_pylist()[:20])


def _key_batches(rng: np.random.Generator, hi: int):
    """Read batches of keys in [0, hi) (hi > the populated keys: absent ones too): a small
    one, a sliced one and a chunked one, as ``(keys, cuts for a second column)``."""
    keys = pa.array(rng.integers(0, hi, _ROWS + 5), pa.int64())
    return [(keys.slice(0, 30), None), (keys.slice(5, _ROWS), None),
            (chunked(keys.slice(5, _ROWS), [4600]), [4300])]


class CollectionReadConformance(ConformanceBase):
    """List and map state batch reads and removals and ``clear_batch`` of every state kind,
    against the reference backend, with TTL, and with bad input."""

    @pytest.mark.parametrize("element_type", LIST_TYPES)
    def test_list_get_batch_differential(self, element_type):
        b, ref = self.backend_pair()
        outs = []
        for be in (b, ref):
            st = be.get_state(ListStateDescriptor("l", element_type))
            rng = np.random.default_rng(21)
            st.append_batch(pa.array(rng.integers(0, _KEYS, 3000), pa.int64()),
                            random_values(element_type, 3000, rng))
            outs.append([st.get_batch(keys) for keys, _ in _key_batches(rng, _KEYS + 10)])
            outs[-1].append(st.get_batch(pa.array([], pa.int64())))
        for got, want in zip(*outs):
            _same(got, want)
        assert dump_backend(b) == dump_backend(ref)

    @pytest.mark.parametrize("user_key_type,value_type", MAP_TYPES)
    def test_map_reads_and_removals_differential(self, user_key_type, value_type):
        b, ref = self.backend_pair()
        outs = []
        for be in (b, ref):
            st = be.get_state(MapStateDescriptor("m", user_key_type, value_type))
            rng = np.random.default_rng(22)
            st.put_batch(pa.array(rng.integers(0, _KEYS, 2000), pa.int64()),
                         random_values(user_key_type, 2000, rng),
                         random_values(value_type, 2000, rng))
            out = []
            for keys, cuts in _key_batches(rng, _KEYS + 10):
                uks = random_values(user_key_type, len(keys), rng)
                if cuts:
                    uks = chunked(uks, cuts)
                out.append(st.get_batch(keys, uks))
                out.append(st.contains_batch(keys, uks))
            # Removals with repeated rows, emptying some maps, then the reads again.
            for keys, _cuts in _key_batches(rng, _KEYS + 10)[:2]:
                uks = random_values(user_key_type, len(keys), rng)
                st.remove_batch(keys, uks)
                out.append(st.get_batch(keys, uks))
                out.append(st.contains_batch(keys, random_values(user_key_type, len(keys), rng)))
            outs.append(out)
            outs[-1].append(dump_backend(be))
        for got, want in zip(outs[0][:-1], outs[1][:-1]):
            _same(got, want)
        assert outs[0][-1] == outs[1][-1]

    def test_clear_batch_differential(self):
        b, ref = self.backend_pair()
        for be in (b, ref):
            rng = np.random.default_rng(23)
            keys = pa.array(rng.integers(0, _KEYS, 500), pa.int64())
            ints = pa.array(rng.integers(0, 9, 500), pa.int64())
            v = be.get_state(ValueStateDescriptor("v", "int64"))
            p = be.get_state(ValueStateDescriptor("p", "pickle"))
            r = be.get_state(ReducingStateDescriptor("r", "sum", "int64"))
            lst = be.get_state(ListStateDescriptor("l", "string"))
            m = be.get_state(MapStateDescriptor("m", "int64", "int64"))
            v.put_batch(keys, ints)
            r.add_batch(keys, ints)
            lst.append_batch(keys, random_values("string", 500, rng))
            m.put_batch(keys, ints, ints)
            for k in range(_KEYS):
                be.set_current_key(k)
                p.update({"k": k})
            batches = _key_batches(rng, _KEYS + 10)  # plain, sliced, chunked
            for st, (keys, _) in zip((v, p, r, lst, m), [*batches, *batches[:2]]):
                st.clear_batch(keys.slice(0, 25) if st in (lst, m) else keys)
        assert dump_backend(b) == dump_backend(ref)

    @pytest.mark.parametrize("update_type,visibility,cleanup", [
        ("OnCreateAndWrite", "NeverReturnExpired", None),
        ("OnReadAndWrite", "NeverReturnExpired", None),
        ("OnCreateAndWrite", "ReturnExpiredIfNotCleanedUp", None),
        ("OnReadAndWrite", "ReturnExpiredIfNotCleanedUp", None),
        # Incremental cleanup: one access per row before the reads (it then finds most of
        # what expired before the reads do).
        ("OnReadAndWrite", "NeverReturnExpired", 1)])
    def test_collection_reads_with_ttl_differential(self, update_type, visibility, cleanup):
        cfg = StateTtlConfig(1000, update_type=update_type, state_visibility=visibility,
                             cleanup_incrementally=cleanup)
        clocks = [ManualClock(0), ManualClock(0)]
        b = self.new_backend(ttl_clock=clocks[0])
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128,
                                          ttl_clock=clocks[1])
        outs = []
        for be, clock in ((b, clocks[0]), (ref, clocks[1])):
            ls = be.get_state(ListStateDescriptor("ls", "string").enable_time_to_live(cfg))
            li = be.get_state(ListStateDescriptor("li", "int64").enable_time_to_live(cfg))
            m = be.get_state(MapStateDescriptor("m", "int64", "string").enable_time_to_live(cfg))
            rng = np.random.default_rng(24)
            out = []
            for step in range(6):
                clock.set(350 * step)  # elements written 3 steps ago expire
                keys = pa.array(rng.integers(0, 20, 120), pa.int64())
                ls.append_batch(keys, random_values("string", 120, rng))
                li.append_batch(keys, random_values("int64", 120, rng))
                m.put_batch(keys, random_values("int64", 120, rng),
                            random_values("string", 120, rng))
                clock.set(350 * step + 200)
                # Repeated and absent keys; a chunked read at one step.
                rk = pa.array(rng.integers(0, 25, 60), pa.int64())
                uk = random_values("int64", 60, rng)
                if step == 3:
                    rk = chunked(pa.array(rng.integers(0, 25, _ROWS), pa.int64()), [4500])
                    uk = chunked(random_values("int64", _ROWS, rng), [5000])
                out += [ls.get_batch(rk), m.contains_batch(rk, uk), li.get_batch(rk),
                        m.get_batch(rk, uk)]
                if step % 2:
                    m.remove_batch(rk, random_values("int64", len(rk), rng))
                    ls.clear_batch(pa.array(rng.integers(0, 25, 5), pa.int64()))
                out.append(dump_backend(be))
                out.append(be.ttl_statistics())
            outs.append(out)
        for got, want in zip(*outs):
            if isinstance(got, pa.Array):
                _same(got, want)
            else:
                assert got == want
        assert outs[0][-1].get("read" if cleanup is None else "incremental")  # TTL did act

    def test_collection_read_errors_in_a_later_chunk_change_nothing(self):
        from statecore.key_groups import KeyGroupRange

        cfg = StateTtlConfig(10)
        clock = ManualClock(0)
        b = self.new_backend(key_group_range=KeyGroupRange(0, 63), ttl_clock=clock)
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        tl = b.get_state(ListStateDescriptor("tl", "int64").enable_time_to_live(cfg))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        tm = b.get_state(MapStateDescriptor("tm", "string", "int64").enable_time_to_live(cfg))
        def owned(k) -> bool:
            try:
                return b.key_group_of(k) is not None
            except InvalidInputError:
                return False

        served = [k for k in range(400) if owned(k)]
        other = next(k for k in range(400) if k not in served)
        good = pa.array([served[i % len(served)] for i in range(_ROWS)], pa.int64())
        bad = pa.array([served[i % len(served)] for i in range(_ROWS - 1)] + [other], pa.int64())
        uks = pa.array([str(i % 7) for i in range(_ROWS)])
        ints = pa.array(np.arange(_ROWS), pa.int64())
        for st in (lst, tl):
            st.append_batch(good, ints)
        for st in (m, tm):
            st.put_batch(good, uks, ints)
        clock.set(100)  # every TTL element and pair is expired: a TTL read would remove them
        before, stats = dump_backend(b), b.ttl_statistics()
        ck, cu = chunked(bad, [4500]), chunked(uks, [4000])
        bad_calls = [
            lambda: lst.clear_batch(ck), lambda: tl.get_batch(ck), lambda: tm.get_batch(ck, cu),
            lambda: tm.contains_batch(ck, cu), lambda: m.remove_batch(ck, cu),
            lambda: m.remove_batch(chunked(good, [4500]),
                                   chunked(pa.array([*uks.to_pylist()[:-1], None]), [4000])),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert dump_backend(b) == before
            assert b.ttl_statistics() == stats
