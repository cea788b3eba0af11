"""Namespace merging part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``merge_namespaces(target, sources)``
of reducing, aggregating and list state (Flink ``InternalMergingState.mergeNamespaces``, merging
windows) -- the merged values, sources absent, partly present, repeated or equal to the target,
TTL (expired sources dropped, the merged target stamped anew), the errors, and snapshots after
merging equal to the reference backend's.
"""

from __future__ import annotations

import pytest

from statecore.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import AverageAggregate, snapshot_dump
from statecore.ttl import ManualClock, StateTtlConfig

__all__ = ["MergingConformance", "MergeableAverage"]


class MergeableAverage(AggregateFunction):
    """Mean of the added numbers with ``merge``; accumulator ``[sum, count, order]``, ``order``
    the numbers in the order they were added and merged (so a test sees the merge order)."""

    def create_accumulator(self):
        return [0, 0, []]

    def add(self, value, acc):
        return [acc[0] + value, acc[1] + 1, acc[2] + [value]]

    def merge(self, a, b):
        return [a[0] + b[0], a[1] + b[1], a[2] + b[2]]

    def get_result(self, acc):
        return (acc[0] / acc[1], acc[2])


def _fill(state, key_values: dict, backend, key=1) -> None:
    """``{namespace: [values...]}`` added to ``state`` for ``key``, namespace by namespace."""
    backend.set_current_key(key)
    for ns, vals in key_values.items():
        state.set_current_namespace(ns)
        for v in vals:
            state.add(v)


def _read(state, namespaces) -> list:
    """``get()`` of ``state`` in each of ``namespaces`` (current key unchanged)."""
    out = []
    for ns in namespaces:
        state.set_current_namespace(ns)
        out.append(state.get())
    return out


class MergingConformance(ConformanceBase):
    """``merge_namespaces`` of the merging states."""

    @pytest.mark.parametrize("reducer", ["sum", "count", "py"])
    def test_merge_reducing(self, reducer):
        """Sources fold in the order of ``sources``, then into the target (target first); the
        sources are gone afterwards, other keys untouched."""
        b = self.new_backend()
        if reducer == "py":
            d = ReducingStateDescriptor("r", lambda a, x: f"{a}{x}", "string")
            vals = {10: ["a"], 20: ["b", "c"], 30: ["d"]}
        else:
            d = ReducingStateDescriptor("r", reducer, "int64")
            vals = {10: [1], 20: [2, 3], 30: [4]}
        s = b.get_state(d, "int64")
        _fill(s, vals, b, key=1)
        _fill(s, vals, b, key=2)
        b.set_current_key(1)
        s.set_current_namespace(20)
        s.merge_namespaces(10, [30, 20])
        assert s.current_namespace == 20 and s.get() is None  # the current namespace stays
        expect = {"sum": 10, "count": 4, "py": "adbc"}[reducer]
        assert _read(s, [10, 20, 30]) == [expect, None, None]
        b.set_current_key(2)
        assert _read(s, [10, 20, 30]) == ({"sum": [1, 5, 4], "count": [1, 2, 1],
                                           "py": ["a", "bc", "d"]}[reducer])
        assert b.num_entries() == 4

    def test_merge_reducing_into_absent_target_and_absent_sources(self):
        b = self.new_backend()
        s = b.get_state(ReducingStateDescriptor("r", "max", "float64"), "string")
        _fill(s, {"a": [1.5], "b": [7.0]}, b)
        s.merge_namespaces("t", ["x", "a", "y", "b", "t", "a"])
        assert _read(s, ["t", "a", "b"]) == [7.0, None, None]
        assert b.num_entries() == 1
        s.merge_namespaces("u", ["x", "y"])  # nothing present: nothing written
        s.merge_namespaces("t", [])
        s.merge_namespaces("t", ["t"])
        assert _read(s, ["u", "t"]) == [None, 7.0]
        assert b.num_entries() == 1

    def test_merge_reducing_overflow_changes_nothing(self):
        b = self.new_backend()
        s = b.get_state(ReducingStateDescriptor("r", "sum", "int64"), "int32")
        _fill(s, {1: [(1 << 63) - 1], 2: [1], 3: [5]}, b)
        before = snapshot_dump(b.snapshot())
        with pytest.raises(InvalidInputError):
            s.merge_namespaces(1, [3, 2])
        assert snapshot_dump(b.snapshot()) == before
        assert _read(s, [1, 2, 3]) == [(1 << 63) - 1, 1, 5]

    def test_merge_aggregating(self):
        b = self.new_backend()
        s = b.get_state(AggregatingStateDescriptor("a", MergeableAverage()), "int64")
        _fill(s, {1: [1, 2], 2: [3], 3: [6]}, b)
        s.merge_namespaces(1, [3, 2, 4])
        assert _read(s, [1, 2, 3]) == [(3.0, [1, 2, 6, 3]), None, None]
        s.merge_namespaces(9, [1])
        assert _read(s, [9, 1]) == [(3.0, [1, 2, 6, 3]), None]
        assert b.num_entries() == 1

    def test_merge_aggregating_needs_merge(self):
        """An aggregate function without ``merge`` cannot merge: InvalidInputError naming the
        method, nothing changed (also when the namespaces hold nothing)."""
        b = self.new_backend()
        s = b.get_state(AggregatingStateDescriptor("a", AverageAggregate()), "int64")
        _fill(s, {1: [1], 2: [3]}, b)
        with pytest.raises(InvalidInputError, match="merge"):
            s.merge_namespaces(1, [2])
        with pytest.raises(InvalidInputError, match="merge"):
            s.merge_namespaces(5, [6])
        assert _read(s, [1, 2]) == [1.0, 3.0]

    def test_merge_list(self):
        b = self.new_backend(key_type="string")
        s = b.get_state(ListStateDescriptor("l", "string"), "binary")
        b.set_current_key("k")
        for ns, vals in {b"t": ["t1", "t2"], b"a": ["a1"], b"b": ["b1", "b2"]}.items():
            s.set_current_namespace(ns)
            s.add_all(vals)
        s.merge_namespaces(b"t", [b"b", b"t", b"none", b"a"])
        assert _read(s, [b"t", b"a", b"b"]) == [["t1", "t2", "b1", "b2", "a1"], [], []]
        s.merge_namespaces(b"new", (ns for ns in [b"t"]))
        assert _read(s, [b"new", b"t"]) == [["t1", "t2", "b1", "b2", "a1"], []]
        assert b.num_entries() == 1  # one chunk

    def test_merge_errors(self):
        """A void namespace state, a namespace not of the namespace type, sources that are no
        iterable of namespaces, no current key: InvalidInputError, nothing changed."""
        b = self.new_backend()
        void = b.get_state(ReducingStateDescriptor("v", "sum", "int64"))
        lst = b.get_state(ListStateDescriptor("l", "int64"), "int64")
        red = b.get_state(ReducingStateDescriptor("r", "sum", "int64"), "string")
        with pytest.raises(InvalidInputError):
            red.merge_namespaces("a", ["b"])  # no current key
        b.set_current_key(1)
        void.add(1)
        with pytest.raises(InvalidInputError, match="void"):
            void.merge_namespaces(None, [None])
        _fill(lst, {1: [1], 2: [2]}, b)
        _fill(red, {"a": [1], "b": [2]}, b)
        before = snapshot_dump(b.snapshot())
        for st, target, sources in [(lst, 1, [2, "x"]), (lst, "x", [2]), (lst, 1, [None]),
                                    (lst, 1, 2), (lst, 1, None), (red, "a", "b"),
                                    (red, "a", [b"b"]), (red, 1, ["b"])]:
            with pytest.raises(InvalidInputError):
                st.merge_namespaces(target, sources)
        assert snapshot_dump(b.snapshot()) == before

    @pytest.mark.parametrize("kind", ["reducing", "aggregating", "list"])
    def test_merge_ttl(self, kind):
        """An expired source counts as absent and is removed; the merged target is a write,
        stamped with the time of the merge (it outlives the target's old timestamp)."""
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        if kind == "reducing":
            d = ReducingStateDescriptor("s", "sum", "int64")
        elif kind == "aggregating":
            d = AggregatingStateDescriptor("s", MergeableAverage())
        else:
            d = ListStateDescriptor("s", "int64")
        s = b.get_state(d.enable_time_to_live(StateTtlConfig(100)), "int64")
        _fill(s, {1: [1], 2: [2]}, b)  # target 1 and source 2 at 0 ms
        clock.set(60)
        _fill(s, {3: [3]}, b)
        clock.set(100)  # 2 expired, 1 expired too
        s.merge_namespaces(1, [2, 3])
        clock.set(190)  # the merge stamped 1 at 100 ms: alive until 200 ms
        got = _read(s, [1, 2, 3])
        assert got == {"reducing": [3, None, None], "aggregating": [(3.0, [3]), None, None],
                       "list": [[3], [], []]}[kind]
        assert b.num_entries() == 1
        assert b.ttl_statistics().get("read", 0) == 2
        clock.set(200)
        assert _read(s, [1]) == [None if kind != "list" else []]

    def test_merge_ttl_list_drops_expired_elements(self):
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        d = ListStateDescriptor("s", "int64").enable_time_to_live(StateTtlConfig(100))
        s = b.get_state(d, "int32")
        _fill(s, {1: [1], 2: [2]}, b)
        clock.set(50)
        _fill(s, {1: [11], 2: [22]}, b)
        clock.set(120)
        s.merge_namespaces(1, [2])
        assert _read(s, [1, 2]) == [[11, 22], []]
        clock.set(219)
        assert _read(s, [1]) == [[11, 22]]

    @pytest.mark.parametrize("ttl", [False, True])
    def test_merge_snapshots_equal_reference(self, ttl):
        """The same merges leave byte-identical snapshots in the backend and the reference
        (native: the encoded keys of the merged and removed namespaces, variable-width keys
        and namespaces included)."""
        cfg = StateTtlConfig(1000) if ttl else None

        def desc(d):
            return d if cfg is None else d.enable_time_to_live(cfg)

        def program(b):
            states = [
                b.get_state(desc(ReducingStateDescriptor("r", "sum", "int64")), "int64"),
                b.get_state(desc(ReducingStateDescriptor("p", lambda a, x: a + x)), "string"),
                b.get_state(desc(AggregatingStateDescriptor("a", MergeableAverage())), "binary"),
                b.get_state(desc(ListStateDescriptor("l", "string")), "string"),
            ]
            nss = [[1, 2, 3, 4], ["a", "bb", "", "ccc"], [b"a", b"", b"xyz", b"q"],
                   ["w1", "w2", "w3", "w4"]]
            seen = []
            for key in ["k", "kk", "a longer key"]:
                for st, ns in zip(states, nss):
                    vals = {n: [i * 3 + j for j in range(i % 3)] for i, n in enumerate(ns)}
                    if st.name in ("p", "l"):
                        vals = {n: [str(v) for v in vs] for n, vs in vals.items()}
                    _fill(st, vals, b, key=key)
                    st.merge_namespaces(ns[1], [ns[3], ns[0], ns[2]])
                    seen.append(_read(st, ns))
            return seen

        options = dict(key_type="string")
        if ttl:
            options["ttl_clock"] = ManualClock(5)
        self.same_as_reference(program, **options)
