"""Key-group assignment, key-group ranges and operator indexes (pure-Python reference).

A key group is the unit of state partitioning and rescaling: every key maps to exactly one key
group in ``[0, max_parallelism)``, and each operator instance (parallel task) owns one contiguous,
inclusive :class:`KeyGroupRange`. Two assigners are provided:

* ``"spark"`` (default of statecore): bit-identical to Spark SQL's ``pmod(xxhash64(col...),
  maxP)`` (``XxHash64Function``), so that Spark can compute the key group (and the owning
  partition) as a column before ``repartitionById``.
* ``"flink"``: ``murmurHash(key.hashCode()) % maxP`` as Flink's ``KeyGroupRangeAssignment``.

What each assigner hashes for each key type: docs/formats.md "Key groups". The key types and
their per-record values: :mod:`statecore.key_types`.
Ranges and operator indexes follow Flink ``KeyGroupRangeAssignment`` exactly
(``computeKeyGroupRangeForOperatorIndex``, ``computeOperatorIndexForKeyGroup``). Verified against
``tests/data/*.json``, which were produced by real Flink and Spark runs. The native extension
implements the same functions; this module is the reference it is tested against.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterator, Sequence

import mmh3
import numpy as np
import xxhash

from statecore import key_types as KT
from statecore.errors import InvalidInputError

__all__ = [
    "KEY_TYPES",
    "ASSIGNERS",
    "UPPER_BOUND_MAX_PARALLELISM",
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "SPARK_SEED",
    "KeyGroupRange",
    "xxh64",
    "murmur3_32",
    "spark_murmur3_32",
    "flink_murmur_hash",
    "java_hash_code",
    "spark_key_bytes",
    "spark_xxhash64",
    "spark_hash",
    "spark_key_group",
    "flink_key_group",
    "assign_key_group",
    "assign_key_groups",
    "compute_default_max_parallelism",
    "check_max_parallelism",
    "key_group_range_for_operator",
    "operator_index_for_key_group",
    "normalize_key_type",
    "check_key",
]

#: Scalar key types (timestamp is timestamp[s|ms|us|ns], fixed_size_binary is
#: fixed_size_binary[N]); several of them form a multi-column key "struct<t1,t2,...>".
KEY_TYPES = KT.SCALAR_KINDS
ASSIGNERS = ("spark", "flink")
UPPER_BOUND_MAX_PARALLELISM = 1 << 15  # Flink Transformation.UPPER_BOUND_MAX_PARALLELISM
DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7
SPARK_SEED = 42  # seed of Spark SQL's hash() and xxhash64()

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def _to_signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >= (1 << (bits - 1)) else v


def normalize_key_type(key_type) -> str:
    """Return the canonical key type name (``int32``, ``int64``, ``uint64``, ``float64``,
    ``bool``, ``timestamp[us]``, ``string``, ``binary``, ``fixed_size_binary[16]``,
    ``struct<int32,string>``, ...; see :mod:`statecore.key_types`).

    Accepts those names, aliases (``int``, ``long``, ``bigint``, ``double``, ``boolean``,
    ``timestamp`` = ``timestamp[us]``, ``str``, ``bytes``, ``large_string``, ...), pyarrow
    DataTypes, and a tuple/list of key types or a pa.struct for a multi-column key.
    Raises InvalidInputError for anything else.
    """
    return KT.key_type(key_type).name


def check_key(key, key_type):
    """Validate ``key`` against ``key_type`` and return it in canonical Python form
    (:meth:`statecore.key_types.KeyType.check`): int for the integer and timestamp types, float
    for float64 (-0.0 -> 0.0, one NaN), bool, str, bytes, a tuple for a multi-column key.
    Raises InvalidInputError for None, a wrong type or an out-of-range value."""
    return KT.key_type(key_type).check(key)


# --------------------------------------------------------------------------- hash primitives

def xxh64(data: bytes, seed: int) -> int:
    """XXH64 of ``data`` with a 64-bit ``seed`` (signed or unsigned); returns the unsigned
    digest."""
    return xxhash.xxh64_intdigest(bytes(data), seed=seed & _M64)


def murmur3_32(data: bytes, seed: int) -> int:
    """Standard MurmurHash3_x86_32 of ``data``; returns a signed int32 (as Java would)."""
    return mmh3.hash(bytes(data), seed & _M32, signed=True)


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _M32
    k1 = _rotl32(k1, 15)
    return (k1 * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl32(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _M32


def _fmix32(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1


def spark_murmur3_32(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` (used by Spark SQL ``hash()``), signed int32.

    Differs from standard Murmur3 only when ``len(data) % 4 != 0``: each trailing byte is
    sign-extended and mixed as a full block (Spark's historical variant). Provided so the
    ``hash``/``repartition`` vectors of ``spark_hashes.json`` can be checked; statecore routes with
    xxhash64, not with this.
    """
    data = bytes(data)
    n = len(data)
    aligned = n - n % 4
    h1 = seed & _M32
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for i in range(aligned, n):
        b = data[i] - 256 if data[i] >= 128 else data[i]
        h1 = _mix_h1(h1, _mix_k1(b & _M32))
    return _to_signed(_fmix32(h1, n), 32)


def flink_murmur_hash(code: int) -> int:
    """Flink ``MathUtils.murmurHash(int)``: one Murmur3 block over the int32 ``code`` plus fmix,
    made non-negative (``Integer.MIN_VALUE`` -> 0). ``code`` must fit in int32."""
    code = operator.index(code)
    if not _INT32_MIN <= code <= _INT32_MAX:
        raise InvalidInputError(f"hash code {code} does not fit in int32")
    raw = mmh3.hash(code.to_bytes(4, "little", signed=True), 0, signed=True)
    if raw >= 0:
        return raw
    return 0 if raw == _INT32_MIN else -raw


def java_hash_code(key, key_type) -> int:
    """Java ``hashCode()`` of the boxed key, a signed int32: Integer -> value; Long (int64,
    timestamp, uint64 as the same bits) -> ``(int)(v ^ (v >>> 32))``; Double -> the same over
    ``doubleToLongBits`` (canonical NaN; -0.0 hashes as 0.0, the same key); Boolean -> 1231 /
    1237; String -> ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units (int32 overflow);
    binary, fixed_size_binary -> ``java.util.Arrays.hashCode(byte[])`` (signed bytes, start 1);
    multi-column -> Flink ``TupleN.hashCode`` (``h = 31*h + field hash``, from 0)."""
    return KT.key_type(key_type).java_hash(key)


def spark_key_bytes(key, key_type) -> bytes:
    """Bytes Spark's xxhash64/hash feed to the hash for one column value (module docstring);
    InvalidInputError for a multi-column key type (see :func:`spark_xxhash64`)."""
    return KT.key_type(key_type).spark_bytes(key)


def _columns(values: Sequence, types: Sequence) -> list[bytes]:
    if len(values) != len(types):
        raise InvalidInputError("values and types must have the same length")
    out = []
    for v, t in zip(values, types):
        out += KT.key_type(t).spark_columns(v)
    return out


def spark_xxhash64(values: Sequence, types: Sequence, seed: int = SPARK_SEED) -> int:
    """Spark SQL ``xxhash64(c1, c2, ...)`` (Spark ``XxHash64Function``): signed int64; each
    column's hash seeds the next (a multi-column key type contributes its fields in order)."""
    h = seed
    for b in _columns(values, types):
        h = _to_signed(xxh64(b, h), 64)
    return h


def spark_hash(values: Sequence, types: Sequence, seed: int = SPARK_SEED) -> int:
    """Spark SQL ``hash(c1, c2, ...)`` (Murmur3 Spark variant): signed int32, chained seeds."""
    h = seed
    for b in _columns(values, types):
        h = spark_murmur3_32(b, h)
    return h


def check_max_parallelism(max_parallelism) -> int:
    """Validate ``0 < max_parallelism <= 32768`` (Flink's bound) and return it as int."""
    if isinstance(max_parallelism, bool) or not isinstance(max_parallelism, (int, np.integer)):
        raise InvalidInputError(f"max_parallelism must be an int, got {max_parallelism!r}")
    mp = int(max_parallelism)
    if not 0 < mp <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidInputError(
            f"max_parallelism must be in [1, {UPPER_BOUND_MAX_PARALLELISM}], got {mp}"
        )
    return mp


def spark_key_group(key, key_type, max_parallelism: int) -> int:
    """Spark-compatible key group: ``pmod(xxhash64(key...), max_parallelism)`` (int in
    [0, maxP)); a multi-column key hashes as ``xxhash64(c1, c2, ...)``."""
    mp = check_max_parallelism(max_parallelism)
    return spark_xxhash64((key,), (key_type,)) % mp  # Python % on a positive modulus == pmod


def flink_key_group(key, key_type, max_parallelism: int) -> int:
    """Flink ``KeyGroupRangeAssignment.assignToKeyGroup``: ``murmurHash(hashCode) % maxP``."""
    mp = check_max_parallelism(max_parallelism)
    return flink_murmur_hash(java_hash_code(key, key_type)) % mp


def assign_key_group(key, key_type, max_parallelism: int, assigner: str = "spark") -> int:
    """Key group of ``key`` under ``assigner`` ("spark" or "flink"). Raises InvalidInputError."""
    if assigner == "spark":
        return spark_key_group(key, key_type, max_parallelism)
    if assigner == "flink":
        return flink_key_group(key, key_type, max_parallelism)
    raise InvalidInputError(f"unknown assigner {assigner!r}; expected 'spark' or 'flink'")


def assign_key_groups(keys, key_type, max_parallelism: int, assigner: str = "spark") -> np.ndarray:
    """Key groups of every element of ``keys`` (pa.Array/ChunkedArray or Python sequence) as a
    numpy int32 array of the same length. Nulls raise InvalidInputError. (Row-by-row reference
    implementation; the native extension provides the fast path.)"""
    if hasattr(keys, "to_pylist"):
        kt = KT.key_type(key_type)
        arr = keys.combine_chunks() if hasattr(keys, "combine_chunks") else keys
        if arr.null_count:
            keys = arr.to_pylist()  # the loop below names the null row
        else:
            keys = kt.to_pylist(arr)
    out = np.empty(len(keys), dtype=np.int32)
    for i, k in enumerate(keys):
        if k is None:
            raise InvalidInputError(f"null key at row {i}")
        out[i] = assign_key_group(k, key_type, max_parallelism, assigner)
    return out


# --------------------------------------------------------------------------- ranges

def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink ``computeDefaultMaxParallelism``:
    ``min(max(roundUpToPowerOfTwo(p + p // 2), 128), 32768)`` for ``0 < p <= 32768``."""
    if isinstance(parallelism, bool) or not isinstance(parallelism, (int, np.integer)):
        raise InvalidInputError(f"parallelism must be an int, got {parallelism!r}")
    p = int(parallelism)
    if not 0 < p <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidInputError(
            f"parallelism must be in [1, {UPPER_BOUND_MAX_PARALLELISM}], got {p}"
        )
    x = p + p // 2
    pow2 = 1 << (x - 1).bit_length()
    return min(max(pow2, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


def _check_parallelism(max_parallelism: int, parallelism: int) -> tuple[int, int]:
    mp = check_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, (int, np.integer)):
        raise InvalidInputError(f"parallelism must be an int, got {parallelism!r}")
    p = int(parallelism)
    if not 0 < p <= mp:
        raise InvalidInputError(
            f"parallelism must be in [1, max_parallelism={mp}], got {p}"
        )
    return mp, p


@dataclass(frozen=True)
class KeyGroupRange:
    """Inclusive range ``[start, end]`` of key groups (Flink ``KeyGroupRange``).

    ``KeyGroupRange.EMPTY`` is ``(0, -1)``. Otherwise ``0 <= start <= end`` is required
    (InvalidInputError). Supports ``len``, iteration, ``in`` and :meth:`intersection`.
    """

    start: int
    end: int

    def __post_init__(self):
        for v in (self.start, self.end):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidInputError(f"key-group range bounds must be ints, got {v!r}")
        object.__setattr__(self, "start", int(self.start))
        object.__setattr__(self, "end", int(self.end))
        if (self.start, self.end) == (0, -1):
            return
        if self.start < 0 or self.end < self.start:
            raise InvalidInputError(
                f"invalid key-group range [{self.start}, {self.end}]: need 0 <= start <= end"
            )

    @classmethod
    def of(cls, spec) -> "KeyGroupRange":
        """Build from a KeyGroupRange or a ``(start, end)`` pair (inclusive)."""
        if isinstance(spec, KeyGroupRange):
            return spec
        try:
            start, end = spec
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"key_group_range must be a KeyGroupRange or (start, end), got {spec!r}"
            ) from None
        return cls(start, end)

    @classmethod
    def all(cls, max_parallelism: int) -> "KeyGroupRange":
        """The full range ``[0, max_parallelism - 1]``."""
        return cls(0, check_max_parallelism(max_parallelism) - 1)

    @property
    def number_of_key_groups(self) -> int:
        """``end - start + 1``: 0 for EMPTY (Flink ``getNumberOfKeyGroups``)."""
        return self.end - self.start + 1

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __contains__(self, key_group) -> bool:
        return isinstance(key_group, (int, np.integer)) and self.start <= key_group <= self.end

    def contains(self, key_group: int) -> bool:
        """Whether ``key_group`` is an int in ``[start, end]`` (as ``key_group in self``;
        Flink ``contains``)."""
        return key_group in self

    def is_empty(self) -> bool:
        """True for a range without key groups (EMPTY)."""
        return self.end < self.start

    def intersection(self, other: "KeyGroupRange") -> "KeyGroupRange":
        """The key groups in both ranges; EMPTY when they do not overlap."""
        other = KeyGroupRange.of(other)
        s, e = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(s, e) if s <= e else KeyGroupRange.EMPTY

    def to_tuple(self) -> tuple[int, int]:
        """``(start, end)``, both inclusive (what :meth:`of` accepts; ``(0, -1)`` for EMPTY)."""
        return (self.start, self.end)

    def __repr__(self) -> str:
        return f"KeyGroupRange({self.start}, {self.end})"


KeyGroupRange.EMPTY = KeyGroupRange(0, -1)


def key_group_range_for_operator(max_parallelism: int, parallelism: int,
                                 operator_index: int) -> KeyGroupRange:
    """Flink ``computeKeyGroupRangeForOperatorIndex``:
    ``[(i*maxP + p - 1) // p, ((i+1)*maxP - 1) // p]``. Requires ``0 < p <= maxP <= 32768`` and
    ``0 <= i < p`` (InvalidInputError otherwise)."""
    mp, p = _check_parallelism(max_parallelism, parallelism)
    if isinstance(operator_index, bool) or not isinstance(operator_index, (int, np.integer)):
        raise InvalidInputError(f"operator index must be an int, got {operator_index!r}")
    i = int(operator_index)
    if not 0 <= i < p:
        raise InvalidInputError(f"operator index must be in [0, {p - 1}], got {i}")
    return KeyGroupRange((i * mp + p - 1) // p, ((i + 1) * mp - 1) // p)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """Flink ``computeOperatorIndexForKeyGroup``: ``kg * p // maxP``. Requires
    ``0 <= kg < maxP`` and ``0 < p <= maxP`` (InvalidInputError otherwise)."""
    mp, p = _check_parallelism(max_parallelism, parallelism)
    if isinstance(key_group, bool) or not isinstance(key_group, (int, np.integer)):
        raise InvalidInputError(f"key group must be an int, got {key_group!r}")
    kg = int(key_group)
    if not 0 <= kg < mp:
        raise InvalidInputError(f"key group must be in [0, {mp - 1}], got {kg}")
    return kg * p // mp
