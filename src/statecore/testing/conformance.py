"""Backend conformance suite: every keyed state backend must pass it.

Subclass :class:`BackendConformance` in a test module and implement ``make_backend(**options)``
(options as ``statecore.create_backend``); ``make_reference_backend`` defaults to the
PythonBackend, the oracle the differential tests (``test_differential_*``) compare against, byte
for byte on snapshots. Example::

    class TestPythonBackend(BackendConformance):
        def make_backend(self, **kw):
            return PythonBackend(**kw)
"""

from __future__ import annotations

import datetime
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from statecore import key_groups as K
from statecore import serializers as S
from statecore.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.testing.collection_batches import CollectionBatchConformance
from statecore.testing.namespace_batches import NamespaceBatchConformance
from statecore.testing.collection_reads import CollectionReadConformance
from statecore.testing.key_types import KeyTypeConformance
from statecore.testing.value_types import ValueTypeConformance

__all__ = ["BackendConformance", "snapshot_dump", "merge_incremental", "AverageAggregate"]


class AverageAggregate(AggregateFunction):
    """Mean of the added numbers; accumulator ``[sum, count]``."""

    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        acc[0] += value
        acc[1] += 1
        return acc

    def get_result(self, acc):
        return acc[0] / acc[1] if acc[1] else None


class _StreamOnly:
    """Exposes only ``__arrow_c_stream__`` of ``obj`` (what e.g. a polars or nanoarrow object
    offers), so tests do not lean on pyarrow's own types."""

    def __init__(self, obj):
        self.obj = obj

    def __arrow_c_stream__(self, requested_schema=None):
        return self.obj.__arrow_c_stream__(requested_schema)


class _ArrayOnly:
    """Exposes only ``__arrow_c_array__`` of ``obj``."""

    def __init__(self, obj):
        self.obj = obj

    def __arrow_c_array__(self, requested_schema=None):
        return self.obj.__arrow_c_array__(requested_schema)


class TamperedSnapshot:
    """A snapshot that hands out ``mangle(keys, values)`` instead of the non-empty entries of
    state ``state`` of ``inner`` (for tests of restores of malformed snapshots)."""

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
    of ``snap`` (or of ``key_groups``)."""
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


def _metas(snap) -> dict:
    return {m["name"]: m for m in snap.state_metas()}


class BackendConformance(KeyTypeConformance, ValueTypeConformance, CollectionBatchConformance,
                         NamespaceBatchConformance, CollectionReadConformance):
    """Pytest base class; see module docstring. The key-type tests come from
    :class:`statecore.testing.key_types.KeyTypeConformance`, the tests of the uint64, timestamp
    and fixed_size_binary value types from
    :class:`statecore.testing.value_types.ValueTypeConformance`."""

    # ------------------------------------------------------------------ factories
    def make_backend(self, **options):
        raise NotImplementedError("subclasses return a fresh backend for these options")

    def make_reference_backend(self, **options):
        from statecore.backends.python import PythonBackend

        return PythonBackend(**options)

    def _backend(self, **kw):
        kw.setdefault("key_type", "int64")
        kw.setdefault("max_parallelism", 128)
        return self.make_backend(**kw)

    # ------------------------------------------------------------------ value state
    def test_value_state(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64", default=7))
        b.set_current_key(1)
        assert v.value() == 7
        v.update(42)
        assert v.value() == 42
        b.set_current_key(2)
        assert v.value() == 7
        v.update(-(1 << 63))
        assert v.value() == -(1 << 63)
        b.set_current_key(1)
        assert v.value() == 42
        v.update(None)
        assert v.value() == 7
        v.update(5)
        v.clear()
        assert v.value() == 7
        assert b.num_entries() == 1

    @pytest.mark.parametrize("vt,val", [("float64", 1.25), ("bool", True), ("string", "héllo"),
                                        ("binary", b"\x00\xff"), ("int32", -3),
                                        ("pickle", {"a": [1, 2]})])
    def test_value_types(self, vt, val):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", vt))
        b.set_current_key(3)
        assert v.value() is None
        v.update(val)
        assert v.value() == val

    def test_pickle_values_are_copied(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v"))
        b.set_current_key(1)
        obj = [1, 2]
        v.update(obj)
        obj.append(3)
        got = v.value()
        assert got == [1, 2]
        got.append(4)
        assert v.value() == [1, 2]
        d = b.get_state(ValueStateDescriptor("d", default=[]))
        d.value().append(1)
        assert d.value() == []

    def test_value_wrong_type_rejected(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(1)
        v.update(1)
        for bad in ["x", 1.5, 1 << 63, True]:
            with pytest.raises(InvalidInputError):
                v.update(bad)
        assert v.value() == 1

    # ------------------------------------------------------------------ list state
    def test_list_state(self):
        b = self._backend()
        ls = b.get_state(ListStateDescriptor("l", "string"))
        b.set_current_key(1)
        assert ls.get() == []
        ls.add("a")
        ls.add_all(["b", "c"])
        assert ls.get() == ["a", "b", "c"]
        ls.add_all([])
        assert ls.get() == ["a", "b", "c"]
        with pytest.raises(InvalidInputError):
            ls.add(None)
        with pytest.raises(InvalidInputError):
            ls.add_all(["d", None])
        with pytest.raises(InvalidInputError):
            ls.add(3)
        assert ls.get() == ["a", "b", "c"]
        ls.update(["z"])
        assert ls.get() == ["z"]
        ls.update([])
        assert ls.get() == [] and b.num_entries() == 0
        ls.add("q")
        ls.clear()
        assert ls.get() == []
        li = b.get_state(ListStateDescriptor("li", "int64"))
        li.add_all([3, 1, 2])
        assert li.get() == [3, 1, 2]
        lp = b.get_state(ListStateDescriptor("lp"))
        lp.add({"x": 1})
        lp.add((2,))
        assert lp.get() == [{"x": 1}, (2,)]

    # ------------------------------------------------------------------ map state
    def test_map_state(self):
        b = self._backend()
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        b.set_current_key(1)
        assert m.is_empty() and m.items() == [] and m.get("a") is None
        m.put("b", 2)
        m.put("a", 1)
        m.put_all({"c": 3, "b": 20})
        assert m.items() == [("a", 1), ("b", 20), ("c", 3)]
        assert m.keys() == ["a", "b", "c"] and m.values() == [1, 20, 3]
        assert m.contains("a") and not m.contains("zz") and m.get("b") == 20
        m.remove("zz")
        m.remove("a")
        assert m.keys() == ["b", "c"]
        with pytest.raises(InvalidInputError):
            m.put(1, 1)
        with pytest.raises(InvalidInputError):
            m.put("d", "x")
        with pytest.raises(InvalidInputError):
            m.put_all({"e": 1, "f": "bad"})
        assert m.keys() == ["b", "c"]
        m.remove("b")
        m.remove("c")
        assert m.is_empty() and b.num_entries() == 0
        m.put("x", 1)
        m.clear()
        assert m.is_empty()
        b.set_current_key(2)
        assert m.is_empty()

    def test_map_state_pickle_user_keys(self):
        b = self._backend()
        m = b.get_state(MapStateDescriptor("m"))
        b.set_current_key(1)
        m.put((1, "a"), [1])
        m.put(None, "none")
        m.put(frozenset(), {})
        assert m.get((1, "a")) == [1] and m.get(None) == "none" and m.contains(frozenset())
        assert len(m.items()) == 3
        enc = sorted(S.key_serializer("pickle").serialize(k) for k in [(1, "a"), None, frozenset()])
        assert [S.key_serializer("pickle").serialize(k) for k in m.keys()] == enc

    # ------------------------------------------------------------------ reducing / aggregating
    def test_reducing_builtins(self):
        b = self._backend()
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        mn = b.get_state(ReducingStateDescriptor("mn", "min", "float64"))
        mx = b.get_state(ReducingStateDescriptor("mx", "max", "string"))
        c = b.get_state(ReducingStateDescriptor("c", "count"))
        b.set_current_key(9)
        for st_ in (s, mn, mx, c):
            assert st_.get() is None
        for x in [5, -2, 10]:
            s.add(x)
            mn.add(x)
            mx.add(str(x))
            c.add(x)
        c.add(None)
        s.add(None)
        assert (s.get(), mn.get(), mx.get(), c.get()) == (13, -2.0, "5", 3)
        s.add((1 << 63) - 14)
        assert s.get() == (1 << 63) - 1
        with pytest.raises(InvalidInputError):
            s.add(1)
        assert s.get() == (1 << 63) - 1
        with pytest.raises(InvalidInputError):
            s.add("x")
        s.clear()
        assert s.get() is None

    @pytest.mark.parametrize("vt,vals", [("int64", [5, -2, 10]), ("float64", [0.5, -2.0, 7.25]),
                                         ("string", ["b", "a", "c"])])
    def test_reducing_first_and_last(self, vt, vals):
        """``first`` keeps the first value added, ``last`` the latest; nulls change nothing. The
        batch (kernels for int64/float64) and per-record paths agree."""
        b = self._backend()
        f = b.get_state(ReducingStateDescriptor("f", "first", vt))
        la = b.get_state(ReducingStateDescriptor("l", "last", vt))
        b.set_current_key(1)
        for x in vals:
            f.add(x)
            la.add(x)
        la.add(None)
        assert (f.get(), la.get()) == (vals[0], vals[-1])
        t = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}[vt]
        keys = pa.array([2, 3, 2, 2, 3], pa.int64())
        batch = pa.array([vals[0], vals[1], None, vals[2], vals[0]], t)
        assert f.add_batch(keys, batch).to_pylist() == [vals[0], vals[1], vals[0], vals[0], vals[1]]
        assert la.add_batch(keys, batch).to_pylist() == [vals[0], vals[1], vals[0], vals[2], vals[0]]
        assert f.get_batch(pa.array([1, 2, 3])).to_pylist() == [vals[0], vals[0], vals[1]]
        assert la.get_batch(pa.array([1, 2, 3])).to_pylist() == [vals[-1], vals[2], vals[0]]

    def test_vectorized_reducer_equals_the_scalar_one(self):
        """A Reducer.vectorized function gives the outputs and state of the same function
        applied row by row, with one call per round (the most repeated key's row count)."""
        import pyarrow.compute as pc

        from statecore.descriptors import Reducer

        calls = []

        def vec(acc, v):
            calls.append(len(acc))
            return pc.add(pc.subtract(acc, pc.multiply(v, 2)), 1)

        rng = random.Random(11)
        vb, sb = self._backend(), self._backend()
        vs = vb.get_state(ReducingStateDescriptor("r", Reducer.vectorized(vec), "int64"))
        ss = sb.get_state(ReducingStateDescriptor("r", lambda a, v: a - 2 * v + 1, "int64"))
        for _ in range(5):
            keys = [rng.randrange(30) for _ in range(200)]
            vals = [None if rng.random() < 0.1 else rng.randrange(-5, 5) for _ in keys]
            calls.clear()
            got = vs.add_batch(pa.array(keys, pa.int64()), pa.array(vals, pa.int64()))
            want = ss.add_batch(pa.array(keys, pa.int64()), pa.array(vals, pa.int64()))
            assert got.to_pylist() == want.to_pylist()
            assert 0 < len(calls) <= max(keys.count(k) for k in set(keys))
        assert snapshot_dump(vb.snapshot()) == snapshot_dump(sb.snapshot())
        vb.set_current_key(1)
        sb.set_current_key(1)
        vs.add(7)
        ss.add(7)
        assert vs.get() == ss.get()
        before = snapshot_dump(vb.snapshot())
        bad = [lambda a, v: pa.array([1]), lambda a, v: pa.array([None] * len(a), pa.int64()),
               lambda a, v: 1 / 0, lambda a, v: pa.array(["x"] * len(a))]
        for fn in bad:
            st = vb.get_state(ReducingStateDescriptor("r", Reducer.vectorized(fn), "int64"))
            with pytest.raises(InvalidInputError):
                st.add_batch(pa.array([1, 2, 1], pa.int64()), pa.array([1, 2, 3], pa.int64()))
            assert snapshot_dump(vb.snapshot()) == before
        with pytest.raises(InvalidInputError):
            ReducingStateDescriptor("p", Reducer.vectorized(vec))  # pickle values

    def test_reducing_custom_and_aggregating(self):
        b = self._backend()
        r = b.get_state(ReducingStateDescriptor("r", lambda a, x: a * 10 + x, "int64"))
        a = b.get_state(AggregatingStateDescriptor("a", AverageAggregate()))
        b.set_current_key(1)
        for x in [1, 2, 3]:
            r.add(x)
            a.add(x)
        assert r.get() == 123 and a.get() == 2.0
        a.add(None)
        assert a.get() == 2.0
        a.clear()
        assert a.get() is None
        b.set_current_key(2)
        assert r.get() is None and a.get() is None

    def test_aggregating_batch(self):
        """add_batch folds rows in order (the mutating AverageAggregate cannot change results
        already returned), a null row yields the current result; get_batch; result_type; an
        error in the function or in the results leaves the state unchanged."""
        b = self._backend()
        a = b.get_state(AggregatingStateDescriptor("a", AverageAggregate()))
        out = a.add_batch(pa.array([1, 2, 1, 1, 3]), pa.array([2, 5, 4, None, None]))
        assert out.to_pylist() == [2.0, 5.0, 3.0, 3.0, None]
        assert a.get_batch(pa.array([1, 2, 3])).to_pylist() == [3.0, 5.0, None]
        b.set_current_key(1)
        a.add(6)
        assert a.get() == 4.0
        single = self._backend()
        s = single.get_state(AggregatingStateDescriptor("a", AverageAggregate()))
        for k, v in [(1, 2), (2, 5), (1, 4), (1, 6)]:
            single.set_current_key(k)
            s.add(v)
        assert snapshot_dump(b.snapshot()) == snapshot_dump(single.snapshot())
        typed = b.get_state(AggregatingStateDescriptor("t", AverageAggregate(), result_type="string"))
        with pytest.raises(InvalidInputError, match="result_type"):
            typed.add_batch(pa.array([1]), pa.array([1]))  # 1.0 is not a string
        t64 = b.get_state(AggregatingStateDescriptor("t64", AverageAggregate(), result_type="float64"))
        assert t64.add_batch(pa.array([1]), pa.array([1])).type == pa.float64()
        before = snapshot_dump(b.snapshot())
        for call in (lambda: a.add_batch(pa.array([1, 2]), pa.array(["x", "y"])),
                     lambda: a.add_batch(pa.array([1]), pa.array([1, 2])),
                     lambda: typed.add_batch(pa.array([1]), pa.array(["x"]))):
            with pytest.raises(InvalidInputError):
                call()
            assert snapshot_dump(b.snapshot()) == before

    # ------------------------------------------------------------------ namespaces
    def test_namespaces(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"), namespace_type="int64")
        w = b.get_state(ValueStateDescriptor("w", "string"), namespace_type="string")
        b.set_current_key(1)
        with pytest.raises(InvalidInputError):
            v.value()
        v.set_current_namespace(10)
        v.update(1)
        v.set_current_namespace(20)
        assert v.value() is None
        v.update(2)
        v.set_current_namespace(10)
        assert v.value() == 1
        with pytest.raises(InvalidInputError):
            v.set_current_namespace("x")
        assert v.current_namespace == 10
        w.set_current_namespace("")
        w.update("e")
        w.set_current_namespace("a")
        assert w.value() is None
        assert b.num_entries() == 3
        void = b.get_state(ValueStateDescriptor("void"))
        with pytest.raises(InvalidInputError):
            void.set_current_namespace(1)
        void.set_current_namespace(None)

    def test_state_registration_conflicts(self):
        b = self._backend()
        b.get_state(ValueStateDescriptor("x", "int64"))
        with pytest.raises(StateMigrationError):
            b.get_state(ListStateDescriptor("x", "int64"))
        with pytest.raises(StateMigrationError):
            b.get_state(ValueStateDescriptor("x", "string"))
        with pytest.raises(StateMigrationError):
            b.get_state(ValueStateDescriptor("x", "int64"), namespace_type="int64")
        again = b.get_state(ValueStateDescriptor("x", "int64"))
        b.set_current_key(1)
        again.update(3)
        assert b.get_state(ValueStateDescriptor("x", pa.int64())).value() == 3
        with pytest.raises(InvalidInputError):
            b.get_state(ValueStateDescriptor("y"), namespace_type="float64")

    # ------------------------------------------------------------------ keys
    def test_invalid_keys(self):
        b = self._backend(key_group_range=(0, 63))
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        with pytest.raises(InvalidInputError):
            v.value()  # no current key yet
        inside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) <= 63)
        outside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) > 63)
        b.set_current_key(inside)
        v.update(1)
        for bad in [None, "1", 1.0, True, 1 << 64, outside]:
            with pytest.raises(InvalidInputError):
                b.set_current_key(bad)
            assert b.current_key == inside
        assert v.value() == 1
        assert b.current_key_group == K.spark_key_group(inside, "int64", 128)

    @pytest.mark.parametrize("key_type,keys", [
        ("int32", [0, -1, (1 << 31) - 1]), ("string", ["", "a", "日本語", "😀emoji"]),
        ("binary", [b"", b"\x00", b"abc"])])
    def test_key_types(self, key_type, keys):
        for assigner in ("spark", "flink"):
            b = self._backend(key_type=key_type, assigner=assigner)
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            for i, k in enumerate(keys):
                b.set_current_key(k)
                assert b.current_key_group == K.assign_key_group(k, key_type, 128, assigner)
                v.update(i)
            for i, k in enumerate(keys):
                b.set_current_key(k)
                assert v.value() == i
            arrow_type = {"int32": pa.int32(), "string": pa.string(), "binary": pa.binary()}[key_type]
            got = v.get_batch(pa.array(keys, arrow_type))
            assert got.to_pylist() == list(range(len(keys)))

    # ------------------------------------------------------------------ batch API
    def test_value_batch(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "float64"))
        v.put_batch(pa.array([1, 2, 3, 1], pa.int64()), pa.array([1.0, 2.0, 3.0, 4.0]))
        assert v.get_batch(pa.array([1, 2, 3, 4])).to_pylist() == [4.0, 2.0, 3.0, None]
        assert v.get_batch(pa.array([1, 2])).type == pa.float64()
        v.put_batch(pa.array([2, 2]), pa.array([None, 5.0]))
        v.put_batch(pa.array([3]), pa.array([None], pa.float64()))
        assert v.get_batch(pa.chunked_array([[1, 2], [3]])).to_pylist() == [4.0, 5.0, None]
        b.set_current_key(1)
        assert v.value() == 4.0
        assert v.contains_batch(pa.array([1, 4, 3])).to_pylist() == [True, False, False]
        v.clear_batch(pa.array([1]))
        assert v.value() is None and b.current_key == 1
        assert v.get_batch(pa.array([], pa.int64())).to_pylist() == []

    def test_batch_namespaces(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"), namespace_type="string")
        with pytest.raises(InvalidInputError):
            v.get_batch(pa.array([1]))  # no current namespace
        v.put_batch(pa.array([1, 1]), pa.array([10, 20]), namespaces=pa.array(["a", "b"]))
        v.put_batch(pa.array([2]), pa.array([30]), namespaces="a")
        v.set_current_namespace("b")
        assert v.get_batch(pa.array([1, 2])).to_pylist() == [20, None]
        assert v.get_batch(pa.array([1, 2]), namespaces="a").to_pylist() == [10, 30]
        b.set_current_key(2)
        v.set_current_namespace("a")
        assert v.value() == 30
        for bad in [pa.array(["a", None]), pa.array([1, 2]), pa.array(["a"]), 5]:
            with pytest.raises(InvalidInputError):
                v.put_batch(pa.array([1, 2]), pa.array([0, 0]), namespaces=bad)
        void = b.get_state(ValueStateDescriptor("w", "int64"))
        with pytest.raises(InvalidInputError):
            void.get_batch(pa.array([1]), namespaces=pa.array(["a"]))

    def test_reducing_batch(self):
        b = self._backend()
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        c = b.get_state(ReducingStateDescriptor("c", "count"))
        mx = b.get_state(ReducingStateDescriptor("mx", "max", "float64"))
        b.set_current_key(1)
        s.add(100)
        out = s.add_batch(pa.array([1, 2, 1, 3, 2]), pa.array([1, 5, None, None, 7]))
        assert out.type == pa.int64()
        assert out.to_pylist() == [101, 5, 101, None, 12]
        assert s.get_batch(pa.array([1, 2, 3])).to_pylist() == [101, 12, None]
        oc = c.add_batch(pa.array([1, 1, 2]), pa.array(["x", None, "y"]))
        assert oc.type == pa.int64() and oc.to_pylist() == [1, 1, 1]
        om = mx.add_batch(pa.array([4, 4, 4]), pa.array([2.0, 1.0, 3.0]))
        assert om.to_pylist() == [2.0, 2.0, 3.0]
        c.clear_batch(pa.array([1, 2]))
        assert c.get_batch(pa.array([1, 2])).to_pylist() == [None, None]

    def test_list_batch(self):
        b = self._backend()
        lst = b.get_state(ListStateDescriptor("l", "string"))
        lst.append_batch(pa.array([1, 2, 1]), pa.array(["a", "b", "c"]))
        lst.append_batch(pa.array([1, 3, 2], pa.int64()),
                         pa.array([["d", "e"], None, []], pa.list_(pa.string())))
        lst.append_batch(pa.chunked_array([[2]]), pa.array([["f"]], pa.large_list(pa.large_string())))
        got = lst.get_batch(pa.array([1, 2, 3]))
        assert got.type == pa.list_(pa.string())
        assert got.to_pylist() == [["a", "c", "d", "e"], ["b", "f"], []]
        lst.clear_batch(pa.array([1]))
        assert lst.get_batch(pa.array([1, 2])).to_pylist() == [[], ["b", "f"]]
        b.set_current_key(2)
        assert lst.get() == ["b", "f"]  # the batch calls did not move the current key
        assert b.current_key == 2

    def test_map_batch(self):
        b = self._backend()
        m = b.get_state(MapStateDescriptor("m", "int32", "float64"))
        m.put_batch(pa.array([1, 1, 2, 1]), pa.array([10, 20, 10, 10], pa.int32()),
                    pa.array([1.0, 2.0, 3.0, 4.0]))
        got = m.get_batch(pa.array([1, 1, 2, 2]), pa.array([10, 20, 10, 20], pa.int32()))
        assert got.type == pa.float64() and got.to_pylist() == [4.0, 2.0, 3.0, None]
        m.remove_batch(pa.array([1, 2, 2]), pa.array([10, 10, 99], pa.int32()))
        assert m.contains_batch(pa.array([1, 1, 2]), pa.array([10, 20, 10], pa.int32())
                                ).to_pylist() == [False, True, False]
        b.set_current_key(1)
        assert m.items() == [(20, 2.0)]
        b.set_current_key(2)
        assert m.is_empty()  # removing the last user key removed the map
        ns = b.get_state(MapStateDescriptor("n", "string", "int64"), namespace_type="string")
        ns.put_batch(pa.array([1, 1]), pa.array(["u", "u"]), pa.array([5, 6]),
                     namespaces=pa.array(["w1", "w2"]))
        assert ns.get_batch(pa.array([1, 1]), pa.array(["u", "u"]),
                            namespaces=pa.array(["w2", "w1"])).to_pylist() == [6, 5]

    def test_list_and_map_batches_equal_the_rows_one_at_a_time(self):
        rng = random.Random(5)
        keys = [rng.randrange(20) for _ in range(300)]
        uks = [rng.choice("abcde") for _ in keys]
        vals = [rng.randrange(-50, 50) for _ in keys]
        batched, single = self._backend(), self._backend()
        for be, batch in ((batched, True), (single, False)):
            lst = be.get_state(ListStateDescriptor("l", "int64"))
            m = be.get_state(MapStateDescriptor("m", "string", "int64"))
            for lo in range(0, len(keys), 60):
                ks, us, vs = keys[lo:lo + 60], uks[lo:lo + 60], vals[lo:lo + 60]
                if batch:
                    lst.append_batch(pa.array(ks, pa.int64()), pa.array(vs, pa.int64()))
                    m.put_batch(pa.array(ks, pa.int64()), pa.array(us), pa.array(vs, pa.int64()))
                    m.remove_batch(pa.array(ks[::7], pa.int64()), pa.array(us[::3][:len(ks[::7])]))
                else:
                    for k, u, v in zip(ks, us, vs):
                        be.set_current_key(k)
                        lst.add(v)
                        m.put(u, v)
                    for k, u in zip(ks[::7], us[::3]):
                        be.set_current_key(k)
                        m.remove(u)
        assert snapshot_dump(batched.snapshot()) == snapshot_dump(single.snapshot())

    def test_batch_errors_leave_state_untouched(self):
        b = self._backend(key_group_range=(0, 63))
        inside = [k for k in range(1000) if K.spark_key_group(k, "int64", 128) <= 63][:3]
        outside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) > 63)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        p = b.get_state(ValueStateDescriptor("p"))
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        v.put_batch(pa.array(inside), pa.array([1, 2, 3]))
        s.add_batch(pa.array(inside), pa.array([1, 2, 3]))
        lst.append_batch(pa.array(inside), pa.array([1, 2, 3]))
        m.put_batch(pa.array(inside), pa.array(["a", "b", "c"]), pa.array([1, 2, 3]))
        before = snapshot_dump(b.snapshot())
        k2 = pa.array(inside[:2])
        bad_calls = [
            lambda: v.put_batch(pa.array([inside[0], None]), pa.array([9, 9])),
            lambda: v.put_batch(k2, pa.array([9])),
            lambda: v.put_batch(k2, pa.array([9, 9], pa.int32())),
            lambda: v.put_batch(k2, pa.array(["a", "b"])),
            lambda: v.put_batch(pa.array(inside[:2], pa.int32()), pa.array([9, 9])),
            lambda: v.put_batch(pa.array([inside[0], outside]), pa.array([9, 9])),
            lambda: v.put_batch([1, 2], pa.array([9, 9])),
            lambda: v.get_batch(pa.array([inside[0], None])),
            lambda: s.add_batch(pa.array([inside[0], outside]), pa.array([9, 9])),
            lambda: s.add_batch(pa.array([inside[0], inside[0]]), pa.array([5, (1 << 63) - 1])),
            lambda: s.add_batch(k2, pa.array([1.0, 2.0])),
            lambda: v.clear_batch(pa.array([inside[0], outside])),
            lambda: p.put_batch(k2, pa.array([1, 2])),
            lambda: p.get_batch(k2),
            lambda: lst.append_batch(k2, pa.array([1, None])),
            lambda: lst.append_batch(k2, pa.array([[1], [2, None]], pa.list_(pa.int64()))),
            lambda: lst.append_batch(k2, pa.array([[1], [2]], pa.list_(pa.int32()))),
            lambda: lst.append_batch(k2, pa.array([1])),
            lambda: lst.append_batch(pa.array([inside[0], outside]), pa.array([1, 2])),
            lambda: m.put_batch(k2, pa.array(["a", None]), pa.array([1, 2])),
            lambda: m.put_batch(k2, pa.array(["a", "b"]), pa.array([1, None])),
            lambda: m.put_batch(k2, pa.array([1, 2]), pa.array([1, 2])),
            lambda: m.put_batch(k2, pa.array(["a"]), pa.array([1, 2])),
            lambda: m.remove_batch(pa.array([inside[0], outside]), pa.array(["a", "b"])),
            lambda: m.get_batch(k2, pa.array(["a", None])),
            lambda: b.timers.register_batch(pa.array([inside[0], outside]), pa.array([1, 2])),
            lambda: b.timers.register_batch(k2, pa.array([1, None], pa.int64())),
            lambda: b.timers.register_batch(k2, pa.array([1.0, 2.0])),
            lambda: b.timers.register_batch(k2, pa.array([1])),
            lambda: b.timers.register_batch(k2, pa.array([1, 2]), namespaces=pa.array([1, 2])),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert snapshot_dump(b.snapshot()) == before

    def test_batch_accepts_c_data_interface(self):
        class Wrapped:
            def __init__(self, arr):
                self.arr = arr

            def __arrow_c_array__(self, requested_schema=None):
                return self.arr.__arrow_c_array__(requested_schema)

        b = self._backend(key_type="string")
        v = b.get_state(ValueStateDescriptor("v", "string"))
        v.put_batch(Wrapped(pa.array(["a", "b"])), Wrapped(pa.array(["x", "y"])))
        assert v.get_batch(pa.array(["b", "a", "c"], pa.large_string())).to_pylist() == ["y", "x", None]

    # ------------------------------------------------------------------ Arrow streams
    @staticmethod
    def _column(values, type_, form: str, name: str = "c"):
        """One batch column in the input form ``form``: "array", "chunked" (a ChunkedArray of an
        empty, a sliced and a plain chunk), "stream" (an object exposing only
        ``__arrow_c_stream__`` over such chunks), "table" (a one-column Table behind only
        ``__arrow_c_stream__``: a record-batch stream) or "c_array" (only ``__arrow_c_array__``
        over a sliced array). Streams can be read once: build one per call."""
        arr = pa.array(values, type_)
        if form == "array":
            return arr
        if form == "c_array":
            padded = pa.concat_arrays([pa.array(values[:1] * 3, type_), arr]) if values else arr
            return _ArrayOnly(padded.slice(3) if values else arr)
        cut = len(arr) // 3
        padded = pa.concat_arrays([pa.array(values[:1] * 2, type_), arr.slice(cut)]) \
            if values else arr
        chunks = [arr.slice(0, 0), arr.slice(0, cut), padded.slice(2) if values else arr]
        ca = pa.chunked_array(chunks, type_)
        if form == "chunked":
            return ca
        if form == "stream":
            return _StreamOnly(ca)
        if form == "table":
            return _StreamOnly(pa.table({name: ca}))
        raise ValueError(form)

    def _stream_program(self, form: str):
        def col(values, type_):
            return self._column(values, type_, form)

        def program(b):
            from statecore.ttl import StateTtlConfig

            n = 40
            keys = [(i * 7) % 13 for i in range(n)]
            ints = [None if i % 9 == 4 else i - 20 for i in range(n)]
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            vt = b.get_state(ValueStateDescriptor("vt", "string").enable_time_to_live(
                StateTtlConfig(10**9)))
            s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
            mx = b.get_state(ReducingStateDescriptor("mx", "max", "float64"))
            cnt = b.get_state(ReducingStateDescriptor("cnt", "count"))
            agg = b.get_state(AggregatingStateDescriptor("a", AverageAggregate(), "pickle"))
            lst = b.get_state(ListStateDescriptor("l", "int32"))
            m = b.get_state(MapStateDescriptor("m", "string", "int64"))
            ns = b.get_state(ValueStateDescriptor("ns", "int64"), namespace_type="string")
            seen = []
            v.put_batch(col(keys, pa.int64()), col(ints, pa.int64()))
            seen.append(v.get_batch(col(list(range(15)), pa.int64())).to_pylist())
            seen.append(v.contains_batch(col(list(range(15)), pa.int64())).to_pylist())
            v.clear_batch(col([1, 2, 3], pa.int64()))
            vt.put_batch(col(keys, pa.int64()), col([str(x) for x in ints], pa.string()))
            seen.append(vt.get_batch(col(keys, pa.int64())).to_pylist())
            seen.append(s.add_batch(col(keys, pa.int64()), col(ints, pa.int64())).to_pylist())
            seen.append(s.get_batch(col(keys[:5], pa.int64())).to_pylist())
            floats = [None if x is None else x / 3 for x in ints]
            seen.append(mx.add_batch(col(keys, pa.int64()), col(floats, pa.float64())).to_pylist())
            # Values of any type (count, aggregating) are taken as they come: a one-column
            # record batch would be a struct value there, so "table" passes a column instead.
            anycol = col if form != "table" else (lambda xs, t: self._column(xs, t, "stream"))
            seen.append(cnt.add_batch(col(keys, pa.int64()), anycol(floats, pa.float64())).to_pylist())
            seen.append(agg.add_batch(col(keys, pa.int64()), anycol(ints, pa.int64())).to_pylist())
            seen.append(agg.get_batch(col(keys[:5], pa.int64())).to_pylist())
            lst.append_batch(col(keys, pa.int64()), col([i for i in range(n)], pa.int32()))
            seen.append(lst.get_batch(col(keys[:5], pa.int64())).to_pylist())
            uks = [str(i % 4) for i in range(n)]
            m.put_batch(col(keys, pa.int64()), col(uks, pa.string()), col(list(range(n)), pa.int64()))
            seen.append(m.get_batch(col(keys, pa.int64()), col(uks[::-1], pa.string())).to_pylist())
            seen.append(m.contains_batch(col(keys, pa.int64()), col(uks[::-1], pa.string())).to_pylist())
            m.remove_batch(col(keys[:10], pa.int64()), col(uks[:10], pa.string()))
            nss = ["a" if i % 3 else "b" for i in range(n)]
            ns.put_batch(col(keys, pa.int64()), col(ints, pa.int64()), namespaces=col(nss, pa.string()))
            seen.append(ns.get_batch(col(keys, pa.int64()), namespaces=col(nss[::-1], pa.string())).to_pylist())
            b.timers.register_batch(col(keys, pa.int64()), col(list(range(n)), pa.int64()))
            b.timers.delete_batch(col(keys[:10], pa.int64()), col(list(range(10)), pa.int64()))
            seen.append(b.timers.num_timers())
            return seen

        return program

    @pytest.mark.parametrize("form", ["chunked", "stream", "table", "c_array"])
    def test_batch_accepts_arrow_streams(self, form):
        """Every batch call reads stream / chunked / capsule inputs as the plain array."""
        from statecore.ttl import ManualClock

        seen = self._same_as_reference(self._stream_program(form), ttl_clock=ManualClock(0))
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128,
                                          ttl_clock=ManualClock(0))
        assert seen == self._stream_program("array")(ref)

    @pytest.mark.parametrize("form", ["chunked", "stream", "table"])
    def test_multi_column_keys_from_a_record_batch_stream(self, form):
        # A record-batch stream of the key columns is the struct key array.
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            ks = pa.StructArray.from_arrays([pa.array([1, 2, 1, 3], pa.int32()),
                                             pa.array(["a", "b", "a", "c"])], names=["x", "y"])
            chunks = [ks.slice(0, 1), ks.slice(1)]
            if form == "chunked":
                keys = pa.chunked_array(chunks)
            elif form == "stream":
                keys = _StreamOnly(pa.chunked_array(chunks))
            else:
                keys = _StreamOnly(pa.Table.from_batches(
                    [pa.RecordBatch.from_struct_array(c) for c in chunks]))
            v.put_batch(keys, pa.array([1, 2, 3, 4]))
            return v.get_batch(ks).to_pylist()

        assert self._same_as_reference(program, key_type=("int32", "string")) == [3, 2, 3, 4]

    def test_batch_stream_errors_leave_state_untouched(self):
        from statecore.ttl import ManualClock, StateTtlConfig

        clock = ManualClock(0)
        b = self._backend(key_group_range=(0, 63), ttl_clock=clock)
        inside = [k for k in range(5000) if K.spark_key_group(k, "int64", 128) <= 63][:40]
        outside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) > 63)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        s32 = b.get_state(ReducingStateDescriptor("s32", "sum", "int32"))
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        vt = b.get_state(ValueStateDescriptor("vt", "int64").enable_time_to_live(
            StateTtlConfig(10)))
        v.put_batch(pa.array(inside), pa.array(range(40)))
        s.add_batch(pa.array(inside), pa.array(range(40)))
        s32.add_batch(pa.array(inside), pa.array(range(40), pa.int32()))
        vt.put_batch(pa.array(inside), pa.array(range(40)))
        clock.set(100)  # every vt entry expired: a TTL read would remove what it reads
        before = snapshot_dump(b.snapshot())

        def chunked(*parts, type_=pa.int64()):
            return pa.chunked_array([pa.array(p, type_) for p in parts], type_)

        def failing_stream(first, type_=pa.int64()):
            schema = pa.schema([("c", type_)])

            def gen():
                yield pa.record_batch([pa.array(first, type_)], schema=schema)
                raise RuntimeError("producer failed mid-stream")

            return _StreamOnly(pa.RecordBatchReader.from_batches(schema, gen()))

        good = inside[:20]
        bad_calls = [
            # a later chunk holds a key outside the range, a null key, a bad value type
            lambda: v.put_batch(chunked(good, [inside[20], outside]), chunked(range(22))),
            lambda: v.put_batch(_StreamOnly(chunked(good, [inside[20], None])), chunked(range(22))),
            lambda: v.get_batch(chunked(good, [outside])),
            lambda: vt.get_batch(chunked(good, [outside])),
            lambda: vt.get_batch(_StreamOnly(chunked(good, [None]))),
            lambda: v.put_batch(chunked(good), _StreamOnly(chunked(range(20), type_=pa.int32()))),
            lambda: v.put_batch(_StreamOnly(chunked(good, type_=pa.int32())), chunked(range(20))),
            # mismatched total lengths, as streams
            lambda: v.put_batch(_StreamOnly(chunked(good[:10], good[10:])), _StreamOnly(chunked(range(19)))),
            lambda: s.add_batch(chunked(good), _StreamOnly(chunked(range(5), range(16)))),
            # a stream that errors mid-way
            lambda: v.put_batch(failing_stream(good), pa.array(range(20))),
            lambda: v.put_batch(pa.array(good), failing_stream(list(range(10)))),
            lambda: s.add_batch(failing_stream(good), pa.array(range(20))),
            lambda: m.put_batch(pa.array(good[:2]), failing_stream(["a"], pa.string()), pa.array([1, 2])),
            lambda: lst.append_batch(pa.array(good[:2]), failing_stream([1])),
            lambda: b.timers.register_batch(pa.array(good[:2]), failing_stream([1])),
            # an overflowing sum in a later chunk
            lambda: s.add_batch(chunked(good, good), chunked(range(20), [1] * 19 + [(1 << 63) - 1])),
            lambda: s32.add_batch(chunked(good, good), chunked(range(20), [1] * 19 + [(1 << 31) - 1],
                                                              type_=pa.int32())),
            # a record-batch stream of two columns is not a column
            lambda: v.put_batch(_StreamOnly(pa.table({"a": good, "b": good})), pa.array(range(20))),
            # not Arrow at all
            lambda: v.put_batch(object(), pa.array(range(20))),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert snapshot_dump(b.snapshot()) == before

    # ------------------------------------------------------------------ int32 / bool batches
    @pytest.mark.parametrize("ttl", [False, True])
    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_differential_int32_bool_batches(self, ttl, seed):
        """int32 and bool value and reducing states through the batch API (nulls in values,
        sliced arrays, repeated keys, TTL): the same outputs and snapshot bytes as the
        reference backend."""
        from statecore.ttl import ManualClock, StateTtlConfig

        def program(b):
            b.ttl_clock.set(0)  # one clock object serves both backends of the comparison
            rnd = random.Random(seed)
            descs = {"v32": ValueStateDescriptor("v32", "int32"),
                     "vb": ValueStateDescriptor("vb", "bool"),
                     **{f"r32{r}": ReducingStateDescriptor(f"r32{r}", r, "int32")
                        for r in ("sum", "min", "max", "first", "last")},
                     **{f"rb{r}": ReducingStateDescriptor(f"rb{r}", r, "bool")
                        for r in ("first", "last")},
                     "cnt": ReducingStateDescriptor("cnt", "count")}
            if ttl:
                for d in descs.values():
                    d.enable_time_to_live(StateTtlConfig(50, update_type="OnReadAndWrite"))
            st = {name: b.get_state(d) for name, d in descs.items()}
            seen = []
            for round_ in range(6):
                n = rnd.randrange(0, 30)
                pad = rnd.randrange(0, 3)
                keys = pa.array([rnd.randrange(12) for _ in range(n + pad)], pa.int64()).slice(pad)
                i32 = pa.array([None if rnd.random() < 0.2 else rnd.randrange(-1000, 1000)
                                for _ in range(n + pad)], pa.int32()).slice(pad)
                bools = pa.array([None if rnd.random() < 0.2 else rnd.random() < 0.5
                                  for _ in range(n + pad)], pa.bool_()).slice(pad)
                st["v32"].put_batch(keys, i32)
                st["vb"].put_batch(keys, bools)
                for name, s in st.items():
                    if name.startswith("r32"):
                        seen.append((name, s.add_batch(keys, i32).to_pylist()))
                    elif name.startswith("rb") or name == "cnt":
                        seen.append((name, s.add_batch(keys, bools).to_pylist()))
                probe = pa.array(range(14), pa.int64())
                for name, s in st.items():
                    got = s.get_batch(probe)
                    seen.append((name, str(got.type), got.to_pylist()))
                seen.append(st["vb"].contains_batch(probe).to_pylist())
                if round_ == 3:
                    big = pa.array([(1 << 31) - 1] * 2, pa.int32())
                    with pytest.raises(InvalidInputError):
                        st["r32sum"].add_batch(pa.array([0, 0], pa.int64()), big)
                b.ttl_clock.advance(rnd.choice([0, 10, 30]))
            return seen

        self._same_as_reference(program, ttl_clock=ManualClock(0))

    # ------------------------------------------------------------------ timers
    def test_timers(self):
        b = self._backend(timer_namespace_type="int64")
        t = b.timers
        keys = list(range(20))
        for k in keys:
            b.set_current_key(k)
            t.register_event_time_timer(100, namespace=0)
            t.register_event_time_timer(100, namespace=0)  # duplicate: registered once
            t.register_event_time_timer(50 + k, namespace=1)
        assert t.num_timers() == 40
        b.set_current_key(3)
        assert t.list_event_time_timers() == [(53, 1), (100, 0)]
        t.delete_event_time_timer(53, namespace=1)
        t.delete_event_time_timer(999, namespace=1)  # absent: no-op
        assert t.advance_watermark(49) == []
        fired = t.advance_watermark(60)
        assert [(ts, k, ns) for ts, k, ns in fired] == [(50 + k, k, 1) for k in range(11) if k != 3]
        fired = t.advance_watermark(100)
        assert [(ts, k) for ts, k, _ in fired[:9]] == [(50 + k, k) for k in range(11, 20)]
        ties = fired[9:]
        assert len(ties) == 20 and all(ts == 100 and ns == 0 for ts, _, ns in ties)

        def tie_order(k):
            kg = K.spark_key_group(k, "int64", 128)
            return kg, S.encode_timer_key(kg, 128, 100, k, "int64", 0, "int64")

        assert [k for _, k, _ in ties] == sorted(keys, key=tie_order)
        assert t.num_timers() == 0
        assert t.advance_watermark(10_000) == []
        b.set_current_key(1)
        t.register_event_time_timer(-5, namespace=0)
        # the watermark never goes back: a lower value still fires what is behind 10_000
        assert t.advance_watermark(50) == [(-5, 1, 0)]
        assert t.current_watermark == 10_000

    def test_timer_batch_equals_the_rows_one_at_a_time(self):
        batched = self._backend(timer_namespace_type="int64")
        single = self._backend(timer_namespace_type="int64")
        keys, ts, nss = [1, 2, 1, 3, 1], [100, 50, 100, 70, 40], [0, 0, 0, 1, 2]
        batched.timers.register_batch(pa.array(keys, pa.int64()), pa.array(ts, pa.int64()),
                                      namespaces=pa.array(nss, pa.int64()))
        batched.timers.delete_batch(pa.array([3]), pa.array([70]), namespaces=1)
        for k, t, ns in zip(keys, ts, nss):
            single.set_current_key(k)
            single.timers.register_event_time_timer(t, namespace=ns)
        single.set_current_key(3)
        single.timers.delete_event_time_timer(70, namespace=1)
        assert batched.current_key is None  # the batch did not set a current key
        assert batched.timers.all_timers() == single.timers.all_timers()
        assert batched.timers.num_timers() == 3
        # Timestamp arrays are taken in ms, finer units floored.
        b = self._backend()
        b.timers.register_batch(pa.array([1, 2]), pa.array([1_500, -1], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")))
        assert [ts for _, ts, _, _ in b.timers.all_timers()] == [-1, 1]
        b.timers.delete_batch(pa.array([1, 2]), pa.array([1, -1], pa.int64()))
        assert b.timers.num_timers() == 0

    def test_timer_ordering_and_validation(self):
        b = self._backend()
        t = b.timers
        with pytest.raises(InvalidInputError):
            t.register_event_time_timer(5)  # no current key
        b.set_current_key(1)
        for bad in [1.5, None, "1", 1 << 63]:
            with pytest.raises(InvalidInputError):
                t.register_event_time_timer(bad)
        with pytest.raises(InvalidInputError):
            t.register_event_time_timer(1, namespace=3)  # void timer namespace
        for ts in [30, -10, 20, 10]:
            t.register_event_time_timer(ts)
        t.delete_event_time_timer(20)
        t.register_event_time_timer(20)
        t.delete_event_time_timer(20)
        assert t.advance_watermark(25) == [(-10, 1, None), (10, 1, None)]
        t.register_event_time_timer(5)  # behind the watermark: fires at the next advance
        assert t.advance_watermark(25) == [(5, 1, None)]
        assert t.advance_watermark(30) == [(30, 1, None)]
        with pytest.raises(InvalidInputError):
            t.advance_watermark("x")

    # ------------------------------------------------------------------ snapshots
    def _populate(self, b, keys, tag=0):
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        ls = b.get_state(ListStateDescriptor("l", "string"), namespace_type="int64")
        m = b.get_state(MapStateDescriptor("m", "int64", "pickle"))
        r = b.get_state(ReducingStateDescriptor("r", "sum", "float64"))
        ls.set_current_namespace(7)
        for k in keys:
            b.set_current_key(k)
            v.update(k * 10 + tag)
            ls.add_all([f"{k}", "x"])
            m.put(k, {"k": k})
            m.put(-1, None)
            r.add(k / 2)
            b.timers.register_event_time_timer(1000 + k)

    def test_snapshot_isolation(self):
        b = self._backend()
        self._populate(b, range(30))
        snap = b.snapshot()
        dump = snapshot_dump(snap)
        assert dump == snapshot_dump(snap)
        self._populate(b, range(20, 60), tag=1)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(0)
        v.clear()
        b.timers.advance_watermark(1010)
        assert snapshot_dump(snap) == dump
        snap.release()
        snap.release()
        with pytest.raises(StateError):
            snap.entries("v", 0)

    def test_snapshot_format(self):
        b = self._backend()
        self._populate(b, range(10))
        snap = b.snapshot()
        metas = _metas(snap)
        assert metas["v"]["kind"] == "value" and metas["v"]["value_type"] == "int64"
        assert metas["l"]["namespace_type"] == "int64" and metas["m"]["user_key_type"] == "int64"
        assert metas["__timers__"]["kind"] == "timers"
        assert snap.max_parallelism == 128 and snap.key_type == "int64" and snap.assigner == "spark"
        n = 0
        for kg, rows in snapshot_dump(snap)["v"].items():
            keys = [k for k, _ in rows]
            assert keys == sorted(keys)
            for kb, vb in rows:
                kg2, key, ns, _ = S.decode_key(kb, 128, "int64", "void")
                assert kg2 == kg == K.spark_key_group(key, "int64", 128)
                assert S.value_serializer("int64").deserialize(vb) == key * 10
                n += 1
        assert n == 10
        for rows in snapshot_dump(snap)["l"].values():
            for kb, vb in rows:
                _, key, ns, _ = S.decode_key(kb, 128, "int64", "int64")
                assert ns == 7 and S.decode_list(vb, "string") == [str(key), "x"]
        for rows in snapshot_dump(snap)["m"].values():
            for kb, vb in rows:
                _, key, _, _ = S.decode_key(kb, 128, "int64", "void")
                # sorted by serialized user key: big-endian two's complement puts -1 last
                assert S.decode_map(vb, "int64", "pickle") == [(key, {"k": key}), (-1, None)]
        ts = sorted(S.decode_timer_key(kb, 128, "int64", "void")[1]
                    for rows in snapshot_dump(snap)["__timers__"].values() for kb, _ in rows)
        assert ts == [1000 + k for k in range(10)]
        expected = sum(len(kb) + len(vb) for name, per in snapshot_dump(snap).items()
                       if name != "__timers__" for rows in per.values() for kb, vb in rows)
        assert b.state_bytes() == expected
        assert b.num_entries() == 40

    def test_snapshot_restore_round_trip(self):
        b = self._backend()
        self._populate(b, range(50))
        snap = b.snapshot()
        fresh = self._backend()
        fresh.restore(snap)
        assert snapshot_dump(fresh.snapshot()) == snapshot_dump(snap)
        assert fresh.num_entries() == b.num_entries() and fresh.state_bytes() == b.state_bytes()
        fresh.set_current_key(7)
        assert fresh.get_state(ValueStateDescriptor("v", "int64")).value() == 70
        assert fresh.get_state(MapStateDescriptor("m", "int64", "pickle")).get(7) == {"k": 7}
        with pytest.raises(StateMigrationError):
            fresh.get_state(ValueStateDescriptor("m", "int64"))
        with pytest.raises(StateMigrationError):
            fresh.get_state(ListStateDescriptor("l", "string"))  # namespace type differs
        assert [f[0] for f in fresh.timers.advance_watermark(1005)] == [1000, 1001, 1002, 1003, 1004, 1005]
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128)
        ref.restore(snap)
        assert snapshot_dump(ref.snapshot()) == snapshot_dump(snap)

    def test_restore_rejects_incompatible(self):
        b = self._backend()
        self._populate(b, range(5))
        snap = b.snapshot()
        for kw in [dict(key_type="string"), dict(max_parallelism=256), dict(assigner="flink")]:
            other = self._backend(**kw)
            with pytest.raises(StateMigrationError):
                other.restore(snap)
            assert other.num_entries() == 0
        other = self._backend()
        other.get_state(ValueStateDescriptor("v", "string"))
        with pytest.raises(StateMigrationError):
            other.restore(snap)

    def test_restore_of_malformed_snapshot_changes_nothing(self):
        """A snapshot whose timers, keys or values are malformed is rejected as a whole: the
        states and timers the backend already held are exactly as before."""
        b = self._backend()
        self._populate(b, range(20))
        snap = b.snapshot()

        target = self._backend()
        self._populate(target, range(100, 110))
        before = snapshot_dump(target.snapshot())
        timers_before = target.timers.num_timers()
        bad = [
            ("__timers__", lambda k, v: (pa.array([b"\x00"] * len(k), pa.binary()), v)),
            ("v", lambda k, v: (pa.array([x[:1] for x in k.to_pylist()], pa.binary()), v)),
            ("v", lambda k, v: (k, pa.array([b"\x01\x02"] * len(v), pa.binary()))),
        ]
        for state, mangle in bad:
            with pytest.raises((InvalidInputError, StateMigrationError)):
                target.restore(TamperedSnapshot(snap, state, mangle))
            assert snapshot_dump(target.snapshot()) == before
            assert target.timers.num_timers() == timers_before

    def _ttl_migration_history(self, make) -> list:
        """Restore plain state with TTL switched on (enable_ttl_migration), write a little,
        snapshot, restore that with TTL switched off again once part of it expired; returns what
        to compare: snapshot dumps, ``incremental`` flags and TTL statistics."""
        from statecore.ttl import ManualClock, StateTtlConfig

        def register(b, ttl):
            def d(desc):
                if ttl:
                    desc.enable_time_to_live(StateTtlConfig(100))
                return desc.enable_ttl_migration()
            ls = b.get_state(d(ListStateDescriptor("l", "string")), namespace_type="int64")
            ls.set_current_namespace(7)
            return (b.get_state(d(ValueStateDescriptor("v", "int64"))), ls,
                    b.get_state(d(MapStateDescriptor("m", "int64", "pickle"))),
                    b.get_state(d(ReducingStateDescriptor("r", "sum", "float64"))),
                    b.get_state(d(AggregatingStateDescriptor("a", AverageAggregate(), "pickle"))))

        src = make(key_type="int64", max_parallelism=128)
        self._populate(src, range(40))
        agg = src.get_state(AggregatingStateDescriptor("a", AverageAggregate(), "pickle"))
        for k in range(40):
            src.set_current_key(k)
            agg.add(k)
        out = []
        clock = ManualClock(1000)
        b = make(key_type="int64", max_parallelism=128, ttl_clock=clock)
        b.restore(src.snapshot())
        v, ls, m, r, a = register(b, ttl=True)  # off -> on: stamped 1000
        out.append(snapshot_dump(b.snapshot()))
        clock.set(1050)
        for k in range(10):
            b.set_current_key(k)
            v.update(-k)
            ls.add("late")
            m.put(1000, k)
            r.add(1.0)
            a.add(k)
        snap = b.snapshot(incremental=True)  # full: the base is the plain state
        out += [snap.incremental, snapshot_dump(snap), b.ttl_statistics()]
        c = make(key_type="int64", max_parallelism=128, ttl_clock=ManualClock(1120))
        c.restore(snap)
        register(c, ttl=False)  # on -> off: what was written at 1000 expired at 1100
        out += [snapshot_dump(c.snapshot()), c.ttl_statistics(), c.num_entries()]
        return out

    def test_ttl_migration_matches_reference(self):
        got = self._ttl_migration_history(self.make_backend)
        assert got == self._ttl_migration_history(self.make_reference_backend)
        assert got[1] is False  # the snapshot after the migration was full
        # v, r, a: 30 keys each; l: 2 elements, m: 2 entries of each of the 40 keys
        assert got[-2]["migration"] == 3 * 30 + 80 + 80
        assert got[-1] == 10 * 5  # keys 0-9 of each state survive

    @pytest.mark.parametrize("max_parallelism", [128, 300])
    def test_rescale_two_to_three(self, max_parallelism):
        mp = max_parallelism
        old = []
        for i in range(2):
            kgr = K.key_group_range_for_operator(mp, 2, i)
            b = self._backend(max_parallelism=mp, key_group_range=kgr)
            mine = [k for k in range(400) if K.spark_key_group(k, "int64", mp) in kgr]
            self._populate(b, mine)
            old.append((b.snapshot(), mine))
        all_keys = sorted(k for _, ks in old for k in ks)
        assert all_keys == list(range(400))
        seen_keys, seen_timers = [], []
        for j in range(3):
            kgr = K.key_group_range_for_operator(mp, 3, j)
            nb = self._backend(max_parallelism=mp, key_group_range=kgr)
            for snap, _ in old:
                nb.restore(snap)
            owned = [k for k in range(400) if K.spark_key_group(k, "int64", mp) in kgr]
            assert nb.num_entries() == 4 * len(owned)
            v = nb.get_state(ValueStateDescriptor("v", "int64"))
            assert v.get_batch(pa.array(owned)).to_pylist() == [k * 10 for k in owned]
            dump = snapshot_dump(nb.snapshot())
            for name, per in dump.items():
                assert set(per) <= set(kgr), name
                if mp > 128:
                    for kg, rows in per.items():
                        assert all(kb[:2] == kg.to_bytes(2, "big") for kb, _ in rows)
            seen_keys += owned
            fired = nb.timers.advance_watermark(10_000)
            assert sorted(k for _, k, _ in fired) == owned
            seen_timers += [k for _, k, _ in fired]
        assert sorted(seen_keys) == list(range(400))
        assert sorted(seen_timers) == list(range(400))

    def test_flink_assigner_and_large_max_parallelism(self):
        b = self._backend(key_type="string", max_parallelism=4096, assigner="flink")
        v = b.get_state(ValueStateDescriptor("v", "int32"), namespace_type="string")
        b.set_current_key("hello")
        assert b.current_key_group == 2723
        v.set_current_namespace("ns")
        v.update(1)
        (kb, vb), = snapshot_dump(b.snapshot())["v"][2723]
        assert kb.hex() == "0aa30668656c6c6f06036e7303"
        assert vb == (1).to_bytes(4, "little")
        b.set_current_key("a")
        assert b.current_key_group == 3025

    def test_close(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(1)
        v.update(1)
        b.close()
        b.close()
        with pytest.raises(StateError):
            b.set_current_key(1)

    # ------------------------------------------------------------------ current key and namespace
    # A backend may cache what it derives from the current key and namespace (the native one
    # caches each state's encoded key); these tests fail if such a cache goes stale. Each runs
    # the same program on this backend and on the reference and compares every observation and
    # the snapshot bytes.
    def _same_as_reference(self, program, **kw):
        kw.setdefault("key_type", "int64")
        kw.setdefault("max_parallelism", 128)
        runs = []
        for b in (self.make_backend(**kw), self.make_reference_backend(**kw)):
            seen = program(b)
            runs.append((seen, snapshot_dump(b.snapshot())))
        assert runs[0][0] == runs[1][0]
        assert runs[0][1] == runs[1][1]
        return runs[0][0]

    @staticmethod
    def _every_kind(b, ttl: bool = False, namespace_type: str = "void") -> dict:
        from statecore.ttl import StateTtlConfig

        descs = {"v": ValueStateDescriptor("v", "int64", default=-1),
                 "l": ListStateDescriptor("l", "string"),
                 "m": MapStateDescriptor("m", "string", "int64"),
                 "r": ReducingStateDescriptor("r", "sum", "int64"),
                 "a": AggregatingStateDescriptor("a", AverageAggregate(), "pickle")}
        if ttl:
            for d in descs.values():
                d.enable_time_to_live(StateTtlConfig(10**9, update_type="OnReadAndWrite"))
        return {n: b.get_state(d, namespace_type=namespace_type) for n, d in descs.items()}

    @staticmethod
    def _read_all(st: dict) -> tuple:
        return (st["v"].value(), st["l"].get(), st["m"].items(), st["r"].get(), st["a"].get())

    @staticmethod
    def _write_all(st: dict, i: int) -> None:
        st["v"].update(i)
        st["l"].add(str(i))
        st["m"].put(str(i), i)
        st["r"].add(i)
        st["a"].add(i)

    @pytest.mark.parametrize("ttl", [False, True])
    def test_key_switches_address_each_keys_entries(self, ttl):
        from statecore.ttl import ManualClock

        def program(b):
            st = self._every_kind(b, ttl=ttl)
            seen = []
            for k in (1, 2, 1, 1, 3, 2):
                b.set_current_key(k)
                seen.append(self._read_all(st))
                self._write_all(st, k * 10 + len(seen))
                seen.append(self._read_all(st))
            b.set_current_key(2)
            b.set_current_key(1)  # two switches without an access in between
            seen.append(self._read_all(st))
            for s in st.values():
                s.clear()
            seen.append(self._read_all(st))
            b.set_current_key(2)
            seen.append(self._read_all(st))
            return seen

        seen = self._same_as_reference(program, ttl_clock=ManualClock(0))
        assert seen[0] == (-1, [], [], None, None)
        assert seen[1][0] == 11 and seen[2] == (-1, [], [], None, None)  # key 2 sees nothing of 1

    @pytest.mark.parametrize("key_type,keys", [("int64", (1, 2)), ("string", ("b", "bb"))])
    @pytest.mark.parametrize("ns_type,namespaces", [("int64", [5, 6, 5]),
                                                    ("string", ["a", "ab", "", "a"])])
    def test_namespace_switches_address_each_namespaces_entries(self, key_type, keys, ns_type,
                                                               namespaces):
        # string keys with string namespaces: encoded keys carry length bytes ("b"+"ab" and
        # "bb"+"a" must not meet)
        def program(b):
            st = self._every_kind(b, namespace_type=ns_type)
            other = b.get_state(ValueStateDescriptor("other", "int64"), namespace_type=ns_type)
            seen = []
            for i, k in enumerate(keys):
                b.set_current_key(k)
                other.set_current_namespace(namespaces[-1])
                for j, ns in enumerate(namespaces):
                    for s in st.values():
                        s.set_current_namespace(ns)
                    seen.append(self._read_all(st))
                    self._write_all(st, 100 * i + j)
                    seen.append(self._read_all(st))
                    # another state's namespace is its own
                    seen.append(other.value())
                    other.update(j)
                # a rejected namespace leaves the current one in force
                with pytest.raises(InvalidInputError):
                    st["v"].set_current_namespace(None if ns_type == "string" else "x")
                seen.append((st["v"].current_namespace, st["v"].value()))
            b.set_current_key(keys[0])
            st["v"].set_current_namespace(namespaces[0])
            seen.append(st["v"].value())
            # the same namespace again (also as a numpy scalar), then another key with it
            same = np.int64(namespaces[0]) if ns_type == "int64" else np.str_(namespaces[0])
            for ns in (namespaces[0], same):
                st["v"].set_current_namespace(ns)
                seen.append(st["v"].value())
            b.set_current_key(keys[1])
            st["v"].set_current_namespace(namespaces[0])
            seen.append(st["v"].value())
            st["v"].update(-5)
            b.set_current_key(keys[0])
            seen.append(st["v"].value())
            return seen

        self._same_as_reference(program, key_type=key_type)

    @pytest.mark.parametrize("key_type,variants", [
        ("int64", [1, np.int64(1), np.int32(1)]),
        ("float64", [1.0, 1, np.float64(1.0), np.int64(1), np.float32(1.0)]),
        ("float64", [0.0, -0.0]),
        ("bool", [True, np.bool_(True)]),
        ("string", ["ab", np.str_("ab")]),
        ("binary", [b"ab", bytearray(b"ab"), memoryview(b"ab")]),
        ("timestamp[us]", [86_400_000_000, np.int64(86_400_000_000),
                           datetime.datetime(1970, 1, 2, tzinfo=datetime.timezone.utc)]),
    ])
    def test_equal_keys_of_other_python_types_are_one_key(self, key_type, variants):
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            lst = b.get_state(ListStateDescriptor("l", "int64"))
            seen = []
            for i, k in enumerate(variants):
                b.set_current_key(k)
                seen.append((b.current_key, b.current_key_group, v.value(), lst.get()))
                v.update(i)
                lst.add(i)
            return seen

        seen = self._same_as_reference(program, key_type=key_type)
        assert [s[2] for s in seen] == [None] + list(range(len(variants) - 1))
        assert len({(s[0], s[1]) for s in seen}) == 1

    def test_rejected_key_keeps_the_current_key(self):
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            seen = []
            b.set_current_key(1)
            v.update(10)
            b.set_current_key(2)
            v.update(20)
            for bad in (True, 1.0, "1", None, 1 << 63, np.float64(2.0)):
                with pytest.raises(InvalidInputError):
                    b.set_current_key(bad)
                seen.append((b.current_key, v.value()))
                v.update(v.value() + 1)
            return seen

        assert self._same_as_reference(program)[0] == (2, 20)
        # a key outside the range: rejected before anything changes
        b = self._backend(key_group_range=(0, 63))
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        inside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) <= 63)
        outside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) > 63)
        b.set_current_key(inside)
        v.update(5)
        with pytest.raises(InvalidInputError, match="outside this backend's key-group range"):
            b.set_current_key(outside)
        assert (b.current_key, v.value()) == (inside, 5)

    def test_current_key_entries_after_snapshot_restore_and_batches(self):
        def program(b):
            st = self._every_kind(b)
            seen = []
            b.set_current_key(7)
            self._write_all(st, 1)
            snap = b.snapshot()
            self._write_all(st, 2)
            seen.append(self._read_all(st))
            b.restore(snap)  # same key overwritten with the snapshot's entries
            seen.append(self._read_all(st))
            snap.release()
            # batch calls address their own rows and leave the current key and its cache
            st["v"].put_batch(pa.array([7, 8]), pa.array([70, 80]))
            seen.append(st["v"].value())
            st["r"].add_batch(pa.array([8, 7, 8]), pa.array([1, 2, 3]))
            st["l"].append_batch(pa.array([8, 7]), pa.array(["x", "y"]))
            st["m"].put_batch(pa.array([8]), pa.array(["k"]), pa.array([1]))
            st["a"].add_batch(pa.array([8]), pa.array([4]))
            seen.append((b.current_key, self._read_all(st)))
            st["v"].clear_batch(pa.array([7]))
            seen.append(st["v"].value())
            other = b.get_state(ValueStateDescriptor("v", "int64", default=-1))  # a new state object
            other.update(3)
            seen.append((st["v"].value(), other.value()))
            return seen

        seen = self._same_as_reference(program)
        assert seen[0][0] == 2 and seen[1][0] == 1 and seen[2] == 70 and seen[4] == -1

    def test_closed_backend_rejects_state_access(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(1)
        v.update(1)
        assert v.value() == 1
        b.close()
        with pytest.raises(StateError):
            v.value()
        with pytest.raises(StateError):
            v.update(2)

    # ------------------------------------------------------------------ incremental snapshots
    def _incremental_history(self, b, seed: int, steps: int):
        """Seeded random writes over value / list / map / reducing (per record and batch) states,
        with namespaces. Returns nothing; the states are registered on ``b``."""
        rng = random.Random(seed)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        ls = b.get_state(ListStateDescriptor("l", "string"), namespace_type="int64")
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        r = b.get_state(ReducingStateDescriptor("r", "sum", "int64"), namespace_type="string")
        for _ in range(steps):
            b.set_current_key(rng.randint(0, 40))
            op = rng.random()
            if op < 0.25:
                v.update(rng.choice([None, rng.randint(-9, 9)]))
            elif op < 0.4:
                ls.set_current_namespace(rng.randint(0, 2))
                rng.choice([lambda: ls.add("x" * rng.randint(0, 3)), ls.clear,
                            lambda: ls.update([])])()
            elif op < 0.6:
                uk = rng.choice(["a", "b", "c"])
                (m.put(uk, rng.randint(0, 5)) if rng.random() < 0.6 else m.remove(uk))
            elif op < 0.75:
                r.set_current_namespace(rng.choice(["x", "y"]))
                r.add(rng.randint(-3, 3)) if rng.random() < 0.8 else r.clear()
            elif op < 0.85:
                ks = [rng.randint(0, 40) for _ in range(rng.randint(1, 8))]
                vals = [rng.choice([None, rng.randint(-9, 9)]) for _ in ks]
                v.put_batch(pa.array(ks, pa.int64()), pa.array(vals, pa.int64()))
            elif op < 0.95:
                ks = [rng.randint(0, 40) for _ in range(rng.randint(1, 8))]
                r.add_batch(pa.array(ks, pa.int64()), pa.array([1] * len(ks), pa.int64()),
                            namespaces=rng.choice(["x", "y"]))
            else:
                ks = [rng.randint(0, 40) for _ in range(rng.randint(1, 4))]
                v.clear_batch(pa.array(ks, pa.int64()))
            if rng.random() < 0.05:
                b.timers.register_event_time_timer(rng.randint(0, 100))

    def test_incremental_random_histories(self):
        """For each seed: the backend and the reference run the same history with snapshots,
        some completed (the latest or an older one), some never; every incremental snapshot is
        byte-identical on both, and base + incremental merged equals the full snapshot taken at
        the same moment."""
        for seed in (1, 2, 3, 4):
            b, ref = self._backend(), self.make_reference_backend(key_type="int64", max_parallelism=128)
            rng = random.Random(seed * 7919)
            base_dump, pending = None, {}
            for _ in range(12):
                # The same seed gives the same operations on both backends.
                hist_seed, steps = rng.randint(0, 1 << 30), rng.randint(5, 80)
                self._incremental_history(b, hist_seed, steps)
                self._incremental_history(ref, hist_seed, steps)
                inc, inc_ref = b.snapshot(incremental=True), ref.snapshot(incremental=True)
                full, full_ref = b.snapshot(), ref.snapshot()
                assert inc.incremental and not full.incremental
                assert inc.snapshot_id == inc_ref.snapshot_id and full.snapshot_id > inc.snapshot_id
                inc_dump, full_dump = snapshot_dump(inc), snapshot_dump(full)
                assert inc_dump == snapshot_dump(inc_ref)
                assert full_dump == snapshot_dump(full_ref)
                assert merge_incremental(base_dump, inc_dump) == full_dump
                pending[inc.snapshot_id] = pending[full.snapshot_id] = full_dump
                choice = rng.random()
                if choice < 0.5:
                    sid = max(pending) if choice < 0.35 else min(pending)
                    b.notify_checkpoint_complete(sid)
                    ref.notify_checkpoint_complete(sid)
                    base_dump = pending[sid]
                    pending = {i: d for i, d in pending.items() if i > sid}
                for snap in (inc, inc_ref, full, full_ref):
                    snap.release()

    def test_incremental_snapshot_lists_changes_and_tombstones(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        for k in range(5):
            b.set_current_key(k)
            v.update(k * 10)
        b.timers.register_event_time_timer(7)
        s1 = b.snapshot(incremental=True)
        assert s1.incremental and s1.snapshot_id == 1
        assert merge_incremental(None, snapshot_dump(s1)) == snapshot_dump(b.snapshot())
        b.notify_checkpoint_complete(s1.snapshot_id)
        b.set_current_key(1)
        v.update(11)
        b.set_current_key(2)
        v.clear()
        b.set_current_key(3)
        v.clear()
        v.update(33)  # removed then re-put: a put
        b.set_current_key(9)
        v.update(1)
        v.clear()  # created and removed after the base: a (harmless) tombstone
        s3 = b.snapshot(incremental=True)
        assert s3.snapshot_id == 3
        got = {}
        for kg in b.key_group_range:
            keys, vals = s3.entries("v", kg)
            assert keys.to_pylist() == sorted(keys.to_pylist())
            for kb, vb in zip(keys.to_pylist(), vals.to_pylist()):
                _, key, _, _ = S.decode_key(kb, 128, S.key_serializer("int64"), S.key_serializer("void"))
                got[key] = None if vb is None else S.value_serializer("int64").deserialize(vb)
        assert got == {1: 11, 2: None, 3: 33, 9: None}
        # Timers are complete in an incremental snapshot.
        assert sum(len(s3.entries("__timers__", kg)[0]) for kg in b.key_group_range) == 1

    def test_incremental_snapshot_isolation(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "string"))
        for k in range(200):
            b.set_current_key(k)
            v.update("a" * (k % 5))
        b.notify_checkpoint_complete(b.snapshot().snapshot_id)
        for k in range(0, 200, 3):
            b.set_current_key(k)
            v.update("changed") if k % 2 else v.clear()
        inc = b.snapshot(incremental=True)
        before = snapshot_dump(inc)
        for k in range(200):
            b.set_current_key(k)
            v.update("later")
        b.set_current_key(1)
        v.clear()
        b.notify_checkpoint_complete(inc.snapshot_id)  # completing it does not change it either
        assert snapshot_dump(inc) == before
        nonempty = {kg: rows for kg, rows in before["v"].items()}
        assert sum(len(r) for r in nonempty.values()) == len(range(0, 200, 3))

    def test_notify_checkpoint_complete_validation(self):
        b = self._backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        for bad in (0, 1, "1", 1.0, True, None):
            with pytest.raises(InvalidInputError):
                b.notify_checkpoint_complete(bad)  # nothing issued yet / not an int
        b.set_current_key(1)
        v.update(1)
        s1, s2 = b.snapshot(), b.snapshot(incremental=True)
        with pytest.raises(InvalidInputError):
            b.notify_checkpoint_complete(s2.snapshot_id + 1)
        b.notify_checkpoint_complete(s2.snapshot_id)
        b.notify_checkpoint_complete(s2.snapshot_id)  # idempotent
        b.notify_checkpoint_complete(s1.snapshot_id)  # older than the base: ignored
        assert b.base_snapshot_id == s2.snapshot_id
        assert snapshot_dump(b.snapshot(incremental=True))["v"] == {}

    def test_incremental_after_restore_holds_only_later_changes(self):
        src = self._backend()
        v = src.get_state(ValueStateDescriptor("v", "int64"))
        for k in range(50):
            src.set_current_key(k)
            v.update(k)
        full = src.snapshot()
        for b in (self._backend(), self.make_reference_backend(key_type="int64", max_parallelism=128)):
            b.snapshot()  # an id issued before the restore
            b.restore(full)
            assert b.base_snapshot_id == 1
            b.notify_checkpoint_complete(1)  # predates the restored state: ignored
            inc = b.snapshot(incremental=True)
            assert snapshot_dump(inc)["v"] == {}
            w = b.get_state(ValueStateDescriptor("v", "int64"))
            b.set_current_key(3)
            w.update(300)
            b.set_current_key(4)
            w.clear()
            inc2 = b.snapshot(incremental=True)
            d = snapshot_dump(inc2)
            assert sum(len(r) for r in d["v"].values()) == 2
            assert merge_incremental(snapshot_dump(full), d) == snapshot_dump(b.snapshot())

    # ------------------------------------------------------------------ differential testing
    def test_differential_state_machine(self):
        suite = self

        class Machine(_DifferentialMachine):
            def make_pair(self, **kw):
                return suite.make_backend(**kw), suite.make_reference_backend(**kw)

        run_state_machine_as_test(Machine, settings=settings(
            max_examples=60, stateful_step_count=40, derandomize=True, deadline=None,
            suppress_health_check=list(HealthCheck)))

    def test_differential_random_programs(self):
        """Long seeded random operation sequences on the backend and the reference."""
        suite = self

        class Machine(_DifferentialMachine):
            def make_pair(self, **kw):
                return suite.make_backend(**kw), suite.make_reference_backend(**kw)

        rng = random.Random(0x5EED)
        for mp, assigner in [(128, "spark"), (200, "flink"), (128, "flink")]:
            machine = Machine()
            machine.setup(mp=mp, assigner=assigner)
            _random_program(machine, rng, 400)


KEYS = st.integers(-2, 4)


def _random_program(machine: "_DifferentialMachine", rng, steps: int) -> None:
    """Run ``steps`` random rules of ``machine`` (already set up), checking the invariant after
    each one. Complements the hypothesis run with long, focused operation sequences."""
    key = lambda: rng.randint(-2, 6)  # noqa: E731
    small = lambda: rng.choice([None, rng.randint(-5, 5), rng.randint(-5, 5)])  # noqa: E731
    for _ in range(steps):
        r = rng.random()
        if r < 0.12:
            machine.set_key(key())
        elif r < 0.2:
            machine.value_update(rng.choice([None, rng.randint(-5, 5), 1 << 63]))
        elif r < 0.3:
            machine.list_op(rng.choice(["add", "add_all", "update", "clear"]),
                            [rng.choice([1, "a", (2,)]) for _ in range(rng.randint(0, 3))])
            if rng.random() < 0.2:
                machine.list_namespace(rng.randint(0, 2))
        elif r < 0.5:
            machine.map_op(rng.choice(["put", "put", "remove", "remove", "clear"]),
                           rng.choice(["", "a", "ü", "bb"]), rng.randint(-5, 5))
        elif r < 0.62:
            machine.reduce_add(rng.choice(["s", "c", "a"]), small())
            if rng.random() < 0.2:
                machine.sum_namespace(rng.choice(["x", "y"]))
        elif r < 0.7:
            n = rng.randint(0, 6)
            ks = [rng.choice([key(), key(), None]) if rng.random() < 0.1 else key() for _ in range(n)]
            machine._batch_value(ks, [small() for _ in range(n)])
        elif r < 0.8:
            n = rng.randint(0, 6)
            ns = [rng.choice(["x", "y"]) for _ in range(n)] if rng.random() < 0.5 else None
            machine._batch_reduce([key() for _ in range(n)], [small() for _ in range(n)],
                                  rng.choice(["s", "c"]), ns)
        elif r < 0.9:
            machine.timer(rng.randint(0, 30), rng.randint(0, 1), rng.random() < 0.3)
        elif r < 0.95:
            machine.watermark(rng.randint(0, 30))
        elif r < 0.985:
            machine.incremental_snapshot(rng.choice(["none", "latest", "latest", "oldest"]))
        else:
            machine.snapshot_restore(rng.random() < 0.5)
        machine.same_accounting_and_reads()
SMALL = st.integers(-5, 5)


class _DifferentialMachine(RuleBasedStateMachine):
    """Drives a backend under test and the reference with identical operations; every result,
    every raised error class and every snapshot (byte for byte) must agree."""

    def make_pair(self, **kw):  # overridden
        raise NotImplementedError

    @initialize(mp=st.sampled_from([128, 200]), assigner=st.sampled_from(["spark", "flink"]))
    def setup(self, mp, assigner):
        self.opts = dict(key_type="int64", max_parallelism=mp, assigner=assigner,
                         timer_namespace_type="int64")
        self._install(*self.make_pair(**self.opts))
        self._base_dump = None  # contents at the base of incremental snapshots (None: empty)
        self._pending_dumps = {}  # snapshot id -> contents, for ids newer than the base

    def _install(self, a, b):
        self.backends = (a, b)
        self.states = []
        for be in self.backends:
            self.states.append(dict(
                v=be.get_state(ValueStateDescriptor("v", "int64")),
                l=be.get_state(ListStateDescriptor("l", "pickle"), namespace_type="int64"),
                m=be.get_state(MapStateDescriptor("m", "string", "int64")),
                s=be.get_state(ReducingStateDescriptor("s", "sum", "int64"), namespace_type="string"),
                c=be.get_state(ReducingStateDescriptor("c", "count")),
                a=be.get_state(AggregatingStateDescriptor("a", AverageAggregate())),
            ))
        for sts in self.states:
            sts["l"].set_current_namespace(0)
            sts["s"].set_current_namespace("x")

    def _both(self, fn):
        results = []
        for be, sts in zip(self.backends, self.states):
            try:
                r = fn(be, sts)
                if isinstance(r, (pa.Array, pa.ChunkedArray)):
                    r = (str(r.type), r.to_pylist())
                results.append(("ok", r))
            except (InvalidInputError, StateError) as e:
                results.append(("error", type(e).__name__))
        assert results[0] == results[1], results
        return results[0]

    @rule(k=KEYS)
    def set_key(self, k):
        self._both(lambda be, s: be.set_current_key(k))

    @rule(v=st.one_of(st.none(), SMALL, st.just(1 << 63)))
    def value_update(self, v):
        self._both(lambda be, s: s["v"].update(v))

    @rule()
    def value_read(self):
        self._both(lambda be, s: s["v"].value())

    @rule(ns=st.integers(0, 2))
    def list_namespace(self, ns):
        self._both(lambda be, s: s["l"].set_current_namespace(ns))

    @rule(op=st.sampled_from(["add", "add_all", "update", "get", "clear"]),
          xs=st.lists(st.one_of(SMALL, st.text(max_size=2)), max_size=3))
    def list_op(self, op, xs):
        def f(be, s):
            ls = s["l"]
            if op == "add":
                return ls.add(xs[0] if xs else None)
            if op in ("add_all", "update"):
                return getattr(ls, op)(xs)
            return getattr(ls, op)()
        self._both(f)

    @rule(op=st.sampled_from(["put", "put", "remove", "remove", "get", "contains", "clear"]),
          uk=st.sampled_from(["", "a", "ü"]), uv=SMALL)
    def map_op(self, op, uk, uv):
        def f(be, s):
            m = s["m"]
            if op == "put":
                return m.put(uk, uv)
            if op in ("get", "remove", "contains"):
                return getattr(m, op)(uk)
            return getattr(m, op)()
        self._both(f)

    @rule(name=st.sampled_from(["s", "c", "a"]), v=st.one_of(st.none(), SMALL))
    def reduce_add(self, name, v):
        self._both(lambda be, s: s[name].add(v))

    @rule(name=st.sampled_from(["s", "c", "a"]))
    def reduce_get(self, name):
        self._both(lambda be, s: s[name].get())

    @rule(ns=st.sampled_from(["x", "y"]))
    def sum_namespace(self, ns):
        self._both(lambda be, s: s["s"].set_current_namespace(ns))

    @rule(keys=st.lists(st.one_of(KEYS, st.none()), max_size=6), data=st.data())
    def batch_value(self, keys, data):
        vals = data.draw(st.lists(st.one_of(st.none(), SMALL), min_size=len(keys), max_size=len(keys)))
        self._batch_value(keys, vals)

    def _batch_value(self, keys, vals):
        ka, va = pa.array(keys, pa.int64()), pa.array(vals, pa.int64())
        self._both(lambda be, s: s["v"].put_batch(ka, va))
        self._both(lambda be, s: s["v"].get_batch(ka))

    @rule(keys=st.lists(KEYS, max_size=6), data=st.data(), name=st.sampled_from(["s", "c"]),
          per_row_ns=st.booleans())
    def batch_reduce(self, keys, data, name, per_row_ns):
        vals = data.draw(st.lists(st.one_of(st.none(), SMALL), min_size=len(keys), max_size=len(keys)))
        ns = None
        if per_row_ns:
            ns = data.draw(st.lists(st.sampled_from(["x", "y"]), min_size=len(keys), max_size=len(keys)))
        self._batch_reduce(keys, vals, name, ns)

    def _batch_reduce(self, keys, vals, name, ns_list):
        ka, va = pa.array(keys, pa.int64()), pa.array(vals, pa.int64())
        ns = None if ns_list is None or name != "s" else pa.array(ns_list, pa.string())
        self._both(lambda be, s: s[name].add_batch(ka, va, namespaces=ns))
        self._both(lambda be, s: s[name].get_batch(ka, namespaces=ns))

    @rule(ts=st.integers(0, 30), ns=st.integers(0, 1), delete=st.booleans())
    def timer(self, ts, ns, delete):
        if delete:
            self._both(lambda be, s: be.timers.delete_event_time_timer(ts, ns))
        else:
            self._both(lambda be, s: be.timers.register_event_time_timer(ts, ns))

    @rule(wm=st.integers(0, 30))
    def watermark(self, wm):
        self._both(lambda be, s: be.timers.advance_watermark(wm))

    @rule(cross=st.booleans())
    def snapshot_restore(self, cross):
        snaps = [be.snapshot() for be in self.backends]
        assert snapshot_dump(snaps[0]) == snapshot_dump(snaps[1])
        key = self.backends[1].current_key
        fresh = self.make_pair(**self.opts)
        # cross: restore each fresh backend from the OTHER backend's snapshot
        for be, snap in zip(fresh, snaps[::-1] if cross else snaps):
            be.restore(snap)
        self._base_dump = snapshot_dump(snaps[0])  # the restored state is the base
        self._pending_dumps = {}
        self._install(*fresh)
        if key is not None:
            self._both(lambda be, s: be.set_current_key(key))
        for s in snaps:
            s.release()

    @rule(complete=st.sampled_from(["none", "latest", "oldest"]))
    def incremental_snapshot(self, complete):
        """Incremental snapshots: byte-identical on both backends, and base + incremental merged
        equals a full snapshot taken at the same moment; then maybe complete a pending one."""
        incs = [be.snapshot(incremental=True) for be in self.backends]
        fulls = [be.snapshot() for be in self.backends]
        assert [s.incremental for s in incs + fulls] == [True, True, False, False]
        assert incs[0].snapshot_id == incs[1].snapshot_id < fulls[0].snapshot_id == fulls[1].snapshot_id
        inc_dump = snapshot_dump(incs[0])
        assert inc_dump == snapshot_dump(incs[1])
        full_dump = snapshot_dump(fulls[0])
        assert full_dump == snapshot_dump(fulls[1])
        assert merge_incremental(self._base_dump, inc_dump) == full_dump
        self._pending_dumps[incs[0].snapshot_id] = full_dump
        self._pending_dumps[fulls[0].snapshot_id] = full_dump
        if complete != "none":
            sid = (max if complete == "latest" else min)(self._pending_dumps)
            for be in self.backends:
                be.notify_checkpoint_complete(sid)
            self._base_dump = self._pending_dumps[sid]
            self._pending_dumps = {i: d for i, d in self._pending_dumps.items() if i > sid}
        for snap in incs + fulls:
            snap.release()

    @invariant()
    def same_accounting_and_reads(self):
        if not hasattr(self, "backends"):
            return
        self._both(lambda be, s: (be.num_entries(), be.state_bytes(), be.timers.num_timers()))
        if self.backends[1].current_key is None:
            return
        self._both(lambda be, s: (be.current_key, be.current_key_group, s["v"].value(),
                                  s["l"].get(), s["m"].items(), s["s"].get(), s["c"].get(),
                                  s["a"].get(), be.timers.list_event_time_timers()))
