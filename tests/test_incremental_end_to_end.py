"""Incremental checkpoints end to end with the real backends: random histories (fixed seeds) are
checkpointed every step through a real CheckpointStore — a full run first, then incremental runs,
with some checkpoints failing before their commit (never notified) — and every retained version
restores, into both backends and at another parallelism, to exactly the state the backend had
when that version's snapshot was taken."""

import importlib.util
import random

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
    create_backend,
    key_group_range_for_operator,
)
from statecore.testing.conformance import snapshot_dump
from support.fs_wrappers import LocalDelegatingHandler

KINDS = ["python"] + (["native"] if importlib.util.find_spec("statecore._native") else [])


def _states(b):
    return (b.get_state(ValueStateDescriptor("v", "int64")),
            b.get_state(ListStateDescriptor("l", "string")),
            b.get_state(MapStateDescriptor("m", "int64", "pickle")),
            b.get_state(ReducingStateDescriptor("s", "sum", "int64")))


def _step(b, rng, keys):
    v, lst, m, s = _states(b)
    for _ in range(rng.randrange(1, 40)):
        k = rng.choice(keys)
        b.set_current_key(k)
        op = rng.randrange(7)
        if op == 0:
            v.update(rng.randrange(1000))
        elif op == 1:
            v.clear()
        elif op == 2:
            lst.add(f"e{rng.randrange(50)}")
        elif op == 3:
            m.put(rng.randrange(5), {"x": rng.randrange(9)})
        elif op == 4:
            m.remove(rng.randrange(5))
        elif op == 5:
            b.timers.register_event_time_timer(rng.randrange(10_000))
        else:
            lst.clear()
    batch = pa.array(rng.sample(keys, 8), pa.int64())
    s.add_batch(batch, pa.array([rng.randrange(100) for _ in range(8)], pa.int64()))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_incremental_checkpoints_restore_every_version(tmp_path, kind, seed):
    rng = random.Random(seed)
    keys = list(range(300))
    store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=4)
    b = create_backend(kind, key_type="int64")
    _states(b)
    expected = {}
    committed = []
    for version in range(1, 16):
        _step(b, rng, keys)
        snap = b.snapshot(incremental=bool(committed))
        expected[version] = snapshot_dump(b.snapshot())
        desc = store.write_snapshot(snap, version, writer="p0")
        if rng.random() < 0.2 and committed:
            continue  # crashed before the commit: never notified, the next run must cover it
        store.commit(version, [desc])
        b.notify_checkpoint_complete(snap.snapshot_id, version)
        committed.append(version)
        if version % 5 == 0:
            store.retain(4)
    retained = store.versions()
    assert retained == committed[-len(retained):] and len(retained) >= 2
    for version in retained:
        for restore_kind in KINDS:
            fresh = create_backend(restore_kind, key_type="int64")
            store.restore(fresh, version)
            assert snapshot_dump(fresh.snapshot()) == expected[version], (version, restore_kind)
        # Rescaled: three operators together hold exactly the same entries.
        parts = {}
        for i in range(3):
            op = create_backend(kind, key_type="int64",
                                key_group_range=key_group_range_for_operator(128, 3, i))
            store.restore(op, version)
            for name, per in snapshot_dump(op.snapshot()).items():
                parts.setdefault(name, {}).update(per)
        assert parts == expected[version]
    # The chain of runs stays bounded by compaction.
    assert store.describe(retained[-1])["max_runs_per_key_group"] <= 4


@pytest.mark.parametrize("kind", KINDS)
def test_incremental_bytes_follow_the_change_set(tmp_path, kind):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    b = create_backend(kind, key_type="int64")
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(50_000), pa.int64())
    st.put_batch(keys, keys)
    full = b.snapshot()
    d1 = store.write_snapshot(full, 1)
    store.commit(1, [d1])
    b.notify_checkpoint_complete(full.snapshot_id, 1)
    changed = pa.array(range(0, 50_000, 100), pa.int64())  # 1% of the keys
    st.put_batch(changed, pa.array([7] * len(changed), pa.int64()))
    inc = b.snapshot(incremental=True)
    d2 = store.write_snapshot(inc, 2)
    store.commit(2, [d2])
    assert d2["size"] * 20 < d1["size"], (d2["size"], d1["size"])
    fresh = create_backend(kind, key_type="int64")
    store.restore(fresh, 2)
    assert fresh.get_state(ValueStateDescriptor("v", "int64")).get_batch(
        pa.array([0, 1, 100], pa.int64())).to_pylist() == [7, 1, 7]


class _FailingWrites(LocalDelegatingHandler):
    """Local disk; the next output stream whose path contains ``fail`` raises OSError once it
    would pass its first 64 bytes (a write that dies half way)."""

    type_name = "failing-writes"

    def __init__(self):
        super().__init__()
        self.fail = None
        self.doomed = None

    def before_write(self, stream, data):
        if self.fail is not None and self.fail in stream.path:
            self.doomed, self.fail = stream, None
        if stream is self.doomed and stream.written + len(data) > 64:
            raise OSError("injected: disk full")


@pytest.mark.parametrize("kind", KINDS)
def test_one_call_checkpoints_survive_failing_writes(tmp_path, kind):
    """CheckpointStore.checkpoint in a loop over random histories, with data-file and manifest
    writes dying half way now and then: every committed version restores to the state it was
    taken of, and the checkpoint after a failure is still incremental and complete."""
    rng = random.Random(5)
    handler = _FailingWrites()
    store = CheckpointStore(str(tmp_path / "ckpt"), filesystem=pafs.PyFileSystem(handler),
                            max_runs=None)
    b = create_backend(kind, key_type="int64")
    _states(b)
    expected, failed = {}, 0
    for version in range(1, 21):
        _step(b, rng, list(range(300)))
        if version > 1 and rng.random() < 0.3:
            handler.fail = rng.choice([".sckp", "manifest-"])
            base = b.base_snapshot_id
            with pytest.raises(OSError, match="injected"):
                store.checkpoint(b, version)
            assert b.base_snapshot_id == base and not store.is_committed(version)
            failed += 1
            continue
        store.checkpoint(b, version)
        expected[version] = snapshot_dump(b.snapshot())
        kinds = {r["kind"] for r in store.describe(version)["run_list"]
                 if r["version"] == version}
        assert kinds == {"full" if version == 1 else "incremental"}
    assert failed >= 3 and store.versions() == sorted(expected)
    for version, dump in expected.items():
        fresh = create_backend(kind, key_type="int64")
        store.restore(fresh, version)
        assert snapshot_dump(fresh.snapshot()) == dump, version
