"""Incremental checkpoints: runs with tombstones, newest-wins merge on restore, runs shared between
versions, compaction, rescaling, byte counts that scale with the change set, version-1 files.

Snapshots are in-test fakes implementing the contract of docs/architecture.md "Contract:
StateSnapshot" (NULL value = tombstone, timers complete in every snapshot), plus the full
snapshots of the real backends."""

from __future__ import annotations

import random
import struct

import pyarrow as pa
import pytest

from statecore.checkpoint import CheckpointStore
from statecore.checkpoint import format as fmt
from statecore.errors import CorruptCheckpointError, InvalidInputError
from statecore.key_groups import KeyGroupRange
from support.data_files import data_file_bytes, rewrite_footer_meta, without_lookup_tables

MAXP = 128
TIMERS = "__timers__"


def ekey(kg: int, key: int) -> bytes:
    return bytes([kg]) + struct.pack(">q", key) + b"\x00"


def tkey(kg: int, ts: int, key: int) -> bytes:
    return bytes([kg]) + struct.pack(">Q", (ts + 2**63) % 2**64) + struct.pack(">q", key) + b"\x00"


METAS = [{"name": "a", "kind": "value", "namespace_type": "void", "value_type": "binary"},
         {"name": "b", "kind": "value", "namespace_type": "void", "value_type": "binary"},
         {"name": TIMERS, "kind": "timers", "namespace_type": "void", "value_type": "binary"}]


class Snap:
    """Full or incremental StateSnapshot over ``data[name][kg] = {key: value or None}``."""

    def __init__(self, kg_range, data, incremental=False, snapshot_id=0, base_version=None):
        self.max_parallelism = MAXP
        self.base_version = base_version
        self.key_group_range = KeyGroupRange(*kg_range)
        self.key_type = "int64"
        self.assigner = "spark"
        self.incremental = incremental
        self.snapshot_id = snapshot_id
        self.data = data

    def state_metas(self):
        return [dict(m) for m in METAS]

    def entries(self, name, kg):
        items = sorted(self.data.get(name, {}).get(kg, {}).items())
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self):
        pass


class Model:
    """Reference state + change tracking, as a backend's incremental snapshots behave."""

    def __init__(self):
        self.state = {n: {} for n in ("a", "b", TIMERS)}  # name -> kg -> {key: value}
        self.changed = {n: {} for n in ("a", "b")}  # since the base: kg -> {key: value | None}
        self.sid = 0
        self.base = None  # the version of the last completed checkpoint

    def mutate(self, rng, kgs, n_ops):
        for _ in range(n_ops):
            name = rng.choice("ab")
            kg = rng.choice(kgs)
            d = self.state[name].setdefault(kg, {})
            if d and rng.random() < 0.35:
                k = rng.choice(sorted(d))
                del d[k]
                self.changed[name].setdefault(kg, {})[k] = None
            else:
                k = ekey(kg, rng.randrange(60))
                d[k] = rng.randbytes(rng.randint(0, 12))
                self.changed[name].setdefault(kg, {})[k] = d[k]
        for kg in kgs:  # timers: few, replaced wholesale
            if rng.random() < 0.3:
                self.state[TIMERS][kg] = {tkey(kg, rng.randrange(-5, 10**6), rng.randrange(9)): b""
                                          for _ in range(rng.randint(0, 3))}

    def snapshot(self, kg_range, incremental):
        self.sid += 1
        s, e = kg_range
        keep = lambda per: {kg: dict(d) for kg, d in per.items() if s <= kg <= e}  # noqa: E731
        if incremental:
            data = {n: keep(self.changed[n]) for n in ("a", "b")}
        else:
            data = {n: keep(self.state[n]) for n in ("a", "b")}
        data[TIMERS] = keep(self.state[TIMERS])
        return Snap(kg_range, data, incremental, self.sid,
                    base_version=self.base if incremental else None)

    def complete(self, version=None):
        self.changed = {n: {} for n in ("a", "b")}
        self.base = version

    def expected(self, kgs):
        out = {}
        for name, per in self.state.items():
            for kg in kgs:
                if per.get(kg):
                    out[(name, kg)] = sorted(per[kg].items())
        return out


def read_all(reader, kgs=None):
    kgs = list(reader.key_group_range) if kgs is None else kgs
    out = {}
    for m in reader.state_metas():
        for kg in kgs:
            k, v = reader.entries(m["name"], kg)
            assert v.null_count == 0 and k.type == v.type == pa.binary()
            if len(k):
                out[(m["name"], kg)] = list(zip(k.to_pylist(), v.to_pylist()))
    return out


def splits(n):
    from statecore.key_groups import key_group_range_for_operator

    return [(r.start, r.end) for r in (key_group_range_for_operator(MAXP, n, i) for i in range(n))]


def kgr(r):
    return (r.start, r.end) if hasattr(r, "start") else r


# ------------------------------------------------------------------------------------- format


def test_incremental_file_round_trips_tombstones(tmp_path):
    store = CheckpointStore(tmp_path)
    data = {"a": {3: {ekey(3, 1): b"x", ekey(3, 2): None, ekey(3, 5): b""}}, "b": {}, TIMERS: {}}
    d = store.write_snapshot(Snap((0, 7), data, incremental=True, snapshot_id=4), 1)
    assert d["kind"] == "incremental" and d["tombstones"] == {"a": 1, "b": 0, TIMERS: 0}
    assert d["snapshot_id"] == 4 and d["entries"]["a"] == 3
    with pa.OSFile(str(tmp_path / d["path"])) as f:
        r = fmt.DataFileReader(f, "x", expected_size=d["size"])
        assert r.kind == "incremental" and r.format_version == fmt.FORMAT_VERSION == 6
        k, v = r.entries("a", 3)
        assert k.to_pylist() == [ekey(3, 1), ekey(3, 2), ekey(3, 5)]
        assert v.to_pylist() == [b"x", None, b""]
        r.close()
    # a full snapshot must not carry NULL values
    with pytest.raises(InvalidInputError, match="nulls"):
        store.write_snapshot(Snap((0, 7), data, incremental=False), 2)


def test_block_validity_bitmap_is_checked():
    koff = pa.array([b"k1", b"k2"]).buffers()
    import numpy as np

    ko = np.array([0, 2, 4], np.int32)
    vo = np.array([0, 1, 1], np.int32)
    payload = fmt.encode_block(ko, b"k1k2", vo, b"v", np.array([True, False]))
    keys, values = fmt.decode_block(payload, 2, "w", has_validity=True)
    assert values.to_pylist() == [b"v", None]
    bad = payload[:-1] + bytes([payload[-1] | 0x80])  # a bit past the entries
    with pytest.raises(CorruptCheckpointError, match="past the entries"):
        fmt.decode_block(bad, 2, "w", has_validity=True)
    bad = fmt.encode_block(ko, b"k1k2", vo, b"v", np.array([False, True]))  # tombstone with bytes
    with pytest.raises(CorruptCheckpointError, match="tombstone carries"):
        fmt.decode_block(bad, 2, "w", has_validity=True)
    with pytest.raises(CorruptCheckpointError, match="offsets describe"):
        fmt.decode_block(payload, 2, "w", has_validity=False)
    del koff


def _write_v1(store, snap, version, writer="p0"):
    """A data file + manifest exactly as format/manifest version 1 wrote them."""
    import json
    import time

    from statecore.checkpoint.manifests import canonical_json as _canonical

    raw, summary = data_file_bytes(snap, version, writer)
    raw = without_lookup_tables(raw)

    def as_v1(meta):  # meta without kind/tombstones/filters, format 1
        for k in ("kind", "tombstones", "bloom_bits_per_key"):
            meta.pop(k)
        meta["format_version"] = 1

    data, fsum = rewrite_footer_meta(raw, as_v1, trailer_version=1)
    rel = f"data/{version:020d}/{writer}.sckp"  # the names format-1 runs had
    (store_path := f"{store.root}/{rel}")
    import os

    os.makedirs(os.path.dirname(store_path), exist_ok=True)
    with open(store_path, "wb") as f:
        f.write(data)
    body = {"format": "statecore-checkpoint", "format_version": 1, "version": version,
            "created_ms": int(time.time() * 1000), "max_parallelism": MAXP, "key_type": "int64",
            "assigner": "spark", "key_group_range": list(kgr(snap.key_group_range)),
            "states": [dict(m) for m in METAS],
            "files": [{"path": rel, "size": len(data), "writer": writer,
                       "key_group_range": list(kgr(snap.key_group_range)),
                       "states": [m["name"] for m in METAS], "entries": summary.entries,
                       "blocks": summary.blocks, "raw_bytes": summary.raw_bytes,
                       "stored_bytes": summary.stored_bytes,
                       "key_groups_nonempty": summary.key_groups_nonempty,
                       "footer_xxh64": f"{fsum:016x}"}],
            "metadata": {}}
    doc = dict(body, checksum_xxh64=f"{fmt.xxh64(_canonical(body)):016x}")
    with open(f"{store.root}/{store.manifest_name(version)}", "w") as f:
        json.dump(doc, f)


def test_version_1_files_and_manifests_are_read_and_extended(tmp_path):
    store = CheckpointStore(tmp_path)
    rng = random.Random(5)
    m = Model()
    m.mutate(rng, list(range(8)), 80)
    _write_v1(store, m.snapshot((0, 7), False), 0)
    m.complete(0)
    with store.open(0) as r:
        assert read_all(r) == m.expected(range(8))
    assert store.verify(0)["runs"] == 1
    # an incremental run on top of the version-1 base
    m.mutate(rng, list(range(8)), 20)
    store.commit(1, [store.write_snapshot(m.snapshot((0, 7), True), 1)])
    with store.open(1) as r:
        assert read_all(r) == m.expected(range(8))
    assert [x["kind"] for x in store.describe(1)["run_list"]] == ["incremental", "full"]


# ----------------------------------------------------------------------------- merge / history


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_history_incremental_equals_full(tmp_path, seed):
    """Each version restored from incremental runs equals the model, a full checkpoint of the
    same state, and every older retained version still restores to what it was."""
    rng = random.Random(seed)
    inc = CheckpointStore(tmp_path / "inc", max_runs=4)
    full = CheckpointStore(tmp_path / "full")
    m = Model()
    parts = splits(2)
    kgs = list(range(MAXP))
    history = {}
    for v in range(12):
        m.mutate(rng, rng.sample(kgs, 10), rng.randint(0, 60))
        incremental = v > 0 and rng.random() < 0.8
        failed = rng.random() < 0.15  # a checkpoint that never completes: changes accumulate
        descs = [inc.write_snapshot(m.snapshot(p, incremental), v, f"p{i}")
                 for i, p in enumerate(parts)]
        full.commit(v, [full.write_snapshot(m.snapshot(p, False), v, f"p{i}")
                        for i, p in enumerate(parts)])
        if failed and v > 0:
            continue
        inc.commit(v, descs, metadata={"v": v})
        m.complete(v)
        history[v] = m.expected(kgs)
        assert inc.describe(v)["max_runs_per_key_group"] <= 4
        with inc.open(v) as a, full.open(v) as b:
            assert read_all(a) == read_all(b) == history[v]
    for v, want in history.items():
        with inc.open(v) as r:
            assert read_all(r) == want, v
        inc.verify(v)
    latest = inc.latest_version()
    inc.retain(2)
    with inc.open(latest) as r:
        assert read_all(r) == history[latest]


def test_runs_are_shared_and_full_runs_drop_older_ones(tmp_path):
    store = CheckpointStore(tmp_path, max_runs=None)
    m, rng = Model(), random.Random(0)
    m.mutate(rng, list(range(16)), 100)
    d0 = store.write_snapshot(m.snapshot((0, 15), False), 0)
    store.commit(0, [d0])
    m.complete(0)
    for v in (1, 2, 3):
        m.mutate(rng, [1, 2], 5)
        store.commit(v, [store.write_snapshot(m.snapshot((0, 15), True), v)])
        m.complete(v)
    runs = store.describe(3)["run_list"]
    assert [(r["seq"], r["kind"], r["version"]) for r in runs] == [
        (4, "incremental", 3), (3, "incremental", 2), (2, "incremental", 1), (1, "full", 0)]
    assert runs[-1]["path"] == d0["path"]  # shared, not copied
    # a full run of a part of the range drops nothing else; of the whole range, everything older
    m.mutate(rng, [1, 9], 5)
    d4 = [store.write_snapshot(m.snapshot((0, 7), False), 4, "p0"),
          store.write_snapshot(m.snapshot((8, 15), True), 4, "p1")]
    store.commit(4, d4)
    m.complete(4)
    assert len(store.describe(4)["run_list"]) == 6
    with store.open(4) as r:
        assert read_all(r) == m.expected(range(16))
    store.commit(5, [store.write_snapshot(m.snapshot((0, 15), False), 5)])
    assert [r["version"] for r in store.describe(5)["run_list"]] == [5]


def test_incremental_without_base_is_rejected(tmp_path):
    store = CheckpointStore(tmp_path)
    m = Model()
    m.mutate(random.Random(1), [0, 1], 10)
    with pytest.raises(InvalidInputError, match="does not record the checkpoint version"):
        store.commit(0, [store.write_snapshot(m.snapshot((0, 15), True), 0)])
    store.commit(0, [store.write_snapshot(m.snapshot((0, 7), False), 0)])
    m.complete(0)
    with pytest.raises(InvalidInputError, match="no full base run for key groups 8..15"):
        store.commit(1, [store.write_snapshot(m.snapshot((0, 15), True), 1)])
    assert store.versions() == [0]


def test_state_meta_change_needs_a_full_run(tmp_path):
    store = CheckpointStore(tmp_path)
    m = Model()
    store.commit(0, [store.write_snapshot(m.snapshot((0, 3), False), 0)])
    m.complete(0)
    snap = m.snapshot((0, 3), True)
    snap.state_metas = lambda: [dict(METAS[0], value_type="int64")] + [dict(x) for x in METAS[1:]]
    with pytest.raises(InvalidInputError, match="stored format of state 'a' changed"):
        store.commit(1, [store.write_snapshot(snap, 1)])


def test_state_meta_change_that_keeps_the_stored_format_commits_incrementally(tmp_path):
    """A new TTL duration or cleanup strategy (or reduce function) leaves the stored entries
    readable: an incremental run commits on top of the old ones and the manifest carries the
    new meta. Switching TTL on or off changes the format and still needs a full run."""
    ttl = {"ttl_ms": 1000, "update_type": "OnCreateAndWrite"}
    metas = [dict(METAS[0], ttl=ttl)] + [dict(x) for x in METAS[1:]]
    store = CheckpointStore(tmp_path)
    m = Model()
    snap = m.snapshot((0, 3), False)
    snap.state_metas = lambda: [dict(x) for x in metas]
    store.commit(0, [store.write_snapshot(snap, 0)])
    m.complete(0)
    longer = [dict(metas[0], ttl=dict(ttl, ttl_ms=5000))] + metas[1:]
    snap = m.snapshot((0, 3), True)
    snap.state_metas = lambda: [dict(x) for x in longer]
    store.commit(1, [store.write_snapshot(snap, 1)])
    m.complete(1)
    man = store.manifest(1)
    assert {f["kind"] for f in man["files"]} == {"full", "incremental"}
    assert [s["ttl"]["ttl_ms"] for s in man["states"] if s["name"] == "a"] == [5000]
    snap = m.snapshot((0, 3), True)
    snap.state_metas = lambda: [dict(METAS[0])] + metas[1:]
    with pytest.raises(InvalidInputError, match="stored format of state 'a' changed"):
        store.commit(2, [store.write_snapshot(snap, 2)])


# ------------------------------------------------------------------------------------ sizes


def test_incremental_bytes_scale_with_the_change_set(tmp_path):
    store = CheckpointStore(tmp_path, max_runs=None)
    rng = random.Random(7)
    state = {kg: {ekey(kg, i): rng.randbytes(40) for i in range(200)} for kg in range(MAXP)}
    base = Snap((0, MAXP - 1), {"a": state, "b": {}, TIMERS: {}})
    d0 = store.write_snapshot(base, 0)
    store.commit(0, [d0])
    changed = {}
    keys = [(kg, k) for kg, d in state.items() for k in d]
    for kg, k in rng.sample(keys, len(keys) // 100):  # 1% of the keys change or go away
        changed.setdefault(kg, {})[k] = None if rng.random() < 0.3 else rng.randbytes(40)
    d1 = store.write_snapshot(Snap((0, MAXP - 1), {"a": changed, "b": {}, TIMERS: {}},
                                   incremental=True, base_version=0), 1)
    store.commit(1, [d1])
    assert d1["size"] * 20 < d0["size"], (d1["size"], d0["size"])
    info = store.describe(1)
    assert info["bytes_added"] == d1["size"] and info["bytes"] == d0["size"] + d1["size"]
    assert info["tombstones"]["a"] == d1["tombstones"]["a"] > 0
    for kg, d in changed.items():
        for k, v in d.items():
            if v is None:
                del state[kg][k]
            else:
                state[kg][k] = v
    with store.open(1) as r:
        assert read_all(r) == {("a", kg): sorted(d.items()) for kg, d in state.items() if d}


# ------------------------------------------------------------------------------ rescaling


def test_rescale_runs_of_two_writers_restored_by_three(tmp_path):
    store = CheckpointStore(tmp_path, max_runs=3)
    m, rng = Model(), random.Random(11)
    kgs = list(range(MAXP))
    m.mutate(rng, kgs, 400)
    store.commit(0, [store.write_snapshot(m.snapshot(p, False), 0, f"p{i}")
                     for i, p in enumerate(splits(2))])
    m.complete(0)
    for v in (1, 2):
        m.mutate(rng, kgs, 80)
        store.commit(v, [store.write_snapshot(m.snapshot(p, True), v, f"p{i}")
                         for i, p in enumerate(splits(2))])
        m.complete(v)
    # 3 writers restore their ranges from runs written by 2
    for p in splits(3):
        with store.open(2) as r:
            r.prefetch(*p)
            assert read_all(r, list(range(p[0], p[1] + 1))) == m.expected(range(p[0], p[1] + 1))
    # and continue incrementally with 3 writers on top of the 2-writer runs
    for v in (3, 4, 5):
        m.mutate(rng, kgs, 80)
        store.commit(v, [store.write_snapshot(m.snapshot(p, True), v, f"q{i}")
                         for i, p in enumerate(splits(3))])
        m.complete(v)
        with store.open(v) as r:
            assert read_all(r) == m.expected(kgs)
        assert store.describe(v)["max_runs_per_key_group"] <= 3
    store.retain(1)
    with store.open(5) as r:
        assert read_all(r) == m.expected(kgs)


@pytest.mark.parametrize("backend_name", ["python", "native"])
def test_real_backend_full_snapshots_rescaled_through_incremental_chain(tmp_path, backend_name):
    """Real backends' full snapshots as base runs + fake incremental runs on top: a backend of
    another parallelism restores the merged state."""
    import statecore
    from statecore.descriptors import ValueStateDescriptor

    try:
        writers = [statecore.create_backend(backend_name, key_type="int64", max_parallelism=MAXP,
                                            key_group_range=KeyGroupRange(*p)) for p in splits(2)]
    except Exception as exc:  # pragma: no cover - native extension missing
        pytest.skip(f"{backend_name} backend unavailable: {exc}")
    desc = ValueStateDescriptor("a", "int64")
    probe = statecore.create_backend(backend_name, key_type="int64", max_parallelism=MAXP)

    def kg_of(k):
        probe.set_current_key(k)
        return probe.current_key_group

    for b in writers:
        st = b.get_state(desc)
        for k in range(300):
            if kg_of(k) in b.key_group_range:
                b.set_current_key(k)
                st.update(k * 10)
    store = CheckpointStore(tmp_path)
    descs = []
    for i, b in enumerate(writers):
        snap = b.snapshot()
        descs.append(store.write_snapshot(snap, 0, f"p{i}"))
        snap.release()
    store.commit(0, descs)
    # version 1: key 7 removed, key 8 changed, via an incremental run of the whole range
    changes = {}
    for k, val in ((7, None), (8, 99)):
        kg = kg_of(k)
        enc = bytes([kg]) + struct.pack(">q", k) + b"\x00"
        changes.setdefault(kg, {})[enc] = None if val is None else struct.pack("<q", val)
    inc = Snap((0, MAXP - 1), {"a": changes}, incremental=True, base_version=0)
    inc.state_metas = lambda: [dict(writers[0].snapshot().state_metas()[0])]
    store.commit(1, [store.write_snapshot(inc, 1, "p0")])
    got = {}
    for p in splits(3):
        b = statecore.create_backend(backend_name, key_type="int64", max_parallelism=MAXP,
                                     key_group_range=KeyGroupRange(*p))
        st = b.get_state(desc)
        store.restore(b, 1)
        for k in range(300):
            if kg_of(k) in b.key_group_range:
                b.set_current_key(k)
                got[k] = st.value()
    want = {k: k * 10 for k in range(300)}
    want[7], want[8] = None, 99
    assert got == want


# ------------------------------------------------------------------------------ compaction


def test_compaction_keeps_every_version_and_reads_less(tmp_path):
    store = CheckpointStore(tmp_path, max_runs=None)
    m, rng = Model(), random.Random(21)
    kgs = list(range(32))
    m.mutate(rng, kgs, 300)
    store.commit(0, [store.write_snapshot(m.snapshot((0, 31), False), 0)])
    m.complete(0)
    history = {0: m.expected(kgs)}
    for v in range(1, 7):
        m.mutate(rng, kgs, 60)
        store.commit(v, [store.write_snapshot(m.snapshot((0, 31), True), v)])
        m.complete(v)
        history[v] = m.expected(kgs)
    before = store.describe(6)
    assert before["runs"] == 7 and before["max_runs_per_key_group"] == 7
    assert store.compact(6, max_runs=7)["files"] == store.manifest(6)["files"]  # nothing to do
    compacted = store.compact(6, max_runs=2)
    after = store.describe(6)
    assert after["runs"] == 1 and after["run_list"][0]["kind"] == "full"
    assert after["run_list"][0]["seq"] == before["run_list"][0]["seq"]
    assert after["tombstones"]["a"] == 0 and after["compacted_ms"] is not None
    assert compacted["metadata"] == store.metadata(6)
    for v, want in history.items():
        with store.open(v) as r:
            assert read_all(r) == want, v
    store.verify(6)
    # the next version builds on the compacted run
    m.mutate(rng, kgs, 20)
    store.commit(7, [store.write_snapshot(m.snapshot((0, 31), True), 7)])
    assert store.describe(7)["runs"] == 2
    # retention removes compaction inputs no retained version uses
    store.retain(2)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "data").rglob("*.sckp"))
    refs = sorted({f["path"] for v in store.versions() for f in store.manifest(v)["files"]})
    assert files == refs and len(files) == 2
    with store.open(7) as r:
        assert read_all(r) == m.expected(kgs)


def test_minor_compaction_merges_the_incremental_runs_alone(tmp_path):
    """Small incremental runs over a large full one: compaction merges them into one
    incremental run (tombstones kept, based on the full run's version) and keeps the full run;
    its output is merged again with the next runs, until they reach 1/ratio of the full run's
    bytes and a full compaction follows. Every version restores what it did and verifies."""
    store = CheckpointStore(tmp_path, max_runs=None, compaction_size_ratio=4)
    m, rng = Model(), random.Random(8)
    kgs = list(range(32))
    m.mutate(rng, kgs, 3000)
    for kg in kgs:  # entries the changes never touch
        m.state["a"][kg].update({ekey(kg, k): bytes(8) for k in range(100, 200)})
    store.commit(0, [store.write_snapshot(m.snapshot((0, 31), False), 0)])
    m.complete(0)
    base = store.manifest(0)["files"][0]
    history = {0: m.expected(kgs)}
    kinds = []
    for v in range(1, 40):
        m.mutate(rng, kgs, 40)
        store.commit(v, [store.write_snapshot(m.snapshot((0, 31), True), v)])
        m.complete(v)
        history[v] = m.expected(kgs)
        if store.describe(v)["max_runs_per_key_group"] > 3:
            files = store.compact(v, max_runs=3)["files"]
            kinds.append([f["kind"] for f in files])
            if len(files) == 2:  # minor: the full run kept under the merged changes
                top, full = files
                assert top["kind"] == "incremental" and full == base
                assert top["base_version"] == base["version"] and top["seq"] == v + 1
                assert sum(top["tombstones"].values()) > 0
            else:
                (base,) = files
        for w in (v - 1, v):
            store.verify(w)
            with store.open(w) as r:
                assert read_all(r) == history[w], w
    assert ["incremental", "full"] in kinds and ["full"] in kinds
    assert kinds.index(["full"]) > kinds.index(["incremental", "full"])


def test_minor_compaction_only_where_it_meets_max_runs_and_the_ratio(tmp_path):
    """``max_runs=1`` and ``compaction_size_ratio=None`` compact full; a bad ratio is
    refused."""
    for ratio, max_runs in ((4, 1), (None, 2)):
        store = CheckpointStore(tmp_path / f"{ratio}-{max_runs}", max_runs=None,
                                compaction_size_ratio=ratio)
        assert store.compaction_size_ratio == ratio
        m, rng = Model(), random.Random(9)
        m.mutate(rng, [0, 1], 2000)
        store.commit(0, [store.write_snapshot(m.snapshot((0, 1), False), 0)])
        m.complete(0)
        for v in (1, 2, 3):
            m.mutate(rng, [0, 1], 5)
            store.commit(v, [store.write_snapshot(m.snapshot((0, 1), True), v)])
            m.complete(v)
        assert [f["kind"] for f in store.compact(3, max_runs=max_runs)["files"]] == ["full"]
        with store.open(3) as r:
            assert read_all(r) == m.expected([0, 1])
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(InvalidInputError, match="compaction_size_ratio"):
            CheckpointStore(tmp_path / "bad", compaction_size_ratio=bad)


def _history_over_a_split(root, pad=False):
    """A store at ``root`` with versions 0 (full) to 4 (incremental) over key groups 0..31 and
    5: an incremental run of 0..15 and a full one of 16..31; returns it and ``{version:
    expected contents}``. ``pad``: version 0 also holds entries no change touches, many more
    bytes than the changes."""
    store = CheckpointStore(root, max_runs=None)
    m, rng = Model(), random.Random(33)
    kgs = list(range(32))
    m.mutate(rng, kgs, 300)
    if pad:
        for kg in kgs:
            m.state["a"].setdefault(kg, {}).update(
                {ekey(kg, k): bytes(16) for k in range(100, 400)})
    store.commit(0, [store.write_snapshot(m.snapshot((0, 31), False), 0)])
    m.complete(0)
    history = {0: m.expected(kgs)}
    for v in range(1, 6):
        m.mutate(rng, kgs, 60)
        if v < 5:
            snaps = [m.snapshot((0, 31), True)]
        else:
            snaps = [m.snapshot((0, 15), True), m.snapshot((16, 31), False)]
        store.commit(v, [store.write_snapshot(s, v, f"w{i}") for i, s in enumerate(snaps)])
        m.complete(v)
        history[v] = m.expected(kgs)
    return store, history


@pytest.mark.parametrize("minor", [False, True])
def test_compaction_reaches_the_later_versions_chained_onto_its_runs(tmp_path, minor):
    """Compacting version 3 after 4 and 5 were committed on top of it (a background compaction
    slower than the commits) replaces the merged runs in 4 and 5 too, their own runs kept
    above the compacted one -- a full run, or (``minor``) the merged incremental runs over
    version 0's full run; every version restores what it did, and retention then needs only
    the runs of the newest."""
    store, history = _history_over_a_split(tmp_path, pad=minor)
    assert store.describe(5)["max_runs_per_key_group"] == 6
    base = store.manifest(0)["files"]
    store.compact(3, max_runs=2 if minor else 1)
    out, *below = store.manifest(3)["files"]
    assert below == (base if minor else [])
    assert out["kind"] == ("incremental" if minor else "full") and out["seq"] == 4
    assert [f["path"] for f in store.manifest(4)["files"]][1:] == [out["path"]] + [
        f["path"] for f in below]
    five = store.manifest(5)["files"]
    assert out["path"] in {f["path"] for f in five} and len(five) == 4 + len(below)
    assert store.describe(5)["max_runs_per_key_group"] == 3 + len(below)
    for v, want in history.items():
        store.verify(v)
        with store.open(v) as r:
            assert read_all(r) == want, v
    store.retain(1)
    files = {p.relative_to(tmp_path).as_posix() for p in (tmp_path / "data").rglob("*.sckp")}
    assert files == {f["path"] for f in five}
    with store.open(5) as r:
        assert read_all(r) == history[5]


def test_compaction_leaves_later_versions_whose_chains_differ(tmp_path):
    """Version 4 was compacted first (its chain no longer holds version 3's runs): compacting
    3 then replaces 3's manifest alone."""
    store, history = _history_over_a_split(tmp_path)
    store.compact(4, max_runs=1)
    later = {v: store.manifest(v)["checksum_xxh64"] for v in (4, 5)}
    store.compact(3, max_runs=1)
    assert len(store.manifest(3)["files"]) == 1
    assert {v: store.manifest(v)["checksum_xxh64"] for v in (4, 5)} == later
    for v, want in history.items():
        with store.open(v) as r:
            assert read_all(r) == want, v


def test_store_block_target_reaches_writes_and_compactions(tmp_path):
    """A store's ``block_target_bytes`` cuts the blocks of every run it writes (synchronous,
    asynchronous, compacted) unless a write gives its own; readers need no setting."""
    kgs = list(range(8))
    counts = {}
    for target in (fmt.DEFAULT_BLOCK_TARGET_BYTES, 32):
        m, rng = Model(), random.Random(5)
        m.mutate(rng, kgs, 400)
        store = CheckpointStore(tmp_path / str(target), max_runs=None, block_target_bytes=target)
        assert store.block_target_bytes == target
        d0 = store.write_snapshot(m.snapshot((0, 7), False), 0)
        own = store.write_snapshot(m.snapshot((0, 7), False), 0, "own",
                                   block_target_bytes=fmt.DEFAULT_BLOCK_TARGET_BYTES)
        store.commit(0, [d0])
        m.complete(0)
        m.mutate(rng, kgs, 200)
        store.commit(1, [store.write_snapshot_async(m.snapshot((0, 7), True), 1).result()])
        d1 = store.manifest(1)["files"][-1]
        m.complete(1)
        compacted = store.compact(1, max_runs=1)["files"][0]
        assert compacted["kind"] == "full"
        counts[target] = (d0["blocks"], d1["blocks"], compacted["blocks"], own["blocks"])
        with store.open(1) as r:
            assert read_all(r) == m.expected(kgs)
    big, small = counts[fmt.DEFAULT_BLOCK_TARGET_BYTES], counts[32]
    assert all(s > 2 * b for s, b in zip(small[:3], big[:3])), counts
    assert small[3] == big[3]
    for bad in (0, -1, 1.5, True, "16KiB", None):
        with pytest.raises(InvalidInputError, match="block_target_bytes"):
            CheckpointStore(tmp_path / "bad", block_target_bytes=bad)


def test_commit_compacts_automatically_sync_and_async(tmp_path):
    for background in (False, True):
        root = tmp_path / str(background)
        store = CheckpointStore(root, max_runs=3, background_compaction=background)
        m, rng = Model(), random.Random(3)
        m.mutate(rng, list(range(8)), 50)
        store.commit(0, [store.write_snapshot(m.snapshot((0, 7), False), 0)])
        m.complete(0)
        for v in range(1, 10):
            m.mutate(rng, list(range(8)), 10)
            store.commit(v, [store.write_snapshot(m.snapshot((0, 7), True), v)])
            m.complete(v)
            store.close()  # waits for a background compaction
            assert store.describe(v)["max_runs_per_key_group"] <= 3
            with store.open(v) as r:
                assert read_all(r) == m.expected(range(8))
    with pytest.raises(InvalidInputError):
        CheckpointStore(tmp_path, max_runs=0)
    with pytest.raises(InvalidInputError):
        store.compact(1, max_runs=True)


def test_compaction_does_not_publish_over_a_recommitted_version(tmp_path):
    store = CheckpointStore(tmp_path, max_runs=None)
    m, rng = Model(), random.Random(4)
    m.mutate(rng, [0, 1], 20)
    store.commit(0, [store.write_snapshot(m.snapshot((0, 1), False), 0)])
    m.complete(0)
    m.mutate(rng, [0, 1], 5)
    store.commit(1, [store.write_snapshot(m.snapshot((0, 1), True), 1)])
    real_manifest = store.manifest
    calls = []

    def racing_manifest(v):  # a replay re-commits version 1 while compaction writes
        calls.append(v)
        if len(calls) == 2:
            store.commit(1, [store.write_snapshot(m.snapshot((0, 1), False), 1)],
                         metadata={"replayed": True}, replace=True)
        return real_manifest(v)

    store.manifest = racing_manifest
    out = store.compact(1, max_runs=1)
    store.manifest = real_manifest
    assert out["metadata"] == {"replayed": True}
    assert "compacted_ms" not in store.manifest(1)
