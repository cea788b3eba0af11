"""Crash safety: a failure injected at EVERY filesystem mutation (write, move, delete) of
write_snapshot, commit (with its automatic compaction), compact and retain must leave every
committed version restoring exactly what it did, and a retry must succeed."""

from __future__ import annotations

import random
import shutil

import pyarrow.fs as pafs
import pytest

from statecore.checkpoint import CheckpointStore
from support.fs_wrappers import LocalDelegatingHandler
from test_checkpoint_incremental import Model, read_all


class InjectedCrash(OSError):
    pass


class FaultyHandler(LocalDelegatingHandler):
    """Local filesystem whose ``crash_at``-th mutation (1-based) and every later one raise
    InjectedCrash, as if the process died there. A crashing output stream leaves a torn file."""

    type_name = "faulty"

    def __init__(self, crash_at):
        super().__init__()
        self.crash_at = crash_at
        self.mutations = 0

    def _step(self, what):
        self.mutations += 1
        if self.crash_at is not None and self.mutations >= self.crash_at:
            raise InjectedCrash(f"injected crash at mutation {self.mutations} ({what})")

    def delete_dir(self, path):
        self._step(f"delete_dir {path}")
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self._step(f"delete_dir_contents {path}")
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_file(self, path):
        self._step(f"delete_file {path}")
        self.fs.delete_file(path)

    def move(self, src, dest):
        self._step(f"move {src}")
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self._step(f"copy {src}")
        self.fs.copy_file(src, dest)

    def open_output_stream(self, path, metadata):
        try:
            self._step(f"write {path}")
        except InjectedCrash:
            with self.fs.open_output_stream(path) as out:  # torn: a prefix of garbage
                out.write(b"SCKGDAT1torn")
            raise
        return self.fs.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        self._step(f"append {path}")
        return self.fs.open_append_stream(path)


MAX_RUNS = 3
PARTS = [(0, 15), (16, 31)]
KGS = list(range(32))


def build_history(root):
    """Versions 0..4 (full base, then incremental runs; version 4 pushed over MAX_RUNS and
    compacted by commit). Returns (model, {version: expected}, descriptors of version 5 written
    but not committed)."""
    store = CheckpointStore(root, max_runs=MAX_RUNS)
    m, rng = Model(), random.Random(99)
    history = {}
    for v in range(5):
        m.mutate(rng, KGS, 120 if v == 0 else 25)
        store.commit(v, [store.write_snapshot(m.snapshot(p, v > 0), v, f"p{i}")
                         for i, p in enumerate(PARTS)])
        m.complete(v)
        history[v] = m.expected(KGS)
    return m, rng, history


def check_versions(root, history, must_have):
    store = CheckpointStore(root)
    versions = store.versions()
    assert set(must_have) <= set(versions), (versions, must_have)
    for v in versions:
        with store.open(v) as r:
            assert read_all(r) == history[v], v
    return versions


def run_with_crashes(tmp_path, base, op, history_after, must_have_before, check_after):
    """For n = 1, 2, ...: copy ``base``, run ``op(store)`` on a filesystem crashing at the n-th
    mutation, check the committed versions, retry on a healthy filesystem, check again; stop
    at the first n where ``op`` completes without hitting the crash."""
    for n in range(1, 200):
        root = tmp_path / f"crash{n}"
        shutil.copytree(base, root)
        handler = FaultyHandler(n)
        faulty = CheckpointStore(str(root), filesystem=pafs.PyFileSystem(handler),
                                 max_runs=MAX_RUNS)
        try:
            op(faulty)
            crashed = False
        except InjectedCrash:
            crashed = True
        check_versions(root, history_after, must_have_before)
        if not crashed:
            check_after(root)
            return n - 1
        op(CheckpointStore(str(root), max_runs=MAX_RUNS))  # the retry succeeds
        check_after(root)
        # a crash may leave temporary files (torn or complete); no manifest may name one
        store = CheckpointStore(str(root))
        assert not any(".tmp-" in f["path"] for v in store.versions()
                       for f in store.manifest(v)["files"])
        shutil.rmtree(root)
    raise AssertionError("operation never completed")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("base") / "ckpt"
    m, rng, history = build_history(root)
    m.mutate(rng, KGS, 25)
    snaps = [m.snapshot(p, True) for p in PARTS]
    m.complete()
    history = {**history, 5: m.expected(KGS)}
    return root, snaps, history


def test_crash_in_write_snapshot_and_commit(tmp_path, base):
    root, snaps, history = base

    def op(store):
        descs = [store.write_snapshot(s, 5, f"p{i}") for i, s in enumerate(snaps)]
        store.commit(5, descs, metadata={"v": 5})

    def after(r):
        assert check_versions(r, history, range(6)) == list(range(6))
        store = CheckpointStore(r)
        assert store.describe(5)["max_runs_per_key_group"] <= MAX_RUNS
        assert store.metadata(5) == {"v": 5}

    steps = run_with_crashes(tmp_path, root, op, history, range(5), after)
    assert steps >= 6  # 2 data files (write + move each), manifest, compaction


def test_crash_in_compact(tmp_path, base):
    root, _, history = base

    def op(store):
        store.compact(2, max_runs=1)

    def after(r):
        check_versions(r, history, range(5))
        assert CheckpointStore(r).describe(2)["max_runs_per_key_group"] == 1

    assert run_with_crashes(tmp_path, root, op, history, range(5), after) >= 5


@pytest.mark.parametrize("k", [1, 2])
def test_crash_in_retain(tmp_path, base, k):
    root, _, history = base
    keep = list(range(5))[-k:]

    def op(store):
        store.retain(k)

    def after(r):
        assert check_versions(r, history, keep) == keep
        store = CheckpointStore(r)
        refs = {f["path"] for v in keep for f in store.manifest(v)["files"]}
        files = {p.relative_to(r).as_posix() for p in (r / "data").rglob("*.sckp")}
        newest = f"data/{keep[-1]:020d}/"
        assert {f for f in files if not f.startswith(newest)} <= refs

    assert run_with_crashes(tmp_path, root, op, history, keep, after) >= 3
