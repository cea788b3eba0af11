"""Checkpoints on S3-compatible object storage, against a real S3 protocol server (moto in
server mode, its own process, bound to 127.0.0.1) through ``pyarrow.fs.S3FileSystem``: round
trips large enough for multipart uploads, the URI and environment forms, the commit protocol
without rename, two drivers on one root, torn objects, failures mid-upload and a SIGKILL
mid-commit, and the process exit with pyarrow's S3 finalizer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
from statecore.checkpoint import readers
from statecore.checkpoint.format import CHUNK_TARGET_BYTES
from statecore.checkpoint.layout import CheckpointRoot, join_uri
from statecore.checkpoint.lease import LEASE_NAME
from statecore.checkpoint.snapshot_writes import OBJECT_STORE_CHUNK_BYTES, SnapshotWriter
from statecore.errors import CheckpointIOError, CorruptCheckpointError, FencedError
from support.s3_server import (
    DroppingProxy,
    S3DelegatingHandler,
    start_s3_server,
)

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "statecore-ckpt"
SUM = ReducingStateDescriptor("sum", "sum", "int64")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto server with the bucket, and the AWS credentials in the environment (the usual
    variables; endpoint and region come from each URI's query) for the module's tests."""
    log_dir = tmp_path_factory.mktemp("s3")
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                             "AWS_EC2_METADATA_DISABLED")}
    with start_s3_server(str(log_dir)) as server:
        env = server.env()
        os.environ.update(AWS_ACCESS_KEY_ID=env["AWS_ACCESS_KEY_ID"],
                          AWS_SECRET_ACCESS_KEY=env["AWS_SECRET_ACCESS_KEY"],
                          AWS_EC2_METADATA_DISABLED="true")
        try:
            server.create_bucket(BUCKET)
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


_prefixes = iter(range(10**6))


@pytest.fixture
def prefix(request):
    return f"{request.node.name[:40]}-{next(_prefixes)}".replace("[", "-").replace("]", "")


def _loaded(n: int, impl: str = "native", offset: int = 0):
    if impl == "native":
        pytest.importorskip("statecore.backends.native")
    b = create_backend(impl, key_type="int64")
    st = b.get_state(SUM)
    for s in range(0, n, 1 << 20):
        k = pa.array(np.arange(s, min(n, s + (1 << 20)), dtype=np.int64))
        st.add_batch(k, pa.array(np.arange(s, min(n, s + (1 << 20)), dtype=np.int64) + offset))
    return b, st


def _contents(backend) -> dict:
    snap = backend.snapshot()
    try:
        out = {}
        for kg in snap.key_group_range:
            keys, values = snap.entries("sum", kg)
            out.update(zip(keys.to_pylist(), values.to_pylist()))
        return out
    finally:
        snap.release()


def _restored(store, version=None, impl="python"):
    fresh = create_backend(impl, key_type="int64")
    store.restore(fresh, version)
    return fresh


def _referenced_files_exist(fs: pafs.FileSystem, store: CheckpointStore) -> list[str]:
    """Paths that a committed manifest references but that do not exist."""
    missing = []
    for v in store.versions():
        for f in store.manifest(v)["files"]:
            if fs.get_file_info(store.root + "/" + f["path"]).type != pafs.FileType.File:
                missing.append(f"v{v}: {f['path']}")
    return missing


# ------------------------------------------------------------------------------ round trips

def test_full_and_incremental_round_trip_with_multipart(s3, prefix):
    """1M entries (a data file of more than 10 MiB: pyarrow uploads it in parts), then an
    incremental version; both restore to exactly what was checkpointed."""
    store = CheckpointStore(s3.uri(BUCKET, prefix))
    assert store.fencing
    b, st = _loaded(1_000_000)
    m1 = store.checkpoint(b, 1)
    assert m1["files"][0]["size"] > 10 << 20
    keys = pa.array(np.arange(0, 1_000_000, 97, dtype=np.int64))
    st.add_batch(keys, pa.array(np.ones(len(keys), np.int64)))
    st.clear_batch(pa.array(np.arange(5, 1_000_000, 1013, dtype=np.int64)))
    m2 = store.checkpoint(b, 2)
    assert {f["kind"] for f in m2["files"]} == {"full", "incremental"}
    want = _contents(b)
    fresh = _restored(store, 2, impl="native")
    assert _contents(fresh) == want
    assert store.verify(2)["entries"]["sum"] > 0
    fresh1 = _restored(store, 1, impl="native")
    assert len(_contents(fresh1)) == 1_000_000
    for x in (b, fresh, fresh1):
        x.close()


def test_background_write_in_upload_parts_is_byte_identical(s3, prefix, tmp_path):
    """On an object store a background write hands its stream chunks of a multipart upload's
    part (10 MiB) instead of 1 MiB; a file of several such chunks is byte-identical to the
    synchronous write of the same snapshot to the local disk, and verifies once committed."""
    uri = s3.uri(BUCKET, prefix)
    assert SnapshotWriter(CheckpointRoot(uri)).chunk_bytes == OBJECT_STORE_CHUNK_BYTES == 10 << 20
    assert SnapshotWriter(CheckpointRoot(str(tmp_path))).chunk_bytes == CHUNK_TARGET_BYTES
    b, _ = _loaded(1_500_000)
    store, local = CheckpointStore(uri), CheckpointStore(str(tmp_path / "local"))
    snap = b.snapshot()
    try:
        d = store.write_snapshot_async(snap, 1, nice=0).result()
        want = local.write_snapshot(snap, 1)
    finally:
        snap.release()
    assert d["size"] > 2 * OBJECT_STORE_CHUNK_BYTES
    fs, root = pafs.FileSystem.from_uri(uri)
    with fs.open_input_file(f"{root}/{d['path']}") as f:
        got = f.read()
    with open(tmp_path / "local" / want["path"], "rb") as f:
        assert got == f.read()
    store.commit(1, [d])
    assert store.verify(1)["entries"]["sum"] == 1_500_000
    b.close()


def test_uri_forms_and_environment(s3, prefix, monkeypatch):
    """The endpoint and region from the query or from AWS_ENDPOINT_URL[_S3] /
    AWS_REGION / AWS_DEFAULT_REGION; an operator name joins the path, not the query."""
    b, _ = _loaded(1000, "python")
    CheckpointStore(s3.uri(BUCKET, prefix)).checkpoint(b, 3)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{s3.endpoint}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    plain = CheckpointStore(f"s3://{BUCKET}/{prefix}")
    assert plain.versions() == [3]
    assert _contents(_restored(plain)) == _contents(b)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3.endpoint}")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    assert CheckpointStore(f"s3://{BUCKET}/{prefix}").versions() == [3]
    joined = join_uri(s3.uri(BUCKET, prefix), "sessions")
    assert joined.startswith(f"s3://{BUCKET}/{prefix}/sessions?endpoint_override=")
    assert CheckpointStore(joined).root == f"{BUCKET}/{prefix}/sessions"


def test_no_rename_anywhere_on_the_object_store(s3, prefix):
    """Commits, compactions, retention and pending descriptors never move or copy an object:
    data files and manifests are written once under their final names, the manifest last."""
    handler = S3DelegatingHandler(s3.filesystem())
    fs = pafs.PyFileSystem(handler)
    store = CheckpointStore(f"{BUCKET}/{prefix}", filesystem=fs, max_runs=2)
    assert store.fencing
    b, st = _loaded(5000, "python")
    for v in range(1, 7):
        st.add_batch(pa.array([v, v + 100], pa.int64()), pa.array([1, 1], pa.int64()))
        snap = b.snapshot(incremental=v > 1)
        store.write_pending(v, "p0", store.write_snapshot(snap, v))
        store.commit(v)
        b.notify_checkpoint_complete(snap.snapshot_id, v, store.manifest(v)["commit_id"])
        snap.release()
        store.clear_pending(v)
        store.retain(2)
    ops = {op for op, _ in handler.calls}
    assert "move" not in ops and "copy_file" not in ops
    outputs = [p for op, p in handler.calls if op == "open_output_stream"]
    assert not any(".tmp-" in p for p in outputs)
    # Each version's manifest is put after the data file it lists.
    for v in range(1, 7):
        m = f"manifest-{v:020d}.json"
        data_puts = [i for i, p in enumerate(outputs) if f"/data/{v:020d}/p0-" in p]
        man_puts = [i for i, p in enumerate(outputs) if p.endswith(m)]
        assert data_puts and man_puts and max(data_puts) < min(man_puts)
    assert store.versions() == [5, 6]
    assert any(f["path"].split("/")[-1].startswith("compacted-")
               for v in (5, 6) for f in store.manifest(v)["files"])
    assert _referenced_files_exist(s3.filesystem(), store) == []
    assert _contents(_restored(store)) == _contents(b)


def test_torn_objects_are_refused(s3, prefix):
    """A manifest or data file holding only part of its bytes is refused with
    CorruptCheckpointError, never half-read."""
    fs = s3.filesystem()
    store = CheckpointStore(s3.uri(BUCKET, prefix))
    b, _ = _loaded(20_000, "python")
    store.checkpoint(b, 1)
    root = f"{BUCKET}/{prefix}"
    man = f"{root}/manifest-{1:020d}.json"
    with fs.open_input_file(man) as f:
        raw = f.read()
    with fs.open_output_stream(f"{root}/manifest-{2:020d}.json") as out:
        out.write(raw[: len(raw) // 2])
    with pytest.raises(CorruptCheckpointError, match="manifest"):
        store.manifest(2)
    with pytest.raises(CorruptCheckpointError):
        store.restore(create_backend("python", key_type="int64"))
    fs.delete_file(f"{root}/manifest-{2:020d}.json")
    data = f"{root}/{store.manifest(1)['files'][0]['path']}"
    with fs.open_input_file(data) as f:
        whole = f.read()
    with fs.open_output_stream(data) as out:
        out.write(whole[:-100])
    with pytest.raises(CorruptCheckpointError, match="truncated|size"):
        store.restore(create_backend("python", key_type="int64"))


# ---------------------------------------------------------------------------- two drivers

def test_second_driver_takes_over_and_fences_the_first(s3, prefix):
    uri = s3.uri(BUCKET, prefix)
    a = CheckpointStore(uri, takeover_delay_s=0.2)
    b_backend, st = _loaded(2000, "python")
    a.checkpoint(b_backend, 1)
    lease = json.loads(s3.filesystem().open_input_file(f"{BUCKET}/{prefix}/{LEASE_NAME}")
                       .read())
    assert lease["epoch"] == 1
    b = CheckpointStore(uri, takeover_delay_s=0.2)
    other, _ = _loaded(2000, "python", offset=7)
    b.checkpoint(other, 2)
    with pytest.raises(FencedError, match="another driver"):
        a.checkpoint(b_backend, 3)
    with pytest.raises(FencedError):
        a.retain(1)
    with pytest.raises(FencedError):
        a.compact(2, max_runs=1)
    assert b.versions() == [1, 2]
    assert _contents(_restored(b)) == _contents(other)
    # Restarting the first driver (a new store) takes the root back.
    a2 = CheckpointStore(uri, takeover_delay_s=0.2)
    a2.checkpoint(b_backend, 3)
    with pytest.raises(FencedError):
        b.retain(1)
    assert a2.retain(1) == [1, 2]


def test_takeover_during_the_manifest_put_retracts_it(s3, prefix):
    """The lease is checked before and verified after the manifest put: a takeover while the
    put is in flight makes the first driver delete the manifest it wrote and raise."""
    uri = s3.uri(BUCKET, prefix)
    state = {"armed": False}

    def takeover(path):
        if state["armed"] and path.endswith(f"manifest-{2:020d}.json"):
            state["armed"] = False
            intruder = CheckpointStore(uri, takeover_delay_s=0)
            intruder.retain(5)  # takes the lease (deletes nothing)

    handler = S3DelegatingHandler(s3.filesystem(), on_output=takeover)
    a = CheckpointStore(f"{BUCKET}/{prefix}", filesystem=pafs.PyFileSystem(handler),
                        takeover_delay_s=0)
    b, st = _loaded(2000, "python")
    a.checkpoint(b, 1)
    st.add_batch(pa.array([1], pa.int64()), pa.array([1], pa.int64()))
    state["armed"] = True
    with pytest.raises(FencedError):
        a.checkpoint(b, 2)
    assert CheckpointStore(uri).versions() == [1]


def test_two_drivers_racing_commits_compactions_and_retention(s3, prefix):
    """Two stores on one prefix commit, compact and retain concurrently: the second starts while
    the first is busy and takes the root over; the first gets FencedError and stops, the second
    finishes. Every committed manifest's files exist and every version verifies."""
    uri = s3.uri(BUCKET, prefix)
    errors: dict[str, BaseException] = {}
    committed: dict[str, list[int]] = {"a": [], "b": []}
    first_busy = threading.Event()

    def driver(name: str, offset: int):
        store = CheckpointStore(uri, max_runs=2, takeover_delay_s=0.5)
        backend, st = _loaded(3000, "python", offset=offset)
        rng = np.random.default_rng(offset)
        if name == "b":
            assert first_busy.wait(300)
        try:
            for _ in range(12):
                keys = pa.array(rng.integers(0, 5000, 200), pa.int64())
                st.add_batch(keys, pa.array(np.ones(200, np.int64)))
                v = (store.latest_version() or 0) + 1
                store.checkpoint(backend, v, replace=True)
                committed[name].append(v)
                if len(committed[name]) == 3:
                    first_busy.set()
                store.retain(2)
        except FencedError as exc:
            errors[name] = exc
        except Exception as exc:  # noqa: BLE001 - reported below
            errors[name] = exc

    threads = [threading.Thread(target=driver, args=(n, o)) for n, o in (("a", 0), ("b", 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    assert set(errors) == {"a"} and isinstance(errors["a"], FencedError), errors
    assert len(committed["a"]) >= 3 and len(committed["b"]) == 12
    store = CheckpointStore(uri)
    assert _referenced_files_exist(s3.filesystem(), store) == []
    for v in store.versions():
        store.verify(v)
    assert len(store.versions()) <= 3


# ------------------------------------------------------------------------------------ faults


def _store_through(server, proxy, prefix: str) -> CheckpointStore:
    """A store on ``server`` reached through ``proxy``, with few retries and short timeouts: a
    failure is reported in seconds."""
    fs = server.filesystem(proxy.endpoint, connect_timeout=5, request_timeout=20,
                           retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))
    return CheckpointStore(f"{BUCKET}/{prefix}", filesystem=fs, takeover_delay_s=0)


@pytest.mark.parametrize("fault", ["request_dropped", "server_down"])
def test_failure_mid_upload_leaves_the_last_version_restorable(s3, prefix, fault):
    """A connection cut after some bytes of a multipart data file upload (a request failing
    mid-upload), or the endpoint going away mid-upload (the server dying, its storage intact
    when it comes back): the checkpoint fails with an OSError, the last committed version
    stays the latest and restores, and a retry succeeds."""
    proxy = DroppingProxy(s3.port)
    try:
        store = _store_through(s3, proxy, prefix)
        b, st = _loaded(600_000)
        store.checkpoint(b, 1)
        want = _contents(_restored(store, 1, impl="native"))
        st.add_batch(pa.array(np.arange(0, 600_000, dtype=np.int64)),
                     pa.array(np.ones(600_000, np.int64)))
        if fault == "request_dropped":
            proxy.drop_after(3 << 20)
            with pytest.raises(OSError):
                store.checkpoint(b, 2, incremental=False)
            assert proxy.dropped >= 1
            proxy.heal()
        else:
            proxy.down_after(3 << 20)
            with pytest.raises(OSError):
                store.checkpoint(b, 2, incremental=False)
            assert proxy.dropped >= 1
            proxy.heal()
            proxy.up()
        assert store.versions() == [1]
        assert _contents(_restored(store, impl="native")) == want
        store.checkpoint(b, 2)
        assert _contents(_restored(store, 2, impl="native")) == _contents(b)
        store.retain(1)
        assert _referenced_files_exist(s3.filesystem(), store) == []
        b.close()
    finally:
        proxy.close()


@pytest.mark.parametrize("piece_bytes", [None, 256 << 10])
def test_read_failure_mid_restore_is_an_io_error_and_changes_nothing(s3, prefix, monkeypatch,
                                                                     piece_bytes):
    """A connection cut mid-download while a restore reads a data file: CheckpointIOError (an
    OSError naming the file; the file is intact, so not CorruptCheckpointError), the backend
    stays empty, and once the network is back the same restore succeeds. With small prefetch
    pieces the restore reads the run in parallel pieces: the same outcome, no hang, and an
    undisturbed restore through pieces equals one through a single read."""
    if piece_bytes is not None:
        monkeypatch.setattr(readers, "REMOTE_PIECE_BYTES", piece_bytes)
        monkeypatch.setattr(readers, "REMOTE_CHUNK_BYTES", 1 << 20)
    proxy = DroppingProxy(s3.port)
    try:
        store = _store_through(s3, proxy, prefix)
        b, _ = _loaded(600_000)
        store.checkpoint(b, 1)
        assert store.manifest(1)["files"][0]["size"] > 4 << 20
        want = _contents(b)
        proxy.drop_downstream_after(2 << 20)
        fresh = create_backend("native", key_type="int64")
        with pytest.raises(CheckpointIOError, match="checkpoint data file .*cannot") as exc:
            store.restore(fresh, 1)
        assert not isinstance(exc.value, CorruptCheckpointError)
        assert isinstance(exc.value, OSError) and proxy.dropped >= 1
        assert fresh.num_entries() == 0
        proxy.heal()
        store.restore(fresh, 1)
        assert _contents(fresh) == want
        fresh.close()
        b.close()
    finally:
        proxy.close()


@pytest.mark.timeout(600)  # a hang fails the test instead of blocking the run
def test_server_killed_mid_upload_fails_the_checkpoint_in_bounded_time(tmp_path):
    """The moto process itself SIGKILLed while a multipart data file upload runs: the checkpoint
    raises OSError (no hang, nothing committed). moto keeps its objects in memory, so what was
    committed before dies with it; that the last committed version survives a failure mid-upload
    is what the proxy cases above check."""
    with start_s3_server(str(tmp_path)) as server:
        server.create_bucket(BUCKET)
        # Through a proxy that kills the server once 3 MiB of the data file went up.
        proxy = DroppingProxy(server.port)
        try:
            store = _store_through(server, proxy, "killed")
            b, _ = _loaded(600_000)
            store.checkpoint(b, 1)
            proxy.call_after(3 << 20, server.kill)
            with pytest.raises(OSError):
                store.checkpoint(b, 2, incremental=False)
            with pytest.raises(OSError):
                store.versions()
            b.close()
        finally:
            proxy.close()


_KILL_SCRIPT = r"""
import os, sys
import numpy as np, pyarrow as pa, pyarrow.fs as pafs
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
store = CheckpointStore(sys.argv[1], max_runs=3, takeover_delay_s=0)
b = create_backend("python", key_type="int64")
st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
rng = np.random.default_rng(0)
st.add_batch(pa.array(np.arange(20000, dtype=np.int64)), pa.array(np.ones(20000, np.int64)))
v = 0
while True:
    v += 1
    keys = pa.array(rng.integers(0, 30000, 2000), pa.int64())
    st.add_batch(keys, pa.array(np.ones(2000, np.int64)))
    store.checkpoint(b, v)
    store.retain(2)
    print(v, flush=True)
"""


def test_sigkill_mid_commit_leaves_the_last_version_restorable(s3, prefix, tmp_path):
    """A driver SIGKILLed at some point of its commit loop (writes, manifest puts, compaction,
    retention): the latest committed version restores and verifies, and a new driver takes the
    root over and commits on top of it."""
    uri = s3.uri(BUCKET, prefix)
    script = tmp_path / "loop.py"
    script.write_text(_KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "src"), os.environ.get("PYTHONPATH", "")]))
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, str(script), uri], stdout=subprocess.PIPE,
                                env=env, start_new_session=True, text=True)
        try:
            seen = 0
            deadline = time.monotonic() + 180
            while seen < 3 + round_ and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                seen += 1
            assert seen >= 3, "the commit loop did not get going"
            time.sleep(0.05 * (round_ + 1))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            proc.stdout.close()
        store = CheckpointStore(uri, takeover_delay_s=0)
        latest = store.latest_version()
        assert latest is not None and latest >= 3
        store.verify(latest)
        assert _referenced_files_exist(s3.filesystem(), store) == []
        fresh = _restored(store)
        assert fresh.num_entries() > 0
        # The next driver commits on top of it (full: its base is a restore).
        store.checkpoint(fresh, latest + 1)
        store.retain(2)
        assert _referenced_files_exist(s3.filesystem(), store) == []
        # The killed loop restarts from version 1 with replace-free commits: start it on a
        # fresh prefix next round.
        uri = s3.uri(BUCKET, f"{prefix}-{round_ + 1}")


_EXIT_SCRIPT = r"""
import sys
import pyarrow as pa
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
store = CheckpointStore(sys.argv[1])
b = create_backend("python", key_type="int64")
b.get_state(ReducingStateDescriptor("sum", "sum", "int64")).add_batch(
    pa.array([1, 2, 3], pa.int64()), pa.array([4, 5, 6], pa.int64()))
store.checkpoint(b, 1)
print(store.versions(), flush=True)
"""


def test_process_exits_after_s3_use(s3, prefix, tmp_path):
    """pyarrow's S3 finalizer at interpreter exit (apache/arrow#50188): a process that used an
    S3 store and returns from its script exits on its own, as does ``statecore inspect``."""
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(REPO, "src"), os.environ.get("PYTHONPATH", "")]))
    uri = s3.uri(BUCKET, prefix)
    for argv in ([sys.executable, str(script), uri],
                 [sys.executable, "-m", "statecore", "inspect", uri]):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                start_new_session=True, text=True)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
            pytest.fail(f"{argv[1:]} did not exit within 120 s after using S3")
        assert proc.returncode == 0, err
    assert "version" in out and "1" in out


def test_inspect_cli_on_s3(s3, prefix, capsys):
    """``statecore inspect`` of one root and of a prefix above several (as the demo's
    ``operators``) on S3; the roots found keep the URI's query."""
    from statecore.cli import main
    from statecore.inspect import find_stores

    uri = s3.uri(BUCKET, prefix)
    b, _ = _loaded(5000, "python")
    for name in ("alpha", "beta"):
        CheckpointStore(join_uri(uri, f"ops/{name}")).checkpoint(b, 4)
    assert find_stores(join_uri(uri, "ops")) == [join_uri(uri, "ops/alpha"),
                                                 join_uri(uri, "ops/beta")]
    assert main(["inspect", join_uri(uri, "ops/alpha"), "--verify", "--entries", "2"]) == 0
    out = capsys.readouterr().out
    assert "4" in out and "sum" in out
    assert main(["inspect", uri, "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"{prefix}/ops/alpha" in out and f"{prefix}/ops/beta" in out


def test_bench_case_reports_s3_against_raw_transfers(tmp_path):
    """The ``s3_checkpoint`` bench case (its own moto server) reports, on loopback and behind
    the network proxy, the S3 figures next to the raw transfers of the same bytes (the
    restore's over the faster raw download), the local disk and the goals, and the CPU seconds
    that the write, the restore and the raw transfers cost this process and the server."""
    from bench.cli import main

    out = tmp_path / "r.json"
    assert main(["--quick", "--scale", "0.02", "--case", "s3_checkpoint", "--json",
                 str(out)]) == 0
    by = {(r["impl"], r["metric"]): r["value"] for r in json.loads(out.read_text())}
    for m in ("write", "write_sync", "restore", "fetch"):
        assert by[("local", f"{m}_MB_per_s")] > 0
    assert by[("s3_net", "net_first_byte_latency_ms")] > 0
    assert by[("s3_net", "net_MB_per_s_per_connection")] > 0
    for ours, raw in (("s3", "raw_s3"), ("s3_net", "raw_s3_net")):
        for m in ("write", "write_sync", "restore", "fetch"):
            assert by[(ours, f"{m}_MB_per_s")] > 0
        assert by[(raw, "upload_MB_per_s")] > 0 and by[(raw, "download_MB_per_s")] > 0
        floor = by[(raw, "download_floor_MB_per_s")]
        assert floor == max(by[(raw, "download_MB_per_s")],
                            by[(raw, "download_ranged_MB_per_s")])
        assert by[(ours, "goal_min_ratio_write_over_raw_upload")] == 0.8
        assert abs(by[(ours, "ratio_write_over_raw_upload")]
                   - by[(ours, "write_MB_per_s")] / by[(raw, "upload_MB_per_s")]) < 1e-9
        assert by[(ours, "goal_min_ratio_restore_over_raw_download")] == 0.8
        assert abs(by[(ours, "ratio_restore_over_raw_download")]
                   - by[(ours, "restore_MB_per_s")] / floor) < 1e-9
        assert by[(ours, "file_bytes")] > 0 and by[(ours, "restore_pieces")] >= 1
        for mine, theirs in (("write", "upload"), ("restore", "download")):
            assert by[(ours, f"{mine}_cpu_s")] >= 0 and by[(raw, f"{theirs}_cpu_s")] >= 0
            if sys.platform.startswith("linux"):
                assert by[(ours, f"{mine}_server_cpu_s")] >= 0
                assert by[(raw, f"{theirs}_server_cpu_s")] >= 0
