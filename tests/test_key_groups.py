"""Key-group assignment against the real Flink / Spark outputs in tests/data.

Every vector is checked against the pure-Python reference (statecore.key_groups) and, when it is
built, against the native extension (statecore._native) through the same checks.
"""

import json
import pathlib
import types

import mmh3
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore import key_groups as kgm
from statecore.errors import InvalidInputError
from statecore.key_groups import KeyGroupRange

DATA = pathlib.Path(__file__).parent / "data"
FLINK = json.loads((DATA / "flink_keygroups.json").read_text())
SPARK = json.loads((DATA / "spark_hashes.json").read_text())

FLINK_TYPES = {"java.lang.Integer": "int32", "java.lang.Long": "int64",
               "java.lang.String": "string"}


def _python_impl():
    return types.SimpleNamespace(
        spark_key_group=kgm.spark_key_group,
        flink_key_group=kgm.flink_key_group,
        xxh64=kgm.xxh64,
        murmur3_32=kgm.murmur3_32,
        flink_murmur_hash=kgm.flink_murmur_hash,
        default_max_parallelism=kgm.compute_default_max_parallelism,
        key_group_range_for_operator=lambda mp, p, i: kgm.key_group_range_for_operator(
            mp, p, i).to_tuple(),
        operator_index_for_key_group=kgm.operator_index_for_key_group,
    )


def _native_impl():
    return pytest.importorskip("statecore._native")


@pytest.fixture(params=["python", "native"])
def impl(request):
    return _python_impl() if request.param == "python" else _native_impl()


def _signed64(u):
    return u - (1 << 64) if u >= (1 << 63) else u


def _spark_value(kind, v):
    if kind == "binary":
        return bytes.fromhex(v)
    return v


SPARK_KIND = {"int": "int32", "bigint": "int64", "string": "string", "binary": "binary",
              "extra_string_len_multiple_of_4": "string"}


def _spark_vectors():
    for kind, key_type in SPARK_KIND.items():
        for v in SPARK[kind]:
            yield key_type, _spark_value(kind, v["value"]), v


# ------------------------------------------------------------------ checks on any implementation

def test_flink_key_groups(impl):
    n = 0
    for e in FLINK["keys"]:
        key_type = FLINK_TYPES[e["type"]]
        key = int(e["key"]) if key_type != "string" else e["key"]
        assert impl.flink_murmur_hash(e["hashCode"]) == e["murmurHash"], e
        for mp, kg in e["keyGroup"].items():
            assert impl.flink_key_group(key, key_type, int(mp)) == kg, (e, mp)
            n += 1
    assert n == 3 * len(FLINK["keys"])


def test_flink_murmur_raw_matches_mmh3(impl):
    for code, raw in FLINK["murmurRaw_extra_for_mmh3_check"].items():
        code = int(code)
        assert impl.murmur3_32(code.to_bytes(4, "little", signed=True), 0) == raw
        expected = 0 if raw == -(1 << 31) else abs(raw)
        assert impl.flink_murmur_hash(code) == expected


def test_flink_ranges(impl):
    for p, mp in FLINK["computeDefaultMaxParallelism"].items():
        assert impl.default_max_parallelism(int(p)) == mp
    for e in FLINK["computeKeyGroupRangeForOperatorIndex_128_3"]:
        got = tuple(impl.key_group_range_for_operator(128, 3, e["operatorIndex"]))
        assert got == (e["start"], e["end"])
    for kg, op in FLINK["computeOperatorIndexForKeyGroup_128_3"].items():
        assert impl.operator_index_for_key_group(128, 3, int(kg)) == op


def test_spark_xxhash64_vectors(impl):
    n = 0
    for key_type, key, v in _spark_vectors():
        data = bytes.fromhex(v["bytes_hex"])
        assert _signed64(impl.xxh64(data, 42)) == v["xxhash64"], v
        assert impl.spark_key_group(key, key_type, 128) == v["pmod_xxhash64_128"], v
        # Standard Murmur3 equals Spark's hash() only when the length is a multiple of 4.
        if len(data) % 4 == 0:
            assert impl.murmur3_32(data, 42) == v["hash"], v
        n += 1
    assert n == sum(len(SPARK[k]) for k in SPARK_KIND)


def test_range_partition_agreement(impl):
    """Every key group lands in exactly one operator's range, and that operator is the one
    operator_index_for_key_group names (Flink's invariant), for several (maxP, p)."""
    for mp, p in [(128, 1), (128, 3), (128, 7), (4096, 77), (32768, 1000), (5, 5)]:
        owners = {}
        for i in range(p):
            s, e = impl.key_group_range_for_operator(mp, p, i)
            for kg in range(s, e + 1):
                assert kg not in owners
                owners[kg] = i
        assert sorted(owners) == list(range(mp))
        for kg in list(range(0, mp, max(1, mp // 500))) + [mp - 1]:
            assert impl.operator_index_for_key_group(mp, p, kg) == owners[kg]


# ------------------------------------------------------------------ pure-Python-only checks

def test_spark_hash_variant_and_repartition():
    for key_type, key, v in _spark_vectors():
        data = bytes.fromhex(v["bytes_hex"])
        assert kgm.spark_murmur3_32(data, 42) == v["hash"], v
        assert kgm.spark_hash([key], [key_type]) % 128 == v["pmod_hash_128"]
        assert kgm.spark_xxhash64([key], [key_type]) == v["python_xxhash_xxh64_seed42_signed"]
    for r in SPARK["repartition_check_string_128"]:
        assert kgm.spark_hash([r["k"]], ["string"]) % 128 == r["spark_partition_id"]


def test_spark_multi_column_chaining():
    mc = SPARK["multi_column"]
    assert kgm.spark_xxhash64([7, "a"], ["int32", "string"]) == mc["xxhash64"]
    assert kgm.spark_hash([7, "a"], ["int32", "string"]) == mc["hash"]


def test_java_hash_codes():
    for e in FLINK["keys"]:
        key_type = FLINK_TYPES[e["type"]]
        key = int(e["key"]) if key_type != "string" else e["key"]
        assert kgm.java_hash_code(key, key_type) == e["hashCode"]
    assert kgm.java_hash_code(b"\x01\xff", "binary") == (31 * (31 * 1 + 1) - 1)


@settings(max_examples=200, derandomize=True)
@given(st.integers(-(1 << 63), (1 << 63) - 1), st.sampled_from([1, 7, 128, 129, 4096, 32768]))
def test_key_group_in_bounds(k, mp):
    for assigner in ("spark", "flink"):
        kg = kgm.assign_key_group(k, "int64", mp, assigner)
        assert 0 <= kg < mp
    assert kgm.spark_key_group(k, "int64", mp) == \
        (_signed64(xxhash.xxh64_intdigest(k.to_bytes(8, "little", signed=True), 42)) % mp)


@settings(max_examples=100, derandomize=True)
@given(st.binary(max_size=40), st.integers(-(1 << 31), (1 << 31) - 1))
def test_spark_murmur_variant_equals_mmh3_on_aligned(data, seed):
    aligned = data[: len(data) - len(data) % 4]
    assert kgm.spark_murmur3_32(aligned, seed) == mmh3.hash(aligned, seed & 0xFFFFFFFF, signed=True)


def test_assign_key_groups_vectorized():
    import pyarrow as pa

    keys = pa.array(["a", "hello", "", "日本語"])
    assert kgm.assign_key_groups(keys, "string", 128, "flink").tolist() == [81, 35, 94, 27]
    assert kgm.assign_key_groups(keys, "string", 128, "spark").tolist() == \
        [kgm.spark_key_group(k, "string", 128) for k in keys.to_pylist()]
    with pytest.raises(InvalidInputError, match="null key at row 1"):
        kgm.assign_key_groups(pa.array(["a", None]), "string", 128)


def test_key_group_range():
    r = KeyGroupRange(3, 7)
    assert len(r) == 5 and list(r) == [3, 4, 5, 6, 7]
    assert 3 in r and 7 in r and 8 not in r and 2 not in r
    assert r.intersection(KeyGroupRange(6, 100)) == KeyGroupRange(6, 7)
    assert r.intersection((8, 9)) is KeyGroupRange.EMPTY
    e = KeyGroupRange.EMPTY
    assert len(e) == 0 and list(e) == [] and 0 not in e and e.is_empty()
    assert KeyGroupRange.all(128) == KeyGroupRange(0, 127)
    for bad in [(-1, 3), (5, 4), (0, -2)]:
        with pytest.raises(InvalidInputError):
            KeyGroupRange(*bad)
    with pytest.raises(InvalidInputError):
        KeyGroupRange.of("x")


@pytest.mark.parametrize("call", [
    lambda: kgm.key_group_range_for_operator(128, 0, 0),
    lambda: kgm.key_group_range_for_operator(128, 129, 0),
    lambda: kgm.key_group_range_for_operator(128, 3, 3),
    lambda: kgm.key_group_range_for_operator(40000, 3, 0),
    lambda: kgm.operator_index_for_key_group(128, 3, 128),
    lambda: kgm.operator_index_for_key_group(128, 3, -1),
    lambda: kgm.compute_default_max_parallelism(0),
    lambda: kgm.compute_default_max_parallelism(40000),
    lambda: kgm.spark_key_group(1, "int64", 0),
    lambda: kgm.spark_key_group("x", "int64", 128),
    lambda: kgm.spark_key_group(1 << 40, "int32", 128),
    lambda: kgm.spark_key_group(None, "string", 128),
    lambda: kgm.spark_key_group(True, "int64", 128),
    lambda: kgm.flink_key_group(1, "float32", 128),
    lambda: kgm.assign_key_group(1, "int64", 128, "hive"),
    lambda: kgm.flink_murmur_hash(1 << 31),
])
def test_invalid_arguments(call):
    with pytest.raises(InvalidInputError):
        call()
