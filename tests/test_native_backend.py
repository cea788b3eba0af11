"""The conformance suite on the native backend: every test of BackendConformance, including the
differential state machine against the pure-Python reference backend, plus native-only checks
(copy-on-write isolation through the Python API, O(key groups) snapshots, bulk restore)."""

import pyarrow as pa
import pytest

pytest.importorskip("statecore._native")

from statecore import (  # noqa: E402
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
    create_backend,
)
from statecore.backends import native_states  # noqa: E402
from statecore.backends.native import NativeBackend  # noqa: E402
from statecore.errors import InvalidInputError  # noqa: E402
from statecore.testing.conformance import BackendConformance, snapshot_dump  # noqa: E402


class TestNativeBackend(BackendConformance):
    def make_backend(self, **options):
        return create_backend("native", **options)

    @pytest.fixture(autouse=True)
    def _kernels_per_chunk(self, request, monkeypatch):
        # The stream tests use small chunks, which the native path would combine (a copy):
        # make it call the kernels once per chunk, as it does for large chunks.
        if "stream" in request.node.name:
            monkeypatch.setattr(native_states, "_MIN_ROWS_PER_CHUNK", 1)


def test_create_backend_native():
    assert isinstance(create_backend("native"), NativeBackend)


def test_snapshot_isolated_while_writing_many_keys():
    b = create_backend("native", key_type="int64")
    st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    keys = pa.array(range(20_000), pa.int64())
    st.add_batch(keys, pa.array([1] * 20_000, pa.int64()))
    snap = b.snapshot()
    # The first read of a flat map's snapshot copies its table on the reading thread
    # (docs/state-map.md "Write-through copy-on-write"); chained maps copy what writes touch.
    before = snapshot_dump(snap)
    # Writes after the snapshot, enough to drive rehashes.
    st.add_batch(keys, pa.array([5] * 20_000, pa.int64()))
    st.add_batch(pa.array(range(20_000, 60_000), pa.int64()), pa.array([7] * 40_000, pa.int64()))
    assert snapshot_dump(snap) == before
    snap.release()
    while b.copy_on_write_stats()["sum"]["rehashing_maps"]:
        st.get_batch(keys)  # finish the migrations (which copy entries in the flat engine)
    copies = b.copy_on_write_stats()["sum"]
    st.add_batch(keys, pa.array([1] * 20_000, pa.int64()))
    # After the last release no copy-on-write happens any more.
    after = b.copy_on_write_stats()["sum"]
    assert ((after["entry_copies"], after["page_copies"])
            == (copies["entry_copies"], copies["page_copies"]))
    assert st.get_batch(pa.array([0, 59_999], pa.int64())).to_pylist() == [7, 7]


def test_batch_and_per_record_address_the_same_entries():
    for key_type, keys in [("int64", [3, -9, 2**40]), ("string", ["a", "ü", ""]),
                           ("int32", [1, -1, 7]), ("binary", [b"\x00", b"xy", b""])]:
        b = create_backend("native", key_type=key_type)
        st = b.get_state(ValueStateDescriptor("v", "float64"))
        typ = {"int64": pa.int64(), "string": pa.string(), "int32": pa.int32(),
               "binary": pa.binary()}[key_type]
        st.put_batch(pa.array(keys, typ), pa.array([1.5, 2.5, None], pa.float64()))
        got = []
        for k in keys:
            b.set_current_key(k)
            got.append(st.value())
        assert got == [1.5, 2.5, None]
        b.set_current_key(keys[2])
        st.update(9.0)
        assert st.get_batch(pa.array(keys, typ)).to_pylist() == [1.5, 2.5, 9.0]


def test_rejected_batch_leaves_state_untouched():
    b = create_backend("native", key_type="int64", key_group_range=(0, 63))
    st = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
    ok_keys = []
    for k in range(1000):
        try:
            b.key_group_of(k)
            ok_keys.append(k)
        except InvalidInputError:
            foreign = k
    st.add_batch(pa.array(ok_keys[:10], pa.int64()), pa.array([1] * 10, pa.int64()))
    before = snapshot_dump(b.snapshot())
    with pytest.raises(InvalidInputError, match="key group"):
        st.add_batch(pa.array(ok_keys[:5] + [foreign], pa.int64()), pa.array([1] * 6, pa.int64()))
    with pytest.raises(InvalidInputError):
        st.add_batch(pa.array([ok_keys[0], None], pa.int64()), pa.array([1, 2], pa.int64()))
    with pytest.raises(InvalidInputError):
        st.add_batch(pa.array(ok_keys[:3], pa.int64()), pa.array([1, 2], pa.int64()))
    with pytest.raises(InvalidInputError):
        st.add_batch(pa.array(ok_keys[:2], pa.int64()), pa.array([1.0, 2.0], pa.float64()))
    assert snapshot_dump(b.snapshot()) == before


def test_checkpoint_round_trip_native_and_python_interchangeable(tmp_path):
    """Native state written by 2 operators through a real checkpoint directory is read back by 3
    native operators and by the Python backend: every entry lands in its owner."""
    from statecore import CheckpointStore, key_group_range_for_operator
    from statecore.key_groups import assign_key_group

    store = CheckpointStore(str(tmp_path / "ckpt"))
    keys = [f"tail-{i}" for i in range(3000)]
    descs = []
    for i in range(2):
        r = key_group_range_for_operator(128, 2, i)
        b = create_backend("native", key_type="string", key_group_range=r)
        st = b.get_state(ReducingStateDescriptor("n", "sum", "int64"))
        mine = [k for k in keys if b.key_group_range.contains(
            assign_key_group(k, "string", 128))]
        st.add_batch(pa.array(mine), pa.array(list(range(len(mine))), pa.int64()))
        for k in mine[:50]:
            b.set_current_key(k)
            b.timers.register_event_time_timer(1000 + len(k))
        descs.append(store.write_snapshot(b.snapshot(), 1, writer=f"p{i}"))
    store.commit(1, descs)
    expected = {}
    for i in range(2):
        r = key_group_range_for_operator(128, 2, i)
        ks = [k for k in keys if r.contains(assign_key_group(k, "string", 128))]
        expected.update({k: v for v, k in enumerate(ks)})
    got, timers = {}, 0
    for i in range(3):
        b = create_backend("native", key_type="string",
                           key_group_range=key_group_range_for_operator(128, 3, i))
        store.restore(b, 1)
        st = b.get_state(ReducingStateDescriptor("n", "sum", "int64"))
        mine = [k for k in keys if b.key_group_range.contains(
            assign_key_group(k, "string", 128))]
        got.update(zip(mine, st.get_batch(pa.array(mine)).to_pylist()))
        timers += b.timers.num_timers()
    assert got == expected
    assert timers == 100
    ref = create_backend("python", key_type="string")
    store.restore(ref, 1)
    st = ref.get_state(ReducingStateDescriptor("n", "sum", "int64"))
    assert dict(zip(keys, st.get_batch(pa.array(keys)).to_pylist())) == expected


def test_removal_log_bounded_and_migration_copies_not_listed():
    b = create_backend("native", key_type="int64", max_parallelism=4)
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(20_000), pa.int64())
    st.put_batch(keys, pa.array([1] * 20_000, pa.int64()))
    held = b.snapshot()  # held while the maps grow: migrations copy entries
    b.notify_checkpoint_complete(held.snapshot_id)
    st.put_batch(pa.array(range(20_000, 60_000), pa.int64()), pa.array([2] * 40_000, pa.int64()))
    st.put_batch(pa.array(range(0, 5_000), pa.int64()), pa.array([None] * 5_000, pa.int64()))
    assert b.copy_on_write_stats()["v"]["entry_copies"] >= 10_000
    inc = b.snapshot(incremental=True)
    rows = [v for kg in range(4) for v in inc.entries("v", kg)[1].to_pylist()]
    # Exactly the 40,000 new keys and 5,000 tombstones: no unchanged entry copied by a migration.
    assert len(rows) == 45_000 and rows.count(None) == 5_000
    assert b.removal_log_sizes()["v"] >= 5_000
    b.notify_checkpoint_complete(inc.snapshot_id)
    # Completed: at most one partly older chunk (64 records) per key-group map remains.
    assert b.removal_log_sizes()["v"] <= 4 * 64


# The native per-record path converts stored forms in Cython (NativeStateTable.get_stored /
# put_stored); the reference is PythonTable.encode_value / decode_value: same bytes written, same
# stored form read, same error for malformed bytes (bytes restored without decoding reach it).

def _random_stored(rng, vt: str):
    if vt in ("int64", "int32", "timestamp[ms]"):
        bits = 31 if vt == "int32" else 63
        return rng.choice([0, -1, 1, -(2**bits), 2**bits - 1, rng.randint(-(2**bits), 2**bits - 1)])
    if vt == "uint64":
        return rng.choice([0, 1, 2**63, 2**64 - 1, rng.randint(0, 2**64 - 1)])
    if vt.startswith("fixed_size_binary"):
        return bytes(rng.randrange(256) for _ in range(int(vt[18:-1])))
    if vt == "float64":
        return rng.choice([0.0, -0.0, 1.5, -2.25e300, float("inf"), float("-inf"), rng.random()])
    if vt == "bool":
        return rng.random() < 0.5
    if vt == "string":
        return "".join(rng.choice("aé日😀\x00")
                       for _ in range(rng.randint(0, 200 if rng.random() < 0.1 else 5)))
    return bytes(rng.randrange(256)
                 for _ in range(rng.randint(0, 200 if rng.random() < 0.1 else 5)))


def _stored_form(rng, kind: str, vt: str, ttl: bool):
    def one():
        s = _random_stored(rng, vt)
        return (s, rng.choice([-(2**63), 0, 2**63 - 1, rng.randint(-(2**40), 2**40)])) if ttl else s

    if kind == "list":  # a chunk: a list of elements (docs/formats.md "List state")
        return [one() for _ in range(rng.randint(1, 4))]
    return one()  # a map state's entry (one per user key) is stored as a value


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # the type and message are what is compared
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", ["value", "list", "map"])
@pytest.mark.parametrize("vt", ["int64", "int32", "float64", "bool", "string", "binary", "pickle",
                                "uint64", "timestamp[ms]", "fixed_size_binary[3]",
                                "fixed_size_binary[8]", "fixed_size_binary[20]"])
def test_per_record_stored_forms_match_the_reference_codec(kind, vt, ttl):
    import random

    from statecore.backends.native import NativeTable
    from statecore.backends.python import PythonTable

    meta = {"name": "s", "kind": kind, "namespace_type": "void", "value_type": vt}
    if kind == "map":
        meta["user_key_type"] = "string"
    if ttl:
        meta["ttl"] = {"ttl_ms": 1}
    ref = PythonTable(meta)
    table = NativeTable(meta, create_backend("native", key_type="int64"))
    rng = random.Random(f"{kind}-{vt}-{ttl}")
    key = b"\x05key"
    blobs = []
    for _ in range(200):
        stored = _stored_form(rng, kind, vt, ttl)
        blob = ref.encode_value(stored)
        table.put(5, key, stored)
        assert table.native.get(5, key) == blob
        assert table.get(5, key) == ref.decode_value(blob)
        blobs.append(blob)
    # malformed bytes: truncated, extended and random blobs read as the reference reads them
    for blob in blobs:
        for bad in (blob[:rng.randrange(len(blob) + 1)], blob + bytes([rng.randrange(256)]),
                    bytes(rng.randrange(256) for _ in range(rng.randint(0, 20))),
                    b"\xff" * rng.randint(1, 12) + b"\x01",
                    b"\xff" * 9 + bytes([rng.randint(2, 127)]) + blob):  # varlen beyond 64 bits
            table.native.put(5, key, bad)
            assert _outcome(lambda: table.get(5, key)) == _outcome(lambda: ref.decode_value(bad))
    table.remove(5, key)
    assert table.get(5, key) is None


def test_per_record_stored_form_that_does_not_fit_changes_nothing():
    b = create_backend("native", key_type="int64")
    lst = b.get_state(ListStateDescriptor("l", "int64"))
    b.set_current_key(1)
    lst.add(1)
    table = lst.table
    kg, key = lst._slot()
    for bad in ([1, 2**63], [1, "x"], [None]):  # all elements encoded before any is written
        with pytest.raises(InvalidInputError):
            table.list_append(kg, key, bad)
        assert lst.get() == [1] and table.list_size(kg, key) == 1
    # the new fixed-width types: out of range, wrong width (values of up to 8 bytes and wider
    # ones take different paths), in every layout
    for vt, good, bads in [("uint64", 2**64 - 1, [-1, 2**64, "x"]),
                           ("timestamp[ns]", -(2**63), [2**63, b"x"]),
                           ("fixed_size_binary[3]", b"abc", [b"ab", b"abcd", "abc"]),
                           ("fixed_size_binary[12]", b"x" * 12, [b"x" * 11, b"x" * 13])]:
        for d in (ValueStateDescriptor("v" + vt, vt), ListStateDescriptor("l" + vt, vt),
                  MapStateDescriptor("m" + vt, "int32", vt)):
            st = b.get_state(d)
            (st.put(1, good) if isinstance(d, MapStateDescriptor)
             else st.add(good) if isinstance(d, ListStateDescriptor) else st.update(good))
            table = st.table
            kg, key = st._slot()
            is_list = isinstance(d, ListStateDescriptor)
            want = table.list_chunks(kg, key) if is_list else table.get(kg, key)
            for bad in bads:
                form = {b"k": bad} if isinstance(d, MapStateDescriptor) else bad
                with pytest.raises(InvalidInputError):
                    if is_list:
                        table.list_append(kg, key, [good, form])
                    else:
                        table.put(kg, key, form)
                assert (table.list_chunks(kg, key) if is_list else table.get(kg, key)) == want


class _StreamOnly:
    def __init__(self, obj):
        self.obj = obj

    def __arrow_c_stream__(self, requested_schema=None):
        return self.obj.__arrow_c_stream__(requested_schema)


def test_kernel_chunks_read_large_chunks_in_place_and_combine_small_ones():
    keys = pa.chunked_array([pa.array(range(10_000), pa.int64()),
                             pa.array(range(10_000, 25_000), pa.int64())])
    vals = pa.chunked_array([pa.array(range(5_000), pa.int64()),
                             pa.array(range(5_000, 25_000), pa.int64())])
    kc, vc = native_states._kernel_chunks(keys, vals)
    assert [len(c) for c in kc] == [len(c) for c in vc] == [5_000, 5_000, 15_000]
    # Views of the producer's buffers: no copy.
    assert kc[1].buffers()[1].address == keys.chunk(0).buffers()[1].address
    assert vc[2].buffers()[1].address == vals.chunk(1).buffers()[1].address
    assert kc[1].offset == 5_000 and vc[1].offset == 0 and vc[2].offset == 5_000
    # Small chunks, or a batch that must be one kernel call, are combined.
    small = pa.chunked_array([pa.array([1, 2]), pa.array([3])])
    assert [len(c) for c in native_states._kernel_chunks(small)[0]] == [3]
    assert [len(c) for c in native_states._kernel_chunks(keys, vals, single=True)[0]] == [25_000]


@pytest.mark.parametrize("value_type,arrow_type", [("int64", pa.int64()), ("int32", pa.int32()),
                                                   ("string", pa.string()), ("bool", pa.bool_()),
                                                   ("string", pa.large_string()),
                                                   ("binary", pa.large_binary())])
def test_large_chunked_stream_batches_match_one_array(value_type, arrow_type):
    n = 3 * native_states._MIN_ROWS_PER_CHUNK
    ks = [(i * 7919) % 5000 for i in range(n)]
    raw = [None if i % 11 == 0 else i % 97 for i in range(n)]
    vs = [None if x is None else (str(x) if value_type == "string" else
                                  str(x).encode() if value_type == "binary" else
                                  (x % 2 == 0 if value_type == "bool" else x)) for x in raw]
    karr, varr = pa.array(ks, pa.int64()), pa.array(vs, arrow_type)
    cut_k, cut_v = n // 3, n // 2
    kstream = pa.chunked_array([karr.slice(0, cut_k), karr.slice(cut_k)])
    vstream = pa.chunked_array([varr.slice(0, cut_v), varr.slice(cut_v)])
    a, b = (create_backend("native", key_type="int64") for _ in range(2))
    sa = a.get_state(ValueStateDescriptor("v", value_type))
    sb = b.get_state(ValueStateDescriptor("v", value_type))
    sa.put_batch(karr, varr)
    sb.put_batch(_StreamOnly(kstream), _StreamOnly(vstream))
    assert snapshot_dump(a.snapshot()) == snapshot_dump(b.snapshot())
    probe = pa.chunked_array([pa.array(range(0, 3000), pa.int64()),
                              pa.array(range(3000, 9000), pa.int64())])
    assert sb.get_batch(_StreamOnly(probe)).equals(sa.get_batch(probe.combine_chunks()))
    if value_type in ("int64", "int32"):
        ra = a.get_state(ReducingStateDescriptor("r", "max", value_type))
        rb = b.get_state(ReducingStateDescriptor("r", "max", value_type))
        assert rb.add_batch(_StreamOnly(kstream), _StreamOnly(vstream)).equals(
            ra.add_batch(karr, varr))


def test_a_table_busy_in_another_thread_raises_instead_of_racing():
    # What a second thread sees while a kernel runs on the table without the GIL (the mark is
    # set for the kernel's duration; set here directly so that the test does not depend on
    # thread timing).
    from statecore.errors import StateError

    b = create_backend("native", key_type="int64")
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    other = b.get_state(ValueStateDescriptor("w", "int64"))
    v.put_batch(pa.array([1, 2]), pa.array([10, 20]))
    before = snapshot_dump(b.snapshot())
    table = b.state_tables()["v"].native
    table._debug_set_busy(True)
    try:
        b.set_current_key(1)
        for call in (lambda: v.put_batch(pa.array([1]), pa.array([5])),
                     lambda: v.get_batch(pa.array([1])),
                     lambda: v.value(),
                     lambda: v.update(3),
                     lambda: b.snapshot()):
            with pytest.raises(StateError):
                call()
        other.put_batch(pa.array([1]), pa.array([5]))  # another table is not affected
    finally:
        table._debug_set_busy(False)
    assert snapshot_dump(b.snapshot())["v"] == before["v"]


def test_batches_on_separate_backends_run_in_parallel_threads():
    import threading

    n = 50_000
    keys = pa.array([(i * 31) % 7000 for i in range(n)], pa.int64())
    vals = pa.array(range(n), pa.int64())

    def run(b, out, i):
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        for _ in range(5):
            s.add_batch(keys, vals)
        out[i] = snapshot_dump(b.snapshot())

    backends = [create_backend("native", key_type="int64") for _ in range(4)]
    out = [None] * 4
    threads = [threading.Thread(target=run, args=(b, out, i)) for i, b in enumerate(backends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ref = [None]
    run(create_backend("native", key_type="int64"), ref, 0)
    assert all(o == ref[0] for o in out)


def test_list_and_map_batches_run_the_kernels(monkeypatch):
    """append_batch / put_batch of typed states (TTL ones too, namespaced ones too) never reach
    the per-row path (made to fail here), pickle ones do."""
    from statecore.backends.states import TableListState, TableMapState
    from statecore.ttl import ManualClock, StateTtlConfig

    def per_row(*a, **k):
        raise AssertionError("per-row path taken")

    monkeypatch.setattr(TableListState, "append_batch", per_row)
    monkeypatch.setattr(TableMapState, "put_batch", per_row)
    b = NativeBackend(key_type="int64", ttl_clock=ManualClock(0))
    keys = pa.array([1, 2, 1])
    for ttl in (None, StateTtlConfig(10)):
        ld, md = ListStateDescriptor("l", "int64"), MapStateDescriptor("m", "string", "int64")
        if ttl:
            ld, md = ld.enable_time_to_live(ttl), md.enable_time_to_live(ttl)
            ld.name, md.name = "lt", "mt"
        lst, m = b.get_state(ld), b.get_state(md)
        lst.append_batch(keys, pa.array([1, 2, 3]))
        lst.append_batch(keys, pa.array([[4], None, [5, 6]], pa.list_(pa.int64())))
        m.put_batch(keys, pa.array(["a", "b", "a"]), pa.array([1, 2, 3]))
        b.set_current_key(1)
        assert lst.get() == [1, 3, 4, 5, 6]
        assert m.items() == [("a", 3)]
    ns = b.get_state(ListStateDescriptor("n", "int64"), namespace_type="string")
    ns.append_batch(keys, pa.array([1, 2, 3]), namespaces="w")
    nm = b.get_state(MapStateDescriptor("nm", "int64", "int64"), namespace_type="int64")
    nm.put_batch(keys, pa.array([1, 2, 3]), pa.array([1, 2, 3]), namespaces=pa.array([5, 6, 5]))
    b.set_current_key(1)
    ns.set_current_namespace("w")
    nm.set_current_namespace(5)
    assert ns.get() == [1, 3] and nm.items() == [(1, 1), (3, 3)]
    pm = b.get_state(MapStateDescriptor("p", "pickle", "int64"))
    with pytest.raises(AssertionError, match="per-row"):
        pm.put_batch(keys, pa.array([1, 2, 3]), pa.array([1, 2, 3]))


def test_namespaced_value_and_reducing_batches_run_the_kernels(monkeypatch):
    """Namespaced get/put/add batches (one namespace a row, one for the batch, the current one)
    never reach the per-row path (made to fail here)."""

    def per_row(*a, **k):
        raise AssertionError("per-row path taken")

    monkeypatch.setattr(NativeBackend, "batch_slots", per_row)
    b = NativeBackend(key_type="string")
    v = b.get_state(ValueStateDescriptor("v", "int64"), namespace_type="binary")
    c = b.get_state(ReducingStateDescriptor("c", "max", "float64"), namespace_type="int32")
    keys = pa.array(["a", "b", "a"])
    v.put_batch(keys, pa.array([1, 2, 3]), namespaces=pa.array([b"x", b"", b"x"]))
    assert v.get_batch(keys, namespaces=b"x").to_pylist() == [3, None, 3]
    c.set_current_namespace(-1)
    assert c.add_batch(keys, pa.array([1.5, 2.0, 0.5])).to_pylist() == [1.5, 2.0, 1.5]
    assert c.get_batch(keys, namespaces=pa.array([-1, 0, -1], pa.int32())).to_pylist() == \
        [1.5, None, 1.5]


def test_collection_reads_removals_and_clear_run_the_kernels(monkeypatch):
    """List get_batch, map get/contains/remove_batch and clear_batch of every state kind
    (TTL ones too; clear_batch and remove_batch also with pickle values) never reach the
    per-row path -- every per-row batch path resolves its rows through ``batch_slots``, made
    to fail here -- namespaced calls included."""
    from statecore.ttl import ManualClock, StateTtlConfig

    def per_row(*a, **k):
        raise AssertionError("per-row path taken")

    b = NativeBackend(key_type="int64", ttl_clock=ManualClock(0))
    keys, uks = pa.array([1, 2, 1]), pa.array(["a", "b", "a"])
    states = []
    for ttl in (None, StateTtlConfig(10, update_type="OnReadAndWrite")):
        ds = [ListStateDescriptor("l", "int64"), MapStateDescriptor("m", "string", "int64"),
              MapStateDescriptor("mp", "string", "pickle"), ValueStateDescriptor("v", "pickle"),
              ReducingStateDescriptor("r", "sum", "int64")]
        for d in ds:
            if ttl:
                d = d.enable_time_to_live(ttl)
                d.name += "_ttl"
            states.append(b.get_state(d))
        lst, m, mp, v, r = states[-5:]
        lst.append_batch(keys, pa.array([1, 2, 3]))
        m.put_batch(keys, uks, pa.array([1, 2, 3]))
        b.set_current_key(1)
        mp.put("a", {"x": 1})
        v.update({"y": 2})
        monkeypatch.setattr(NativeBackend, "batch_slots", per_row)
        assert lst.get_batch(keys).to_pylist() == [[1, 3], [2], [1, 3]]
        assert m.get_batch(keys, uks).to_pylist() == [3, 2, 3]
        assert m.contains_batch(keys, pa.array(["a", "a", "b"])).to_pylist() == [True, False, False]
        m.remove_batch(keys, uks)
        mp.remove_batch(keys, uks)
        for st in (lst, v, r):
            st.clear_batch(keys)
        monkeypatch.undo()
        assert not m.contains_batch(keys, uks).to_pylist()[0] and mp.is_empty()
        assert lst.get_batch(keys).to_pylist() == [[], [], []] and v.value() is None
    monkeypatch.setattr(NativeBackend, "batch_slots", per_row)
    ns = b.get_state(ListStateDescriptor("n", "int64"), namespace_type="string")
    nm = b.get_state(MapStateDescriptor("nm", "string", "int64"), namespace_type="int64")
    ns.append_batch(keys, pa.array([1, 2, 3]), namespaces=pa.array(["w", "w", "v"]))
    nm.put_batch(keys, uks, pa.array([1, 2, 3]), namespaces=7)
    assert ns.get_batch(keys, namespaces="w").to_pylist() == [[1], [2], [1]]
    assert nm.get_batch(keys, uks, namespaces=7).to_pylist() == [3, 2, 3]
    assert nm.contains_batch(keys, uks, namespaces=8).to_pylist() == [False] * 3
    nm.remove_batch(keys.slice(1), uks.slice(1), namespaces=7)
    assert nm.get_batch(keys, uks, namespaces=pa.array([7, 7, 7])).to_pylist() == [None, None, None]
    ns.clear_batch(keys, namespaces="w")
    assert ns.get_batch(keys, namespaces=pa.array(["w", "v", "v"])).to_pylist() == [[], [], [3]]


@pytest.mark.parametrize("max_parallelism", [128, 1000])
@pytest.mark.parametrize("namespaced", [False, True])
def test_int32_key_batches_store_the_bytes_the_python_backend_stores(max_parallelism, namespaced):
    # int32 keys are encoded in place by the batch kernels (not by the key encoder): the state
    # they leave, encoded keys included, must be the python backend's, under both key-group
    # prefix sizes, with and without a namespace, over many groups of rows.
    import numpy as np

    rng = np.random.default_rng(5)
    keys = rng.integers(-2**31, 2**31, 700).astype(np.int32)
    keys[:4] = [-2**31, -1, 0, 2**31 - 1]
    rows = pa.array(rng.choice(keys, 20_000), pa.int32())
    ones = pa.array(np.ones(len(rows), np.int64))
    ns = pa.array(rng.integers(0, 3, len(rows)), pa.int64()) if namespaced else None
    dumps, outs = [], []
    for kind in ("native", "python"):
        b = create_backend(kind, key_type="int32", max_parallelism=max_parallelism)
        st = b.get_state(ReducingStateDescriptor("c", "sum", "int64"),
                         **({"namespace_type": "int64"} if namespaced else {}))
        kw = {"namespaces": ns} if namespaced else {}
        outs.append(st.add_batch(rows, ones, **kw).to_pylist())
        outs.append(st.get_batch(pa.array(keys, pa.int32()),
                                 **({"namespaces": pa.array([1] * len(keys), pa.int64())}
                                    if namespaced else {})).to_pylist())
        dumps.append(snapshot_dump(b.snapshot()))
    assert outs[0] == outs[2] and outs[1] == outs[3]
    assert dumps[0] == dumps[1]
