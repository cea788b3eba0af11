"""Restore and catch-up read a partition as a few large (keys, values) pairs instead of one pair
per key group: ``CheckpointReader.entries_chunks`` (one native decode per run and chunk) checked
by ``_native.check_entry_range`` and loaded by ``NativeStateTable.load_range``. These tests pin
the pieces: chunks equal the per-key-group entries concatenated (full versions and change sets
with tombstones, split at any size), every check rule rejects before anything is loaded, and
the load upserts and removes as the per-key-group ``load``/``remove_keys`` do."""

from __future__ import annotations

import random
import re

import pyarrow as pa
import pytest

import statecore
from statecore.checkpoint.store import CheckpointStore
from statecore.errors import InvalidInputError
from statecore.key_groups import spark_key_group
from test_async_snapshot import _States

_native = pytest.importorskip("statecore._native")

_MP = 32


def _history(tmp_path, seed=3):
    """A store with version 0 (full) and versions 1, 2 (incremental, with removals)."""
    rnd = random.Random(seed)
    store = CheckpointStore(str(tmp_path / "ckpt"))
    b = statecore.create_backend("native", key_type="int64", max_parallelism=_MP,
                                 key_group_range=(0, _MP - 1))
    st = _States(b)
    descs = []
    for version, n in enumerate((3000, 800, 800)):
        for i in range(n):
            st.op(rnd, version * 10**5 + i)
        snap = b.snapshot(incremental=version > 0)
        d = store.write_snapshot(snap, version, f"p0-v{version}", block_target_bytes=512)
        snap.release()
        store.commit(version, [d])
        b.notify_checkpoint_complete(d["snapshot_id"], d["version"])
        descs.append(d)
    return store, b, descs


def _per_key_group(reader, name, lo, hi):
    keys, values = [], []
    for kg in range(lo, hi + 1):
        k, v = reader.entries(name, kg)
        keys += k.to_pylist()
        values += v.to_pylist()
    return keys, values


@pytest.mark.parametrize("max_bytes", [1, 700, 1 << 30])
@pytest.mark.parametrize("bounds", [(0, _MP - 1), (5, 20), (7, 7)])
def test_chunks_are_the_key_groups_entries_in_order(tmp_path, max_bytes, bounds):
    store, _, descs = _history(tmp_path)
    lo, hi = bounds
    with store.open(2) as full:
        changes = store.open_changes(2, descs[0]["path"], lo, hi)
        try:
            for reader in (full, changes):
                for meta in reader.state_metas():
                    name = meta["name"]
                    chunks = list(reader.entries_chunks(name, lo, hi, max_bytes=max_bytes))
                    keys = [k for c, _ in chunks for k in c.to_pylist()]
                    values = [v for _, c in chunks for v in c.to_pylist()]
                    assert (keys, values) == _per_key_group(reader, name, lo, hi)
                    if max_bytes == 1 and meta["kind"] != "timers":
                        # Split at every key group, never inside one.
                        prefixes = [{k[0] for k in c.to_pylist()} for c, _ in chunks]
                        assert all(len(p) == 1 for p in prefixes)
            if hi - lo > 1:  # the change set removes keys: its tombstones stay NULL values
                assert sum(vals.null_count for m in changes.state_metas()
                           for _, vals in changes.entries_chunks(m["name"], lo, hi)) > 0
        finally:
            changes.release()


def test_unknown_state_has_no_chunks(tmp_path):
    store, _, _ = _history(tmp_path)
    with store.open(2) as r:
        assert list(r.entries_chunks("nope", 0, _MP - 1)) == []


def _pairs(entries):
    keys = pa.array([k for k, _ in entries], pa.binary())
    values = pa.array([v for _, v in entries], pa.binary())
    return keys, values


@pytest.mark.parametrize("entries, width, tombstones, match", [
    ([(b"\x01", b"12345678")], 8, False, "not longer than the 1-byte key-group prefix"),
    ([(b"\x02a", b"12345678"), (b"\x01a", b"12345678")], 8, False, "below the entry before it"),
    ([(b"\x09a", b"12345678")], 8, False, r"outside \[1, 8\]"),
    ([(b"\x00a", b"12345678")], 8, False, r"outside \[1, 8\]"),
    ([(b"\x01a", None)], 8, False, "NULL value"),
    ([(b"\x01a", b"1234567")], 8, False, "entry 0: value is 7 bytes, the state's values are 8"),
])
def test_check_entry_range_names_the_first_bad_entry(entries, width, tombstones, match):
    err = _native.check_entry_range(*_pairs(entries), 1, 8, 1, width, tombstones)
    assert err is not None and re.search(match, err), err


def test_check_entry_range_accepts_tombstones_and_two_byte_prefixes():
    keys, values = _pairs([(b"\x00\x01a", b"x"), (b"\x00\x01b", None), (b"\x01\x00a", b"yz")])
    assert _native.check_entry_range(keys, values, 1, 256, 2, -1, True) is None
    assert "NULL value" in _native.check_entry_range(keys, values, 1, 256, 2, -1, False)
    with pytest.raises(InvalidInputError, match="must not be null"):
        _native.check_entry_range(pa.array([None], pa.binary()), pa.array([b"x"]), 0, 1, 1, -1,
                                  False)
    with pytest.raises(InvalidInputError, match="1 keys but 2 values"):
        _native.check_entry_range(pa.array([b"\x00a"]), pa.array([b"x", b"y"]), 0, 1, 1, -1,
                                  False)
    with pytest.raises(InvalidInputError, match="prefix_width must be 1 or 2"):
        _native.check_entry_range(keys, values, 1, 256, 3, -1, True)


def test_load_range_upserts_removes_and_honours_offsets():
    t = _native.NativeStateTable(0, 3)
    t.load(1, pa.array([b"\x01a", b"\x01b"], pa.binary()),
           pa.array([b"old", b"gone"], pa.binary()), 1)
    keys, values = _pairs([(b"\x00z", b"pad"), (b"\x01a", b"new"), (b"\x01b", None),
                           (b"\x01c", b"c"), (b"\x03d", b"d")])
    t.load_range(keys.slice(1), values.slice(1), 1)  # sliced: the first entry is not loaded
    assert t.get(0, b"\x00z") is None
    assert (t.get(1, b"\x01a"), t.get(1, b"\x01b"), t.get(1, b"\x01c")) == (b"new", None, b"c")
    assert t.get(3, b"\x03d") == b"d" and len(t) == 3


def test_load_range_rejects_before_touching_the_table():
    t = _native.NativeStateTable(0, 3)
    t.load(1, pa.array([b"\x01a"], pa.binary()), pa.array([b"keep"], pa.binary()), 1)
    for entries in ([(b"\x01a", b"x"), (b"\x04a", b"y")],  # key group outside the table
                    [(b"\x02a", b"x"), (b"\x01a", b"y")],  # not sorted by key group
                    [(b"\x01a", b"x"), (b"\x02", b"y")]):  # key without bytes after the prefix
        with pytest.raises(InvalidInputError, match="entry 1"):
            t.load_range(*_pairs(entries), 1)
        assert t.get(1, b"\x01a") == b"keep" and len(t) == 1


def test_restore_of_a_damaged_prefix_leaves_the_backend_unchanged(tmp_path):
    """A full run whose entries carry a key-group prefix outside the backend's range (written by
    a snapshot-like object the writer trusts) fails the restore; the backend keeps its state."""
    store, src, _ = _history(tmp_path)
    dst = statecore.create_backend("native", key_type="int64", max_parallelism=_MP,
                                   key_group_range=(0, 15))
    st = _States(dst)
    mine = next(k for k in range(100) if spark_key_group(k, "int64", _MP) <= 15)
    dst.set_current_key(mine)
    st.v.update("mine")
    before = dst.num_entries()

    class Shifted:
        """Version 2 with every key of state 'v' moved to key group 31's prefix."""

        def __init__(self, reader):
            self._r = reader
            self.key_group_range = reader.key_group_range
            self.max_parallelism, self.key_type, self.assigner = _MP, "int64", "spark"
            self.incremental = False

        def state_metas(self):
            return self._r.state_metas()

        def entries_chunks(self, name, lo, hi, max_bytes=1 << 30):
            for k, v in self._r.entries_chunks(name, lo, hi, max_bytes):
                if name == "v":
                    k = pa.array([b"\x1f" + x[1:] for x in k.to_pylist()], pa.binary())
                yield k, v

        def entries(self, name, kg):
            return self._r.entries(name, kg)

        def timers(self, *a, **kw):
            return self._r.timers(*a, **kw)

    with store.open(2) as r:
        with pytest.raises(InvalidInputError, match=r"state 'v', key groups 0..15: entry 0: "
                                                     r"key-group prefix 31 is outside"):
            dst.restore(Shifted(r))
    assert dst.num_entries() == before
    dst.set_current_key(mine)
    assert st.v.value() == "mine"


def _raw_binary(offsets, data: bytes, validity=None):
    """A pa.binary array from raw buffers (pyarrow does not validate these)."""
    import numpy as np

    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [validity, pa.py_buffer(np.array(offsets, np.int32).tobytes()),
                                  pa.py_buffer(data)])


@pytest.mark.parametrize("bad", [
    ("keys", [0, 10, 5], b"\x01" * 20),     # decreasing
    ("keys", [0, 30, 20], b"\x01" * 20),    # entry 0 past the data buffer
    ("values", [0, 8, 4], b"v" * 16),       # decreasing
    ("values", [0, 24, 16], b"v" * 16),     # entry 0 past the data buffer
])
def test_arrays_with_broken_offsets_are_refused_not_read(bad):
    """``pa.Array.from_buffers`` checks only the last offset against the data (not the order of
    the others); the bulk paths read through every offset without bounds checks, so they must
    refuse such arrays first."""
    which, offsets, data = bad
    good_keys = _raw_binary([0, 10, 20], b"\x01" * 20)
    good_values = _raw_binary([0, 8, 16], b"v" * 16)
    keys, values = (_raw_binary(offsets, data), good_values) if which == "keys" else \
        (good_keys, _raw_binary(offsets, data))
    with pytest.raises(InvalidInputError, match=f"{which}: offset"):
        _native.check_entry_range(keys, values, 0, 3, 1, -1, False)
    t = _native.NativeStateTable(0, 3)
    with pytest.raises(InvalidInputError, match=f"{which}: offset"):
        t.load_range(keys, values, 1)
    assert len(t) == 0


def test_per_key_group_load_and_removal_refuse_broken_offsets():
    t = _native.NativeStateTable(0, 3)
    keys = _raw_binary([0, 30, 20], b"\x01" * 20)
    with pytest.raises(InvalidInputError, match="keys: offset"):
        t.load(1, keys, pa.array([b"a", b"b"], pa.binary()), 1)
    with pytest.raises(InvalidInputError, match="keys: offset"):
        t.remove_keys(1, keys)
    assert len(t) == 0


def test_per_key_group_load_refuses_keys_of_another_key_group():
    t = _native.NativeStateTable(0, 3)
    with pytest.raises(InvalidInputError, match=r"key group 1: entry 1: key-group prefix 2"):
        t.load(1, pa.array([b"\x01a", b"\x02b"], pa.binary()), pa.array([b"x", b"y"]), 1)
    with pytest.raises(InvalidInputError, match="outside the table's range"):
        t.load(4, pa.array([b"\x04a"], pa.binary()), pa.array([b"x"]), 1)
    assert len(t) == 0
