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
from tests.support.data_files import DataFileLayout
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


@pytest.fixture(autouse=True)
def near_store(monkeypatch):
    """The order of a store near this process (the footer's piece first), whatever the time
    opening a file takes on a busy machine; the far store's order has a test of its own."""
    monkeypatch.setattr(readers, "REMOTE_FAR_OPEN_S", float("inf"))


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


@pytest.mark.parametrize("impl", ["native", "python"])
def test_restore_of_part_of_a_run_in_pieces_split_key_groups(remote, monkeypatch, impl):
    """Key groups of part of a run prefetched in pieces cut at block starts (so a piece
    boundary may split a key group's blocks): loaded as their pieces arrive, the key group
    split between two in a range of its own, the state the same."""
    handler, store, path, desc, want = remote
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", 20_000)
    fresh = create_backend(impl, key_type="int64", key_group_range=(10, 60))
    store.restore(fresh, 1)
    assert _contents(fresh) == {kg: v for kg, v in want.items() if 10 <= kg <= 60}
    fresh.close()
    with store.open(1) as r:
        data = r.data_file(r.manifest["files"][0])
        r.prefetch(10, 60, wait=True)
        cuts = data.piece_cuts()
        rows = data._index_rows
        starts = {int(x["offset"]): int(x["key_group"]) for x in rows}
        edges = sorted({a for a, _, _ in data._prefetched})[1:]
    assert len(edges) > 3 and cuts
    for at in edges:  # one state: a key-group index row per key group
        if at in starts:
            assert starts[at] in cuts
        else:  # the edge splits a key group: it is a range of its own
            holder = int(rows[(rows["offset"] <= at)][-1]["key_group"])
            assert holder in cuts and holder + 1 in cuts


@pytest.mark.parametrize("pieces", [1, 4])
def test_a_flipped_byte_is_detected_through_a_whole_fetch(remote, monkeypatch, pieces):
    handler, store, path, desc, want = remote
    size = desc["size"]
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-size // pieces))
    layout = DataFileLayout(path)
    blocks, filters_at, footer_at = layout.blocks, layout.filters_at, layout.footer_at
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
            layout.assert_names_the_damage(msg, pos)
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


class _HeldHeadHandler(RecordingHandler):
    """A :class:`RecordingHandler` whose read of offset 0 of a file named ``held`` (a data file's
    first piece, fetched last) waits until ``release`` is set (at most ``timeout`` seconds;
    ``timed_out`` says whether it had to give up), then fails while ``fail`` is set."""

    def __init__(self, held, timeout=30.0):
        super().__init__()
        self.held = held
        self.release = threading.Event()
        self.timeout = timeout
        self.timed_out = False
        self.fail = False

    def on_read(self, path, offset, data):
        if offset == 0 and path.endswith(self.held):
            self.timed_out = not self.release.wait(self.timeout)
            if self.fail:
                raise OSError("connection reset by peer")
        super().on_read(path, offset, data)


def _with_handler(tmp_path, handler):
    return CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(handler))


def _counting_load_blocks(monkeypatch, on_call):
    """Wrap ``statecore._native.load_blocks`` (the native restore's loader): ``on_call(key
    groups)`` before each call."""
    from statecore import _native

    real = _native.load_blocks

    def load_blocks(table, data, blocks, key_groups, *args, **kwargs):
        on_call(np.asarray(key_groups))
        return real(table, data, blocks, key_groups, *args, **kwargs)

    monkeypatch.setattr(_native, "load_blocks", load_blocks)


def test_a_restore_loads_the_first_piece_to_arrive_while_the_rest_downloads(
        remote, tmp_path, monkeypatch):
    """The footer's piece (the file's last key groups) is read first; those key groups are
    loaded while the file's first piece is still on its way (its read is held until a load
    happened), and the restored state is complete."""
    _, _, path, desc, want = remote
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-desc["size"] // 2))
    handler = _HeldHeadHandler(os.path.basename(path))
    store = _with_handler(tmp_path, handler)
    loads = []

    def on_call(kgs):
        loads.append((handler.release.is_set(), int(kgs.min()), int(kgs.max())))
        handler.release.set()

    _counting_load_blocks(monkeypatch, on_call)
    fresh = create_backend("native", key_type="int64")
    store.restore(fresh, 1)
    assert _contents(fresh) == want
    fresh.close()
    assert not handler.timed_out
    # The first load ran while the first piece was held, and it was of the file's last key
    # groups; the first piece's key groups, below them, were loaded after it arrived.
    held, first_lo, _ = loads[0]
    assert not held and first_lo > min(want)
    assert any(released and lo < first_lo for released, lo, _ in loads[1:])
    assert sorted(_data_reads(handler, path))[0][0] == 0


class _TailWaitsForHead:
    """A data file's bytes as an input file (``size``, ``read_at``, ``close``) whose read at
    offset ``tail`` returns only once a read of offset 0 returned (at most ``timeout`` seconds;
    ``timed_out`` says whether it had to give up). Not through ``PyFileSystem``: its files
    serve one read at a time."""

    def __init__(self, data: bytes, tail: int, timeout: float = 2.0):
        self.data, self.tail, self.timeout = data, tail, timeout
        self.head_read = threading.Event()
        self.timed_out = False

    def size(self) -> int:
        return len(self.data)

    def read_at(self, n: int, offset: int) -> bytes:
        if offset == self.tail:
            self.timed_out = not self.head_read.wait(self.timeout)
        out = self.data[offset:offset + n]
        if offset == 0:
            self.head_read.set()
        return out

    def close(self) -> None:
        pass


def test_pieces_not_tail_first_are_in_flight_at_once(remote):
    """``tail_first=False``: the first piece is asked for before the footer's piece arrived
    (whose read waits for it: in vain were they asked for one after the other), and the file
    reads the same."""
    _, _, path, desc, want = remote
    size = desc["size"]
    with open(path, "rb") as f:
        file = _TailWaitsForHead(f.read(), size - size // 2)
    with ThreadPoolExecutor(2) as pool:
        r = DataFileReader(file, path, expected_size=size, fetch_pool=pool,
                           piece_bytes=-(-size // 2), tail_first=False)
        try:
            r.wait_prefetched()
            assert not file.timed_out and r.bytes_read == size
            keys, _ = r.entries("sum", 5)
            assert keys.to_pylist() == want.get(5, ([], []))[0]
        finally:
            r.close()


@pytest.mark.parametrize("far_s", [0.0, float("inf")])
def test_a_store_slow_to_open_a_file_asks_for_its_pieces_at_once(remote, monkeypatch, far_s):
    """Opening a data file that takes ``REMOTE_FAR_OPEN_S`` or more (a store a long round trip
    away) has its pieces asked for at once, not the footer's first; the restore is the same."""
    handler, store, path, desc, want = remote
    size = desc["size"]
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-size // 2))
    monkeypatch.setattr(readers, "REMOTE_FAR_OPEN_S", far_s)
    opened = []

    def spy(*args, **kwargs):
        opened.append(kwargs["tail_first"])
        return DataFileReader(*args, **kwargs)

    monkeypatch.setattr(readers, "DataFileReader", spy)
    fresh = create_backend("native", key_type="int64")
    store.restore(fresh, 1)
    assert _contents(fresh) == want
    fresh.close()
    assert opened == [far_s > 0]
    assert _data_reads(handler, path) == [(0, size - size // 2), (size - size // 2, size // 2)]


def _flip(path, pos):
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x40]))


def _with_other_state(impl="native"):
    """A backend holding another state's entries, which a failed restore must leave alone."""
    b = create_backend(impl, key_type="int64")
    st = b.get_state(ReducingStateDescriptor("other", "sum", "int64"))
    st.add_batch(pa.array(np.arange(100, dtype=np.int64)), pa.array(np.ones(100, np.int64)))
    return b


def _other_unchanged(b):
    snap = b.snapshot()
    try:
        got = {}
        for m in snap.state_metas():
            for kg in snap.key_group_range:
                keys, vals = snap.entries(m["name"], kg)
                got[m["name"]] = got.get(m["name"], 0) + len(keys)
    finally:
        snap.release()
    # The restored state was not registered: the snapshot lists it not even empty.
    return "sum" not in got and {name: n for name, n in got.items() if n} == {"other": 100}


def _held_loads(monkeypatch, handler):
    """Load calls recorded (their first key group), the first one releasing ``handler``'s held
    read."""
    loads = []

    def on_call(kgs):
        loads.append(int(kgs.min()))
        handler.release.set()

    _counting_load_blocks(monkeypatch, on_call)
    return loads


def test_corruption_in_the_last_piece_to_arrive_leaves_the_backend_unchanged(
        remote, tmp_path, monkeypatch):
    """A damaged block in the file's first piece, which arrives last (held until a load
    happened): the key groups of the pieces before it were loaded already, yet the restore
    raises CorruptCheckpointError naming the block and the backend holds what it held (the new
    state's table is registered only at the end). Once repaired, the same restore succeeds."""
    _, _, path, desc, want = remote
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-desc["size"] // 3))
    handler = _HeldHeadHandler(os.path.basename(path))
    store = _with_handler(tmp_path, handler)
    layout = DataFileLayout(path)
    blk = 3  # in the first key groups: the first piece
    pos = int(layout.blocks[blk]["offset"]) + 5
    _, kg, _ = layout.block_at(pos)
    loads = _held_loads(monkeypatch, handler)
    original = open(path, "rb").read()
    _flip(path, pos)
    b = _with_other_state()
    with pytest.raises(CorruptCheckpointError,
                       match=f"{path}: state 'sum' key group {kg} block {blk}: .*checksum"):
        store.restore(b, 1)
    assert loads and loads[0] > kg and not handler.timed_out  # later key groups loaded first
    assert _other_unchanged(b)
    with open(path, "wb") as f:
        f.write(original)
    store.restore(b, 1)
    assert _contents(b) == want
    b.close()


def test_a_failing_late_piece_is_an_io_error_and_changes_nothing(remote, tmp_path, monkeypatch):
    """The read of the file's first piece (fetched after the footer's, whose key groups were
    loaded meanwhile) fails: CheckpointIOError, the backend holds what it held."""
    _, _, path, desc, want = remote
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", -(-desc["size"] // 2))
    handler = _HeldHeadHandler(os.path.basename(path))
    handler.fail = True
    store = _with_handler(tmp_path, handler)
    loads = _held_loads(monkeypatch, handler)
    b = _with_other_state()
    with pytest.raises(CheckpointIOError, match=f"checkpoint data file {path}: cannot read"):
        store.restore(b, 1)
    assert loads and not handler.timed_out and _other_unchanged(b)
    handler.fail = False
    store.restore(b, 1)
    assert _contents(b) == want
    b.close()


def _incremental_chain(tmp_path, impl):
    """Versions 1 (full), 2 and 3 (incremental: updates, new keys, removals) of one task's
    ``sum`` state in a local store under ``tmp_path``; returns ``(paths of the runs of version 3's
    chain, the task's contents at version 3)``. Fixed seed."""
    rng = np.random.default_rng(11)
    store = CheckpointStore(str(tmp_path))
    b = _loaded(impl)
    st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    for version in (1, 2, 3):
        if version > 1:
            keys = rng.choice(N + 5000, size=N // 6, replace=False).astype(np.int64)
            st.add_batch(pa.array(keys), pa.array(np.full(len(keys), version, np.int64)))
            gone = rng.choice(N, size=N // 20, replace=False).astype(np.int64)
            st.clear_batch(pa.array(gone))
        snap = b.snapshot(incremental=version > 1)
        try:
            desc = store.write_snapshot(snap, version, block_target_bytes=4096)
            store.commit(version, [desc])
            b.notify_checkpoint_complete(snap.snapshot_id, version)
        finally:
            snap.release()
    want = _contents(b)
    b.close()
    runs = [str(tmp_path / f["path"]) for f in store.manifest(3)["files"]]
    return runs, want


@pytest.mark.parametrize("impl", ["native", "python"])
def test_a_chain_restores_through_pieces_fetched_at_once(tmp_path, monkeypatch, impl):
    """A full run and two incremental runs on top, each fetched whole in pieces (the runs'
    footer pieces read at once, each run's other pieces after its footer's): the restored state
    is the chain's newest-wins state (the oldest run loaded first, the newer ones upserted,
    their tombstones removing), and each run is read exactly once."""
    runs, want = _incremental_chain(tmp_path, impl)
    assert len(runs) == 3
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", 64 << 10)
    handler = RecordingHandler()
    store = _with_handler(tmp_path, handler)
    fresh = create_backend(impl, key_type="int64")
    store.restore(fresh, 3)
    assert _contents(fresh) == want
    fresh.close()
    for run in runs:
        size = os.path.getsize(run)
        order = [(at, n) for p, at, n in handler.reads if p == run]
        assert sorted(order)[0][0] == 0 and sum(n for _, n in order) == size
        assert order[0][0] + order[0][1] == size and len(order) >= 2  # the footer's first


class _ShuffledHandler(RecordingHandler):
    """A :class:`RecordingHandler` whose reads each take a random extra 0 to 4 ms (seeded), so
    that the pieces of several runs arrive in shuffled orders."""

    def __init__(self, seed):
        super().__init__()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()

    def on_read(self, path, offset, data):
        with self._rng_lock:
            delay = self._rng.random() * 0.004
        threading.Event().wait(delay)
        super().on_read(path, offset, data)


@pytest.mark.parametrize("seed", range(4))
def test_a_chain_restores_the_same_whatever_order_its_pieces_arrive_in(tmp_path, monkeypatch,
                                                                       seed):
    """Differential, fixed seeds: a chain restored through pieces of a random size arriving in
    shuffled orders equals the chain's state (the local restore's)."""
    runs, want = _incremental_chain(tmp_path, "native")
    rng = random.Random(seed)
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", rng.randrange(8 << 10, 200 << 10))
    store = _with_handler(tmp_path, _ShuffledHandler(seed))
    fresh = create_backend("native", key_type="int64")
    store.restore(fresh, 3)
    assert _contents(fresh) == want
    local = create_backend("native", key_type="int64")
    CheckpointStore(str(tmp_path)).restore(local, 3)
    assert _contents(local) == want
    fresh.close()
    local.close()


def _sliced_loads(monkeypatch, threads):
    """Have the native restore load every chunk of blocks on ``threads`` threads (slices of
    disjoint key groups, however few bytes); returns the ``threads`` of each load call."""
    from statecore import _native
    from statecore.backends import native

    monkeypatch.setattr(native, "_LOAD_THREADS", threads)
    monkeypatch.setattr(native, "_LOAD_SLICE_BYTES", 0)
    calls = []
    real = _native.load_blocks

    def load_blocks(*args, **kwargs):
        calls.append(kwargs.get("threads", 1))
        return real(*args, **kwargs)

    monkeypatch.setattr(_native, "load_blocks", load_blocks)
    return calls


@pytest.mark.parametrize("threads", [2, 3])
def test_a_chain_loaded_on_several_threads_restores_the_same(tmp_path, monkeypatch, threads):
    """Differential: a chain (upserts, tombstones over a full run) restored through pieces
    with each chunk's key groups cut into slices loaded at once equals the chain's state; a
    local restore loads on one thread."""
    runs, want = _incremental_chain(tmp_path, "native")
    calls = _sliced_loads(monkeypatch, threads)
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", 96 << 10)
    fresh = create_backend("native", key_type="int64")
    _with_handler(tmp_path, _ShuffledHandler(threads)).restore(fresh, 3)
    assert _contents(fresh) == want
    fresh.close()
    assert calls and set(calls) == {threads}
    calls.clear()
    local = create_backend("native", key_type="int64")
    CheckpointStore(str(tmp_path)).restore(local, 3)
    assert calls and set(calls) == {1}
    local.close()


def test_damage_in_a_later_slice_names_its_block_and_changes_nothing(remote, monkeypatch):
    """A damaged block among the last key groups of a chunk loaded on two threads (so in the
    second slice, whose blocks are numbered from the chunk's start): CorruptCheckpointError
    naming that block, the backend holds what it held."""
    _, store, path, desc, want = remote
    _sliced_loads(monkeypatch, 2)
    monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", desc["size"])
    layout = DataFileLayout(path)
    pos = int(layout.blocks[-3]["offset"]) + 5
    _flip(path, pos)
    b = _with_other_state()
    with pytest.raises(CorruptCheckpointError) as ei:
        store.restore(b, 1)
    layout.assert_names_the_damage(str(ei.value), pos)
    assert _other_unchanged(b)
    _flip(path, pos)
    store.restore(b, 1)
    assert _contents(b) == want
    b.close()
