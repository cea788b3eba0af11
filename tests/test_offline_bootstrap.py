"""statecore.offline.bootstrap_checkpoint: version 0 of a new checkpoint written from Arrow data
holds, byte for byte, the entries a backend writes for the same state; read_state gives the
input back, both backends restore it, a bounded pass size splits it into several runs, and bad
input is refused with nothing committed."""

import random

import pyarrow as pa
import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    create_backend,
)
from statecore.cli import main
from statecore.errors import InvalidInputError, StateError
from statecore.offline import StateInput, bootstrap_checkpoint, read_state
from statecore.offline import bootstrap as bootstrap_module
from statecore.ttl import ManualClock

BACKENDS = ["python", "native"]
MP = 64
TTL = StateTtlConfig(10**9)


def _descriptors():
    return (ValueStateDescriptor("value", "int64"),
            ListStateDescriptor("list", "string"),
            MapStateDescriptor("map", "int64", "float64"),
            ValueStateDescriptor("ttl", "string").enable_time_to_live(TTL),
            ReducingStateDescriptor("total", "sum", "int64"),
            ListStateDescriptor("ttl_list", "int64").enable_time_to_live(TTL))


def _backend(kind, clock=5, key_type="string"):
    if kind == "native":
        pytest.importorskip("statecore._native")
    return create_backend(kind, key_type=key_type, max_parallelism=MP, ttl_clock=ManualClock(clock))


def _fill(b, seed):
    """Random state of every kind through the per-record API (lists past one chunk of 32
    elements, map entries overwritten, keys of some states only) and event-time timers."""
    rnd = random.Random(seed)
    value, lst, mp, ttl, total, ttl_list = (b.get_state(d) for d in _descriptors())
    for i in range(300):
        b.set_current_key(f"user-{i}")
        if rnd.random() < 0.8:
            value.update(rnd.randrange(-10**12, 10**12))
        lst.add_all([f"e{rnd.randrange(1000)}" for _ in range(rnd.choice((0, 1, 3, 40, 70)))])
        for _ in range(rnd.randrange(4)):
            mp.put(rnd.randrange(10), rnd.random())
        if i % 3 == 0:
            ttl.update(f"T{i}")
        for _ in range(rnd.randrange(3)):
            total.add(rnd.randrange(100))
        if i % 4 == 0:
            ttl_list.add_all(list(range(i % 50)))
        if i % 10 == 0:
            b.timers.register_event_time_timer(1_000 + i)
    return b


def _timers_table(b):
    rows = b.timers.all_timers()
    return pa.table({"key": pa.array([r[2] for r in rows], pa.string()),
                     "timestamp_ms": pa.array([r[1] for r in rows], pa.int64())})


def _entries(snap_like, name):
    out = {}
    for kg in range(MP):
        keys, values = snap_like.entries(name, kg)
        if len(keys):
            out[kg] = (keys.to_pylist(), values.to_pylist())
    return out


def _contents(b):
    value, lst, mp, ttl, total, ttl_list = (b.get_state(d) for d in _descriptors())
    out = {}
    for i in range(300):
        b.set_current_key(f"user-{i}")
        out[i] = (value.value(), list(lst.get()), dict(mp.items()), ttl.value(), total.get(),
                  list(ttl_list.get()))
    return out, sorted((ts, key) for _, ts, key, _ in b.timers.all_timers())


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("memory_bytes", [256 * 1024 * 1024, 4096])
@pytest.mark.parametrize("native_keys", [True, False])
def test_read_state_of_a_backend_bootstraps_the_same_entries(tmp_path, monkeypatch, kind,
                                                              memory_bytes, native_keys):
    """A backend's state, read back with read_state, bootstraps a checkpoint whose entries
    equal, byte for byte, the backend's own full snapshot, whether the keys are encoded by
    the native extension or in Python; both backends restore it."""
    if not native_keys:
        monkeypatch.setattr(bootstrap_module, "native_key_encoder", lambda *a: None)
    src = _fill(_backend(kind), seed=7)
    snap = src.snapshot()
    states = [StateInput(d, pa.Table.from_batches(list(_read_from(snap, tmp_path, d.name))))
              for d in _descriptors()]
    manifest = bootstrap_checkpoint(tmp_path / "boot", states, key_type="string",
                                    max_parallelism=MP, timers=_timers_table(src), now_ms=5,
                                    memory_bytes=memory_bytes)
    files = manifest["files"]
    assert len(files) == 1 if memory_bytes > 10**6 else len(files) > 2
    meta = manifest["metadata"]
    assert (meta["bootstrap"], meta["flush"], meta["final"], meta["batch_id"]) == \
        (True, True, False, None)
    reader = CheckpointStore(tmp_path / "boot").open(0)
    try:
        for d in _descriptors():
            assert _entries(reader, d.name) == _entries(snap, d.name), d.name
        assert _entries(reader, "__timers__") == _entries(snap, "__timers__")
    finally:
        reader.release()
    want = _contents(src)
    for other in BACKENDS:
        b = _backend(other)
        for d in _descriptors():
            b.get_state(d)
        CheckpointStore(tmp_path / "boot").restore(b, 0)
        assert _contents(b) == want
    snap.release()


def _read_from(snap, tmp_path, name):
    """read_state's batches of state ``name`` of ``snap``, written once as version 0 of
    ``tmp_path / "src"``."""
    store = CheckpointStore(tmp_path / "src")
    if not store.versions():
        store.commit(0, [store.write_snapshot(snap, 0)], {})
    return read_state(store, name, batch_rows=100)


def test_bootstrap_then_read_state_gives_the_input(tmp_path):
    """Namespaces, a multi-column key, whole lists and element rows with positions, a TTL
    timestamp per row or the given clock reading: read_state returns what went in."""
    key = pa.struct([("f0", pa.string()), ("f1", pa.int64())])
    keys = pa.array([{"f0": "a", "f1": 1}, {"f0": "b", "f1": 2}, {"f0": "a", "f1": 1}], key)
    value = ValueStateDescriptor("v", "float64").enable_time_to_live(
        StateTtlConfig(1000, time_characteristic="event_time"))
    lst = ListStateDescriptor("l", "int32")
    mp = MapStateDescriptor("m", "string", "binary")
    states = [
        StateInput(value, pa.table({"key": keys, "namespace": pa.array([1, 1, 2], pa.int64()),
                                    "value": [0.5, 1.5, 2.5],
                                    "ttl_timestamp_ms": pa.array([10, None, 30], pa.int64())}),
                   "int64"),
        StateInput(lst, pa.table({"key": keys, "value": pa.array([[3, 4], [5], [6]],
                                                                 pa.list_(pa.int32()))})),
        StateInput(mp, pa.table({"key": keys.take([0, 1]), "user_key": ["x", "y"],
                                 "value": [b"1", b"2"]})),
        StateInput(ListStateDescriptor("positions", "string"),
                   pa.table({"key": keys, "user_key": pa.array([5, 0, 2], pa.uint64()),
                             "value": ["c", "z", "b"]})),
    ]
    bootstrap_checkpoint(tmp_path, states, key_type="struct<string,int64>", max_parallelism=MP,
                         watermark_ms=20)

    def rows(name, *cols):
        t = pa.Table.from_batches(list(read_state(tmp_path, name)))
        return sorted(tuple(tuple(r[c].values()) if c == "key" else r[c] for c in cols)
                      for r in t.to_pylist())

    ka, kb = ("a", 1), ("b", 2)
    assert rows("v", "key", "namespace", "value", "ttl_timestamp_ms") == [
        (ka, 1, 0.5, 10), (ka, 2, 2.5, 30), (kb, 1, 1.5, 20)]
    got = {(r[0], r[1]): r[2] for r in rows("l", "key", "user_key", "value")}
    assert got == {(ka, 0): 3, (ka, 1): 4, (ka, 2): 6, (kb, 0): 5}
    assert rows("m", "key", "user_key", "value") == [(ka, "x", b"1"), (kb, "y", b"2")]
    got = {(r[0], r[1]): r[2] for r in rows("positions", "key", "user_key", "value")}
    assert got == {(ka, 0): "b", (ka, 1): "c", (kb, 0): "z"}


def test_inspect_shows_a_bootstrapped_checkpoint(tmp_path, capsys):
    bootstrap_checkpoint(tmp_path, [(ValueStateDescriptor("counts", "int64"),
                                     pa.table({"key": ["a", "b"], "value": [1, 2]}))],
                         key_type="string")
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "counts" in out


def _value_input(**cols):
    return [(ValueStateDescriptor("v", "int64"), pa.table(cols))]


@pytest.mark.parametrize("states,kw,match", [
    (_value_input(key=pa.array(["a", None]), value=[1, 2]), {}, "null"),
    (_value_input(key=pa.array([1, 2]), value=[1, 2]), {}, "column 'key' must have"),
    (_value_input(key=["a", "b"], value=["x", "y"]), {}, "column 'value' must have"),
    (_value_input(key=["a", "b"], value=pa.array([1, None], pa.int64())), {}, "null"),
    (_value_input(key=["a", "a"], value=[1, 2]), {}, "'a' is given more than once"),
    (_value_input(key=["a"], value=[1], extra=[1]), {}, "unknown column"),
    (_value_input(key=["a"]), {}, "no 'value' column"),
    (_value_input(key=["a"], value=[1], namespace=[1]), {}, "void namespace"),
    (_value_input(key=["a"], value=[1], ttl_timestamp_ms=[5]), {}, "has no TTL"),
    ([(MapStateDescriptor("m", "string", "int64"),
       pa.table({"key": ["a", "a"], "user_key": ["u", "u"], "value": [1, 2]}))], {},
     "user key 'u' of key 'a' is given more than once"),
    ([(MapStateDescriptor("m", "string", "int64"), pa.table({"key": ["a"], "value": [1]}))],
     {}, "needs a 'user_key'"),
    ([(ListStateDescriptor("l", "int64"),
       pa.table({"key": ["a", "a"], "user_key": [1, 1], "value": [1, 2]}))], {},
     "position 1 is given more than once"),
    ([(ValueStateDescriptor("t", "int64").enable_time_to_live(
        StateTtlConfig(5, time_characteristic="event_time")),
       pa.table({"key": ["a"], "value": [1]}))], {}, "need watermark_ms"),
    (_value_input(key=["a"], value=[1]), {"timers": pa.table({"key": ["a"]})},
     "no 'timestamp_ms'"),
    ([(ValueStateDescriptor("v", "int64"), [1, 2])], {}, "data must be a pyarrow Table"),
    ([ValueStateDescriptor("v", "int64")], {}, "must be a StateInput"),
    ([(ListStateDescriptor("l", "int64"),
       lambda: [pa.record_batch({"key": ["a"], "user_key": [0], "value": [1]}),
                pa.record_batch({"key": ["a"], "value": [2]})])], {},
     "positions .* for some of its elements only"),
    ([(ValueStateDescriptor("t", "int64").enable_time_to_live(TTL),
       pa.table({"key": ["a"], "value": [1],
                 "ttl_timestamp_ms": pa.array([2**62], pa.timestamp("s"))}))], {},
     "does not fit in int64"),
])
def test_bad_input_is_refused_and_nothing_is_committed(tmp_path, states, kw, match):
    with pytest.raises(InvalidInputError, match=match):
        bootstrap_checkpoint(tmp_path, states, key_type="string", max_parallelism=MP, **kw)
    assert CheckpointStore(tmp_path).versions() == []


def test_a_checkpoint_with_versions_is_refused(tmp_path):
    states = _value_input(key=["a"], value=[1])
    bootstrap_checkpoint(tmp_path, states, key_type="string")
    with pytest.raises(StateError, match="already holds versions"):
        bootstrap_checkpoint(tmp_path, states, key_type="string")
    with pytest.raises(InvalidInputError, match="memory_bytes"):
        bootstrap_checkpoint(tmp_path / "x", states, key_type="string", memory_bytes=0)


def test_a_dataset_or_a_function_streams_the_input(tmp_path):
    """Inputs read anew at each pass: a pyarrow dataset of Parquet files and a function
    returning batches give the same checkpoint as a table."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    n = 2000
    t = pa.table({"key": [f"k{i}" for i in range(n)], "value": list(range(n))})
    pq.write_table(t.slice(0, 1000), tmp_path / "a.parquet")
    pq.write_table(t.slice(1000), tmp_path / "b.parquet")
    d = ValueStateDescriptor("v", "int64")
    roots = {}
    for name, data in (("table", t), ("dataset", pads.dataset(str(tmp_path), format="parquet")),
                       ("function", lambda: t.to_batches(max_chunksize=300))):
        roots[name] = tmp_path / name
        bootstrap_checkpoint(roots[name], [(d, data)], key_type="string", memory_bytes=8000)
    got = {name: [b.to_pylist() for b in read_state(root, "v")] for name, root in roots.items()}
    assert got["table"] == got["dataset"] == got["function"]
    assert sum(len(b) for b in got["table"]) == n
    assert len(CheckpointStore(roots["table"]).manifest(0)["files"]) > 2


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("native_keys", [True, False])
def test_namespaced_states_bootstrap_the_backends_bytes(tmp_path, monkeypatch, kind,
                                                        native_keys):
    """String keys with string namespaces (both of variable width: the encoded key carries
    their lengths) and int64 namespaces: the bootstrapped entries equal the backend's."""
    if not native_keys:
        monkeypatch.setattr(bootstrap_module, "native_key_encoder", lambda *a: None)
    b = _backend(kind)
    by_window = b.get_state(ValueStateDescriptor("w", "int64"), namespace_type="string")
    per_day = b.get_state(ListStateDescriptor("d", "string"), namespace_type="int64")
    rnd = random.Random(3)
    rows_w, rows_d = [], []
    for i in range(200):
        k = f"k{i}" * (1 + i % 3)
        b.set_current_key(k)
        for ns in {f"win-{rnd.randrange(5)}" for _ in range(3)}:
            by_window.set_current_namespace(ns)
            by_window.update(i)
            rows_w.append((k, ns, i))
        day = rnd.randrange(-3, 3)
        per_day.set_current_namespace(day)
        per_day.add_all([f"x{j}" for j in range(i % 40)])
        rows_d += [(k, day, f"x{j}") for j in range(i % 40)]
    snap = b.snapshot()
    cols = ("key", "namespace", "value")
    states = [StateInput(ValueStateDescriptor("w", "int64"),
                         pa.table(dict(zip(cols, map(list, zip(*rows_w))))), "string"),
              StateInput(ListStateDescriptor("d", "string"),
                         pa.table(dict(zip(cols, map(list, zip(*rows_d))))), "int64")]
    bootstrap_checkpoint(tmp_path, states, key_type="string", max_parallelism=MP)
    reader = CheckpointStore(tmp_path).open(0)
    try:
        for name in ("w", "d"):
            assert _entries(reader, name) == _entries(snap, name)
    finally:
        reader.release()
        snap.release()


class _Mean:
    """An AggregateFunction of (count, sum) accumulators in a pickle."""

    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + 1, acc[1] + value)

    def get_result(self, acc):
        return acc[1] / acc[0]


@pytest.mark.parametrize("kind", BACKENDS)
def test_aggregating_and_pickled_states_take_their_stored_form(tmp_path, kind):
    """An aggregating state's rows are its accumulators (pickle bytes here) and a pickle value
    state's rows its pickle bytes, stored as they are: the restored state reads them."""
    import pickle

    from statecore import AggregatingStateDescriptor

    mean = AggregatingStateDescriptor("mean", _Mean())
    anything = ValueStateDescriptor("anything")
    bootstrap_checkpoint(tmp_path, [
        (mean, pa.table({"key": ["a", "b"],
                         "value": [pickle.dumps((2, 10)), pickle.dumps((1, 3))]})),
        (anything, pa.table({"key": ["a"], "value": [pickle.dumps({"x": [1, 2]})]})),
    ], key_type="string", max_parallelism=MP)
    b = _backend(kind)
    st, other = b.get_state(mean), b.get_state(anything)
    CheckpointStore(tmp_path).restore(b, 0)
    b.set_current_key("a")
    assert (st.get(), other.value()) == (5.0, {"x": [1, 2]})
    st.add(8)
    assert st.get() == 6.0
    b.set_current_key("b")
    assert (st.get(), other.value()) == (3.0, None)


def test_the_next_micro_batch_of_any_query_follows_a_bootstrapped_version(tmp_path):
    """The versions rules (statecore.spark.versions) on a bootstrapped version 0: micro-batch
    b of any query opens a stream at version 1; a non-final flush right after it does
    nothing, a final one takes version 1."""
    from statecore.spark.versions import place_flush, place_micro_batch

    manifest = bootstrap_checkpoint(tmp_path, _value_input(key=["a"], value=[1]),
                                    key_type="string")
    meta = manifest["metadata"]
    for batch_id, query in ((0, "q1"), (7, "q2"), (0, None)):
        place = place_micro_batch("op", batch_id, query, 0, lambda v: meta if v == 0 else None)
        assert (place.version, place.batch_offset, place.committed) == (1, 1 - batch_id, False)
    assert place_flush(0, meta, final=False) is None
    assert place_flush(0, meta, final=True).version == 1
