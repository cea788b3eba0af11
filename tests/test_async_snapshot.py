"""Asynchronous snapshot materialization (CheckpointStore.write_snapshot_async): byte identity
with the synchronous writer, snapshot isolation while the owner keeps writing, cancellation,
failure cleanup and memory reclamation (native copy-on-write stats). Fixed seeds throughout."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import CancelledError

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import statecore
from statecore.checkpoint import format
from statecore.checkpoint.store import CheckpointStore, SnapshotWriteFuture
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from support.fs_wrappers import LocalDelegatingHandler

_native = pytest.importorskip("statecore._native")
if not hasattr(_native, "SnapshotBlockSerializer"):
    pytest.skip("native extension without the snapshot serializer", allow_module_level=True)

BACKENDS = ["native", "python"]
_MAX_OWNER_OPS = 40_000
_MIN_OWNER_OPS = 2_000


class _States:
    def __init__(self, backend):
        self.b = backend
        self.v = backend.get_state(ValueStateDescriptor("v", "string"))
        self.n = backend.get_state(ValueStateDescriptor("n", "int64"), namespace_type="int64")
        self.l = backend.get_state(ListStateDescriptor("l", "int64"))
        self.m = backend.get_state(MapStateDescriptor("m", "string", "float64"))
        self.r = backend.get_state(ReducingStateDescriptor("r", "sum", "int64"))

    def op(self, rnd: random.Random, i: int, key_space: int = 4000) -> None:
        """One random mutation: puts, removals, fresh keys (rehash-inducing inserts), list
        appends, map puts/removals, reducing adds, timers."""
        b = self.b
        b.set_current_key(rnd.randrange(key_space))
        c = rnd.randrange(9)
        if c == 0:
            self.v.update("x" * rnd.randrange(40))
        elif c == 1:
            self.v.clear()
        elif c == 2:
            b.set_current_key(10**6 + i)  # a new key: grows the maps (incremental rehash)
            self.v.update("fresh")
        elif c == 3:
            self.l.add(i)
        elif c == 4:
            self.m.put(f"u{rnd.randrange(20)}", rnd.random())
        elif c == 5:
            self.m.remove(f"u{rnd.randrange(20)}")
        elif c == 6:
            self.r.add(rnd.randrange(100))
        elif c == 7:
            self.n.set_current_namespace(rnd.randrange(5))
            self.n.update(i)
        else:
            if rnd.random() < 0.8:
                b.timers.register_event_time_timer(rnd.randrange(10**6))
            else:
                b.timers.delete_event_time_timer(rnd.randrange(10**6))


def _backend(kind, max_parallelism=32):
    return statecore.create_backend(kind, key_type="int64", max_parallelism=max_parallelism)


def _populate(kind, seed, n=3000, max_parallelism=32):
    b = _backend(kind, max_parallelism)
    st = _States(b)
    rnd = random.Random(seed)
    for i in range(n):
        st.op(rnd, i)
    return b, st, rnd


def _contents(snap) -> dict:
    """{(state, kg): (keys, values) as Python lists} of a StateSnapshot-like object."""
    start, end = snap.key_group_range.start, snap.key_group_range.end
    out = {}
    for m in snap.state_metas():
        for kg in range(start, end + 1):
            k, v = snap.entries(m["name"], kg)
            if len(k):
                out[(m["name"], kg)] = (k.to_pylist(), v.to_pylist())
    return out


def _read(store, rel) -> bytes:
    with store.fs.open_input_stream(store._abs(rel)) as f:
        return f.read()


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("target", [64 * 1024, 200, 1])
def test_async_file_is_byte_identical_to_sync(tmp_path, kind, incremental, target):
    b, st, rnd = _populate(kind, seed=11)
    base = b.snapshot()
    b.notify_checkpoint_complete(base.snapshot_id, 0)
    base.release()
    for i in range(800):
        st.op(rnd, 5000 + i)
    # The writer name and version are in the footer: same (version, writer), two roots.
    store, sync_store = CheckpointStore(str(tmp_path / "a")), CheckpointStore(str(tmp_path / "s"))
    snap = b.snapshot(incremental=incremental)
    fut = store.write_snapshot_async(snap, 1, "p0", block_target_bytes=target,
                                     release_snapshot=False)
    assert isinstance(fut, SnapshotWriteFuture)
    desc_async = fut.result(timeout=60)
    desc_sync = sync_store.write_snapshot(snap, 1, "p0", block_target_bytes=target)
    expected = _read(sync_store, desc_sync["path"])
    assert _read(store, desc_async["path"]) == expected
    # Format 6: both writers built the same Bloom filters and block keys (docs/formats.md
    # "Filters and block keys"), one filter per (state, key group) holding its keys.
    reader = format.DataFileReader(pa.BufferReader(expected), "sync")
    filters, key_offsets, _ = reader.lookup_tables()
    assert reader.format_version == 6 and len(key_offsets) == desc_sync["blocks"] + 1
    assert len(filters) and reader.filter_bytes == int(filters["length"].sum())
    # Equal but for the file's name: every write gets a new one.
    assert ({k: v for k, v in desc_async.items() if k != "path"}
            == {k: v for k, v in desc_sync.items() if k != "path"})
    for key in ("size", "entries", "blocks", "raw_bytes", "stored_bytes", "footer_xxh64",
                "kind", "tombstones", "snapshot_id", "key_groups_nonempty"):
        assert desc_async[key] == desc_sync[key], key
    assert desc_async["kind"] == ("incremental" if incremental else "full")
    if incremental:
        assert sum(desc_async["tombstones"].values()) > 0
    snap.release()
    # With release_snapshot a second, identical snapshot gives the same bytes.
    snap2 = b.snapshot(incremental=incremental)
    store2 = CheckpointStore(str(tmp_path / "b"))
    d2 = store2.write_snapshot_async(snap2, 1, "p0", block_target_bytes=target,
                                     release_snapshot=True).result(timeout=60)
    assert snap2._released
    assert _read(store2, d2["path"]) == expected


class _GatedHandler(LocalDelegatingHandler):
    """Local filesystem whose output streams block in write() until ``gate`` is set."""

    type_name = "gated"

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def before_write(self, stream, data):
        self.waiting.set()
        self.gate.wait(60)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_isolation_while_owner_writes(tmp_path, kind, seed):
    """The owner keeps mutating every kind of state during the background write; the checkpoint
    restores to exactly the state at snapshot() time (full, then incremental on top)."""
    b, st, rnd = _populate(kind, seed=seed, n=6000)
    gated = _GatedHandler()
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(gated))
    for version, incremental in ((1, False), (2, True)):
        gated.gate.clear()
        expected_snap = b.snapshot()  # taken at the same moment, read before any mutation
        expected = _contents(expected_snap)
        expected_snap.release()
        snap = b.snapshot(incremental=incremental)
        fut = store.write_snapshot_async(snap, version, "p0", block_target_bytes=256,
                                         queue_blocks=2, release_snapshot=bool(version % 2))
        ops = 0
        i = 10**5 * version
        # The write holds its first data write until the owner has mutated state, so the two
        # overlap however the threads are scheduled; then the owner goes on while the write
        # runs. Capped: the writer needs the GIL per block, which a busy owner hands over only
        # every switch interval (5 ms), so an uncapped owner made ~100k ops/s for the whole
        # write and the next incremental version grew with them (minutes on a quiet machine).
        assert gated.waiting.wait(60)
        while ops < _MIN_OWNER_OPS or (not fut.done() and ops < _MAX_OWNER_OPS):
            for _ in range(20):
                st.op(rnd, i)
                i += 1
                ops += 1
            if ops >= _MIN_OWNER_OPS:
                gated.gate.set()
        desc = fut.result()
        snap.release()
        store.commit(version, [desc])
        b.notify_checkpoint_complete(desc["snapshot_id"], desc["version"])
        with store.open(version) as reader:
            assert _contents(reader) == expected
        restored = _backend(kind)
        store.restore(restored, version)
        got = restored.snapshot()
        assert _contents(got) == expected
        got.release()
        for _ in range(500):  # more changes before the next (incremental) version
            st.op(rnd, i)
            i += 1


def test_native_memory_reclaimed_after_write(tmp_path):
    b, st, rnd = _populate("native", seed=5, n=6000)
    store = CheckpointStore(str(tmp_path))
    snap = b.snapshot()
    fut = store.write_snapshot_async(snap, 1, "p0", block_target_bytes=128, queue_blocks=1,
                                     release_snapshot=True)
    peak = 0
    i = 0
    while not fut.done():
        for _ in range(50):
            st.op(rnd, 10**5 + i, key_space=200)  # overwrite entries the snapshot shares
            i += 1
        stats = b.copy_on_write_stats()
        peak = max(peak, sum(s["retired_entries"] for s in stats.values()))
    fut.result()
    assert snap._released  # the write owned and released it (key group by key group)
    assert peak > 0  # old versions were kept alive for the snapshot during the write
    held = {name: _native._table_reclaim(t.native) for name, t in b.state_tables().items()}
    assert held == {name: 0 for name in held}
    assert all(s["retired_entries"] == 0 for s in b.copy_on_write_stats().values())


@pytest.mark.parametrize("kind", BACKENDS)
def test_cancel_stops_and_cleans_up(tmp_path, kind):
    b, st, rnd = _populate(kind, seed=3, n=8000, max_parallelism=128)
    store = CheckpointStore(str(tmp_path))
    snap = b.snapshot()
    fut = store.write_snapshot_async(snap, 7, "p0", block_target_bytes=32, queue_blocks=1)
    st.op(rnd, 1)  # the owner works while the write runs
    assert fut.cancel() is True
    assert fut.cancelled() and fut.done()
    with pytest.raises(CancelledError):
        fut.result()
    assert not any(f.endswith(".sckp") or ".tmp-" in f for f in _files(tmp_path))
    if kind == "native":
        assert snap._released
        held = {name: _native._table_reclaim(t.native) for name, t in b.state_tables().items()}
        assert set(held.values()) == {0}
    # A finished write cannot be cancelled; its file stays.
    fut2 = store.write_snapshot_async(b.snapshot(), 8, "p0")
    desc = fut2.result(timeout=60)
    assert fut2.cancel() is False
    assert (tmp_path / desc["path"]).exists()


class _FailingHandler(LocalDelegatingHandler):
    """Local filesystem whose output streams raise OSError after ``limit`` bytes."""

    type_name = "failing"

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def before_write(self, stream, data):
        if stream.written + len(data) > self.limit:
            raise OSError("disk full (injected)")

    def open_append_stream(self, path, metadata):
        raise OSError("not supported")


@pytest.mark.parametrize("kind", BACKENDS)
def test_failing_filesystem(tmp_path, kind):
    b, st, rnd = _populate(kind, seed=4, n=4000)
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(_FailingHandler(5000)))
    snap = b.snapshot()
    fut = store.write_snapshot_async(snap, 3, "p0", block_target_bytes=512)
    with pytest.raises(OSError, match="injected"):
        fut.result(timeout=60)
    assert not fut.cancelled()
    assert _files(tmp_path) == []  # the temporary file was removed, nothing published
    if kind == "native":
        assert snap._released
        held = {name: _native._table_reclaim(t.native) for name, t in b.state_tables().items()}
        assert set(held.values()) == {0}


def test_release_during_write_is_deferred(tmp_path):
    b, st, rnd = _populate("native", seed=8, n=3000)
    store = CheckpointStore(str(tmp_path / "a"))
    sync_store = CheckpointStore(str(tmp_path / "s"))
    snap = b.snapshot()
    expected = sync_store.write_snapshot(snap, 1, "p0", block_target_bytes=100)
    fut = store.write_snapshot_async(snap, 1, "p0", block_target_bytes=100, queue_blocks=1,
                                     release_snapshot=False)
    snap.release()  # deferred: the write still reads the map snapshots
    desc = fut.result(timeout=60)
    assert snap._released
    assert _read(store, desc["path"]) == _read(sync_store, expected["path"])


def test_bad_arguments_raise_at_once(tmp_path):
    b, _, _ = _populate("native", seed=9, n=10)
    store = CheckpointStore(str(tmp_path))
    snap = b.snapshot()
    for kwargs in ({"queue_blocks": 0}, {"block_target_bytes": 0}, {"nice": -1}, {"nice": True},
                   {"chunk_bytes": 0}, {"chunk_bytes": 1.5}):
        with pytest.raises(InvalidInputError):
            store.write_snapshot_async(snap, 1, "p0", **kwargs)
    with pytest.raises(InvalidInputError):
        store.write_snapshot_async(snap, 1, "bad/name")
    assert not snap._released and snap._pins == 0


def test_nogil_hash_matches_xxhash():
    import xxhash

    rnd = random.Random(2)
    for n in (0, 1, 31, 32, 1000, 70000):
        data = bytes(rnd.randrange(256) for _ in range(n))
        assert _native.xxh64(data) == xxhash.xxh64_intdigest(data)


def test_native_lz4_gives_the_bindings_bytes():
    """The vendored LZ4 (1.9.4) compresses as ``lz4.block.compress(mode="fast",
    acceleration=format.LZ4_ACCELERATION, store_size=False)``: the same bytes where the binding
    has the same LZ4 release, readable by the binding in any case."""
    import lz4
    import lz4.block

    rnd = random.Random(5)
    same_release = lz4.library_version_number() == 10904
    differs_from_default_mode = False
    for n in (0, 1, 15, 4096, 70000, 300000):
        data = bytes(rnd.randrange(4) for _ in range(n // 2)) + b"key-123" * (n // 14)
        stored = _native.lz4_block_compress(data)
        assert lz4.block.decompress(stored, uncompressed_size=len(data)) == data
        if same_release:
            assert stored == lz4.block.compress(data, mode="fast", store_size=False,
                                                acceleration=format.LZ4_ACCELERATION)
            differs_from_default_mode |= stored != lz4.block.compress(data, store_size=False)
    # the acceleration is in effect: this data compresses differently at acceleration 1
    assert differs_from_default_mode or not same_release
    assert _native.lz4_block_compress(memoryview(b"abc" * 100)[3:]) == \
        _native.lz4_block_compress(b"abc" * 99)


class _CountingHandler(LocalDelegatingHandler):
    """Local filesystem that records the size of every write()."""

    type_name = "counting"

    def __init__(self):
        super().__init__()
        self.writes: list[int] = []

    def before_write(self, stream, data):
        self.writes.append(len(data))


def test_async_writer_writes_chunks_not_blocks(tmp_path):
    """The background writer takes the GIL once per chunk of blocks (each take can wait a whole
    switch interval while the owner runs Python): a file of many blocks is written in about
    size / CHUNK_TARGET_BYTES writes, header and footer included, where the synchronous writer
    writes block by block (its bytes are the same: test_async_file_is_byte_identical_to_sync)."""
    from statecore.checkpoint.format import CHUNK_TARGET_BYTES

    b, _, _ = _populate("native", seed=12, n=20_000)
    handler = _CountingHandler()
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(handler))
    snap = b.snapshot()
    d = store.write_snapshot_async(snap, 1, "p0", block_target_bytes=512).result(timeout=120)
    async_writes = list(handler.writes)
    handler.writes.clear()
    store.write_snapshot(snap, 2, "p0", block_target_bytes=512)
    snap.release()
    assert d["blocks"] > 300 and sum(async_writes) == d["size"]
    assert len(async_writes) <= d["size"] // CHUNK_TARGET_BYTES + 2, (len(async_writes), d)
    assert len(handler.writes) > d["blocks"]  # the synchronous path: a write per block


def test_owner_runs_while_serializer_waits():
    """The serializer waits with the GIL released: another Python thread keeps running while
    next_block() blocks on a full pipeline (backpressure) -- observed by progress of a counter."""
    t = _native.NativeStateTable(0, 0)
    # A few hundred blocks: each next_block() hands the GIL back to the spinning thread, which
    # returns it only after the switch interval (5 ms), so 20k entries in 64-byte blocks took 80 s.
    for i in range(3000):
        t.put(0, bytes([0]) + i.to_bytes(4, "big"), b"v" * 20)
    ser = _native.SnapshotBlockSerializer([("s", t.snapshot(), False, 0)], 0, 0, 1, 256, False, 1)
    ser.start()
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    n = 0
    while (blk := ser.next_block()) is not None:
        n += blk.entries
    stop.set()
    th.join()
    assert n == 3000 and counter[0] > 0
    assert ser.stats()["max_queued"] <= 1


def _thread_nices() -> dict:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = int(fields[16])  # field 19 of stat(5), counted after the "(comm)"
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux thread priorities")
def test_writer_threads_yield_the_cpu_to_the_owner(tmp_path):
    b, _, _ = _populate("native", seed=4, n=3000)
    handler = _GatedHandler()
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(handler))
    base = _thread_nices()[threading.get_native_id()]
    want = min(19, base + 7)
    # chunk_bytes=1: a write per block, so the producer is still running (held back by the
    # full queue) while the writer is inside its first write.
    fut = store.write_snapshot_async(b.snapshot(), 3, "p0", block_target_bytes=64,
                                     queue_blocks=1, release_snapshot=True, nice=7, chunk_bytes=1)
    try:
        assert handler.waiting.wait(30)  # the Python writer is inside write(), the C++ producer
        # lowers its own priority when the OS first runs it, which on a loaded machine can come
        # after the writer's first write (the file header): poll for it.
        deadline = time.monotonic() + 30
        while True:
            nices = _thread_nices()
            if sum(1 for n in nices.values() if n == want) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert nices[threading.get_native_id()] == base  # the owner keeps its priority
        assert sum(1 for n in nices.values() if n == want) >= 2
    finally:
        handler.gate.set()
    fut.result(timeout=60)
    fut._thread.join(30)  # the result is set just before the writer thread exits
    # Threads that the lowered writer started (e.g. pyarrow's pool threads) inherit its nice
    # value and outlive it; only threads new in the second write count below.
    lowered_before = {tid for tid, n in _thread_nices().items() if n == want}
    # nice=0 leaves the writing threads alone
    handler.gate.clear()
    handler.waiting.clear()
    fut = store.write_snapshot_async(b.snapshot(), 4, "p0", block_target_bytes=64, queue_blocks=1,
                                     release_snapshot=True, nice=0, chunk_bytes=1)
    try:
        assert handler.waiting.wait(30)
        assert {tid for tid, n in _thread_nices().items() if n == want} <= lowered_before
    finally:
        handler.gate.set()
    fut.result(timeout=60)


class _ArraysSnapshot:
    """A StateSnapshot over ``data[name][kg] = (keys, values)`` (``pa.binary()`` arrays; a
    NULL value is a tombstone in an incremental one), max parallelism 64."""

    max_parallelism = 64
    key_type = "binary"
    assigner = "spark"

    def __init__(self, data: dict, kg_range, incremental: bool):
        self.data = data
        self.key_group_range = statecore.KeyGroupRange(*kg_range)
        self.incremental = incremental
        self.base_version = 0 if incremental else None

    def state_metas(self):
        return [{"name": n, "kind": "value", "namespace_type": "void", "value_type": "binary"}
                for n in self.data]

    def entries(self, name, kg):
        return self.data[name].get(kg, (pa.array([], pa.binary()), pa.array([], pa.binary())))


def _random_arrays_snapshot(seed: int, incremental: bool) -> _ArraysSnapshot:
    rnd = random.Random(seed)
    data = {}
    for name in ("a", "b", "c"):
        per = {}
        for kg in range(8, 40):
            if rnd.random() < 0.3:
                continue  # an empty key group
            keys = sorted({bytes([kg]) + rnd.randbytes(rnd.randint(0, 9))
                           for _ in range(rnd.randint(1, 300))})
            values = [None if incremental and rnd.random() < 0.2
                      else rnd.randbytes(rnd.choice([0, 8, rnd.randint(0, 200)]))
                      for _ in keys]
            if kg % 5:
                per[kg] = (pa.array(keys, pa.binary()), pa.array(values, pa.binary()))
            else:  # arrays with an offset
                per[kg] = (pa.array([b"x"] + keys, pa.binary()).slice(1),
                           pa.array([None, b"y"] + values, pa.binary()).slice(2))
        data[name] = per
    return _ArraysSnapshot(data, (8, 39), incremental)


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("window", [1, 2000, 1 << 20])
def test_serialized_writer_is_byte_identical_to_the_python_writer(incremental, window):
    """``write_data_file_serialized`` (compaction's writer: the native serializer over arrays,
    a window of key groups at a time) writes the bytes ``write_data_file`` writes, tombstones
    included, whatever the window and block size."""
    for seed in range(4):
        snap = _random_arrays_snapshot(seed, incremental)
        for target in (1, 256, 4096):
            want, got = pa.BufferOutputStream(), pa.BufferOutputStream()
            a = format.write_data_file(want, snap, version=3, writer="w",
                                       block_target_bytes=target)
            b = format.write_data_file_serialized(got, snap, version=3, writer="w",
                                                  block_target_bytes=target,
                                                  window_bytes=window)
            assert got.getvalue() == want.getvalue(), (seed, target)
            assert a.tombstones == b.tombstones and a.entries == b.entries
            if incremental:
                assert sum(a.tombstones.values()) > 0


@pytest.mark.parametrize("broken", ["unsorted", "prefix", "null key", "null in full",
                                    "lengths", "not binary"])
def test_serialized_writer_refuses_what_the_python_writer_refuses(broken):
    snap = _random_arrays_snapshot(1, incremental=False)
    k, v = snap.data["b"][9]
    if broken == "unsorted":
        k = pa.array(list(reversed(k.to_pylist())), pa.binary())
    elif broken == "prefix":
        k = pa.array([b"\x07" + x[1:] for x in k.to_pylist()], pa.binary())
    elif broken == "null key":
        k = pa.array([None] + k.to_pylist()[1:], pa.binary())
    elif broken == "null in full":
        v = pa.array([None] + v.to_pylist()[1:], pa.binary())
    elif broken == "lengths":
        v = v[1:]
    else:
        k = pa.array(range(len(k)), pa.int64())
    snap.data["b"][9] = (k, v)
    errors = []
    for write in (format.write_data_file, format.write_data_file_serialized):
        with pytest.raises(InvalidInputError) as e:
            write(pa.BufferOutputStream(), snap, version=3, writer="w")
        errors.append(str(e.value))
    assert errors[0] == errors[1]
