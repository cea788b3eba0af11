"""Value-type part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): the fixed-width value types uint64,
timestamp[unit] and fixed_size_binary[N] (:mod:`statecore.value_types`) through the per-record
and the batch APIs of every state kind -- stored bytes, sliced, chunked and streamed arrays,
nulls, the reducers, TTL, snapshots and restores, wrong types and values -- each program run on
the backend and on the reference backend, which must agree on every result and on the snapshot
bytes; plus seeded random differential runs of those types and of int32 and bool values
through the batch API.
"""

from __future__ import annotations

import datetime
import random
import re

import numpy as np
import pyarrow as pa
import pytest

from statecore import serializers as S
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateMigrationError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import column_in_form, dump_backend, sliced

__all__ = ["ValueTypeConformance", "VALUE_CASES"]

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
_WIDE = [bytes([i]) * 300 for i in (0, 1, 0x7F, 0x80, 0xFF)]

#: (value type, five distinct values in per-record form) exercised by every test below:
#: uint64 values >= 2**63, timestamps negative and at the int64 extremes of every unit,
#: fixed_size_binary with bytes >= 0x80 and wider than the native flat engine's inline values.
VALUE_CASES = [
    ("uint64", [0, 1, 2**63 - 1, 2**63, 2**64 - 1]),
    ("timestamp[s]", [0, -1, I64_MIN, I64_MAX, 1_600_000_000]),
    ("timestamp[ms]", [1, -86_400_000, I64_MIN, I64_MAX, 1_600_000_000_123]),
    ("timestamp[us]", [0, -1, I64_MIN + 1, I64_MAX - 1, -62_135_596_800_000_000]),
    ("timestamp[ns]", [0, -1, I64_MIN, I64_MAX, 1_600_000_000_123_456_789]),
    ("fixed_size_binary[1]", [b"\x00", b"\x7f", b"\x80", b"\xff", b"a"]),
    ("fixed_size_binary[16]", [b"\x00" * 16, b"\xff" * 16, bytes(range(16)),
                               bytes(range(16, 32)), b"\x80" + b"\x00" * 15]),
    ("fixed_size_binary[300]", _WIDE),
]
CASE_IDS = [c[0] for c in VALUE_CASES]

#: The other types a restore of each case must refuse (StateMigrationError).
_OTHER_TYPES = {"uint64": ["int64"], "timestamp": ["timestamp[us]", "timestamp[ns]", "int64"],
                "fixed_size_binary": ["fixed_size_binary[2]", "binary"]}


def _ser(vt: str):
    return S.value_serializer(vt)


def _arr(vt: str, values) -> pa.Array:
    return pa.array(values, _ser(vt).arrow_type)


def _py(vt: str, arr) -> list:
    """Per-record values of an output array (timestamps as their ints)."""
    return _ser(vt).to_pylist(arr)


def _stored(vt: str, x) -> bytes:
    """The stored bytes of value ``x``, written out independently of the serializers."""
    if vt == "uint64":
        return x.to_bytes(8, "little")
    if vt.startswith("timestamp"):
        return x.to_bytes(8, "little", signed=True)
    return x


def _reducers(vt: str) -> list:
    if vt == "uint64":
        return ["sum", "min", "max", "first", "last"]
    return ["min", "max", "first", "last"]


def _same_after(b, ops) -> None:
    """Every call in ``ops`` raises InvalidInputError and leaves ``b``'s snapshot unchanged."""
    before = dump_backend(b)
    for call in ops:
        with pytest.raises(InvalidInputError):
            call()
        assert dump_backend(b) == before


class ValueTypeConformance(ConformanceBase):
    """Value types beyond the basic ones (uint64, timestamp[unit], fixed_size_binary[N], and
    int32 / bool through the batch API) in every state kind, against the reference backend."""

    # ------------------------------------------------------------------ value state
    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_round_trip(self, vt, vals):
        """Per-record writes read back per record and by batch (the value type's Arrow type),
        batch writes of sliced arrays (a null clears) read back per record, the stored bytes
        are the documented format, and both backends agree byte for byte."""
        ser = _ser(vt)

        def program(b):
            v = b.get_state(ValueStateDescriptor("v", vt))
            w = b.get_state(ValueStateDescriptor("w", ser.arrow_type))  # the pyarrow type
            keys = pa.array(range(len(vals)), pa.int64())
            for i, x in enumerate(vals):
                b.set_current_key(i)
                v.update(x)
            got = v.get_batch(sliced(keys, 0))
            assert got.type == ser.arrow_type and _py(vt, got) == vals
            snap = b.snapshot()
            stored = sorted(vb for kg in range(128) for vb in snap.entries("v", kg)[1].to_pylist())
            snap.release()
            assert stored == sorted(_stored(vt, x) for x in vals)
            written = vals[::-1]
            written[1] = None
            w.put_batch(sliced(keys, 3), sliced(_arr(vt, written), vals[0]))
            seen = []
            for i in range(len(vals)):
                b.set_current_key(i)
                seen.append(w.value())
            assert seen == written
            assert w.contains_batch(keys).to_pylist() == [x is not None for x in written]
            w.put_batch(keys.slice(2), _arr(vt, [None] * (len(vals) - 2)))
            seen.append(_py(vt, w.get_batch(keys)))
            assert seen[-1] == written[:2] + [None] * (len(vals) - 2)
            return seen

        self.same_as_reference(program)

    def test_numpy_str_values_read_back_as_str(self):
        """A string value, list element, map user key or user value given as numpy.str_ (a str
        subclass) is stored as the plain str it equals and read back as ``str`` per record and
        in batches; a pickle value keeps its type (pickle stores the object)."""
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "string"))
            ls = b.get_state(ListStateDescriptor("l", "string"))
            m = b.get_state(MapStateDescriptor("m", "string", "string"))
            r = b.get_state(ReducingStateDescriptor("r", "max", "string"))
            p = b.get_state(ValueStateDescriptor("p"))
            b.set_current_key(1)
            v.update(np.str_("x"))
            ls.add(np.str_("y"))
            ls.add_all([np.str_("z"), "w"])
            m.put(np.str_("k"), np.str_("u"))
            m.put_all({np.str_("k2"): np.str_("u2")})
            r.add(np.str_("q"))
            p.update(np.str_("o"))
            seen = [v.value(), *ls.get(), *m.keys(), *m.values(), r.get()]
            assert [type(x) for x in seen] == [str] * len(seen)
            assert type(p.value()) is np.str_
            return seen

        assert self.same_as_reference(program) == ["x", "y", "z", "w", "k", "k2", "u", "u2", "q"]

    @pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
    def test_timestamp_values_from_datetimes(self, unit):
        """Per record a timestamp takes a datetime (naive = UTC), a numpy.datetime64 or an int
        and reads back as the int of its unit; batch writes take any time zone and batch reads
        have none; what is not whole in the unit is rejected."""
        vt = f"timestamp[{unit}]"
        per = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
        when = datetime.datetime(2021, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc)
        secs = int(when.timestamp())

        def program(b):
            v = b.get_state(ValueStateDescriptor("v", vt))
            b.set_current_key(1)
            v.update(when)
            seen = [v.value()]
            v.update(when.replace(tzinfo=None))
            seen.append(v.value())
            v.update(np.datetime64(secs, "s"))
            seen.append(v.value())
            assert seen == [secs * per] * 3
            inexact = when.replace(microsecond=1) if unit in ("s", "ms") else np.datetime64(1, "ps")
            _same_after(b, [lambda: v.update(inexact),
                            lambda: v.update(np.datetime64("NaT")), lambda: v.update(1.5),
                            lambda: v.update("2021-03-04")])
            zoned = pa.array([secs * per, -1], pa.timestamp(unit, tz="America/New_York"))
            v.put_batch(pa.array([2, 3], pa.int64()), zoned)
            got = v.get_batch(pa.array([1, 2, 3], pa.int64()))
            assert got.type == pa.timestamp(unit)  # no time zone
            seen.append(_py(vt, got))
            assert seen[-1] == [secs * per, secs * per, -1]
            return seen

        self.same_as_reference(program)

    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_stream_and_chunked_inputs(self, vt, vals):
        """Chunked arrays (empty, sliced and plain chunks), Arrow C streams and capsule arrays
        as keys and values of put, get and add read as the plain arrays."""
        keys = [i % 4 for i in range(12)]
        xs = [None if i % 5 == 3 else vals[i % len(vals)] for i in range(12)]

        def program(b):
            seen = []
            for form in ("array", "chunked", "stream", "c_array"):
                v = b.get_state(ValueStateDescriptor("v" + form, vt))
                r = b.get_state(ReducingStateDescriptor("r" + form, "max", vt))
                c = b.get_state(ReducingStateDescriptor("c" + form, "count"))
                t = _ser(vt).arrow_type
                v.put_batch(column_in_form(keys, pa.int64(), form), column_in_form(xs, t, form))
                seen.append(_py(vt, v.get_batch(column_in_form(list(range(5)), pa.int64(), form))))
                seen.append(_py(vt, r.add_batch(column_in_form(keys, pa.int64(), form),
                                                column_in_form(xs, t, form))))
                seen.append(c.add_batch(column_in_form(keys, pa.int64(), form),
                                        column_in_form(xs, t, form)).to_pylist())
            assert all(s == seen[i % 3] for i, s in enumerate(seen))
            return seen

        self.same_as_reference(program)

    # ------------------------------------------------------------------ reducing state
    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_reducers(self, vt, vals):
        """Every reducer the type allows (sum only for uint64; min/max compare timestamps as
        ints and fixed_size_binary as bytes; count of values of the type): add_batch over
        repeated keys and null rows gives the running aggregates that the same rows added one
        at a time give, and reads back per record and by batch."""
        rnd = random.Random(vt)
        keys = [rnd.randrange(4) for _ in range(25)]
        xs = [None if rnd.random() < 0.2 else rnd.choice(vals) for _ in keys]

        def program(b):
            seen = []
            for r in _reducers(vt) + ["count"]:
                rows = [None if x is None else x % 1000 for x in xs] if r == "sum" else xs
                dt = None if r == "count" else vt
                bs = b.get_state(ReducingStateDescriptor("b" + r, r, dt))
                ps = b.get_state(ReducingStateDescriptor("p" + r, r, dt))
                out = bs.add_batch(sliced(pa.array(keys, pa.int64()), 0),
                                   sliced(_arr(vt, rows), vals[0]))
                per = []
                for k, x in zip(keys, rows):
                    b.set_current_key(k)
                    ps.add(x)
                    per.append(ps.get())
                assert (out.to_pylist() if r == "count" else _py(vt, out)) == per, r
                got = bs.get_batch(pa.array(range(5), pa.int64()))
                seen.append((r, per, got.to_pylist() if r == "count" else _py(vt, got)))
            return seen

        self.same_as_reference(program)
        if vt.startswith("timestamp"):
            with pytest.raises(InvalidInputError, match="sum"):
                ReducingStateDescriptor("s", "sum", vt)

    def test_uint64_sum_overflow_changes_nothing(self):
        """A uint64 sum past 2**64 - 1 raises per record and per batch (plain, sliced, chunked
        and with TTL) and leaves every aggregate as it was; up to 2**64 - 1 it is exact."""
        from statecore.ttl import ManualClock, StateTtlConfig

        def program(b):
            s = b.get_state(ReducingStateDescriptor("s", "sum", "uint64"))
            st = b.get_state(ReducingStateDescriptor("st", "sum", pa.uint64()).enable_time_to_live(
                StateTtlConfig(100)))
            keys = pa.array([1, 2, 1], pa.int64())
            ups = pa.array([2**63, 5, 2**63 - 1], pa.uint64())
            seen = [_py("uint64", s.add_batch(keys, ups)), _py("uint64", st.add_batch(keys, ups))]
            assert seen[0] == [2**63, 5, 2**64 - 1]
            b.set_current_key(1)
            more = pa.array([3, 1], pa.uint64())
            two = pa.array([2, 1], pa.int64())
            _same_after(b, [lambda: s.add(1), lambda: st.add(1), lambda: s.add_batch(two, more),
                            lambda: st.add_batch(two, more),
                            lambda: s.add_batch(sliced(two, 2), sliced(more, 0)),
                            lambda: s.add_batch(
                                pa.chunked_array([two.slice(0, 1), two.slice(1)]),
                                pa.chunked_array([more.slice(0, 1), more.slice(1)]))])
            seen.append((s.get(), st.get()))
            return seen

        self.same_as_reference(program, ttl_clock=ManualClock(0))

    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_aggregating_state(self, vt, vals):
        """The type as an aggregating state's accumulator and result type: accumulators stored
        in its format, results as its Arrow type, per record and by batch."""
        from statecore.descriptors import AggregateFunction, AggregatingStateDescriptor

        class KeepMax(AggregateFunction):
            def create_accumulator(self):
                return None

            def add(self, value, acc):
                return value if acc is None or value > acc else acc

            def get_result(self, acc):
                return acc

        # Aggregating inputs are any Arrow type, read as pyarrow's Python values: timestamps
        # go in as int64 (a datetime cannot hold the extremes).
        src_type = pa.int64() if vt.startswith("timestamp") else _ser(vt).arrow_type

        def program(b):
            a = b.get_state(AggregatingStateDescriptor("a", KeepMax(), vt, result_type=vt))
            keys = pa.array([1, 2, 1, 1, 2], pa.int64())
            out = a.add_batch(keys, pa.array([vals[0], vals[1], vals[2], None, vals[3]], src_type))
            assert out.type == _ser(vt).arrow_type
            b.set_current_key(3)
            a.add(vals[4])
            got = a.get_batch(pa.array([1, 2, 3], pa.int64()))
            return [_py(vt, out), _py(vt, got), a.get()]

        seen = self.same_as_reference(program)
        assert seen[1] == [max(vals[0], vals[2]), max(vals[1], vals[3]), vals[4]]

    # ------------------------------------------------------------------ list and map state
    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_list_and_map_states(self, vt, vals):
        """List elements (one per row, or a list<type> per row) and map values of the type,
        by batch and per record."""
        t = _ser(vt).arrow_type

        def program(b):
            lst = b.get_state(ListStateDescriptor("l", vt))
            m = b.get_state(MapStateDescriptor("m", "string", vt))
            keys = pa.array([1, 2, 1], pa.int64())
            lst.append_batch(sliced(keys, 0), sliced(_arr(vt, vals[:3]), vals[4]))
            lst.append_batch(keys, pa.array([vals[3:], None, []], pa.large_list(t)))
            b.set_current_key(2)
            lst.add(vals[4])
            got = lst.get_batch(pa.array([1, 2, 3], pa.int64()))
            assert got.type == pa.list_(t)
            seen = [_py(vt, got)]
            assert seen[0] == [[vals[0], vals[2], vals[3], vals[4]], [vals[1], vals[4]], []]
            m.put_batch(keys, pa.array(["a", "b", "b"]), _arr(vt, vals[:3]))
            b.set_current_key(1)
            m.put("c", vals[4])
            seen.append(m.items())
            assert seen[-1] == [("a", vals[0]), ("b", vals[2]), ("c", vals[4])]
            got = m.get_batch(pa.array([1, 1, 2], pa.int64()), pa.array(["c", "x", "b"]))
            assert got.type == t
            seen.append(_py(vt, got))
            assert seen[-1] == [vals[4], None, vals[1]]
            return seen

        self.same_as_reference(program)

    # ------------------------------------------------------------------ TTL
    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_ttl(self, vt, vals):
        """With TTL every value, list element and map value carries the 8-byte timestamp after
        its bytes; reads expire and renew (OnReadAndWrite), aggregates restart after expiry,
        cleanup in full snapshots drops expired entries -- as the reference does."""
        from statecore.ttl import ManualClock, StateTtlConfig

        def program(b):
            b.ttl_clock.set(0)  # one clock object serves both backends of the comparison
            cfg = StateTtlConfig(100, update_type="OnReadAndWrite", cleanup_full_snapshot=True)
            v = b.get_state(ValueStateDescriptor("v", vt).enable_time_to_live(cfg))
            r = b.get_state(ReducingStateDescriptor("r", "max", vt).enable_time_to_live(cfg))
            lst = b.get_state(ListStateDescriptor("l", vt).enable_time_to_live(cfg))
            m = b.get_state(MapStateDescriptor("m", "int32", vt).enable_time_to_live(cfg))
            keys = pa.array(range(5), pa.int64())
            seen = []
            v.put_batch(keys, _arr(vt, vals))
            seen.append(_py(vt, r.add_batch(keys, _arr(vt, vals))))
            lst.append_batch(keys, _arr(vt, vals))
            m.put_batch(keys, pa.array(range(5), pa.int32()), _arr(vt, vals))
            snap = b.snapshot()
            for name in ("v", "r", "l"):  # the value's bytes, then the 8-byte timestamp
                lens = {len(vb) for kg in range(128)
                        for vb in snap.entries(name, kg)[1].to_pylist()}
                assert lens == {_ser(vt).fixed_width + 8}, name
            snap.release()
            b.ttl_clock.advance(60)
            seen.append(_py(vt, v.get_batch(keys.slice(0, 2))))  # renews keys 0 and 1
            b.ttl_clock.advance(60)
            seen.append(_py(vt, v.get_batch(keys)))
            assert seen[-1] == vals[:2] + [None] * 3
            seen.append(_py(vt, r.add_batch(keys.slice(3), _arr(vt, vals[:2]))))
            assert seen[-1] == vals[:2]  # the expired aggregates started over
            b.set_current_key(0)
            seen += [lst.get(), m.items(), r.get()]
            assert seen[-3:] == [[], [], None]
            seen.append(dump_backend(b))
            return seen

        self.same_as_reference(program, ttl_clock=ManualClock(0))

    # ------------------------------------------------------------------ snapshots
    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_snapshot_restore(self, vt, vals):
        """Snapshots record the canonical type name; they restore into both backends with every
        value back, and a restore under another value type (another timestamp unit, another
        width, a neighbouring type) is a StateMigrationError, whichever comes first: the
        descriptor or the restore."""
        descs = lambda t: [ValueStateDescriptor("v", t), ListStateDescriptor("l", t),  # noqa: E731
                           MapStateDescriptor("m", "int64", t),
                           ReducingStateDescriptor("r", "last", t)]
        src = self.new_backend()
        states = [src.get_state(d) for d in descs(_ser(vt).arrow_type)]
        for i, x in enumerate(vals):
            src.set_current_key(i)
            states[0].update(x)
            states[1].add_all([x, vals[0]])
            states[2].put(i, x)
            states[3].add(x)
        snap = src.snapshot()
        assert {m["value_type"] for m in snap.state_metas() if m["name"] != "__timers__"} == {vt}
        for make in (self.new_backend, self.make_reference_backend):
            dst = make(key_type="int64", max_parallelism=128)
            dst.restore(snap)
            v, lst, m, r = (dst.get_state(d) for d in descs(vt))
            assert _py(vt, v.get_batch(pa.array(range(5), pa.int64()))) == vals
            for i, x in enumerate(vals):
                dst.set_current_key(i)
                assert (v.value(), lst.get(), m.items(), r.get()) == (x, [x, vals[0]], [(i, x)], x)
            assert dump_backend(dst) == dump_backend(src)
            for other in _OTHER_TYPES[_ser(vt).kind]:
                if other == vt:
                    other = "timestamp[ms]"
                for d in descs(other):
                    late = make(key_type="int64", max_parallelism=128)
                    late.restore(snap)
                    with pytest.raises(StateMigrationError, match="value_type"):
                        late.get_state(d)
                    early = make(key_type="int64", max_parallelism=128)
                    early.get_state(d)
                    with pytest.raises(StateMigrationError):
                        early.restore(snap)
        snap.release()

    # ------------------------------------------------------------------ bad input
    @pytest.mark.parametrize("vt,vals", VALUE_CASES, ids=CASE_IDS)
    def test_value_type_wrong_input_rejected(self, vt, vals):
        """Batch values of another Arrow type (the message names the expected and the given
        type) and per-record values of another type, out of range or of another width raise
        InvalidInputError and change nothing, with TTL too."""
        from statecore.ttl import StateTtlConfig

        ser = _ser(vt)
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", vt))
        vt_ = b.get_state(ValueStateDescriptor("vt", vt).enable_time_to_live(StateTtlConfig(10**6)))
        r = b.get_state(ReducingStateDescriptor("r", "last", vt))
        lst = b.get_state(ListStateDescriptor("l", vt))
        m = b.get_state(MapStateDescriptor("m", "string", vt))
        keys = pa.array([1, 2], pa.int64())
        v.put_batch(keys, _arr(vt, vals[:2]))
        vt_.put_batch(keys, _arr(vt, vals[:2]))
        r.add_batch(keys, _arr(vt, vals[:2]))
        if ser.kind == "uint64":
            bad_arrays = [pa.array([1, 2], pa.int64()), pa.array([1, 2], pa.uint32())]
            bad_values = [-1, 2**64, True, 1.0, b"\x00" * 8]
        elif ser.kind == "timestamp":
            other = "s" if ser.unit != "s" else "ms"
            bad_arrays = [pa.array([1, 2], pa.timestamp(other)), pa.array([1, 2], pa.int64()),
                          pa.array([0, 86_400_000], pa.date64())]  # valid date64: whole days
            bad_values = [I64_MAX + 1, I64_MIN - 1, 1.5, "1", np.datetime64("NaT")]
        else:
            w = ser.width
            bad_arrays = [pa.array([b"x" * (w + 1)] * 2, pa.binary(w + 1)),
                          pa.array([b"x" * w] * 2, pa.binary()),
                          pa.array([b"x" * w] * 2, pa.large_binary())]
            bad_values = [b"x" * (w + 1), b"x" * (w - 1), "x" * w, bytearray(w + 1)]
        calls = []
        for arr in bad_arrays:
            calls += [lambda a=arr, s=s: s.put_batch(keys, a) for s in (v, vt_)]
            calls += [lambda a=arr: r.add_batch(keys, a), lambda a=arr: lst.append_batch(keys, a),
                      lambda a=arr: m.put_batch(keys, pa.array(["a", "b"]), a)]
            with pytest.raises(InvalidInputError, match=re.escape(ser.describe_arrow()) + ".*got "
                               + re.escape(str(arr.type))):
                v.put_batch(keys, arr)
        b.set_current_key(1)
        for x in bad_values:
            calls += [lambda x=x: v.update(x), lambda x=x: vt_.update(x), lambda x=x: r.add(x),
                      lambda x=x: lst.add(x), lambda x=x: lst.update([vals[0], x]),
                      lambda x=x: m.put("a", x)]
        _same_after(b, calls)
        assert (v.value(), vt_.value(), r.get()) == (vals[0], vals[0], vals[0])

    # ------------------------------------------------------------------ differential
    @pytest.mark.parametrize("ttl", [False, True])
    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_differential_new_value_type_batches(self, ttl, seed):
        """uint64, timestamp and fixed_size_binary value and reducing states through random
        batches (nulls, sliced arrays, repeated keys, TTL, overflowing uint64 sums) and
        per-record calls: the same outputs and snapshot bytes as the reference backend."""
        from statecore.ttl import ManualClock, StateTtlConfig

        cases = dict(VALUE_CASES)
        types = ["uint64", "timestamp[ms]", "timestamp[ns]", "fixed_size_binary[16]",
                 "fixed_size_binary[300]"]

        def program(b):
            b.ttl_clock.set(0)
            rnd = random.Random(seed)
            descs = {}
            for vt in types:
                descs["v" + vt] = ValueStateDescriptor("v" + vt, vt)
                for r in _reducers(vt):
                    descs[r + vt] = ReducingStateDescriptor(r + vt, r, vt)
            if ttl:
                for d in descs.values():
                    d.enable_time_to_live(StateTtlConfig(50, update_type="OnReadAndWrite"))
            st = {name: b.get_state(d) for name, d in descs.items()}
            seen = []
            for _ in range(6):
                n = rnd.randrange(0, 30)
                pad = rnd.randrange(0, 3)
                keys = pa.array([rnd.randrange(12) for _ in range(n + pad)], pa.int64()).slice(pad)
                for vt in types:
                    pool = cases[vt] + ([1, 2, 2**64 - 2] if vt == "uint64" else [])
                    vals = _arr(vt, [None if rnd.random() < 0.2 else rnd.choice(pool)
                                     for _ in range(n + pad)]).slice(pad)
                    for name, s in st.items():
                        if not name.endswith(vt):
                            continue
                        try:
                            if name.startswith("v"):
                                s.put_batch(keys, vals)
                            else:
                                seen.append((name, _py(vt, s.add_batch(keys, vals))))
                        except InvalidInputError:
                            seen.append((name, "rejected"))  # an overflowing uint64 sum
                        got = s.get_batch(pa.array(range(14), pa.int64()))
                        seen.append((name, str(got.type), _py(vt, got)))
                    key = rnd.randrange(12)
                    b.set_current_key(key)
                    seen.append((vt, key, st["v" + vt].value(), st["last" + vt].get()))
                b.ttl_clock.advance(rnd.choice([0, 10, 30]))
            return seen

        self.same_as_reference(program, ttl_clock=ManualClock(0))

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

        self.same_as_reference(program, ttl_clock=ManualClock(0))
