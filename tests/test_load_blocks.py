"""``statecore._native.load_blocks``, the native restore of stored checkpoint blocks straight into
a table (native/include/statecore/bulk_load.h): loads what ``decode_blocks`` + ``load_range``
load, reports damaged blocks and keys out of order as corrupt and entries that break the
state's rules as not, naming the block; and a restore through it leaves the backend unchanged
on a damaged block."""

from __future__ import annotations

import numpy as np
import pytest

import statecore
from statecore.checkpoint.blocks import compress_block, encode_block, xxh64
from statecore.checkpoint.format import BLOCK_DTYPE
from statecore.checkpoint.store import CheckpointStore
from statecore.errors import CorruptCheckpointError, InvalidInputError

_native = pytest.importorskip("statecore._native")


def _key(kg: int, k: int) -> bytes:
    return bytes([kg]) + k.to_bytes(8, "big") + b"\x00"


def _stored(blocks, incremental=False):
    """``(data, block rows, key groups)`` of blocks given as ``(kg, [(key, value or None)])``."""
    data, rows, kgs = b"", [], []
    for kg, entries in blocks:
        ko = np.cumsum([0] + [len(k) for k, _ in entries]).astype(np.int32)
        vo = np.cumsum([0] + [len(v or b"") for _, v in entries]).astype(np.int32)
        valid = np.array([v is not None for _, v in entries]) if incremental else None
        payload = encode_block(ko, b"".join(k for k, _ in entries), vo,
                               b"".join(v or b"" for _, v in entries), valid)
        stored = compress_block(payload)
        rows.append((len(data), len(stored), len(payload), len(entries), 0, xxh64(stored)))
        data += stored
        kgs.append(kg)
    return data, np.array(rows, BLOCK_DTYPE), np.array(kgs, np.int32)


def _load(table, blocks, incremental=False, into_empty=True, key_width=10, value_width=8,
          base=0, cut=None):
    data, rows, kgs = _stored(blocks, incremental)
    if cut is not None:
        data = data[:cut]
    return _native.load_blocks(table, data, rows, kgs, base, incremental, 1, key_width,
                               value_width, into_empty=into_empty)


def test_loads_a_full_run_then_applies_an_incremental_one():
    t = _native.NativeStateTable(0, 3)
    full = [(1, [(_key(1, k), k.to_bytes(8, "little")) for k in range(0, 300, 3)]),
            (1, [(_key(1, k), k.to_bytes(8, "little")) for k in range(300, 600, 3)]),
            (2, [(_key(2, 7), b"seven...")])]
    assert _load(t, full) == (201, None, None, None)
    changes = [(1, [(_key(1, 3), None), (_key(1, 4), b"four....")]), (2, [(_key(2, 7), None)])]
    assert _load(t, changes, incremental=True, into_empty=False) == (3, None, None, None)
    assert t.key_group_size(1) == 200 and t.key_group_size(2) == 0
    assert t.get(1, _key(1, 3)) is None
    assert t.get(1, _key(1, 4)) == b"four...."
    assert t.get(1, _key(1, 597)) == (597).to_bytes(8, "little")


@pytest.mark.parametrize("blocks, bad, match", [
    ([(1, [(_key(1, 2), b"v" * 8), (_key(1, 1), b"v" * 8)])], 0, "entry 1: keys are not strictly"),
    ([(1, [(_key(1, 2), b"v" * 8)]), (1, [(_key(1, 2), b"w" * 8)])], 1, "entry 0: keys are not"),
])
def test_keys_out_of_order_are_corrupt(blocks, bad, match):
    t = _native.NativeStateTable(0, 3)
    n, i, why, corrupt = _load(t, blocks)
    assert (n, i, corrupt) == (None, bad, True) and match in why
    assert t.key_group_size(1) == 0


@pytest.mark.parametrize("entries, kw, vw, match", [
    ([(_key(1, 1), b"v" * 9)], 10, 8, "entry 0: value is 9 bytes, the state's values are 8"),
    ([(_key(1, 1)[:-1], b"v" * 8)], 10, 8, "entry 0: encoded key is 9 bytes, not 10"),
    ([(_key(2, 1), b"v" * 8)], -1, -1, "entry 0: key-group prefix 2 in a block of key group 1"),
    ([(b"\x01", b"v" * 8)], -1, -1, "not longer than the 1-byte key-group prefix"),
])
def test_entries_breaking_the_rules_are_not_corrupt(entries, kw, vw, match):
    t = _native.NativeStateTable(0, 3)
    n, i, why, corrupt = _load(t, [(1, entries)], key_width=kw, value_width=vw)
    assert (n, i, corrupt) == (None, 0, False) and match in why


def test_damaged_stored_bytes_are_corrupt():
    blocks = [(1, [(_key(1, 1), b"v" * 8)]), (2, [(_key(2, 1), b"v" * 8)])]
    t = _native.NativeStateTable(0, 3)
    n, i, why, corrupt = _load(t, blocks, cut=-1)
    assert (n, i, corrupt) == (None, 1, True) and "outside the bytes" in why
    data, rows, kgs = _stored(blocks)
    rows["xxh64"][0] ^= 1
    assert _native.load_blocks(t, data, rows, kgs, 0, False, 1)[1:] == (
        0, "block checksum mismatch", True)
    with pytest.raises(InvalidInputError, match="2 blocks but 1 key groups"):
        _native.load_blocks(t, data, rows, kgs[:1], 0, False, 1)
    with pytest.raises(InvalidInputError, match="prefix_width must be 1 or 2"):
        _native.load_blocks(t, data, rows, kgs, 0, False, 3)


def test_a_restore_of_a_damaged_block_names_it_and_leaves_the_backend_unchanged(tmp_path,
                                                                               monkeypatch):
    src = statecore.create_backend("native", key_type="int64")
    desc = statecore.ValueStateDescriptor("v", "int64")
    st = src.get_state(desc)
    for k in range(2000):
        src.set_current_key(k)
        st.update(k)
    store = CheckpointStore(str(tmp_path / "cp"))
    snap = src.snapshot()
    store.commit(1, [store.write_snapshot(snap, 1)])
    snap.release()
    # Another state holds an entry; 'v' is restored into a new table (the native load path).
    dst = statecore.create_backend("native", key_type="int64")
    other = statecore.ValueStateDescriptor("w", "int64")
    dst.set_current_key(5)
    dst.get_state(other).update(-5)
    loads = []
    real = _native.load_blocks
    monkeypatch.setattr(_native, "load_blocks", lambda *a, **kw: loads.append(1) or real(*a, **kw))
    with store.open(1) as r:
        blk = r.data_file(r.manifest["files"][0]).block_rows(3, 1)[0]
    (path,) = (tmp_path / "cp").rglob("*.sckp")
    with open(path, "r+b") as out:
        out.seek(int(blk["offset"]) + 2)
        byte = out.read(1)
        out.seek(int(blk["offset"]) + 2)
        out.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptCheckpointError, match=r"state 'v' key group \d+ block 3: "
                                                     "block checksum mismatch"):
        store.restore(dst, 1)
    assert loads and dst.num_entries() == 1
    dst.set_current_key(5)
    assert dst.get_state(other).value() == -5
