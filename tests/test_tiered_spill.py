"""Spill runs of the tiered mode (statecore.backends.tiered_spill, docs/tiered.md "Spill"): when
the entries changed since the attached version exceed the budget they go to local runs, memory
stays within the budget, reads and checkpoints see them, and the published runs equal those of a
backend that never spilled."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

pytest.importorskip("statecore._native")

from statecore import create_backend  # noqa: E402
from statecore.checkpoint import CheckpointStore  # noqa: E402
from statecore.checkpoint.format import DataFileReader  # noqa: E402
from statecore.descriptors import (  # noqa: E402
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import CheckpointIOError  # noqa: E402
from statecore.ttl import StateTtlConfig  # noqa: E402
from test_tiered import CKEYS, ENTRY, KEYS, TieredPair, _CollectionPair  # noqa: E402


class _SpillPair(TieredPair):
    """:class:`test_tiered.TieredPair` with a checkpoint whose snapshot is taken at one step
    (``begin``) and written, committed and completed at a later one (``end``), the steps in
    between writing (and spilling) meanwhile."""

    in_flight = None

    def run(self, op):
        if op[0] == "begin":
            if self.in_flight is None:
                self.in_flight = self.b.snapshot(incremental=self.version > 0)
            return
        if op[0] == "end":
            snap, self.in_flight = self.in_flight, None
            if snap is not None:
                self.version += 1
                desc = self.store.write_snapshot(snap, self.version)
                manifest = self.store.commit(self.version, [desc])
                self.b.notify_checkpoint_complete(snap.snapshot_id, self.version,
                                                  manifest.get("commit_id"))
                snap.release()
            return
        if op[0] in ("checkpoint", "restore"):
            self.run(("end",))
        super().run(op)


def _dirty_heavy_ops(rng: random.Random, n: int) -> list:
    """Mostly writes and removals over KEYS keys, with reads, listings and few checkpoints
    (every ~30 ops on average), some of them in flight across later writes."""
    key = lambda: rng.randrange(KEYS)  # noqa: E731
    ops = []
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            ops.append(("put", [(key(), None if rng.random() < 0.15 else rng.randint(-99, 99))
                                for _ in range(rng.randint(1, 24))]))
        elif r < 0.4:
            ops.append(("add", [(key(), rng.randint(-5, 5)) for _ in range(rng.randint(1, 24))]))
        elif r < 0.5:
            ops.append(("agg", [(key(), None if rng.random() < 0.1 else rng.randint(-5, 5))
                                for _ in range(rng.randint(1, 24))]))
        elif r < 0.58:
            ops.append(("clear", [key() for _ in range(rng.randint(1, 8))]))
        elif r < 0.7:
            ops.append(("record", key(), None if rng.random() < 0.2 else rng.randrange(10)))
        elif r < 0.8:
            ops.append(("get", [key() for _ in range(rng.randint(1, 24))]))
        elif r < 0.84:
            ops.append(("keys",))
        elif r < 0.86:
            ops.append(("apply", rng.randint(1, 3)))
        elif r < 0.9:
            ops.append(("advance", rng.randint(0, 40)))
        elif r < 0.93:
            ops.append(("begin",))
        elif r < 0.96:
            ops.append(("end",))
        elif r < 0.985:
            ops.append(("checkpoint",))
        else:
            ops.append(("restore",))
    return ops


@pytest.mark.parametrize("seed, budget", [(1, 8 * ENTRY), (2, 40 * ENTRY)])
def test_dirty_heavy_workloads_spill_and_match_the_in_memory_backend(tmp_path, seed, budget):
    """Every op's result equals the in-memory backend's, memory stays within the budget after
    every op (checked by TieredPair), the workload spills, and the end state -- read in full, and
    restored from the last committed version into an in-memory backend -- is the same."""
    pair = _SpillPair(tmp_path / "store", budget)
    try:
        for op in _dirty_heavy_ops(random.Random(seed), 60):
            pair.run(op)
        assert pair.spills > 0
        keys = pa.array(range(KEYS), pa.int64())
        for x, y in zip(pair.states(pair.b), pair.states(pair.ref)):
            assert pair.b.keys(x.name) == pair.ref.keys(y.name)
            assert x.get_batch(keys).to_pylist() == y.get_batch(keys).to_pylist()
        pair.run(("checkpoint",))
        plain = create_backend("native", key_type="int64", ttl_clock=pair.clock)
        pair.store.restore(plain)
        for x, y in zip(pair.states(plain), pair.states(pair.ref)):
            assert plain.keys(x.name) == pair.ref.keys(y.name)
            assert x.get_batch(keys).to_pylist() == y.get_batch(keys).to_pylist()
        plain.dispose()
    finally:
        pair.b.dispose()
        pair.ref.dispose()
        pair.store.close()


class _CollectionSpillPair(_SpillPair, _CollectionPair):
    """:class:`_SpillPair` over the list and map states of :class:`test_tiered._CollectionPair`
    (the TTL'd list with incremental cleanup): after every op memory is within the budget and
    no eviction check ended above it. The keys of the TTL'd list are not compared: they
    include the expired lists incremental cleanup has not reached, and its steps visit the
    entries memory holds."""

    def states(self, b):
        lst, _, m, mt, ln = super().states(b)
        ttl = StateTtlConfig(50, update_type="OnReadAndWrite", cleanup_incrementally=2)
        return (lst, b.get_state(ListStateDescriptor("lt", "int64").enable_time_to_live(ttl)),
                m, mt, ln)

    def _apply(self, b, op):
        if op[0] == "keys":
            return [b.keys(x.name) for x in self.states(b) if x.name != "lt"]
        return super()._apply(b, op)

    def run(self, op):
        super().run(op)
        stats = self.b.tiered_statistics()
        assert self.b.state_bytes() <= self.budget, op
        assert stats["over_budget_batches"] == 0, op
        self.spills += stats["spills"] - self._spills_seen
        self._spills_seen = stats["spills"]
        self.evicted = getattr(self, "evicted", 0) + stats["evicted_collections"] - \
            getattr(self, "_evicted_seen", 0)
        self._evicted_seen = stats["evicted_collections"]

    def _new(self):
        self._evicted_seen = 0
        return super()._new()


def _collection_ops(rng: random.Random, n: int) -> list:
    """List and map ops of test_tiered._CollectionPair over CKEYS keys, mostly writes and
    removals, with reads, listings and few checkpoints, some in flight across later writes."""
    key = lambda: rng.randrange(CKEYS)  # noqa: E731
    ops = []
    for _ in range(n):
        r = rng.random()
        if r < 0.2:
            ops.append(("append", [(key(), rng.randint(-99, 99))
                                   for _ in range(rng.randint(1, 30))]))
        elif r < 0.38:
            ops.append(("mput", [(key(), rng.randrange(7), rng.randint(-9, 9))
                                 for _ in range(rng.randint(1, 20))]))
        elif r < 0.46:
            ops.append(("mremove", [(key(), rng.randrange(7)) for _ in range(rng.randint(1, 8))]))
        elif r < 0.52:
            ops.append(("clear", [key() for _ in range(rng.randint(1, 5))]))
        elif r < 0.64:
            ops.append(("record", key(), rng.randrange(10)))
        elif r < 0.69:
            ops.append(("merge", key(), rng.randrange(4), rng.randrange(4)))
        elif r < 0.75:
            ops.append(("lget", [key() for _ in range(rng.randint(1, 12))]))
        elif r < 0.8:
            ops.append(("mget", [(key(), rng.randrange(7)) for _ in range(rng.randint(1, 12))]))
        elif r < 0.83:
            ops.append(("keys",))
        elif r < 0.85:
            ops.append(("apply", rng.randint(1, 3)))
        elif r < 0.9:
            ops.append(("advance", rng.randint(0, 30)))
        elif r < 0.93:
            ops.append(("begin",))
        elif r < 0.96:
            ops.append(("end",))
        elif r < 0.985:
            ops.append(("checkpoint",))
        else:
            ops.append(("restore",))
    return ops


def _collections_of(b, states) -> list:
    """Every list and map of ``states`` of ``b`` (maps as sorted items) and the keys of each
    state but the TTL'd list's (_CollectionSpillPair). The reads remove the expired entries
    they find."""
    keys = pa.array(range(CKEYS), pa.int64())
    lst, lt, m, mt, ln = states
    out = [b.keys(x.name) for x in states if x is not lt]
    out += [lst.get_batch(keys).to_pylist(), lt.get_batch(keys).to_pylist()]
    for k in range(CKEYS):
        b.set_current_key(k)
        out.append((sorted(m.items()), sorted(mt.items()),
                    [ln.set_current_namespace(n) or ln.get() for n in range(4)]))
    return out


@pytest.mark.parametrize("seed, budget", [(3, 300), (4, 900)])
def test_list_and_map_changes_spill_and_match_the_in_memory_backend(tmp_path, seed, budget):
    """List and map states (per record and batch, TTL'd or not, incremental cleanup,
    merge_namespaces, keys and apply_to_all_keys) with a budget of a few entries: their
    changes spill, their collections are evicted whole and reloaded from the spill runs and
    the attached version, memory stays within the budget after every op, every op's result
    and the end state equal the in-memory backend's, and the last committed version restores
    into an in-memory backend to that state."""
    pair = _CollectionSpillPair(tmp_path / "store", budget)
    try:
        for op in _collection_ops(random.Random(seed), 40):
            pair.run(op)
        assert pair.spills > 0 and pair.evicted > 0
        want = _collections_of(pair.ref, pair.states(pair.ref))
        assert _collections_of(pair.b, pair.states(pair.b)) == want
        pair.run(("checkpoint",))
        want = _collections_of(pair.ref, pair.states(pair.ref))
        plain = create_backend("native", key_type="int64", ttl_clock=pair.clock)
        pair.store.restore(plain)
        assert _collections_of(plain, pair.states(plain)) == want
        plain.dispose()
    finally:
        pair.b.dispose()
        pair.ref.dispose()
        pair.store.close()


def test_list_and_map_changes_alone_over_the_budget_spill(tmp_path):
    """Appends and puts between checkpoints many times the budget, into a fresh backend and
    then one attached to a version: no eviction check ends above the budget (the changes
    spill and their collections are evicted), and each checkpoint restores to what was
    written."""
    store = CheckpointStore(tmp_path / "store")
    b = create_backend("native", key_type="int64", memory_budget=2000, checkpoint=store,
                       spill_dir=str(tmp_path / "spill"))
    rng = random.Random(7)
    want_l: dict = {}
    want_m: dict = {}
    for version in (1, 2):
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "int64", "int64"))
        for _ in range(12):
            keys = [rng.randrange(60) for _ in range(80)]
            vals = [rng.randrange(1000) for _ in range(80)]
            lst.append_batch(pa.array(keys, pa.int64()), pa.array(vals, pa.int64()))
            m.put_batch(pa.array(keys, pa.int64()), pa.array(vals, pa.int64()),
                        pa.array(keys, pa.int64()))
            for k, x in zip(keys, vals):
                want_l.setdefault(k, []).append(x)
                want_m.setdefault(k, {})[x] = k
        stats = b.tiered_statistics()
        assert stats["over_budget_batches"] == 0 and stats["spills"] > 0
        assert stats["evicted_collections"] > 0 and b.state_bytes() <= 2000
        store.checkpoint(b, version)
        plain = create_backend("native", key_type="int64")
        store.restore(plain)
        pl = plain.get_state(ListStateDescriptor("l", "int64"))
        pm = plain.get_state(MapStateDescriptor("m", "int64", "int64"))
        assert pl.get_batch(pa.array(range(60), pa.int64())).to_pylist() == \
            [want_l.get(k) for k in range(60)]
        for k in range(60):
            plain.set_current_key(k)
            assert dict(pm.items()) == want_m.get(k, {})
        plain.dispose()
        if version == 1:
            b.dispose()
            b = create_backend("native", key_type="int64", memory_budget=2000,
                               checkpoint=store, spill_dir=str(tmp_path / "spill"))
            store.restore(b)
    b.dispose()


def test_spill_runs_prefix_entries_merge_the_runs_newest_wins(tmp_path):
    """SpillRuns.prefix_entries over three runs of a list state's changes (appends and clears,
    few key groups so a group holds many chunks): its values are the live chunks under the
    prefixes asked -- one prefix, many, an absent one -- and its tombstones the chunks the
    newest run holding them removed."""
    from statecore.backends.tiered_spill import SpillRuns
    from statecore.serializers import LIST_SEQ_BYTES

    b = create_backend("native", key_type="int64", max_parallelism=2)
    lst = b.get_state(ListStateDescriptor("l", "int64"))
    runs = SpillRuns(str(tmp_path))
    rng = random.Random(9)
    try:
        for _ in range(3):
            for _ in range(8):
                keys = pa.array([rng.randrange(50) for _ in range(20)], pa.int64())
                lst.append_batch(keys, pa.array(range(20), pa.int64()))
            lst.clear_batch(pa.array([rng.randrange(50) for _ in range(6)], pa.int64()))
            snap = b.snapshot(incremental=True)
            assert runs.write(snap, ["l"]) is not None
            b.notify_checkpoint_complete(snap.snapshot_id)
            snap.release()
        full = b.snapshot()
        live = {k: v for kg in range(2) for k, v in zip(*(a.to_pylist() for a in
                                                          full.entries("l", kg)))}
        full.release()
        every = sorted({k[:-LIST_SEQ_BYTES] for r in runs.runs for kg in range(2)
                        for k in r.reader().entries("l", kg)[0].to_pylist()})
        pw = b.key_prefix_width
        for asked in ([every[3]], every, every[::3] + [every[0][:pw] + b"\xff" * 9]):
            keys, values = runs.prefix_entries("l", asked, pw)
            got = dict(zip(keys.to_pylist(), values.to_pylist()))
            assert {k: v for k, v in got.items() if v is not None} == \
                {k: v for k, v in live.items() if k[:-LIST_SEQ_BYTES] in asked}
            assert all(k not in live for k, v in got.items() if v is None)
            assert keys.to_pylist() == sorted(got)
        assert sum(v is None for v in got.values()) > 0
    finally:
        runs.close()
        b.dispose()


def _run_entries(store: CheckpointStore, root, version: int) -> dict:
    """{(state, key group): (keys, values)} of the run written for ``version``."""
    (run,) = [f for f in store.manifest(version)["files"] if f["version"] == version]
    rd = DataFileReader(pa.OSFile(os.path.join(root, run["path"]), "rb"), run["path"])
    try:
        return {(s, kg): tuple(a.to_pylist() for a in rd.entries(s, kg))
                for s in ("v", "s", "l", "m") for kg in range(128)}
    finally:
        rd.close()


def test_the_published_run_is_the_one_an_unspilled_backend_writes(tmp_path):
    """The same writes into a tiered backend that spills (a budget of 4 entries) and one whose
    budget holds everything: each checkpoint's run lists the same keys, values and tombstones
    -- list chunks (appends continuing a spilled and reloaded list, clears) and map user keys
    (puts, removals, clears) included."""
    rng = random.Random(5)
    pairs = []
    for name, budget in (("small", 4 * ENTRY), ("large", 1 << 30)):
        store = CheckpointStore(tmp_path / name)
        b = create_backend("native", key_type="int64", memory_budget=budget, checkpoint=store,
                           spill_dir=str(tmp_path / f"spill-{name}"))
        pairs.append((store, b, tmp_path / name))
    batches = [[(rng.randrange(300), None if rng.random() < 0.2 else rng.randrange(50))
                for _ in range(60)] for _ in range(12)]
    for i, batch in enumerate(batches):
        keys = pa.array([k for k, _ in batch], pa.int64())
        vals = pa.array([x for _, x in batch], pa.int64())
        for store, b, _ in pairs:
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
            lst = b.get_state(ListStateDescriptor("l", "int64"))
            m = b.get_state(MapStateDescriptor("m", "int64", "int64"))
            v.put_batch(keys, vals)
            s.add_batch(keys, pa.array([1] * len(batch), pa.int64()))
            lst.append_batch(keys.slice(0, 20), pa.array(range(20), pa.int64()))
            m.put_batch(keys.slice(0, 20), pa.array([k % 5 for k in range(20)], pa.int64()),
                        pa.array(range(20), pa.int64()))
            m.remove_batch(keys.slice(20, 5), pa.array([i % 5] * 5, pa.int64()))
            if i % 4 == 3:
                s.clear_batch(keys.slice(0, 5))
                lst.clear_batch(keys.slice(5, 3))
                m.clear_batch(keys.slice(8, 3))
                store.checkpoint(b, i // 4 + 1)
    small, large = pairs
    assert small[1].tiered_statistics()["spills"] > 0
    assert small[1].tiered_statistics()["evicted_collections"] > 0
    assert large[1].tiered_statistics()["spills"] == 0
    for version in (1, 2, 3):
        assert _run_entries(small[0], small[2], version) == \
            _run_entries(large[0], large[2], version), version
    for _, b, _ in pairs:
        b.dispose()


def test_spill_files_are_private_and_go_with_the_checkpoint_and_the_close(tmp_path):
    """Spill files live under ``spill_dir`` only (never in the store), are deleted when a
    checkpoint holding them completes, and their directory when the backend is disposed; a
    snapshot being written keeps the runs it merges readable until it is released."""
    store = CheckpointStore(tmp_path / "store")
    spill = tmp_path / "spill"
    b = create_backend("native", key_type="int64", memory_budget=4 * ENTRY, checkpoint=store,
                       spill_dir=str(spill))
    v = b.get_state(ValueStateDescriptor("v", "int64"))

    def files():
        return sorted(f for _, _, fs in os.walk(spill) for f in fs if f != ".owner.lock")

    v.put_batch(pa.array(range(40), pa.int64()), pa.array(range(40), pa.int64()))
    assert files() == ["spill-000001.data"] and b.state_bytes() <= 4 * ENTRY
    store.checkpoint(b, 1)
    assert files() == [] and b.tiered_statistics()["spill_runs"] == 0
    assert not any("spill" in f for _, _, fs in os.walk(tmp_path / "store") for f in fs)
    v.put_batch(pa.array(range(40), pa.int64()), pa.array(range(1, 41), pa.int64()))
    snap = b.snapshot()
    desc = store.write_snapshot(snap, 2)
    v.put_batch(pa.array(range(40, 80), pa.int64()), pa.array(range(40), pa.int64()))
    assert files() == ["spill-000002.data", "spill-000003.data"]
    manifest = store.commit(2, [desc])
    b.notify_checkpoint_complete(snap.snapshot_id, 2, manifest.get("commit_id"))
    # Run 2 is held by version 2; the snapshot still pins it until released.
    assert files() == ["spill-000002.data", "spill-000003.data"]
    snap.release()
    assert files() == ["spill-000003.data"]
    got = v.get_batch(pa.array(range(80), pa.int64())).to_pylist()
    assert got == list(range(1, 41)) + list(range(40))
    b.dispose()
    assert not spill.exists() or os.listdir(spill) == []


def test_a_spill_that_cannot_be_written_raises_and_keeps_the_entries(tmp_path):
    """A spill directory that cannot be made: CheckpointIOError naming it; the call's writes
    stay in memory (over the budget) and a checkpoint publishes them."""
    store = CheckpointStore(tmp_path / "store")
    (tmp_path / "file").write_text("not a directory")
    b = create_backend("native", key_type="int64", memory_budget=4 * ENTRY, checkpoint=store,
                       spill_dir=str(tmp_path / "file" / "spill"))
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    with pytest.raises(CheckpointIOError, match="spill run"):
        v.put_batch(pa.array(range(20), pa.int64()), pa.array(range(20), pa.int64()))
    store.checkpoint(b, 1)
    fresh = create_backend("native", key_type="int64")
    store.restore(fresh)
    fv = fresh.get_state(ValueStateDescriptor("v", "int64"))
    assert fv.get_batch(pa.array(range(20), pa.int64())).to_pylist() == list(range(20))
    b.dispose()
    fresh.dispose()


def _worker():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "support"))
    import tiered_spill_worker

    return os.path.join(here, "support", "tiered_spill_worker.py"), tiered_spill_worker


def _contents(backend, w) -> dict:
    v, n = w.states(backend)
    keys = pa.array(range(w.KEYS), pa.int64())
    return {k: (x, c) for k, x, c in zip(range(w.KEYS), v.get_batch(keys).to_pylist(),
                                         n.get_batch(keys).to_pylist()) if x is not None}


@pytest.mark.slow
def test_sigkill_during_spills_and_checkpoints_keeps_the_last_committed_version(tmp_path):
    """A tiered worker that spills several runs per version (tests/support/
    tiered_spill_worker.py) is SIGKILLed at random moments (seeded) three times, each run
    attaching what the one before committed: after every kill the newest committed version is
    at least the last one reported, and restores -- into the in-memory backend, and attached by
    a tiered backend -- to exactly the state of that version; leftover spill files change
    nothing. Slow: each worker needs an interpreter start (~0.5 s idle) and a few versions."""
    path, w = _worker()
    rng = random.Random(20261129)
    store_path, spill = str(tmp_path / "store"), str(tmp_path / "spill")
    progressed = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, path, store_path, spill],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ), text=True)
        # Killed at a random moment of the versions after its first commit: spilling,
        # writing a run, committing or attaching.
        first = proc.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"worker ended by itself: {err[-2000:]}"
        done = [int(line.split()[1]) for line in (first + out).splitlines()
                if line.startswith("committed")]
        progressed += len(done)
        store = CheckpointStore(store_path)
        latest = store.latest_version()
        if done:
            assert latest >= done[-1]
        if latest is None:
            continue
        plain = create_backend("native", key_type="int64")
        store.restore(plain)
        assert _contents(plain, w) == w.expected(latest), latest
        plain.dispose()
        attached = create_backend("native", key_type="int64", memory_budget=w.BUDGET,
                                  checkpoint=store, spill_dir=str(tmp_path / "check"))
        store.restore(attached)
        assert _contents(attached, w) == w.expected(latest), latest
        attached.dispose()
    assert progressed >= 3, f"only {progressed} versions in 3 runs"
    # Each worker spilled after its first commit, removing the directories of the killed
    # workers before it: only the last one's is left.
    assert len(os.listdir(spill)) == 1


def test_spill_directories_of_ended_processes_are_removed_at_the_next_spill(tmp_path):
    """A spill directory whose owner ended (its lock file unlocked) goes when the next
    backend spills under the same parent; a live owner's directory and a directory without a
    lock file stay."""
    from statecore.backends.tiered_spill import remove_abandoned_spill_dirs

    parent = tmp_path / "spill"

    def spilling_backend(name):
        b = create_backend("native", key_type="int64", memory_budget=4 * ENTRY,
                           checkpoint=CheckpointStore(tmp_path / name), spill_dir=str(parent))
        return b, b.get_state(ValueStateDescriptor("v", "int64"))

    live, live_v = spilling_backend("store-live")
    live_v.put_batch(pa.array(range(40), pa.int64()), pa.array(range(40), pa.int64()))
    assert live.tiered_statistics()["spill_runs"] >= 1
    (live_dir,) = os.listdir(parent)
    abandoned = parent / "statecore-spill-dead"
    abandoned.mkdir()
    (abandoned / ".owner.lock").touch()
    (abandoned / "spill-000001.data").write_bytes(b"x")
    foreign = parent / "statecore-spill-foreign"
    foreign.mkdir()
    assert remove_abandoned_spill_dirs(str(parent)) == 1
    assert sorted(os.listdir(parent)) == sorted([live_dir, foreign.name])
    b, v = spilling_backend("store")
    (parent / "statecore-spill-dead2").mkdir()
    (parent / "statecore-spill-dead2" / ".owner.lock").touch()
    v.put_batch(pa.array(range(40), pa.int64()), pa.array(range(40), pa.int64()))
    assert b.tiered_statistics()["spill_runs"] >= 1
    assert len(os.listdir(parent)) == 3 and "statecore-spill-dead2" not in os.listdir(parent)
    b.dispose()
    live.dispose()
    assert os.listdir(parent) == [foreign.name]
