"""Current key and namespace part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`). A backend may cache what it derives
from the current key and namespace (the native one caches each state's encoded key); these
tests fail if such a cache goes stale. Each runs the same program on the backend under test and
on the reference and compares every observation and the snapshot bytes.
"""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from statecore import key_groups as K
from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import AverageAggregate

__all__ = ["CurrentKeyConformance"]


def _every_kind(b, ttl: bool = False, namespace_type: str = "void") -> dict:
    """One state of each kind on ``b``, by name: "v" value, "l" list, "m" map, "r" reducing,
    "a" aggregating (with TTL that never expires but renews on reads, if ``ttl``)."""
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


def _read_all(st: dict) -> tuple:
    """What each state of :func:`_every_kind` holds for the current key and namespace."""
    return (st["v"].value(), st["l"].get(), st["m"].items(), st["r"].get(), st["a"].get())


def _write_all(st: dict, i: int) -> None:
    """Write ``i`` to each state of :func:`_every_kind`."""
    st["v"].update(i)
    st["l"].add(str(i))
    st["m"].put(str(i), i)
    st["r"].add(i)
    st["a"].add(i)


class CurrentKeyConformance(ConformanceBase):
    """Switching keys and namespaces addresses each one's entries, on every state kind."""

    @pytest.mark.parametrize("ttl", [False, True])
    def test_key_switches_address_each_keys_entries(self, ttl):
        from statecore.ttl import ManualClock

        def program(b):
            st = _every_kind(b, ttl=ttl)
            seen = []
            for k in (1, 2, 1, 1, 3, 2):
                b.set_current_key(k)
                seen.append(_read_all(st))
                _write_all(st, k * 10 + len(seen))
                seen.append(_read_all(st))
            b.set_current_key(2)
            b.set_current_key(1)  # two switches without an access in between
            seen.append(_read_all(st))
            for s in st.values():
                s.clear()
            seen.append(_read_all(st))
            b.set_current_key(2)
            seen.append(_read_all(st))
            return seen

        seen = self.same_as_reference(program, ttl_clock=ManualClock(0))
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
            st = _every_kind(b, namespace_type=ns_type)
            other = b.get_state(ValueStateDescriptor("other", "int64"), namespace_type=ns_type)
            seen = []
            for i, k in enumerate(keys):
                b.set_current_key(k)
                other.set_current_namespace(namespaces[-1])
                for j, ns in enumerate(namespaces):
                    for s in st.values():
                        s.set_current_namespace(ns)
                    seen.append(_read_all(st))
                    _write_all(st, 100 * i + j)
                    seen.append(_read_all(st))
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

        self.same_as_reference(program, key_type=key_type)

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

        seen = self.same_as_reference(program, key_type=key_type)
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

        assert self.same_as_reference(program)[0] == (2, 20)
        # a key outside the range: rejected before anything changes
        b = self.new_backend(key_group_range=(0, 63))
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
            st = _every_kind(b)
            seen = []
            b.set_current_key(7)
            _write_all(st, 1)
            snap = b.snapshot()
            _write_all(st, 2)
            seen.append(_read_all(st))
            b.restore(snap)  # same key overwritten with the snapshot's entries
            seen.append(_read_all(st))
            snap.release()
            # batch calls address their own rows and leave the current key and its cache
            st["v"].put_batch(pa.array([7, 8]), pa.array([70, 80]))
            seen.append(st["v"].value())
            st["r"].add_batch(pa.array([8, 7, 8]), pa.array([1, 2, 3]))
            st["l"].append_batch(pa.array([8, 7]), pa.array(["x", "y"]))
            st["m"].put_batch(pa.array([8]), pa.array(["k"]), pa.array([1]))
            st["a"].add_batch(pa.array([8]), pa.array([4]))
            seen.append((b.current_key, _read_all(st)))
            st["v"].clear_batch(pa.array([7]))
            seen.append(st["v"].value())
            # a new state object
            other = b.get_state(ValueStateDescriptor("v", "int64", default=-1))
            other.update(3)
            seen.append((st["v"].value(), other.value()))
            return seen

        seen = self.same_as_reference(program)
        assert seen[0][0] == 2 and seen[1][0] == 1 and seen[2] == 70 and seen[4] == -1

    def test_a_second_thread_cannot_use_anothers_current_key(self):
        """The per-record API serves one thread at a time (Flink's keyed state is
        single-threaded): a state call from a thread other than the one that set the current
        key raises StateError instead of reading or writing that thread's key; the thread sets
        its own key first and goes on, and nothing was written under the wrong key."""
        import threading

        from statecore.errors import StateError

        b = self.new_backend()
        st = _every_kind(b)
        b.set_current_key(1)
        _write_all(st, 1)
        errors, results = [], []

        def other():
            b.set_current_key(2)
            _write_all(st, 2)
            results.append(_read_all(st))

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert results and results[0][0] == 2
        for name, call in [("v", lambda: st["v"].value()), ("v", lambda: st["v"].update(9)),
                           ("l", lambda: st["l"].add("x")), ("m", lambda: st["m"].put("x", 9)),
                           ("m", lambda: st["m"].items()), ("r", lambda: st["r"].add(9)),
                           ("a", lambda: st["a"].get()),
                           ("timers", lambda: b.timers.register_event_time_timer(5))]:
            try:
                call()
            except StateError as exc:
                errors.append((name, str(exc)))
        assert len(errors) == 8 and all("set by thread" in e for _, e in errors), errors
        b.set_current_key(1)  # this thread's own key again: everything as it wrote it
        assert _read_all(st) == (1, ["1"], [("1", 1)], 1, 1.0)
        b.set_current_key(2)
        assert _read_all(st) == (2, ["2"], [("2", 2)], 2, 2.0)
        assert b.timers.num_timers() == 0
