"""Workload generators of the peer cases (and ``callgrind_put_batches``): distinct
pseudo-random int64 and string keys, a row order holding every key a fixed number of times,
64k-row Arrow slices, binary values, and the conversions a Python user of an Arrow batch makes.

Keys are distinct by construction (bijective mixes of the index), so a workload's distinct count
is exact.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import pyarrow as pa

__all__ = ["BATCH", "VALUE_BYTES", "int64_keys", "string_keys", "row_order", "zipf_keys",
           "string_buffers", "slices", "binary_values", "pylist"]

#: Rows of every Arrow batch the peer cases feed the implementations.
BATCH = 65_536
#: Bytes of each value of :func:`binary_values`.
VALUE_BYTES = 64


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, a bijection of uint64: distinct inputs give distinct outputs."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def int64_keys(n: int, seed: int = 1) -> np.ndarray:
    """``n`` distinct pseudo-random int64 keys (int64 array of length ``n``)."""
    return _mix64(np.arange(seed << 40, (seed << 40) + n, dtype=np.uint64)).view(np.int64)


_B32 = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz234567", np.uint8)


def string_keys(n: int, seed: int = 1) -> pa.Array:
    """``n`` distinct pseudo-random string keys of 8-32 bytes (uniform length; an Arrow string
    array): 8 base-32 characters of a bijective 40-bit mix of the index (n <= 2**40), then
    random lowercase letters."""
    rng = np.random.default_rng(seed)
    mask = np.uint64((1 << 40) - 1)
    x = np.arange(n, dtype=np.uint64)
    for _ in range(2):  # xorshift and odd multiply mod 2**40: each step a bijection
        x ^= x >> np.uint64(19)
        x = (x * np.uint64(0x9E3779B97F4B)) & mask
    chars = rng.integers(ord("a"), ord("z") + 1, (n, 32), dtype=np.uint8)
    for i in range(8):
        chars[:, i] = _B32[((x >> np.uint64(5 * i)) & np.uint64(31)).astype(np.intp)]
    lengths = rng.integers(8, 33, n)
    data = chars[np.arange(32) < lengths[:, None]]  # row-major: each key's bytes in order
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def row_order(distinct: int, reps: int, seed: int = 2) -> np.ndarray:
    """Indices 0..distinct-1, each exactly ``reps`` times, in random order (int64 array of
    length ``distinct * reps``)."""
    return np.random.default_rng(seed).permutation(distinct * reps) % distinct


def zipf_keys(rng, n: int, m: int) -> np.ndarray:
    """``m`` keys of 0..n-1 (int64 array) drawn Zipf(1.0) by rank (P(rank r) ~ 1 / r) with
    ``rng`` (a numpy Generator), ranks mapped to keys by a random permutation (the hot keys are
    spread over the key groups)."""
    cdf = np.cumsum(1.0 / np.arange(1, n + 1))
    ranks = np.searchsorted(cdf, rng.random(m) * cdf[-1])
    return rng.permutation(n)[np.minimum(ranks, n - 1)].astype(np.int64)


def string_buffers(arr: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    """``(offsets int64 from 0, length n+1; data uint8)`` of a string/binary array without
    nulls, the layout the C++ reference reads."""
    off = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], np.uint8)[off[0]:off[-1]]
    return off.astype(np.int64) - off[0], data


def slices(arr: pa.Array, rows: Optional[int] = None) -> List[pa.Array]:
    """Zero-copy :data:`BATCH`-row slices of ``arr``, or of its first ``rows`` rows."""
    n = len(arr) if rows is None else min(rows, len(arr))
    return [arr.slice(s, min(BATCH, n - s)) for s in range(0, n, BATCH)]


def binary_values(rows: int, seed: int = 3) -> pa.Array:
    """``rows`` random :data:`VALUE_BYTES`-byte values (an Arrow binary array)."""
    data = np.random.default_rng(seed).integers(0, 256, rows * VALUE_BYTES, dtype=np.uint8)
    offsets = np.arange(0, (rows + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), rows,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def pylist(arr: pa.Array) -> list:
    """The Python objects of ``arr``: integers through numpy (several times faster than
    ``to_pylist``, and what a user would write), anything else through ``to_pylist``."""
    return arr.to_numpy().tolist() if pa.types.is_integer(arr.type) else arr.to_pylist()
