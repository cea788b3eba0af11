"""Conformance tests of batch calls with namespaces (windows, panes, ...), mixed into
:class:`statecore.testing.conformance.BackendConformance`.

Differential: seeded random batches over states of every namespace type (int32, int64, string,
binary) go to the backend under test and to the reference (pure-Python) backend -- namespaces
given per row (an array, sliced or chunked at other boundaries than the keys and values), as one
value for the whole batch, or taken from the state's current namespace -- and their results and
snapshots must be equal, byte for byte; with TTL too. The per-record path of the backend under
test must see what the batches wrote. Errors (a null namespace, the wrong Arrow type or length,
no current namespace, namespaces on a void state) raise InvalidInputError and change nothing.
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
from statecore.testing.helpers import chunked, dump_backend, random_values
from statecore.ttl import ManualClock, StateTtlConfig

_ROWS = 9000  # > 2 x 4096: native reads the chunks of chunked batches in place
NAMESPACE_TYPES = ["int64", "int32", "string", "binary"]
# A variable-width key with a variable-width namespace takes Flink's lenbytes after both parts.
KEY_TYPES = ["int64", "string"]


def _namespaces(ns_type: str, n: int, rng: np.random.Generator) -> pa.Array:
    """``n`` namespaces drawn from 5 values, so that (key, namespace) pairs repeat in a batch."""
    w = rng.integers(0, 5, n)
    if ns_type in ("int64", "int32"):
        return pa.array(w * 3600_000 if ns_type == "int64" else w - 2,
                        pa.int64() if ns_type == "int64" else pa.int32())
    words = ["w" * int(i) for i in w]  # "" is a namespace too
    return pa.array(words if ns_type == "string" else [s.encode() for s in words],
                    pa.string() if ns_type == "string" else pa.binary())


def _keys(key_type: str, n: int, rng: np.random.Generator) -> pa.Array:
    k = rng.integers(0, 40, n)
    return pa.array(k, pa.int64()) if key_type == "int64" else pa.array([f"k{i}" for i in k])


def _one(arr: pa.Array):
    return arr[0].as_py()


class NamespaceBatchConformance(ConformanceBase):
    """Batch calls of every state kind with namespaces per row, per batch or current, against
    the reference backend, with TTL, and with bad namespaces."""

    def _ns_batches(self, key_type: str, ns_type: str, seed: int):
        """``(keys, namespaces, value_cuts)`` triples: a plain batch, a sliced one whose
        namespaces are chunked at other boundaries, a chunked one with one namespace for the
        batch, and one using the state's current namespace (namespaces None)."""
        rng = np.random.default_rng(seed)
        keys = _keys(key_type, _ROWS + 7, rng)
        ns = _namespaces(ns_type, _ROWS + 7, rng)
        return rng, [
            (keys.slice(0, 50), ns.slice(0, 50), None),
            (keys.slice(7, _ROWS), chunked(ns.slice(7, _ROWS), [3000, 6500]), [4200]),
            (chunked(keys.slice(7, _ROWS), [4500]), ns[9].as_py(), [5000]),
            (keys.slice(3, 3000), None, None),
        ]

    @pytest.mark.parametrize("key_type", KEY_TYPES)
    @pytest.mark.parametrize("ns_type", NAMESPACE_TYPES)
    def test_namespaced_value_and_reducing_batches_differential(self, key_type, ns_type):
        b, ref = self.backend_pair(key_type=key_type)
        outs = []
        for be in (b, ref):
            got = []
            val = be.get_state(ValueStateDescriptor("v", "string"), namespace_type=ns_type)
            cnt = be.get_state(ReducingStateDescriptor("c", "sum", "int64"), namespace_type=ns_type)
            rng, batches = self._ns_batches(key_type, ns_type, 21)
            current = _one(_namespaces(ns_type, 1, rng))
            val.set_current_namespace(current)
            cnt.set_current_namespace(current)
            for keys, ns, cuts in batches:
                n = len(keys)
                words = random_values("string", n, rng)
                ints = pa.array(rng.integers(-3, 9, n), pa.int64())
                if cuts:
                    words, ints = chunked(words, cuts), chunked(ints, cuts)
                val.put_batch(keys, words, namespaces=ns)
                got.append(cnt.add_batch(keys, ints, namespaces=ns).to_pylist())
                got.append(val.get_batch(keys, namespaces=ns).to_pylist())
                got.append(cnt.get_batch(keys, namespaces=ns).to_pylist())
            outs.append(got)
        assert outs[0] == outs[1]
        assert dump_backend(b) == dump_backend(ref)
        # The per-record path reads what the batches wrote.
        keys = _keys(key_type, 30, np.random.default_rng(5))
        ns = _namespaces(ns_type, 30, np.random.default_rng(6))
        cnt = b.get_state(ReducingStateDescriptor("c", "sum", "int64"), namespace_type=ns_type)
        batch = cnt.get_batch(keys, namespaces=ns).to_pylist()
        per_record = []
        for k, n in zip(keys.to_pylist(), ns.to_pylist()):
            b.set_current_key(k)
            cnt.set_current_namespace(n)
            per_record.append(cnt.get())
        assert batch == per_record

    @pytest.mark.parametrize("ns_type", ["int64", "string"])
    def test_namespaced_list_and_map_batches_differential(self, ns_type):
        b, ref = self.backend_pair(key_type="string")
        for be in (b, ref):
            lst = be.get_state(ListStateDescriptor("l", "int64"), namespace_type=ns_type)
            m = be.get_state(MapStateDescriptor("m", "int32", "string"), namespace_type=ns_type)
            rng, batches = self._ns_batches("string", ns_type, 22)
            current = _one(_namespaces(ns_type, 1, rng))
            lst.set_current_namespace(current)
            m.set_current_namespace(current)
            for keys, ns, cuts in batches:
                n = len(keys)
                ints = random_values("int64", n, rng)
                uks, words = random_values("int32", n, rng), random_values("string", n, rng)
                if cuts:
                    ints, uks = chunked(ints, cuts), chunked(uks, cuts)
                lst.append_batch(keys, ints, namespaces=ns)
                m.put_batch(keys, uks, words, namespaces=ns)
            # list<T> rows: a row's elements go to that row's (key, namespace).
            lists = pa.array([[1, 2], None, [], [3]], pa.list_(pa.int64()))
            lst.append_batch(pa.array(["a", "a", "b", "a"]), lists,
                             namespaces=_namespaces(ns_type, 4, np.random.default_rng(3)))
        assert dump_backend(b) == dump_backend(ref)

    @pytest.mark.parametrize("ns_type", ["int32", "binary"])
    def test_namespaced_reads_removals_and_clears_differential(self, ns_type):
        b, ref = self.backend_pair(key_type="int64")
        outs = []
        for be in (b, ref):
            got = []
            lst = be.get_state(ListStateDescriptor("l", "string"), namespace_type=ns_type)
            m = be.get_state(MapStateDescriptor("m", "int64", "int64"), namespace_type=ns_type)
            val = be.get_state(ValueStateDescriptor("v", "int64"), namespace_type=ns_type)
            rng, batches = self._ns_batches("int64", ns_type, 24)
            current = _one(_namespaces(ns_type, 1, rng))
            for st in (lst, m, val):
                st.set_current_namespace(current)
            for keys, ns, cuts in batches:
                n = len(keys)
                uks = pa.array(rng.integers(0, 6, n), pa.int64())
                lst.append_batch(keys, random_values("string", n, rng), namespaces=ns)
                m.put_batch(keys, uks, random_values("int64", n, rng), namespaces=ns)
                val.put_batch(keys, random_values("int64", n, rng), namespaces=ns)
                got.append(lst.get_batch(keys, namespaces=ns).to_pylist())
                probe = pa.array(rng.integers(0, 8, n), pa.int64())
                if cuts:
                    probe = chunked(probe, cuts)
                got.append(m.get_batch(keys, probe, namespaces=ns).to_pylist())
                got.append(m.contains_batch(keys, probe, namespaces=ns).to_pylist())
                m.remove_batch(keys, probe, namespaces=ns)
                half = keys.slice(0, n // 2)
                hns = ns.slice(0, n // 2) if isinstance(ns, (pa.Array, pa.ChunkedArray)) else ns
                for st in (lst, val):
                    st.clear_batch(half, namespaces=hns)
            outs.append(got)
        assert outs[0] == outs[1]
        assert dump_backend(b) == dump_backend(ref)

    def test_namespaced_batches_with_ttl_differential(self):
        cfg = StateTtlConfig(1000, update_type="OnReadAndWrite")
        clocks, got = [ManualClock(5), ManualClock(5)], []
        b = self.new_backend(key_type="int64", max_parallelism=128, ttl_clock=clocks[0])
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128,
                                          ttl_clock=clocks[1])
        for be, clock in ((b, clocks[0]), (ref, clocks[1])):
            out = []
            cnt = be.get_state(
                ReducingStateDescriptor("c", "sum", "int64").enable_time_to_live(cfg),
                namespace_type="int64")
            lst = be.get_state(ListStateDescriptor("l", "int32").enable_time_to_live(cfg),
                               namespace_type="int64")
            rng = np.random.default_rng(23)
            for step in range(5):
                clock.set(5 + 400 * step)  # later batches see earlier entries expire
                keys = _keys("int64", 300, rng)
                ns = _namespaces("int64", 300, rng)
                out.append(cnt.add_batch(keys, pa.array(rng.integers(0, 5, 300)), namespaces=ns)
                           .to_pylist())
                out.append(cnt.get_batch(keys.slice(0, 100), namespaces=ns.slice(0, 100))
                           .to_pylist())
                lst.append_batch(keys, random_values("int32", 300, rng), namespaces=ns)
            got.append((out, dump_backend(be), be.ttl_statistics()))
        assert got[0] == got[1]

    def test_namespaced_batch_errors_change_nothing(self):
        b = self.new_backend(key_type="int64", max_parallelism=128)
        cnt = b.get_state(ReducingStateDescriptor("c", "sum", "int64"), namespace_type="int64")
        void = b.get_state(ValueStateDescriptor("v", "int64"))
        keys = pa.array(np.arange(_ROWS) % 40, pa.int64())
        ints = pa.array(np.arange(_ROWS), pa.int64())
        ns = pa.array(np.arange(_ROWS) % 3, pa.int64())
        cnt.add_batch(keys, ints, namespaces=ns)
        void.put_batch(keys, ints)
        before = dump_backend(b)
        bad_ns = pa.array([*range(_ROWS - 1), None], pa.int64())
        bad_calls = [
            lambda: cnt.add_batch(keys, ints, namespaces=chunked(bad_ns, [4500])),
            lambda: cnt.add_batch(keys, ints, namespaces=ns.cast(pa.int32())),
            lambda: cnt.add_batch(keys, ints, namespaces=ns.slice(1)),
            lambda: cnt.add_batch(keys, ints, namespaces="not an int"),
            lambda: cnt.add_batch(keys, ints),  # no current namespace
            lambda: cnt.get_batch(keys),
            lambda: void.put_batch(keys, ints, namespaces=ns),
            lambda: void.get_batch(keys, namespaces=5),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert dump_backend(b) == before
