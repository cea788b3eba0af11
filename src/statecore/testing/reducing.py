"""Reducing and aggregating state part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): the built-in reducers (sum, min, max,
count, first, last) per record and by batch, int64 sum overflow, user reduce functions (scalar
and ``Reducer.vectorized``) and aggregate functions, ``add_batch`` / ``get_batch`` and their
errors.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from statecore.descriptors import AggregatingStateDescriptor, ReducingStateDescriptor
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import AverageAggregate, snapshot_dump

__all__ = ["ReducingConformance"]


class ReducingConformance(ConformanceBase):
    """``ReducingState`` and ``AggregatingState`` per record and by batch."""

    def test_reducing_builtins(self):
        b = self.new_backend()
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
        b = self.new_backend()
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
        assert (la.add_batch(keys, batch).to_pylist()
                == [vals[0], vals[1], vals[0], vals[2], vals[0]])
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
        vb, sb = self.new_backend(), self.new_backend()
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
        b = self.new_backend()
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
        b = self.new_backend()
        a = b.get_state(AggregatingStateDescriptor("a", AverageAggregate()))
        out = a.add_batch(pa.array([1, 2, 1, 1, 3]), pa.array([2, 5, 4, None, None]))
        assert out.to_pylist() == [2.0, 5.0, 3.0, 3.0, None]
        assert a.get_batch(pa.array([1, 2, 3])).to_pylist() == [3.0, 5.0, None]
        b.set_current_key(1)
        a.add(6)
        assert a.get() == 4.0
        single = self.new_backend()
        s = single.get_state(AggregatingStateDescriptor("a", AverageAggregate()))
        for k, v in [(1, 2), (2, 5), (1, 4), (1, 6)]:
            single.set_current_key(k)
            s.add(v)
        assert snapshot_dump(b.snapshot()) == snapshot_dump(single.snapshot())
        typed = b.get_state(AggregatingStateDescriptor("t", AverageAggregate(),
                                                       result_type="string"))
        with pytest.raises(InvalidInputError, match="result_type"):
            typed.add_batch(pa.array([1]), pa.array([1]))  # 1.0 is not a string
        t64 = b.get_state(AggregatingStateDescriptor("t64", AverageAggregate(),
                                                     result_type="float64"))
        assert t64.add_batch(pa.array([1]), pa.array([1])).type == pa.float64()
        before = snapshot_dump(b.snapshot())
        for call in (lambda: a.add_batch(pa.array([1, 2]), pa.array(["x", "y"])),
                     lambda: a.add_batch(pa.array([1]), pa.array([1, 2])),
                     lambda: typed.add_batch(pa.array([1]), pa.array(["x"]))):
            with pytest.raises(InvalidInputError):
                call()
            assert snapshot_dump(b.snapshot()) == before
        # Per record as per batch: a failing function is an InvalidInputError naming the
        # state, and the stored accumulator stays.
        b.set_current_key(1)
        with pytest.raises(InvalidInputError, match="aggregate function of 'a' failed"):
            a.add("x")
        assert snapshot_dump(b.snapshot()) == before
