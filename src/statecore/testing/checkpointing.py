"""One-call checkpoint part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``CheckpointStore.checkpoint``
snapshots, writes, commits and advances the backend's incremental base -- every version restores
to the state it was taken of, runs after the first are incremental and small, and a failed write
or commit leaves the base so that the next checkpoint is still complete.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from statecore.checkpoint.store import CheckpointStore
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import snapshot_dump

__all__ = ["CheckpointingConformance"]


class _FailingStore(CheckpointStore):
    """A store whose next write (``fail = "write"``: nothing written) or commit (``fail =
    "commit"``: the run is written, the manifest is not) raises OSError, once."""

    fail = None

    def write_snapshot(self, snap, version, writer="p0", **kw):
        if self.fail == "write":
            self.fail = None
            raise OSError("injected write failure")
        return super().write_snapshot(snap, version, writer, **kw)

    def commit(self, version, descriptors=None, metadata=None, **kw):
        if self.fail == "commit":
            self.fail = None
            raise OSError("injected commit failure")
        return super().commit(version, descriptors, metadata, **kw)


def _states(b):
    return (b.get_state(ValueStateDescriptor("v", "int64")),
            b.get_state(ListStateDescriptor("l", "string"), "int64"),
            b.get_state(MapStateDescriptor("m", "int64", "string")),
            b.get_state(ReducingStateDescriptor("s", "sum", "int64")))


def _change(b, rng):
    v, lst, m, s = _states(b)
    for _ in range(rng.randrange(5, 40)):
        b.set_current_key(rng.randrange(200))
        op = rng.randrange(6)
        if op == 0:
            v.update(rng.randrange(1000))
        elif op == 1:
            v.clear()
        elif op == 2:
            lst.set_current_namespace(rng.randrange(3))
            lst.add(f"e{rng.randrange(9)}")
        elif op == 3:
            m.put(rng.randrange(4), "x" * rng.randrange(5))
        elif op == 4:
            m.remove(rng.randrange(4))
        else:
            b.timers.register_event_time_timer(rng.randrange(10_000))
    keys = pa.array(rng.sample(range(200), 10), pa.int64())
    s.add_batch(keys, pa.array([rng.randrange(50) for _ in range(10)], pa.int64()))


def _top_run_kind(store, version):
    kinds = {r["kind"] for r in store.describe(version)["run_list"] if r["version"] == version}
    assert len(kinds) == 1, kinds
    return kinds.pop()


class CheckpointingConformance(ConformanceBase):
    """``CheckpointStore.checkpoint(backend, version)`` over this backend."""

    def _restored(self, store, version):
        fresh = self.new_backend()
        store.restore(fresh, version)
        return snapshot_dump(fresh.snapshot())

    def test_checkpoint_loop_restores_every_version(self, tmp_path):
        rng = random.Random(7)
        store = CheckpointStore(str(tmp_path / "ckpt"), max_runs=None)  # kinds as written
        b = self.new_backend()
        expected = {}
        for version in range(1, 11):
            _change(b, rng)
            manifest = store.checkpoint(b, version, metadata={"batch": version})
            assert manifest["version"] == version
            expected[version] = snapshot_dump(b.snapshot())
            assert _top_run_kind(store, version) == ("full" if version == 1 else "incremental")
            assert store.metadata(version) == {"batch": version}
        for version, dump in expected.items():
            assert self._restored(store, version) == dump, version
        # incremental=False takes a full run, and the next one is incremental again.
        _change(b, rng)
        store.checkpoint(b, 11, incremental=False)
        assert _top_run_kind(store, 11) == "full"
        _change(b, rng)
        store.checkpoint(b, 12)
        assert _top_run_kind(store, 12) == "incremental"
        assert self._restored(store, 12) == snapshot_dump(b.snapshot())

    def test_checkpoint_incremental_runs_are_small(self, tmp_path):
        store = CheckpointStore(str(tmp_path / "ckpt"))
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        keys = pa.array(range(20_000), pa.int64())
        v.put_batch(keys, keys)
        store.checkpoint(b, 1)
        changed = pa.array(range(0, 20_000, 100), pa.int64())  # 1% of the keys
        v.put_batch(changed, pa.array([-1] * len(changed), pa.int64()))
        store.checkpoint(b, 2)
        full, inc = store.describe(1)["bytes_added"], store.describe(2)["bytes_added"]
        assert inc * 20 < full, (inc, full)
        assert self._restored(store, 2) == snapshot_dump(b.snapshot())

    @pytest.mark.parametrize("failing", ["write", "commit"])
    def test_failed_checkpoint_leaves_the_base(self, tmp_path, failing):
        rng = random.Random(11)
        store = _FailingStore(str(tmp_path / "ckpt"))
        b = self.new_backend()
        _change(b, rng)
        store.checkpoint(b, 1)
        base = b.base_snapshot_id
        _change(b, rng)  # these changes go into the failed checkpoint only
        store.fail = failing
        with pytest.raises(OSError, match="injected"):
            store.checkpoint(b, 2)
        assert b.base_snapshot_id == base
        assert store.versions() == [1]
        _change(b, rng)
        store.checkpoint(b, 3)
        assert _top_run_kind(store, 3) == "incremental"
        assert self._restored(store, 3) == snapshot_dump(b.snapshot())
        # Retrying the failed version below a newer one is refused unless asked for; then it
        # is no chain of this backend: full.
        _change(b, rng)
        base = b.base_snapshot_id
        with pytest.raises(InvalidInputError, match="not above the latest committed version 3"):
            store.checkpoint(b, 2)
        assert b.base_snapshot_id == base and store.versions() == [1, 3]
        store.checkpoint(b, 2, replace=True)
        assert _top_run_kind(store, 2) == "full"
        assert self._restored(store, 2) == snapshot_dump(b.snapshot())
        _change(b, rng)
        store.checkpoint(b, 4)
        assert _top_run_kind(store, 4) == "full"  # version 3 lies between 2 and 4
        assert self._restored(store, 4) == snapshot_dump(b.snapshot())

    def test_checkpoint_is_full_when_the_base_is_no_version_of_the_store(self, tmp_path):
        rng = random.Random(3)
        store = CheckpointStore(str(tmp_path / "ckpt"))
        b = self.new_backend()
        _change(b, rng)
        store.checkpoint(b, 1)
        # Restored: the base is the restored state, not a version this store committed for it.
        fresh = self.new_backend()
        store.restore(fresh, 1)
        _change(fresh, rng)
        store.checkpoint(fresh, 2)
        assert _top_run_kind(store, 2) == "full"
        # b's base is version 1, but version 2 (another writer's) lies in between.
        _change(b, rng)
        store.checkpoint(b, 3)
        assert _top_run_kind(store, 3) == "full"
        # Restored right after its checkpoint: the same base_snapshot_id, yet another base.
        sid = b.base_snapshot_id
        reader = store.open(2)
        b.restore(reader)
        reader.release()
        assert b.base_snapshot_id == sid
        _change(b, rng)
        store.checkpoint(b, 4)
        assert _top_run_kind(store, 4) == "full"
        assert self._restored(store, 4) == snapshot_dump(b.snapshot())
