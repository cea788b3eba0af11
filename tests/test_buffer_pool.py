"""Reused read buffers (``statecore.buffer_pool``): a buffer is lent again only once
nothing refers to it -- no view, no Arrow buffer or array over it -- the pool keeps at most
``MAX_RETAINED_BYTES``, and the checkpoint reader's decoded arrays stay intact while a later
read reuses memory. Fixed seeds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import statecore
from statecore import ValueStateDescriptor, buffer_pool
from statecore.checkpoint.store import CheckpointStore

MB = 1 << 20


@pytest.fixture
def pool(monkeypatch):
    """An empty pool for this test (the module's is process-wide)."""
    monkeypatch.setattr(buffer_pool, "_BUFFERS", [])
    return buffer_pool


def _owner(a: np.ndarray) -> np.ndarray:
    while a.base is not None:
        a = a.base
    return a


def test_small_requests_are_plain_arrays(pool):
    a = pool.take(pool.MIN_BYTES - 1)
    assert a.dtype == np.uint8 and a.shape == (pool.MIN_BYTES - 1,)
    assert pool.retained_bytes() == (0, 0)


def test_a_buffer_is_reused_only_after_every_reference_is_gone(pool):
    a = pool.take(MB)
    assert a.shape == (MB,) and a.flags.writeable
    assert pool.retained_bytes() == (MB, MB)
    b = pool.take(MB)  # a is lent out: a second buffer
    assert id(_owner(b)) != id(_owner(a))
    first = id(_owner(a))  # not the array: a reference would keep it lent out
    ints = a.view(np.int32)
    arrow = pa.py_buffer(ints[:1000])
    del a, ints
    mid = pool.take(MB // 2)
    assert id(_owner(mid)) != first  # an Arrow buffer still reads it
    del arrow
    c = pool.take(MB // 2)
    assert id(_owner(c)) == first and c.shape == (MB // 2,)
    assert pool.retained_bytes() == (5 * MB // 2, 5 * MB // 2)
    del mid
    assert id(_owner(pool.take(MB // 4 * 3 // 2))) != first  # c holds it: mid's serves


def test_at_most_max_retained_bytes_are_kept(pool, monkeypatch):
    monkeypatch.setattr(pool, "MAX_RETAINED_BYTES", 3 * MB)
    held = [pool.take(MB) for _ in range(5)]  # the last two are not kept
    assert pool.retained_bytes() == (3 * MB, 3 * MB)
    del held
    big = pool.take(2 * MB)  # frees room by dropping free buffers, smallest first
    kept, lent = pool.retained_bytes()
    assert kept <= 3 * MB and lent == 2 * MB and big.shape == (2 * MB,)
    with pytest.raises(ValueError, match="negative"):
        pool.take(-1)


def _read(store, version):
    with store.open(version) as r:
        parts = list(r.entries_chunks("v", 0, 7))
    assert len(parts) == 1
    return parts[0]


def test_decoded_arrays_survive_a_later_read_that_reuses_memory(pool, tmp_path):
    """Two versions read in turn: the first version's decoded entries, still referenced, keep
    their bytes while the second read runs; once released, their memory serves a third read."""
    pytest.importorskip("statecore._native")
    rng = np.random.default_rng(5)
    store = CheckpointStore(str(tmp_path))
    b = statecore.create_backend("native", key_type="int64", max_parallelism=8)
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(rng.choice(1 << 40, 60_000, replace=False))
    for version in (1, 2):
        st.put_batch(keys, pa.array(rng.integers(0, 1 << 60, 60_000)))
        snap = b.snapshot()
        store.commit(version, [store.write_snapshot(snap, version, "p0")])
        snap.release()
    k1, v1 = _read(store, 1)
    expect = (k1.to_pylist(), v1.to_pylist())
    assert len(expect[0]) == 60_000 and pool.retained_bytes()[1] > 0
    k2, v2 = _read(store, 2)
    assert (k1.to_pylist(), v1.to_pylist()) == expect
    assert k2.to_pylist() == expect[0] and v2.to_pylist() != expect[1]
    kept = pool.retained_bytes()[0]
    del k1, v1
    k3, v3 = _read(store, 1)
    assert (k3.to_pylist(), v3.to_pylist()) == expect
    assert pool.retained_bytes()[0] == kept  # served by the buffers the first read released
    b.close()
