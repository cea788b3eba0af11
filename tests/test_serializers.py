"""Serializers and the key codec against the contract (docs/formats.md) and Flink's bytes."""

import json
import math
import pathlib
import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore import serializers as S
from statecore.errors import InvalidInputError

DATA = pathlib.Path(__file__).parent / "data"
FLINK = json.loads((DATA / "flink_keygroups.json").read_text())

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
TEXT = st.text(max_size=300)  # hypothesis text never contains lone surrogates
KEYS = {"int32": INT32, "int64": INT64, "string": TEXT, "binary": st.binary(max_size=300)}
NAMESPACES = {"void": st.none(), **KEYS}


def test_rocksdb_composite_key_examples():
    examples = FLINK["rocksdb_composite_key_examples"]
    assert len(examples) == 4
    for e in examples:
        if e["desc"].startswith("Integer key 42, VoidNamespace"):
            args = (42, "int32", None, "void")
        else:
            args = ("hello", "string", "ns", "string")
        enc = S.encode_key(e["keyGroup"], e["maxParallelism"], *args)
        assert enc.hex() == e["hex"], e
        assert S.decode_key(enc, e["maxParallelism"], args[1], args[3]) == \
            (e["keyGroup"], args[0], args[2], None)


def test_len_bytes_and_varlen():
    assert S.len_bytes(6) == b"\x06"
    assert S.len_bytes(300) == b"\x2c\x01"
    assert S.len_bytes(0) == b"\x00"
    assert S.write_varlen(0) == b"\x00"
    assert S.write_varlen(127) == b"\x7f"
    assert S.write_varlen(128) == b"\x80\x01"
    assert S.write_varlen(300) == b"\xac\x02"
    assert S.read_varlen(b"\xac\x02", 0) == (300, 2)
    with pytest.raises(InvalidInputError):
        S.read_varlen(b"\x80", 0)
    for negative in (S.len_bytes, S.write_varlen):
        with pytest.raises(InvalidInputError, match="negative"):
            negative(-1)


def test_value_bytes():
    assert S.value_serializer("int64").serialize(1) == (1).to_bytes(8, "little")
    assert S.value_serializer("int64").serialize(-2) == (-2).to_bytes(8, "little", signed=True)
    assert S.value_serializer("int32").serialize(-2) == (-2).to_bytes(4, "little", signed=True)
    assert S.value_serializer("float64").serialize(1.5) == bytes.fromhex("000000000000f83f")
    assert S.value_serializer("bool").serialize(True) == b"\x01"
    assert S.value_serializer("string").serialize("é") == "é".encode()
    assert S.value_serializer("binary").serialize(bytearray(b"ab")) == b"ab"
    assert S.value_serializer("pickle").serialize({"a": 1}) == pickle.dumps({"a": 1}, protocol=5)
    assert S.value_serializer(pa.int64()).name == "int64"
    assert S.value_serializer(pa.large_string()).name == "string"
    assert S.value_serializer("double").name == "float64"


def test_key_bytes():
    assert S.key_serializer("int32").serialize(42) == b"\x00\x00\x00\x2a"
    assert S.key_serializer("int64").serialize(-1) == b"\xff" * 8
    assert S.key_serializer("string").serialize("hello") == b"\x06hello"
    assert S.key_serializer("binary").serialize(b"") == b"\x01"
    assert S.key_serializer("void").serialize(None) == b"\x00"
    assert S.key_serializer("pickle").serialize((1, 2)) == \
        S.key_serializer("binary").serialize(pickle.dumps((1, 2), protocol=5))
    long = "x" * 200
    assert S.key_serializer("string").serialize(long) == b"\xc9\x01" + long.encode()


def test_fixed_width():
    assert S.is_fixed_width("int32") and S.is_fixed_width("int64") and S.is_fixed_width("void")
    assert not S.is_fixed_width("string") and not S.is_fixed_width("binary")
    assert not S.is_fixed_width("pickle")
    assert S.is_fixed_width("float64") and S.is_fixed_width("bool")
    assert S.is_fixed_width(S.value_serializer("int64"))


def test_two_byte_prefix_and_user_key():
    enc = S.encode_key(300, 4096, 7, "int64", 5, "int64", "uk", "string")
    assert enc == b"\x01\x2c" + (7).to_bytes(8, "big") + (5).to_bytes(8, "big") + b"\x03uk"
    assert S.decode_key(enc, 4096, "int64", "int64", "string") == (300, 7, 5, "uk")
    # variable key + fixed namespace: no length bytes
    assert S.encode_key(1, 128, "ab", "string", None, "void") == b"\x01\x03ab\x00"
    # 300-byte key needs 2 lenbytes
    k = "k" * 298
    enc = S.encode_key(0, 128, k, "string", "n", "string")
    kb = S.key_serializer("string").serialize(k)
    assert len(kb) == 300 and enc == b"\x00" + kb + b"\x2c\x01" + b"\x02n" + b"\x02"
    assert S.decode_key(enc, 128, "string", "string") == (0, k, "n", None)


@settings(max_examples=300, derandomize=True)
@given(st.data(), st.sampled_from(sorted(KEYS)), st.sampled_from(sorted(NAMESPACES)),
       st.sampled_from([1, 128, 129, 32768]))
def test_key_round_trip(data, kt, nt, mp):
    key = data.draw(KEYS[kt])
    ns = data.draw(NAMESPACES[nt])
    kg = data.draw(st.integers(0, mp - 1))
    uk = data.draw(st.one_of(st.none(), st.tuples(st.integers(), st.text(max_size=5))))
    enc = S.encode_key(kg, mp, key, kt, ns, nt)
    assert S.decode_key(enc, mp, kt, nt) == (kg, key, ns, None)
    enc = S.encode_key(kg, mp, key, kt, ns, nt, uk, "pickle")
    assert S.decode_key(enc, mp, kt, nt, "pickle") == (kg, key, ns, uk)
    assert enc[: (1 if mp <= 128 else 2)] == kg.to_bytes(1 if mp <= 128 else 2, "big")


@settings(max_examples=200, derandomize=True)
@given(st.lists(st.text(max_size=20), max_size=5), st.lists(st.text(max_size=20), max_size=5))
def test_encoded_keys_are_unambiguous(a, b):
    """Distinct (key, namespace) pairs never encode to the same bytes (Flink's ambiguity rule)."""
    ka, na = "".join(a), "".join(b)
    kb, nb = "".join(b), "".join(a)
    if (ka, na) != (kb, nb):
        assert S.encode_key(0, 128, ka, "string", na, "string") != \
            S.encode_key(0, 128, kb, "string", nb, "string")


VALUES = {
    "int32": INT32, "int64": INT64, "bool": st.booleans(), "string": TEXT,
    "binary": st.binary(max_size=200), "float64": st.floats(allow_nan=False),
    "uint64": st.integers(0, (1 << 64) - 1), "timestamp[ns]": INT64,
    "fixed_size_binary[3]": st.binary(min_size=3, max_size=3),
    "pickle": st.recursive(st.none() | st.integers() | st.text(max_size=5),
                           lambda c: (st.lists(c, max_size=3)
                                      | st.dictionaries(st.text(max_size=3), c, max_size=3)),
                           max_leaves=8),
}


@settings(max_examples=300, derandomize=True)
@given(st.data(), st.sampled_from(sorted(VALUES)))
def test_value_list_map_round_trip(data, vt):
    v = data.draw(VALUES[vt])
    s = S.value_serializer(vt)
    assert s.deserialize(s.serialize(v)) == v
    if s.fixed_width:
        assert len(s.serialize(v)) == s.fixed_width
    elems = data.draw(st.lists(VALUES[vt].filter(lambda x: x is not None), max_size=10))
    blob = S.encode_list(elems, vt)
    assert S.decode_list(blob, vt) == elems
    if s.fixed_width:
        assert len(blob) == s.fixed_width * len(elems)
    ukt = data.draw(st.sampled_from(["int64", "string", "binary", "pickle"]))
    m = data.draw(st.dictionaries(KEYS.get(ukt, st.integers()),
                                  VALUES[vt].filter(lambda x: x is not None), max_size=8))
    blob = S.encode_map(m, ukt, vt)
    pairs = S.decode_map(blob, ukt, vt)
    assert dict(pairs) == m and len(pairs) == len(m)
    raw = S.decode_map(blob, ukt, vt, raw=True)
    assert [k for k, _ in raw] == sorted(k for k, _ in raw)


def test_map_blob_layout():
    blob = S.encode_map({2: "b", 1: "a"}, "int64", "string")
    one = (1).to_bytes(8, "big")
    two = (2).to_bytes(8, "big")
    assert blob == b"\x08" + one + b"\x01a" + b"\x08" + two + b"\x01b"
    assert S.encode_list(["ab", ""], "string") == b"\x02ab\x00"
    assert S.encode_list([1, 2], "int64") == (1).to_bytes(8, "little") + (2).to_bytes(8, "little")


@settings(max_examples=300, derandomize=True)
@given(INT64, INT64, st.sampled_from(sorted(KEYS)), st.data())
def test_timer_keys_round_trip_and_order(t1, t2, kt, data):
    key = data.draw(KEYS[kt])
    a = S.encode_timer_key(5, 128, t1, key, kt, 3, "int64")
    b = S.encode_timer_key(5, 128, t2, key, kt, 3, "int64")
    assert S.decode_timer_key(a, 128, kt, "int64") == (5, t1, key, 3)
    if t1 < t2:
        assert a < b
    assert a[1:9] == ((t1 + (1 << 63)) % (1 << 64)).to_bytes(8, "big")
    # A processing-time timer's key is the event-time key plus the marker byte; event-time keys
    # (and so checkpoints written before processing-time timers) decode as event time.
    p = S.encode_timer_key(5, 128, t1, key, kt, 3, "int64", processing_time=True)
    assert p == a + S.PROCESSING_TIME_MARKER
    assert S.decode_timer_key(p, 128, kt, "int64", with_domain=True) == (5, t1, key, 3, True)
    assert S.decode_timer_key(a, 128, kt, "int64", with_domain=True) == (5, t1, key, 3, False)
    with pytest.raises(InvalidInputError):
        S.decode_timer_key(p, 128, kt, "int64")  # a caller unaware of domains is not misled
    with pytest.raises(InvalidInputError):
        S.decode_timer_key(p + b"\x01", 128, kt, "int64", with_domain=True)


def test_special_floats():
    s = S.value_serializer("float64")
    assert math.isnan(s.deserialize(s.serialize(float("nan"))))
    assert s.deserialize(s.serialize(float("-inf"))) == float("-inf")
    assert s.check(3) == 3.0 and isinstance(s.check(3), float)


@pytest.mark.parametrize("call", [
    lambda: S.value_serializer("int64").serialize(1 << 63),
    lambda: S.value_serializer("int32").serialize(1 << 31),
    lambda: S.value_serializer("int64").serialize("1"),
    lambda: S.value_serializer("int64").serialize(True),
    lambda: S.value_serializer("int64").serialize(None),
    lambda: S.value_serializer("float64").serialize("x"),
    lambda: S.value_serializer("bool").serialize(1),
    lambda: S.value_serializer("string").serialize(b"x"),
    lambda: S.value_serializer("string").serialize("\ud800"),
    lambda: S.value_serializer("binary").serialize("x"),
    lambda: S.value_serializer("pickle").serialize(lambda: 1),
    lambda: S.value_serializer("decimal"),
    lambda: S.value_serializer(pa.list_(pa.int64())),
    lambda: S.key_serializer("decimal"),
    lambda: S.key_serializer("void").serialize(0),
    lambda: S.key_serializer("int64").serialize(None),
    lambda: S.encode_key(128, 128, 1, "int64", None, "void"),
    lambda: S.encode_key(-1, 128, 1, "int64", None, "void"),
    lambda: S.encode_key(0, 40000, 1, "int64", None, "void"),
    lambda: S.decode_key(b"\x00\x00", 128, "int64", "void"),
    lambda: S.decode_key(S.encode_key(0, 128, 1, "int64", None, "void") + b"\x00", 128, "int64",
                         "void"),
    lambda: S.decode_key(b"\x00\x03ab\x09\x01n\x02", 128, "string", "string"),
    lambda: S.value_serializer("int64").deserialize(b"\x00" * 7),
    lambda: S.decode_list(b"\x00" * 9, "int64"),
    lambda: S.decode_list(b"\x05ab", "string"),
    lambda: S.decode_map(b"\x08\x00", "int64", "int64"),
    lambda: S.encode_timer_key(0, 128, 1.5, 1, "int64", None, "void"),
    lambda: S.encode_timer_key(0, 128, 1 << 63, 1, "int64", None, "void"),
])
def test_invalid_input(call):
    with pytest.raises(InvalidInputError):
        call()
