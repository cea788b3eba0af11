"""Keys part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): validation of the current key against
the key type and the backend's key-group range, key groups of the Spark and Flink assigners
(Flink's ``KeyGroupRangeAssignment``) and the encoded key bytes; then every key type of
:mod:`statecore.key_types` through the per-record and the batch APIs, snapshots and restores
(byte-identical to the reference backend), sliced and chunked key arrays, null keys and null key
fields, wrong types, timers, and a seeded hypothesis differential run against the reference.
"""

from __future__ import annotations

import datetime
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statecore import key_groups as K
from statecore import key_types as KT
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import dump_backend, sliced, snapshot_dump

__all__ = ["KeyTypeConformance", "KEY_CASES"]

NAN = float("nan")

#: (key type, distinct canonical keys) exercised by every test below.
KEY_CASES = [
    ("int32", [0, -1, 2**31 - 1, -(2**31), 77]),
    ("int64", [0, -1, 2**63 - 1, -(2**63), 123456789012]),
    ("uint64", [0, 1, 2**63, 2**64 - 1, 12345678901234567890]),
    ("float64", [0.0, 1.5, -2.25, KT.NAN, math.inf, -math.inf, 5e-324, 1e300]),
    ("bool", [True, False]),
    ("timestamp[us]", [0, -1, 1_600_000_000_123_456, -62_135_596_800_000_000]),
    ("timestamp[ns]", [0, 1, -1, 2**63 - 1]),
    ("string", ["", "a", "日本語", "😀"]),
    ("binary", [b"", b"\x00", b"ab", b"\xff" * 40]),
    ("fixed_size_binary[4]", [b"\x00" * 4, b"dead", b"\xff" * 4]),
    ("struct<int32,string>", [(1, "a"), (1, "b"), (2, "a"), (-1, "")]),
    ("struct<string,string>", [("ab", "c"), ("a", "bc"), ("", "abc")]),
    ("struct<float64,bool,fixed_size_binary[2]>",
     [(0.0, True, b"ab"), (KT.NAN, False, b"xy"), (1.5, True, b"ab"), (1.5, False, b"ab")]),
    ("struct<timestamp[ms],binary,uint64>", [(0, b"", 0), (-1, b"\x00", 2**64 - 1), (7, b"", 0)]),
]
CASE_IDS = [c[0] for c in KEY_CASES]


def key_array(key_type: str, keys: list) -> pa.Array:
    """The key type's Arrow array of per-record keys."""
    return pa.array(keys, KT.key_type(key_type).arrow_type)


def _same_keys(a, b) -> bool:
    """Key lists equal, NaN equal to NaN (the canonical NaN is one key)."""
    def norm(x):
        if isinstance(x, tuple):
            return tuple(norm(y) for y in x)
        return "NaN" if isinstance(x, float) and x != x else x
    return [norm(x) for x in a] == [norm(x) for x in b]


class KeyTypeConformance(ConformanceBase):
    """Current keys and key arrays of every key type: validation, key-group assignment (Spark
    and Flink assigners), batch and per-record paths, snapshots and restores, bad input, and a
    hypothesis differential run against the reference backend."""

    # ------------------------------------------------------------------ current key
    def test_invalid_keys(self):
        b = self.new_backend(key_group_range=(0, 63))
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

    @pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
    def test_timestamp_keys_from_datetimes(self, unit):
        """A timestamp key takes what a timestamp value takes: an int of the unit, a datetime
        (naive = UTC) or a numpy.datetime64 of any fixed unit, all the same key; what is not
        whole in the unit, NaT and calendar units are rejected, the current key unchanged."""
        kt = f"timestamp[{unit}]"
        per = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
        when = datetime.datetime(2021, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc)
        secs = int(when.timestamp())
        forms = [secs * per, when, when.replace(tzinfo=None), np.datetime64(secs, "s"),
                 np.datetime64(secs * 1000, "ms"), np.datetime64(secs * 10**9, "ns")]
        b = self.new_backend(key_type=kt)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        for i, k in enumerate(forms):
            b.set_current_key(k)
            assert b.current_key == secs * per and type(b.current_key) is int
            assert v.value() == (None if i == 0 else i - 1)
            v.update(i)
        assert b.num_entries() == 1
        finer = {"s": "ms", "ms": "us", "us": "ns", "ns": "ps"}[unit]
        for bad, why in [(np.datetime64(1, finer), "whole number"), (np.datetime64("NaT"), "NaT"),
                         (np.datetime64(600, "M"), "fixed"),
                         (np.datetime64(10**17, "D"), "out of range")]:
            with pytest.raises(InvalidInputError, match=why):
                b.set_current_key(bad)
            assert b.current_key == secs * per
        b.set_current_key(np.datetime64(secs, "s"))
        assert v.value() == len(forms) - 1

    def test_numpy_str_keys_are_plain_str(self):
        b = self.new_backend(key_type="string")
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(np.str_("k"))
        v.update(1)
        assert type(b.current_key) is str
        b.set_current_key("k")
        assert v.value() == 1

    @pytest.mark.parametrize("key_type,keys", [
        ("int32", [0, -1, (1 << 31) - 1]), ("string", ["", "a", "日本語", "😀emoji"]),
        ("binary", [b"", b"\x00", b"abc"])])
    def test_key_types(self, key_type, keys):
        for assigner in ("spark", "flink"):
            b = self.new_backend(key_type=key_type, assigner=assigner)
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            for i, k in enumerate(keys):
                b.set_current_key(k)
                assert b.current_key_group == K.assign_key_group(k, key_type, 128, assigner)
                v.update(i)
            for i, k in enumerate(keys):
                b.set_current_key(k)
                assert v.value() == i
            arrow_type = {"int32": pa.int32(), "string": pa.string(),
                          "binary": pa.binary()}[key_type]
            got = v.get_batch(pa.array(keys, arrow_type))
            assert got.to_pylist() == list(range(len(keys)))

    def test_flink_assigner_and_large_max_parallelism(self):
        b = self.new_backend(key_type="string", max_parallelism=4096, assigner="flink")
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

    # ------------------------------------------------------------------ round trips
    @pytest.mark.parametrize("key_type,keys", KEY_CASES, ids=CASE_IDS)
    @pytest.mark.parametrize("assigner", ["spark", "flink"])
    def test_key_type_round_trip(self, key_type, keys, assigner):
        """Per-record writes read back per record and by batch, batch writes read back per
        record; key groups as the reference assigns them; snapshots byte-identical to the
        reference backend's; a restore (also into the reference) gives every value back."""
        opts = dict(key_type=key_type, max_parallelism=200, assigner=assigner)
        b, ref = self.new_backend(**opts), self.make_reference_backend(**opts)
        assert b.key_type == K.normalize_key_type(key_type)
        arr = key_array(key_type, keys)
        for be in (b, ref):
            v = be.get_state(ValueStateDescriptor("v", "int64"))
            s = be.get_state(ReducingStateDescriptor("s", "sum", "int64"))
            for i, k in enumerate(keys):
                be.set_current_key(k)
                assert be.current_key_group == K.assign_key_group(k, key_type, 200, assigner)
                v.update(i)
            assert v.get_batch(arr).to_pylist() == list(range(len(keys)))
            s.add_batch(arr, pa.array([10 * i for i in range(len(keys))], pa.int64()))
            s.add_batch(arr, pa.array([1] * len(keys), pa.int64()))
            for i, k in enumerate(keys):
                be.set_current_key(k)
                assert _same_keys([be.current_key], [k])
                assert s.get() == 10 * i + 1
        assert dump_backend(b) == dump_backend(ref)
        for src in (b, ref):
            for dst_make in (self.new_backend, self.make_reference_backend):
                dst = dst_make(**opts)
                snap = src.snapshot()
                dst.restore(snap)
                snap.release()
                got = dst.get_state(ReducingStateDescriptor("s", "sum", "int64")).get_batch(arr)
                assert got.to_pylist() == [10 * i + 1 for i in range(len(keys))]

    @pytest.mark.parametrize("key_type,keys", KEY_CASES, ids=CASE_IDS)
    def test_key_type_sliced_and_chunked_arrays(self, key_type, keys):
        """Key arrays with an offset (nulls and other keys around the slice), chunked arrays, and
        for multi-column keys a list of (sliced) column arrays all address the same entries."""
        b = self.new_backend(key_type=key_type)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        arr = key_array(key_type, keys)
        vals = pa.array(range(len(keys)), pa.int64())
        v.put_batch(sliced(arr, keys[-1]), sliced(vals, 99))
        assert v.get_batch(arr).to_pylist() == list(range(len(keys)))
        half = len(keys) // 2
        chunked = pa.chunked_array([arr.slice(0, half), arr.slice(half)], arr.type)
        assert v.get_batch(chunked).to_pylist() == list(range(len(keys)))
        assert v.contains_batch(sliced(arr, keys[0])).to_pylist() == [True] * len(keys)
        kt = KT.key_type(key_type)
        if kt.is_struct:
            columns = [sliced(arr.field(i), None) for i in range(len(kt.fields))]
            assert v.get_batch(columns).to_pylist() == list(range(len(keys)))
            assert v.get_batch(sliced(arr, keys[0])).to_pylist() == list(range(len(keys)))
        v.clear_batch(arr.slice(1))
        assert v.get_batch(arr).to_pylist() == [0] + [None] * (len(keys) - 1)

    @pytest.mark.parametrize("key_type,keys", KEY_CASES, ids=CASE_IDS)
    def test_key_type_other_states_and_timers(self, key_type, keys):
        """List, map and reducing states and timers take the new keys per batch and per record;
        timers fire with canonical keys (ints for timestamps, tuples for multi-column keys)."""
        b = self.new_backend(key_type=key_type)
        arr = key_array(key_type, keys)
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        lst.append_batch(arr, pa.array(range(len(keys)), pa.int64()))
        m.put_batch(arr, pa.array(["x"] * len(keys)), pa.array(range(len(keys)), pa.int64()))
        assert lst.get_batch(arr).to_pylist() == [[i] for i in range(len(keys))]
        assert m.get_batch(arr, pa.array(["x"] * len(keys))).to_pylist() == list(range(len(keys)))
        b.timers.register_batch(arr, pa.array(range(len(keys)), pa.int64()))
        b.set_current_key(keys[0])
        b.timers.register_event_time_timer(100)
        fired = b.timers.advance_watermark(1000)
        assert sorted(ts for ts, _, _ in fired) == sorted(list(range(len(keys))) + [100])
        assert _same_keys([k for ts, k, _ in sorted(fired, key=lambda f: f[0]) if ts < 100], keys)

    # ------------------------------------------------------------------ canonical floats
    def test_float64_keys_canonical(self):
        """-0.0 is the key 0.0 and every NaN one key, per record and by batch (Spark groups them
        alike; their hashes agree: key_types module docstring)."""
        import struct

        payload_nan = struct.unpack("<d", bytes.fromhex("010000000000f07f"))[0]
        b = self.new_backend(key_type="float64")
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(-0.0)
        v.update(1)
        assert str(b.current_key) == "0.0"
        b.set_current_key(NAN)
        v.update(2)
        b.set_current_key(payload_nan)
        assert v.value() == 2
        assert v.get_batch(pa.array([0.0, -0.0, payload_nan, -NAN])).to_pylist() == [1, 1, 2, 2]
        v.put_batch(pa.array([-0.0, payload_nan]), pa.array([3, 4], pa.int64()))
        assert b.num_entries() == 2
        b.set_current_key(0.0)
        assert v.value() == 3

    # ------------------------------------------------------------------ bad input
    @pytest.mark.parametrize("key_type,keys", KEY_CASES, ids=CASE_IDS)
    def test_key_type_nulls_rejected_state_untouched(self, key_type, keys):
        b = self.new_backend(key_type=key_type)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        arr = key_array(key_type, keys)
        v.put_batch(arr, pa.array(range(len(keys)), pa.int64()))
        before = dump_backend(b)
        kt = KT.key_type(key_type)
        with_null = pa.concat_arrays([arr, pa.array([None], arr.type)])
        bad_batches = [with_null, sliced(with_null, keys[0])]
        if kt.is_struct:
            # A null in one field of an otherwise present key.
            cols = [arr.field(i) for i in range(len(kt.fields))]
            cols[-1] = pa.concat_arrays([cols[-1].slice(1), pa.array([None], cols[-1].type)])
            bad_batches.append(pa.StructArray.from_arrays(
                cols, names=[f"c{i}" for i in range(len(cols))]))
            bad_batches.append(cols)
        for keys_in in bad_batches:
            rows = len(keys_in[0]) if isinstance(keys_in, list) else len(keys_in)
            ones = pa.array([1] * rows, pa.int64())
            for call in (lambda: v.put_batch(keys_in, ones), lambda: v.get_batch(keys_in),
                         lambda: s.add_batch(keys_in, ones), lambda: v.clear_batch(keys_in),
                         lambda: lst.append_batch(keys_in, ones),
                         lambda: b.timers.register_batch(keys_in, ones)):
                with pytest.raises(InvalidInputError, match="null"):
                    call()
                assert dump_backend(b) == before
        with pytest.raises(InvalidInputError):
            b.set_current_key(None)

    @pytest.mark.parametrize("key_type,bad_arrays,bad_keys", [
        ("uint64", [pa.array([1], pa.int64()), pa.array([1.0])], [-1, 2**64, 1.0, True]),
        ("float64", [pa.array([1], pa.int64()), pa.array([1.0], pa.float32())], ["1", True, None]),
        ("bool", [pa.array([1], pa.int8()), pa.array(["true"])], [1, "true"]),
        ("timestamp[us]", [pa.array([0], pa.timestamp("ms")), pa.array([0], pa.int64()),
                           pa.array([0], pa.date32())], [1.5, "0", 2**63]),
        ("fixed_size_binary[4]", [pa.array([b"abc"], pa.binary(3)), pa.array([b"abcd"])],
         [b"abc", "abcd"]),
        ("binary", [pa.array([b"abcd"], pa.binary(4))], ["x"]),
        ("struct<int32,string>", [pa.array([1], pa.int32()),
                                  pa.array([("a", 1)],
                                           pa.struct([("a", pa.string()), ("b", pa.int32())])),
                                  pa.array([(1, "a", 1)],
                                           pa.struct([("a", pa.int32()), ("b", pa.string()),
                                                      ("c", pa.int32())])),
                                  [pa.array([1], pa.int32())],
                                  [pa.array([1], pa.int32()), pa.array(["a", "b"])]],
         [(1,), ("a", 1), "1a", [1, "a", 2], (1, None)]),
    ])
    def test_key_type_wrong_types_rejected(self, key_type, bad_arrays, bad_keys):
        b = self.new_backend(key_type=key_type)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        before = dump_backend(b)
        for keys_in in bad_arrays:
            rows = len(keys_in[0]) if isinstance(keys_in, list) else len(keys_in)
            with pytest.raises(InvalidInputError, match="keys"):
                v.put_batch(keys_in, pa.array([1] * rows, pa.int64()))
            with pytest.raises(InvalidInputError):
                v.get_batch(keys_in)
        for k in bad_keys:
            with pytest.raises(InvalidInputError):
                b.set_current_key(k)
            assert b.current_key is None
        assert dump_backend(b) == before

    # ------------------------------------------------------------------ differential
    @settings(max_examples=100, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test_key_type_differential_random_ops(self, data):
        """Random per-record and batch operations on random keys of a random key type: the
        backend and the reference return the same results and hold byte-identical snapshots."""
        key_type, pool = data.draw(st.sampled_from(KEY_CASES), label="key type")
        assigner = data.draw(st.sampled_from(["spark", "flink"]), label="assigner")
        opts = dict(key_type=key_type, max_parallelism=data.draw(st.sampled_from([128, 300])),
                    assigner=assigner)
        pair = (self.new_backend(**opts), self.make_reference_backend(**opts))
        states = [(be.get_state(ValueStateDescriptor("v", "int64")),
                   be.get_state(ReducingStateDescriptor("s", "sum", "int64"))) for be in pair]
        keys = st.sampled_from(pool)
        for _ in range(data.draw(st.integers(1, 20), label="ops")):
            op = data.draw(st.sampled_from(["put", "add", "get", "record", "clear"]), label="op")
            ks = data.draw(st.lists(keys, max_size=6), label="keys")
            arr = key_array(key_type, ks)
            vals = pa.array(data.draw(st.lists(st.one_of(st.none(), st.integers(-9, 9)),
                                               min_size=len(ks), max_size=len(ks))), pa.int64())
            out = []
            for be, (v, s) in zip(pair, states):
                if op == "put":
                    v.put_batch(arr, vals)
                    r = v.get_batch(arr).to_pylist()
                elif op == "add":
                    r = s.add_batch(arr, vals).to_pylist()
                elif op == "get":
                    r = (v.get_batch(arr).to_pylist(), s.get_batch(arr).to_pylist())
                elif op == "clear":
                    v.clear_batch(arr)
                    r = None
                else:
                    r = []
                    for k, x in zip(ks, vals.to_pylist()):
                        be.set_current_key(k)
                        if x is not None:
                            v.update(x)
                        r.append((be.current_key_group, v.value(), s.get()))
                out.append(r)
            assert out[0] == out[1], (key_type, op, ks)
        assert dump_backend(pair[0]) == dump_backend(pair[1])
        assert pair[0].num_entries() == pair[1].num_entries()
        assert pair[0].state_bytes() == pair[1].state_bytes()
