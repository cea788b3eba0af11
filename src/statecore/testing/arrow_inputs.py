"""Arrow input part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): every batch call takes chunked
arrays, Arrow C streams (``__arrow_c_stream__``, also record-batch streams) and C data interface
arrays (``__arrow_c_array__``) as it takes the plain array; multi-column keys from a record-batch
stream; a stream that is malformed or fails mid-way, and string columns with malformed UTF-8 or
offsets in any role (keys, values, namespaces, map user keys, list elements), raise
InvalidInputError with the state untouched.
"""

from __future__ import annotations

import struct

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
from statecore.testing.helpers import AverageAggregate, StreamOnly, column_in_form, snapshot_dump

__all__ = ["ArrowInputConformance", "malformed_string_columns"]

_INT64 = pa.int64()
_STRING = pa.string()


def _string_column(offsets, data: bytes, type_=_STRING) -> pa.Array:
    """A string array of ``len(offsets) - 1`` rows over ``data``, built from its buffers
    (pyarrow checks only what its structural validation checks)."""
    width = "q" if type_ in (pa.large_string(), pa.large_binary()) else "i"
    offs = pa.py_buffer(struct.pack(f"<{len(offsets)}{width}", *offsets))
    return pa.Array.from_buffers(type_, len(offsets) - 1, [None, offs, pa.py_buffer(data)])


def _rows(*rows: bytes, type_=_STRING) -> pa.Array:
    offsets = [0]
    for r in rows:
        offsets.append(offsets[-1] + len(r))
    return _string_column(offsets, b"".join(rows), type_)


def _past_the_data() -> pa.Array:
    # The last offset moved far past the 4-byte data buffer after pyarrow built the array (the
    # offsets live in a mutable buffer).
    raw = bytearray(struct.pack("<5i", 0, 1, 2, 3, 4))
    arr = pa.Array.from_buffers(pa.string(), 4, [None, pa.py_buffer(raw), pa.py_buffer(b"abcd")])
    struct.pack_into("<i", raw, 16, 4000)
    return arr


def malformed_string_columns() -> dict:
    """Four-row string columns, each malformed in row 2 (UTF-8 of each class of ill-formed
    sequence of the Unicode Standard's Table 3-7, offsets), by name."""
    utf8 = {
        "overlong": b"\xc0\xaf",
        "overlong 3-byte": b"\xe0\x80\xaf",
        "surrogate": b"\xed\xa0\x80",
        "truncated": b"b\xe2\x82",
        "above U+10FFFF": b"\xf4\x90\x80\x80",
        "stray continuation": b"\x80z",
        "invalid byte": b"\xff",
    }
    cols = {name: _rows(b"a", b"bb", bad, b"c") for name, bad in utf8.items()}
    cols["large_string surrogate"] = _rows(b"a", b"bb", b"\xed\xbf\xbf", b"c",
                                           type_=pa.large_string())
    # "é" split over rows 1 and 2: the bytes together are valid UTF-8, the rows are not.
    cols["a character split over two rows"] = _rows(b"a", b"\xc3", b"\xa9", b"c")
    cols["offsets going backwards"] = _string_column([0, 1, 3, 2, 4], b"abcd")
    cols["an offset past the data buffer"] = _string_column([0, 1, 2, 4000, 4], b"abcd")
    cols["the last offset past the data buffer"] = _past_the_data()
    return cols


def _stream_program(form: str):
    """A program (backend -> observations) calling every batch call with its inputs in the
    Arrow input form ``form`` (:func:`statecore.testing.helpers.column_in_form`)."""
    def col(values, type_):
        return column_in_form(values, type_, form)

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
        anycol = col if form != "table" else (lambda xs, t: column_in_form(xs, t, "stream"))
        seen.append(cnt.add_batch(col(keys, pa.int64()), anycol(floats, pa.float64())).to_pylist())
        seen.append(agg.add_batch(col(keys, pa.int64()), anycol(ints, pa.int64())).to_pylist())
        seen.append(agg.get_batch(col(keys[:5], pa.int64())).to_pylist())
        lst.append_batch(col(keys, pa.int64()), col([i for i in range(n)], pa.int32()))
        seen.append(lst.get_batch(col(keys[:5], pa.int64())).to_pylist())
        uks = [str(i % 4) for i in range(n)]
        m.put_batch(col(keys, pa.int64()), col(uks, pa.string()), col(list(range(n)), pa.int64()))
        seen.append(m.get_batch(col(keys, pa.int64()), col(uks[::-1], pa.string())).to_pylist())
        seen.append(m.contains_batch(col(keys, pa.int64()),
                                     col(uks[::-1], pa.string())).to_pylist())
        m.remove_batch(col(keys[:10], pa.int64()), col(uks[:10], pa.string()))
        nss = ["a" if i % 3 else "b" for i in range(n)]
        ns.put_batch(col(keys, pa.int64()), col(ints, pa.int64()), namespaces=col(nss, pa.string()))
        seen.append(ns.get_batch(col(keys, pa.int64()),
                                 namespaces=col(nss[::-1], pa.string())).to_pylist())
        b.timers.register_batch(col(keys, pa.int64()), col(list(range(n)), pa.int64()))
        b.timers.delete_batch(col(keys[:10], pa.int64()), col(list(range(10)), pa.int64()))
        seen.append(b.timers.num_timers())
        return seen

    return program


class ArrowInputConformance(ConformanceBase):
    """Batch inputs in every Arrow form (see :func:`statecore.testing.helpers.column_in_form`)."""

    def test_batch_accepts_c_data_interface(self):
        class Wrapped:
            def __init__(self, arr):
                self.arr = arr

            def __arrow_c_array__(self, requested_schema=None):
                return self.arr.__arrow_c_array__(requested_schema)

        b = self.new_backend(key_type="string")
        v = b.get_state(ValueStateDescriptor("v", "string"))
        v.put_batch(Wrapped(pa.array(["a", "b"])), Wrapped(pa.array(["x", "y"])))
        got = v.get_batch(pa.array(["b", "a", "c"], pa.large_string()))
        assert got.to_pylist() == ["y", "x", None]

    @pytest.mark.parametrize("form", ["chunked", "stream", "table", "c_array"])
    def test_batch_accepts_arrow_streams(self, form):
        """Every batch call reads stream / chunked / capsule inputs as the plain array."""
        from statecore.ttl import ManualClock

        seen = self.same_as_reference(_stream_program(form), ttl_clock=ManualClock(0))
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128,
                                          ttl_clock=ManualClock(0))
        assert seen == _stream_program("array")(ref)

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
                keys = StreamOnly(pa.chunked_array(chunks))
            else:
                keys = StreamOnly(pa.Table.from_batches(
                    [pa.RecordBatch.from_struct_array(c) for c in chunks]))
            v.put_batch(keys, pa.array([1, 2, 3, 4]))
            return v.get_batch(ks).to_pylist()

        assert self.same_as_reference(program, key_type=("int32", "string")) == [3, 2, 3, 4]

    def test_batch_stream_errors_leave_state_untouched(self):
        from statecore.ttl import ManualClock, StateTtlConfig

        clock = ManualClock(0)
        b = self.new_backend(key_group_range=(0, 63), ttl_clock=clock)
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

        def chunked(*parts, type_=_INT64):
            return pa.chunked_array([pa.array(p, type_) for p in parts], type_)

        def failing_stream(first, type_=_INT64):
            schema = pa.schema([("c", type_)])

            def gen():
                yield pa.record_batch([pa.array(first, type_)], schema=schema)
                raise RuntimeError("producer failed mid-stream")

            return StreamOnly(pa.RecordBatchReader.from_batches(schema, gen()))

        good = inside[:20]
        bad_calls = [
            # a later chunk holds a key outside the range, a null key, a bad value type
            lambda: v.put_batch(chunked(good, [inside[20], outside]), chunked(range(22))),
            lambda: v.put_batch(StreamOnly(chunked(good, [inside[20], None])), chunked(range(22))),
            lambda: v.get_batch(chunked(good, [outside])),
            lambda: vt.get_batch(chunked(good, [outside])),
            lambda: vt.get_batch(StreamOnly(chunked(good, [None]))),
            lambda: v.put_batch(chunked(good), StreamOnly(chunked(range(20), type_=pa.int32()))),
            lambda: v.put_batch(StreamOnly(chunked(good, type_=pa.int32())), chunked(range(20))),
            # mismatched total lengths, as streams
            lambda: v.put_batch(StreamOnly(chunked(good[:10], good[10:])),
                                StreamOnly(chunked(range(19)))),
            lambda: s.add_batch(chunked(good), StreamOnly(chunked(range(5), range(16)))),
            # a stream that errors mid-way
            lambda: v.put_batch(failing_stream(good), pa.array(range(20))),
            lambda: v.put_batch(pa.array(good), failing_stream(list(range(10)))),
            lambda: s.add_batch(failing_stream(good), pa.array(range(20))),
            lambda: m.put_batch(pa.array(good[:2]), failing_stream(["a"], pa.string()),
                                pa.array([1, 2])),
            lambda: lst.append_batch(pa.array(good[:2]), failing_stream([1])),
            lambda: b.timers.register_batch(pa.array(good[:2]), failing_stream([1])),
            # an overflowing sum in a later chunk
            lambda: s.add_batch(chunked(good, good),
                                chunked(range(20), [1] * 19 + [(1 << 63) - 1])),
            lambda: s32.add_batch(chunked(good, good),
                                  chunked(range(20), [1] * 19 + [(1 << 31) - 1],
                                          type_=pa.int32())),
            # a record-batch stream of two columns is not a column
            lambda: v.put_batch(StreamOnly(pa.table({"a": good, "b": good})), pa.array(range(20))),
            # not Arrow at all
            lambda: v.put_batch(object(), pa.array(range(20))),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert snapshot_dump(b.snapshot()) == before

    @pytest.mark.parametrize("bad", sorted(malformed_string_columns()))
    def test_malformed_string_columns_change_nothing(self, bad):
        """A string column with ill-formed UTF-8 or bad offsets, in any role of any batch call,
        plain or as the second chunk of a chunked column, raises InvalidInputError naming the
        column, and the state is unchanged."""
        col = malformed_string_columns()[bad]
        b = self.new_backend(key_type="string")
        v = b.get_state(ValueStateDescriptor("v", "string"))
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        cnt = b.get_state(ReducingStateDescriptor("cnt", "count"))
        lst = b.get_state(ListStateDescriptor("l", "string"))
        m = b.get_state(MapStateDescriptor("m", "string", "string"))
        ns = b.get_state(ValueStateDescriptor("ns", "int64"), namespace_type="string")
        keys = pa.array(["k0", "k1", "k2", "k3"])
        ints = pa.array([1, 2, 3, 4])
        v.put_batch(keys, pa.array(["x", "y", "z", "w"]))
        s.add_batch(keys, ints)
        lst.append_batch(keys, pa.array(["e", "f", "g", "h"]))
        m.put_batch(keys, pa.array(["u"] * 4), pa.array(["v"] * 4))
        ns.put_batch(keys, ints, namespaces=pa.array(["n"] * 4))
        before = snapshot_dump(b.snapshot())
        calls = [
            ("keys", lambda c, k, i: v.put_batch(c, k)),
            ("values", lambda c, k, i: v.put_batch(k, c)),
            ("keys", lambda c, k, i: v.get_batch(c)),
            ("keys", lambda c, k, i: v.contains_batch(c)),
            ("keys", lambda c, k, i: v.clear_batch(c)),
            ("keys", lambda c, k, i: s.add_batch(c, i)),
            ("keys", lambda c, k, i: cnt.add_batch(c, i)),
            ("values", lambda c, k, i: cnt.add_batch(k, c)),
            ("keys", lambda c, k, i: lst.append_batch(c, k)),
            ("values", lambda c, k, i: lst.append_batch(k, c)),
            ("keys", lambda c, k, i: lst.get_batch(c)),
            ("keys", lambda c, k, i: m.put_batch(c, k, k)),
            ("user_keys", lambda c, k, i: m.put_batch(k, c, k)),
            ("values", lambda c, k, i: m.put_batch(k, k, c)),
            ("user_keys", lambda c, k, i: m.get_batch(k, c)),
            ("user_keys", lambda c, k, i: m.contains_batch(k, c)),
            ("user_keys", lambda c, k, i: m.remove_batch(k, c)),
            ("namespaces", lambda c, k, i: ns.put_batch(k, i, namespaces=c)),
            ("namespaces", lambda c, k, i: ns.get_batch(k, namespaces=c)),
        ]
        # Chunked: the malformed chunk after a good one, combined with it first (5000 rows) or
        # large enough for a kernel call of its own (9000), which must not run before the bad
        # chunk is found.
        forms = [(col, keys, ints)]
        for n in (5000, 9000):
            good = pa.array([f"k{j % 4}" for j in range(n)], col.type)
            forms.append((pa.chunked_array([good, col]),
                          pa.chunked_array([good.cast(pa.string()), keys]),
                          pa.chunked_array([pa.array(range(n)), ints])))
        for what, call in calls:
            for c, k, i in forms:
                with pytest.raises(InvalidInputError, match=f"{what}: .*invalid Arrow data"):
                    call(c, k, i)
                assert snapshot_dump(b.snapshot()) == before, (what, bad)
