"""Compaction and retention under an attached tiered backend (docs/tiered.md "Compaction and
retention"): retention keeps the runs an attached backend reads, a chain past
``compact_max_runs`` is compacted in the background and the backend re-attaches to it, and a
process killed (SIGKILL) during a commit or a compaction leaves the last committed version
restorable."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

pytest.importorskip("statecore._native")

from statecore import create_backend  # noqa: E402
from statecore.checkpoint import CheckpointStore, compaction  # noqa: E402
from statecore.checkpoint.readers import CheckpointReader  # noqa: E402
from statecore.descriptors import ReducingStateDescriptor, ValueStateDescriptor  # noqa: E402
from statecore.errors import InvalidInputError  # noqa: E402
from statecore.ttl import ManualClock, StateTtlConfig  # noqa: E402
from support import tiered_kill_worker as w  # noqa: E402
from support.fs_wrappers import LocalDelegatingHandler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
#: Key and value bytes of an int64 -> int64 entry.
ENTRY = 18


def tiered(store, budget=8 * ENTRY, **kw):
    return create_backend("native", key_type="int64", memory_budget=budget, checkpoint=store,
                          **kw)


def _data_files(root) -> set[str]:
    out = set()
    for d, _, files in os.walk(os.path.join(root, "data")):
        out.update(os.path.relpath(os.path.join(d, f), root) for f in files)
    return out


def test_compact_max_runs_is_checked(tmp_path):
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(InvalidInputError, match="compact_max_runs"):
            tiered(CheckpointStore(tmp_path), compact_max_runs=bad)


@pytest.mark.parametrize("how", ["compacted", "superseded"])
def test_retention_keeps_the_runs_an_attached_backend_reads(tmp_path, how):
    """The attached version's runs stop being referenced -- its manifest now lists a compacted
    run, or a newer full version replaced it -- and retention runs: the backend's reader pins
    them until it detaches."""
    store = CheckpointStore(tmp_path, max_runs=None)
    writer = create_backend("native", key_type="int64")
    v = writer.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(300), pa.int64())
    for i in range(1, 4):
        v.put_batch(keys[(i - 1) * 100:], pa.array([i] * (400 - i * 100), pa.int64()))
        store.checkpoint(writer, i)
    b = tiered(store, compact_max_runs=None)
    store.restore(b)  # attached to version 3: nothing read yet
    old_runs = store.manifest(3)["files"]
    runs = {f["path"] for f in old_runs}
    if how == "compacted":
        store.compact(3, max_runs=1)
    else:
        full = create_backend("native", key_type="int64")
        store.restore(full, 3)
        store.checkpoint(full, 4)  # after a restore: a full run
    store.retain(1)
    assert runs.isdisjoint(f["path"] for f in store.manifest(store.latest_version())["files"])
    assert runs <= _data_files(tmp_path)
    got = b.get_state(ValueStateDescriptor("v", "int64")).get_batch(keys).to_pylist()
    assert got == [1] * 100 + [2] * 100 + [3] * 100
    b.dispose()  # detached: the pins go
    store.retain(1)
    # (Files of the newest retained version's directory stay anyway: writes in flight.)
    older = {f["path"] for f in old_runs if f["version"] < 3}
    assert len(older) == 2 and older.isdisjoint(_data_files(tmp_path))


@pytest.mark.parametrize("ratio", [None, 1])
def test_background_compaction_matches_the_in_memory_backend(tmp_path, ratio):
    """Random writes, removals and TTL expiry over six checkpoints; the chain is compacted in
    the background whenever it holds more than two runs (full compactions only, the TTL filter
    dropping expired values, or also minor ones: ``compaction_size_ratio=1`` and a state the
    changes never touch, so that they stay below the full run's bytes), the backend
    re-attaches, retention runs after every checkpoint; reads equal the in-memory backend's
    throughout."""
    clock = ManualClock(0)
    store = CheckpointStore(tmp_path, max_runs=None, ttl_clock=clock,
                            compaction_size_ratio=ratio)
    b = tiered(store, budget=24 * ENTRY, compact_max_runs=2, ttl_clock=clock)
    ref = create_backend("native", key_type="int64", ttl_clock=clock)
    ttl = StateTtlConfig(500, cleanup_in_compaction=10)
    descs = [ValueStateDescriptor("v", "int64"), ReducingStateDescriptor("r", "sum", "int64"),
             ValueStateDescriptor("t", "int64").enable_time_to_live(ttl)]
    pairs = [(b.get_state(d), ref.get_state(d)) for d in descs]
    rng = random.Random(20261129)
    every = pa.array(range(400), pa.int64())
    if ratio is not None:
        cold = pa.array(range(1000, 9000), pa.int64())
        for be in (b, ref):
            be.get_state(ValueStateDescriptor("cold", "int64")).put_batch(cold, cold)
    expired = 0
    minor = 0
    for version in range(1, 7):
        clock.advance(200)
        for _ in range(4):
            ks = pa.array(rng.sample(range(400), 40), pa.int64())
            vs = pa.array([rng.randrange(1000) for _ in range(40)], pa.int64())
            for i, (s, r) in enumerate(pairs):
                op = rng.random()
                for st in (s, r):
                    if i == 1:
                        st.add_batch(ks, vs)
                    elif op < 0.2:
                        st.clear_batch(ks)
                    else:
                        st.put_batch(ks, vs)
        store.checkpoint(b, version)
        store.retain(2)
        b.poll_compaction(wait=True)
        assert b.attached_runs() <= 2
        for s, r in pairs:
            assert s.get_batch(every).to_pylist() == r.get_batch(every).to_pylist()
        assert b.keys("v") == ref.keys("v")
        expired += sum(store.manifest(version).get("ttl_compaction_expired", {}).values())
        minor += any(f["kind"] == "incremental" and "compacted-" in f["path"]
                     for f in store.manifest(version)["files"])
    stats = b.tiered_statistics()
    assert stats["compactions"] >= 2 and stats["compaction_failures"] == 0
    assert (expired > 0) if ratio is None else (minor > 0)
    if ratio is not None:
        cold = pa.array(range(1000, 9000), pa.int64())
        assert (b.get_state(ValueStateDescriptor("cold", "int64")).get_batch(cold)
                == ref.get_state(ValueStateDescriptor("cold", "int64")).get_batch(cold))
    b.dispose()
    store.close()


def test_compaction_reads_the_runs_one_window_of_key_groups_at_a_time(tmp_path, monkeypatch):
    """With a window of one key group's bytes, the compaction prefetches one key group at a
    time (its memory bounded whatever the state's size) and the version restores the same."""
    monkeypatch.setattr(compaction, "PREFETCH_WINDOW_BYTES", 1)
    spans = []
    prefetch = CheckpointReader.prefetch

    def spy(self, start, end, **kw):
        spans.append((start, end))
        return prefetch(self, start, end, **kw)

    store = CheckpointStore(tmp_path, max_runs=None)
    b = create_backend("native", key_type="int64", max_parallelism=64)
    s = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(500), pa.int64())
    for version in range(1, 4):
        s.put_batch(keys[version * 100:], keys[version * 100:])
        store.checkpoint(b, version)

    def restored():
        r = create_backend("native", key_type="int64", max_parallelism=64)
        store.restore(r, 3)
        return r.get_state(ValueStateDescriptor("v", "int64")).get_batch(keys).to_pylist()

    before = restored()
    monkeypatch.setattr(CheckpointReader, "prefetch", spy)
    store.compact(3, max_runs=1)
    assert spans == [(kg, kg) for kg in range(64)]
    assert store.describe(3)["runs"] == 1 and restored() == before


class _ReadPaths(LocalDelegatingHandler):
    def __init__(self):
        super().__init__()
        self.paths: set[str] = set()

    def on_read(self, path, offset, data) -> None:
        self.paths.add(os.path.basename(path))


def test_only_versions_the_store_object_committed_are_compacted(tmp_path):
    """A backend attached to a version another store object (process) committed leaves its
    compaction to that one; its own first checkpoint is compacted."""
    first = CheckpointStore(tmp_path, max_runs=None)
    b = tiered(first, compact_max_runs=None)
    s = b.get_state(ValueStateDescriptor("v", "int64"))
    for version in range(1, 4):
        s.put_batch(pa.array([version], pa.int64()), pa.array([version], pa.int64()))
        first.checkpoint(b, version)
    b.dispose()
    other = CheckpointStore(tmp_path, max_runs=None)
    b = tiered(other, compact_max_runs=1)
    other.restore(b)
    assert b.attached_runs() == 3 and not b.tiered_statistics()["compacting"]
    b.get_state(ValueStateDescriptor("v", "int64")).put_batch(pa.array([9], pa.int64()),
                                                              pa.array([9], pa.int64()))
    other.checkpoint(b, 4)
    assert b.poll_compaction(wait=True) and b.attached_runs() == 1
    b.dispose()
    other.close()


def test_a_failed_background_compaction_is_reported_and_changes_nothing(tmp_path,
                                                                        monkeypatch):
    store = CheckpointStore(tmp_path, max_runs=None)
    b = tiered(store, compact_max_runs=1)
    s = b.get_state(ValueStateDescriptor("v", "int64"))
    for version in (1, 2):
        s.put_batch(pa.array([version], pa.int64()), pa.array([version], pa.int64()))
        if version == 2:
            def broken(*args, **kwargs):
                raise OSError("disk full")

            monkeypatch.setattr(store, "compact", broken)
        store.checkpoint(b, version)
    assert not b.poll_compaction(wait=True)
    stats = b.tiered_statistics()
    assert stats["compaction_failures"] == 1 and stats["attached_runs"] == 2
    assert b.last_compaction_error == "OSError: disk full"
    s.get_batch(pa.array(range(50, 80), pa.int64()))
    assert s.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [1, 2]
    b.dispose()
    store.close()


def test_a_compaction_slower_than_the_checkpoints_is_taken_up(tmp_path, monkeypatch):
    """Version 3's background compaction finishes only after versions 4 and 5 were committed
    on top of it: it reaches their manifests too, and the backend, attached to 5, re-attaches
    to 5's (two runs of its own above the compacted one)."""
    store = CheckpointStore(tmp_path, max_runs=None)
    b = tiered(store, compact_max_runs=2)
    s = b.get_state(ValueStateDescriptor("v", "int64"))
    gate = threading.Event()
    real = store.compact

    def slow(*args, **kwargs):
        gate.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "compact", slow)
    keys = pa.array(range(250), pa.int64())
    for version in range(1, 6):
        s.put_batch(keys[(version - 1) * 50:], pa.array([version] * (300 - version * 50),
                                                         pa.int64()))
        store.checkpoint(b, version)
    stats = b.tiered_statistics()
    assert stats["compacting"] and stats["attached_runs"] == 5 and b.attached_version == 5
    gate.set()
    assert b.poll_compaction(wait=True)
    stats = b.tiered_statistics()
    assert stats["compactions"] == 1 and stats["attached_runs"] == 3
    assert os.path.basename(store.manifest(5)["files"][-1]["path"]).startswith("compacted-")
    assert s.get_batch(keys).to_pylist() == [v for v in range(1, 6) for _ in range(50)]
    b.dispose()
    store.close()


def test_lookups_after_the_re_attach_read_the_compacted_run_alone(tmp_path):
    handler = _ReadPaths()
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(handler), max_runs=None)
    b = tiered(store, compact_max_runs=3)
    s = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(200), pa.int64())
    for version in range(1, 5):
        s.put_batch(keys[(version - 1) * 50:], keys[(version - 1) * 50:])
        store.checkpoint(b, version)
    # Version 4's chain holds four runs: compacted in the background.
    assert b.tiered_statistics()["compacting"]
    assert b.poll_compaction(wait=True)
    assert b.attached_runs() == 1 and b.tiered_statistics()["compactions"] == 1
    (run,) = store.manifest(4)["files"]
    assert run["kind"] == "full" and os.path.basename(run["path"]).startswith("compacted-")
    s.get_batch(pa.array(range(150, 200), pa.int64()))  # evicts the rest
    handler.paths.clear()
    misses = b.tiered_statistics()["lookup"]["cache_misses"]
    assert s.get_batch(keys).to_pylist() == list(range(200))
    # Blocks cached from the old runs are not served for the new file: the cache key names it.
    assert handler.paths == {os.path.basename(run["path"])}
    assert b.tiered_statistics()["lookup"]["cache_misses"] > misses
    b.dispose()
    store.close()


def _run_worker(root, phase, kill_at):
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "support", "tiered_kill_worker.py"), str(root), phase,
         str(kill_at)], capture_output=True, text=True, timeout=120)


def _check_restorable(root) -> int:
    """Every committed version verifies and restores its state (the newest also read through
    a tiered backend); finishing the interrupted work (compaction, retention) leaves no file
    retention would keep without a reference (those of the newest version's directory: writes
    in flight). Returns the newest version."""
    store = CheckpointStore(root, max_runs=None)
    versions = store.versions()
    keys = pa.array(range(w.KEYS), pa.int64())
    latest = versions[-1]
    for v in versions:
        store.verify(v)
        want = w.expected(v)
        backends = [create_backend("native", key_type="int64")]
        if v == latest:
            backends.append(w.tiered(store))
        for b in backends:
            store.restore(b, v)
            got = b.get_state(w.DESC).get_batch(keys).to_pylist()
            assert got == [want.get(k) for k in range(w.KEYS)], f"version {v}"
            b.dispose()
    store.compact(latest, max_runs=1)
    store.retain(1)
    referenced = {f["path"] for f in store.manifest(latest)["files"]}
    newest_dir = os.path.dirname(next(iter(referenced)))
    for f in _data_files(root) - referenced:
        assert os.path.dirname(f) >= newest_dir and "compacted-" not in f, f
    return latest


def _kill_points(tmp_path, phase) -> tuple[str, list[tuple[str, str]]]:
    """The history to copy and the phase's mutations (counted in process)."""
    base = tmp_path / "base"
    w.build(str(base))
    dry = tmp_path / "dry"
    shutil.copytree(base, dry)
    steps = w.main(str(dry), phase, 0).steps
    assert {"open", "write", "move", "delete"} <= {kind for kind, _ in steps}
    return str(base), steps


def _kill_at(tmp_path, base, phase, k) -> None:
    root = tmp_path / f"k{k}"
    shutil.copytree(base, root)
    out = _run_worker(root, phase, k)
    assert out.returncode == -signal.SIGKILL, f"kill point {k}: {out.stderr[-2000:]}"
    latest = _check_restorable(str(root))
    assert latest in (w.LAST, w.LAST + 1, w.LAST + 2)


@pytest.mark.parametrize("phase", ["commit", "compact", "forward"])
def test_sigkill_during_commit_or_compaction_leaves_the_last_version_restorable(tmp_path,
                                                                                phase):
    """One kill point a phase (the sweep below takes many more): at the commit's publishing
    step (the manifest's rename), in the middle of the compacted run's write (a torn
    temporary file is left), at the rename of the second manifest a compaction replaces (the
    first one replaced, the later version's not)."""
    base, steps = _kill_points(tmp_path, phase)
    if phase in ("commit", "forward"):
        k = max(k for k, (kind, _) in enumerate(steps, 1) if kind == "move")
        assert steps[k - 1][1].startswith("manifest-")
    else:
        writes = [k for k, (kind, name) in enumerate(steps, 1)
                  if kind == "write" and name.startswith("compacted-")]
        k = writes[len(writes) // 2]
    _kill_at(tmp_path, base, phase, k)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["commit", "compact", "forward"])
def test_sigkill_at_every_mutation_of_commit_and_compaction(tmp_path, phase):
    """Every kill point but writes into a file, and of those the first and the last of each
    file plus three more drawn with a fixed seed (a fresh interpreter per point, about a second
    each)."""
    base, steps = _kill_points(tmp_path, phase)
    writes: dict[str, list[int]] = {}
    points = []
    for k, (kind, name) in enumerate(steps, 1):
        if kind == "write":
            writes.setdefault(name, []).append(k)
        else:
            points.append(k)
    every_write = [k for ks in writes.values() for k in ks]
    points += [k for ks in writes.values() for k in (ks[0], ks[-1])]
    points += random.Random(7).sample(every_write, min(3, len(every_write)))
    for k in sorted(set(points)):
        _kill_at(tmp_path, base, phase, k)


def test_the_re_attach_after_a_compaction_drops_the_replaced_runs_blocks(tmp_path):
    # Passes over more blocks than the cache holds leave it full of the old runs' blocks with
    # high admission counts (block_cache.h). The compacted run replaces them: kept, they would
    # never be asked for again and the admission test would refuse the new run's blocks.
    store = CheckpointStore(str(tmp_path), block_target_bytes=4096, max_runs=None,
                            compaction_size_ratio=None)
    b = tiered(store, budget=64 * ENTRY, cache_bytes=32 * 4096, compact_max_runs=3)
    s = b.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(40_000), pa.int64())
    s.put_batch(keys, keys)
    store.checkpoint(b, 1)
    for version in (2, 3):
        s.put_batch(keys[:100], keys[:100])
        store.checkpoint(b, version)
    for _ in range(6):
        s.get_batch(keys)

    def cache() -> dict:
        st = b.tiered_statistics()["lookup"]
        return {k: st[k] for k in ("cache_hits", "cache_bytes")}

    assert cache()["cache_bytes"] > 30 * 4096
    s.put_batch(keys[:100], keys[:100])
    store.checkpoint(b, 4)
    assert b.poll_compaction(wait=True) and b.attached_runs() == 1
    assert cache()["cache_bytes"] == 0
    assert s.get_batch(keys).to_pylist() == keys.to_pylist()
    assert cache()["cache_bytes"] > 30 * 4096  # filled with the compacted run's blocks
    before = cache()["cache_hits"]
    assert s.get_batch(keys).to_pylist() == keys.to_pylist()
    assert cache()["cache_hits"] > before
    b.dispose()
    store.close()
