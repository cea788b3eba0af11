"""Value types (statecore.value_types): names, stored bytes, per-record Python values, Arrow
types; the new fixed-width types (uint64, timestamp[unit], fixed_size_binary[N]) in detail."""

import datetime

import numpy as np
import pyarrow as pa
import pytest

from statecore import serializers as S
from statecore import value_types as VT
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.mark.parametrize("spec,name", [
    ("uint64", "uint64"), (pa.uint64(), "uint64"),
    ("timestamp", "timestamp[us]"), ("timestamp[ms]", "timestamp[ms]"),
    ("TIMESTAMP[NS]", "timestamp[ns]"), ("timestamp[s, tz=UTC]", "timestamp[s]"),
    (pa.timestamp("ms"), "timestamp[ms]"), (pa.timestamp("us", tz="Europe/Paris"), "timestamp[us]"),
    ("fixed_size_binary[16]", "fixed_size_binary[16]"), (pa.binary(3), "fixed_size_binary[3]"),
    ("long", "int64"), (pa.large_string(), "string"), ("object", "pickle"),
])
def test_names(spec, name):
    assert S.normalize_value_type(spec) == name
    assert S.value_serializer(spec).name == name
    assert S.value_serializer(spec) is S.value_serializer(name)


@pytest.mark.parametrize("spec", ["uint32", "timestamp[m]", "timestamp[]", "fixed_size_binary",
                                  "fixed_size_binary[0]", "fixed_size_binary[-1]",
                                  "fixed_size_binary[2147483648]", pa.binary(0), pa.date32(),
                                  pa.list_(pa.uint64()), 5, ["int64"]])
def test_unsupported_names(spec):
    with pytest.raises(InvalidInputError):
        S.normalize_value_type(spec)


def test_stored_bytes_and_attributes():
    u = S.value_serializer("uint64")
    assert u.serialize(2**64 - 1) == b"\xff" * 8
    assert u.serialize(2**63) == (2**63).to_bytes(8, "little")
    assert u.deserialize(b"\x00" * 7 + b"\x80") == 2**63
    assert (u.fixed_width, u.arrow_type) == (8, pa.uint64())
    t = S.value_serializer("timestamp[ms]")
    assert t.serialize(-1) == b"\xff" * 8 and t.deserialize(b"\xff" * 8) == -1
    assert t.serialize(I64_MIN) == (I64_MIN).to_bytes(8, "little", signed=True)
    assert (t.fixed_width, t.unit, t.arrow_type) == (8, "ms", pa.timestamp("ms"))
    f = S.value_serializer("fixed_size_binary[3]")
    assert f.serialize(bytearray(b"abc")) == b"abc" and f.deserialize(b"a\x00c") == b"a\x00c"
    assert (f.fixed_width, f.width, f.arrow_type) == (3, 3, pa.binary(3))
    # fixed width: list elements are concatenated without lengths
    assert S.encode_list([1, 2**64 - 1], "uint64") == (1).to_bytes(8, "little") + b"\xff" * 8
    assert S.encode_list([b"abc", b"xyz"], "fixed_size_binary[3]") == b"abcxyz"
    assert S.decode_list(b"abcxyz", "fixed_size_binary[3]") == [b"abc", b"xyz"]
    assert S.is_fixed_width(f) and S.is_fixed_width(t)


def test_timestamp_python_values():
    ms = S.value_serializer("timestamp[ms]")
    ns = S.value_serializer("timestamp[ns]")
    s = S.value_serializer("timestamp[s]")
    utc = datetime.timezone.utc
    assert ms.check(datetime.datetime(2020, 1, 1)) == 1_577_836_800_000  # naive = UTC
    assert ms.check(datetime.datetime(2020, 1, 1, 1, tzinfo=datetime.timezone(
        datetime.timedelta(hours=1)))) == 1_577_836_800_000
    assert ms.check(datetime.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=utc)) == -1
    assert s.check(datetime.datetime(1, 1, 1)) == -62_135_596_800
    assert ms.check(np.datetime64("2020-01-01T00:00:00.001")) == 1_577_836_800_001
    assert ms.check(np.datetime64(3, "s")) == 3000
    assert ms.check(np.datetime64(-2, "D")) == -2 * 86_400_000
    assert ns.check(np.datetime64(I64_MAX, "ns")) == I64_MAX
    assert ms.check(np.int64(5)) == 5 and ms.check(I64_MIN) == I64_MIN
    pd = pytest.importorskip("pandas")
    assert ns.check(pd.Timestamp("1970-01-01T00:00:00.000000007")) == 7
    assert ns.check(pd.Timestamp("1970-01-01T01:00:00.000000007", tz="America/New_York")) == \
        6 * 3_600_000_000_000 + 7
    for bad in [datetime.datetime(2020, 1, 1, 0, 0, 0, 1),  # not whole milliseconds
                np.datetime64(1, "us"), np.datetime64("NaT"), np.datetime64(1, "M"),
                pd.NaT, pd.Timestamp(1, unit="ns"), I64_MAX + 1, True, 1.0, "2020-01-01",
                datetime.date(2020, 1, 1), None]:
        with pytest.raises(InvalidInputError):
            ms.check(bad)
    with pytest.raises(InvalidInputError):
        ns.check(datetime.datetime(9999, 12, 31))  # beyond int64 nanoseconds


def test_uint64_and_fixed_size_binary_python_values():
    u = S.value_serializer("uint64")
    assert u.check(np.uint64(2**64 - 1)) == 2**64 - 1 and u.check(0) == 0
    for bad in [-1, 2**64, True, 1.0, "1", None]:
        with pytest.raises(InvalidInputError):
            u.check(bad)
    f = S.value_serializer("fixed_size_binary[2]")
    assert f.check(memoryview(b"ab")) == b"ab"
    for bad in [b"", b"a", b"abc", "ab", None, 12]:
        with pytest.raises(InvalidInputError):
            f.check(bad)
    with pytest.raises(InvalidInputError):
        f.deserialize(b"abc")
    with pytest.raises(InvalidInputError):
        u.deserialize(b"\x00" * 9)


def test_arrow_acceptance_and_python_lists():
    t = S.value_serializer("timestamp[us]")
    assert t.accepts(pa.timestamp("us")) and t.accepts(pa.timestamp("us", tz="UTC"))
    assert not t.accepts(pa.timestamp("ms")) and not t.accepts(pa.int64())
    f = S.value_serializer("fixed_size_binary[4]")
    assert f.accepts(pa.binary(4)) and not f.accepts(pa.binary(5)) and not f.accepts(pa.binary())
    assert S.value_serializer("uint64").accepts(pa.uint64())
    assert not S.value_serializer("uint64").accepts(pa.int64())
    assert not S.value_serializer("pickle").accepts(pa.binary())
    # timestamps read as ints, whatever pyarrow's datetime range is
    arr = pa.array([I64_MIN, None, I64_MAX], pa.timestamp("s", tz="UTC"))
    assert t.to_pylist(arr) == [I64_MIN, None, I64_MAX]
    lists = pa.array([[1, None], None, []], pa.large_list(pa.timestamp("us")))
    assert t.to_pylist(lists) == [[1, None], None, []]


def test_descriptors():
    d = ValueStateDescriptor("v", pa.timestamp("ms", tz="UTC"),
                             default=datetime.datetime(1970, 1, 2))
    assert d.meta()["value_type"] == "timestamp[ms]" and d.default_value() == 86_400_000
    assert ListStateDescriptor("l", pa.binary(8)).meta()["value_type"] == "fixed_size_binary[8]"
    assert MapStateDescriptor("m", "string", "uint64").meta()["value_type"] == "uint64"
    for r in ("sum", "min", "max", "first", "last"):
        assert ReducingStateDescriptor("r", r, "uint64").value_type == "uint64"
    for r in ("min", "max", "first", "last"):
        ReducingStateDescriptor("r", r, "timestamp[ns]")
        ReducingStateDescriptor("r", r, "fixed_size_binary[2]")
    with pytest.raises(InvalidInputError, match="sum of instants"):
        ReducingStateDescriptor("r", "sum", "timestamp[ms]")
    for vt in ("fixed_size_binary[2]", "uint64", "timestamp"):
        with pytest.raises(InvalidInputError):
            ReducingStateDescriptor("r", "count", vt)  # count stores int64
        with pytest.raises(InvalidInputError):
            MapStateDescriptor("m", vt, "int64")  # not a user-key type
    with pytest.raises(InvalidInputError):
        ReducingStateDescriptor("r", "sum", "fixed_size_binary[2]")
    with pytest.raises(InvalidInputError):
        ValueStateDescriptor("v", "fixed_size_binary[2]", default=b"abc")
    # a vectorized reducer sees Arrow timestamps and hands ints back
    from statecore.descriptors import Reducer

    r = ReducingStateDescriptor("r", Reducer.vectorized(lambda a, b: b), "timestamp[s]")
    assert r.reducer.add(I64_MIN, I64_MAX) == I64_MAX
    assert isinstance(VT.value_serializer("timestamp[s]"), S.ValueSerializer)
