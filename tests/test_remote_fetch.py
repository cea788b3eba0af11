"""Reads of checkpoints on a remote filesystem (not local OS files): a restore of a run's whole
key-group range fetches the data file whole, in pieces read by the fetch pool, and checks its
header, trailer, footer and blocks from those bytes as a restore from local disk checks them.
The filesystem is a ``pyarrow.fs.PyFileSystem`` over real local files that records every read
(offset, length), so each request a restore makes is visible."""

from __future__ import annotations

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
from statecore.checkpoint import readers
from statecore.checkpoint.format import HEADER_SIZE, TRAILER_SIZE, DataFileReader
from statecore.errors import CheckpointIOError, CorruptCheckpointError
from tests.support.fs_wrappers import LocalDelegatingHandler


class RecordingHandler(LocalDelegatingHandler):
    """Local files through ``PyFileSystem`` (so not local to statecore: ``is_local`` is False),
    recording ``(path, offset, length)`` of every read of an input file; ``fail_reads_of``
    (a path suffix) makes reads of that file raise OSError."""

    type_name = "recording"

    def __init__(self):
        super().__init__()
        self.reads = []
        self.fail_reads_of = None
        self._lock = threading.Lock()

    def on_read(self, path, offset, data):
        if self.fail_reads_of and path.endswith(self.fail_reads_of):
            raise OSError("connection reset by peer")
        with self._lock:
            self.reads.append((path, offset, len(data)))


N = 60_000


def _loaded(impl, n=N):
    b = create_backend(impl, key_type="int64")
    st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    k = pa.array(np.arange(n, dtype=np.int64))
    st.add_batch(k, k)
    return b


def _contents(b):
    snap = b.snapshot()
    try:
        out = {}
        for kg in snap.key_group_range:
            keys, vals = snap.entries("sum", kg)
            if len(keys):
                out[kg] = (keys.to_pylist(), vals.to_pylist())
        return out
    finally:
        snap.release()


@pytest.fixture
def remote(tmp_path):
    """``(handler, store, data file path, descriptor, contents)``: version 1 of a native
    backend's state in a store read through :class:`RecordingHandler`."""
    handler = RecordingHandler()
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(handler))
    assert not store._root.is_local
    b = _loaded("native")
    snap = b.snapshot()
    try:
        desc = store.write_snapshot(snap, 1, block_target_bytes=4096)
    finally:
        snap.release()
    store.commit(1, [desc])
    want = _contents(b)
    b.close()
    handler.reads.clear()
    return handler, store, str(tmp_path / desc["path"]), desc, want


def _data_reads(handler, path):
    return sorted((at, n) for p, at, n in handler.reads if p == path)


@pytest.mark.parametrize("impl", ["native", "python"])
@pytest.mark.parametrize("pieces", [1, 3])
def test_restore_of_a_whole_run_reads_it_once_in_pieces(remote, monkeypatch, impl, pieces):
    handler, store, path, desc, want = remote
    size = desc["size"]
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-size // pieces))
    fresh = create_backend(impl, key_type="int64")
    stats = {}
    store.restore(fresh, 1, stats=stats)
    assert _contents(fresh) == want
    fresh.close()
    reads = _data_reads(handler, path)
    # The header, the trailer and the footer come from the pieces: no request of their own.
    assert len(reads) == pieces
    assert reads[0][0] == 0 and sum(n for _, n in reads) == size
    assert all(a + n == b for (a, n), (b, _) in zip(reads, reads[1:]))
    assert max(n for _, n in reads) - min(n for _, n in reads) <= 1
    assert stats["bytes_read"] == size


def test_restore_of_part_of_a_run_reads_only_its_key_groups(remote):
    handler, store, path, desc, want = remote
    with store.open(1) as r:
        data = r.data_file(r.manifest["files"][0])
        rows = data._index_rows
        owned = rows[(rows["key_group"] >= 10) & (rows["key_group"] <= 20)]
        f_len = data.footer_length
    handler.reads.clear()
    fresh = create_backend("native", key_type="int64", key_group_range=(10, 20))
    store.restore(fresh, 1)
    assert _contents(fresh) == {kg: v for kg, v in want.items() if 10 <= kg <= 20}
    fresh.close()
    lo, hi = int(owned["offset"].min()), int((owned["offset"] + owned["length"]).max())
    size = desc["size"]
    assert _data_reads(handler, path) == sorted(
        [(0, HEADER_SIZE), (size - TRAILER_SIZE, TRAILER_SIZE),
         (size - TRAILER_SIZE - f_len, f_len), (lo, hi - lo)])


def _layout(path):
    with pafs.LocalFileSystem().open_input_file(path) as f:
        r = DataFileReader(f, path)
        blocks, index, states = r._blocks.copy(), r._index_rows.copy(), list(r.state_names)
        filters_at = int(blocks[-1]["offset"]) + int(blocks[-1]["stored_length"])
        footer_at = r.size - TRAILER_SIZE - r.footer_length
        r.close()
    return blocks, index, states, filters_at, footer_at


@pytest.mark.parametrize("pieces", [1, 4])
def test_a_flipped_byte_is_detected_through_a_whole_fetch(remote, monkeypatch, pieces):
    handler, store, path, desc, want = remote
    size = desc["size"]
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-size // pieces))
    blocks, index, states, filters_at, footer_at = _layout(path)
    owner = {}
    for rec in index:
        for b in range(int(rec["first_block"]), int(rec["first_block"]) + int(rec["block_count"])):
            owner[b] = (states[int(rec["state"])], int(rec["key_group"]))
    rng = random.Random(5)
    picks = rng.sample(range(len(blocks)), 6)
    positions = ([0, HEADER_SIZE - 1, footer_at, footer_at + 4, size - 1, size - TRAILER_SIZE,
                  filters_at, footer_at - 1]
                 + [int(blocks[b]["offset"]) + rng.randrange(int(blocks[b]["stored_length"]))
                    for b in picks])
    original = open(path, "rb").read()
    fd = os.open(path, os.O_RDWR)
    try:
        for pos in positions:
            os.pwrite(fd, bytes([original[pos] ^ 0x40]), pos)
            fresh = create_backend("native", key_type="int64")
            try:
                if filters_at <= pos < footer_at:
                    # A Bloom filter: fetched with the rest, but restores never check them.
                    store.restore(fresh, 1)
                    assert _contents(fresh) == want
                    with pytest.raises(CorruptCheckpointError, match="Bloom filter"):
                        store.verify(1)
                    continue
                with pytest.raises(CorruptCheckpointError) as ei:
                    store.restore(fresh, 1)
                assert fresh.num_entries() == 0
            finally:
                fresh.close()
                os.pwrite(fd, original[pos:pos + 1], pos)
            msg = str(ei.value)
            assert path in msg, (pos, msg)
            blk = int(np.searchsorted(blocks["offset"].astype(np.int64), pos, "right")) - 1
            if pos < HEADER_SIZE:
                assert "magic" in msg
            elif pos < filters_at:
                name, kg = owner[blk]
                assert f"state {name!r} key group {kg} block {blk}" in msg, (pos, msg)
                assert "checksum" in msg
            elif pos >= size - TRAILER_SIZE:
                assert "trailer" in msg or "footer" in msg, (pos, msg)
            else:
                assert "footer" in msg, (pos, msg)
    finally:
        os.close(fd)
    with open(path, "wb") as f:
        f.write(original)
    fresh = create_backend("native", key_type="int64")
    store.restore(fresh, 1)
    assert _contents(fresh) == want
    fresh.close()


@pytest.mark.parametrize("cut", [-1, -TRAILER_SIZE - 3, 1])
def test_a_file_of_another_size_is_refused_before_it_is_fetched(remote, cut):
    handler, store, path, desc, want = remote
    original = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(original[:cut] if cut < 0 else original + b"\x00" * cut)
    fresh = create_backend("native", key_type="int64")
    with pytest.raises(CorruptCheckpointError, match="size is .* the manifest says"):
        store.restore(fresh, 1)
    assert fresh.num_entries() == 0 and _data_reads(handler, path) == []
    fresh.close()


@pytest.mark.parametrize("pieces", [1, 3])
def test_a_failing_piece_is_an_io_error_and_changes_nothing(remote, monkeypatch, pieces):
    handler, store, path, desc, want = remote
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-desc["size"] // pieces))
    handler.fail_reads_of = os.path.basename(path)
    fresh = create_backend("native", key_type="int64")
    with pytest.raises(CheckpointIOError, match=f"checkpoint data file {path}: cannot read"):
        store.restore(fresh, 1)
    assert fresh.num_entries() == 0
    handler.fail_reads_of = None
    store.restore(fresh, 1)
    assert _contents(fresh) == want
    fresh.close()


def test_a_prefetch_of_bytes_held_reads_nothing_more(remote):
    handler, store, path, desc, want = remote
    with store.open(1) as r:
        r.prefetch(0, r.max_parallelism - 1, wait=True)
        first = _data_reads(handler, path)
        assert first == [(0, desc["size"])]
        r.prefetch(0, r.max_parallelism - 1, wait=True)
        r.prefetch(3, 7, wait=True)
        assert _data_reads(handler, path) == first
        keys, _ = r.entries("sum", 5)
        assert _data_reads(handler, path) == first
    assert keys.to_pylist() == want.get(5, ([], []))[0]


def test_a_whole_fetch_asks_for_the_footer_first(remote):
    """The last piece (the footer's) is read first: the file cannot be decoded before it, and a
    pool takes its queue in order."""
    handler, store, path, desc, want = remote
    size = desc["size"]
    with ThreadPoolExecutor(1) as pool:
        f = store._root.fs.open_input_file(path)
        r = DataFileReader(f, path, expected_size=size, fetch_pool=pool,
                           piece_bytes=-(-size // 4))
        try:
            r.wait_prefetched()
            got = [(at, n) for p, at, n in handler.reads if p == path]
            assert len(got) == 4 and got[0][0] + got[0][1] == size
            assert got[1:] == sorted(got[1:]) and got[1][0] == 0
            assert r.bytes_read == size
            keys, _ = r.entries("sum", 5)
            assert keys.to_pylist() == want.get(5, ([], []))[0]
            assert len(handler.reads) == 4
        finally:
            r.close()
