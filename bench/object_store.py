"""Checkpoints on S3-compatible object storage: write and restore of a checkpoint through a real
S3 protocol server on loopback (moto in server mode, its own process) next to a raw
``pyarrow.fs`` upload and download of the same number of bytes to the same server in the same
run, and next to the local disk.

Workload: one ReducingState ``sum`` over int64 keys and values, keys ``0 .. n-1``, native backend
(python when the extension is missing), n = 2M entries (``--quick``: 500k). Every figure is the
median (of three repetitions; of five rounds for the alternating ones below), in MB/s of
data-file bytes (1e6 bytes per MB):

* ``write``: ``write_snapshot_async(..., nice=0).result()`` (the Spark operator tasks' write, at
  normal priority: the figure is the write, not how it yields to processing) of a full
  snapshot into a new data file; ``write_sync``: ``write_snapshot``.
* ``restore``: ``CheckpointStore.restore`` into a fresh backend (read the manifest, fetch the
  data file, decode and load it); ``fetch``: those reads alone (``CheckpointStore.open`` and
  ``CheckpointReader.prefetch(..., wait=True)`` of every key group). On S3 the restore asks for
  all of the run's key groups, so the data file is fetched whole as it is opened, in
  ``restore_pieces`` ranged GETs (``readers.REMOTE_PIECE_BYTES``: the footer's piece first,
  the others in file order), and the key groups of each piece are loaded as it arrives while
  the next downloads; locally it is a header, a trailer, a footer and a key-group read.
* ``raw_upload`` / ``raw_download``: ``open_output_stream().write()`` of as many random bytes,
  and ``open_input_file().read()`` of them.

The S3 write and the raw upload alternate (write, upload, write, upload, ... after one unmeasured
round of each), and so do the fetch, the restore and the raw download: on a shared machine the
load drifts within a run, and a ratio of two figures taken seconds apart would measure the
drift. Next to the times the case records the CPU seconds (medians) each S3 write, raw upload,
restore and raw download cost this process (all its threads: serializer, writer, pyarrow's
transfers, the loading) and the moto server (Linux: ``/proc/PID/stat``): moto is a Python server
sharing the machine's cores, so on a busy machine our CPU work (serializing, decoding) and the
server's compete, which a raw transfer does not.

Goals (records ``goal_min_*``, never asserted): write >= 0.8 of the raw upload, and fetch and
restore >= 0.8 of the raw download, next to restore on local disk. ``load_avg_1m`` records the
machine's load when the case ran: a restore overlaps loading with the download only where a
core is free for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from bench.common import has_native
from bench.harness import Size, case, record
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
from statecore.checkpoint import readers

_ACCESS_KEY, _SECRET_KEY, _REGION, _BUCKET = "bench", "bench-secret", "us-east-1", "bench"
_REPEAT = 3
#: Rounds of the alternating S3 / raw transfer measures: each is under a second, and a shared
#: machine's noise needs more of them than three.
_ROUNDS = 5


@contextlib.contextmanager
def _moto_server():
    """``(endpoint, S3FileSystem, server pid)`` of a moto server on a free loopback port, killed
    (its process group) on exit; None when moto is not installed."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        print("s3_checkpoint: moto[server] is not installed; case left out", file=sys.stderr)
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)
        endpoint = f"127.0.0.1:{port}"
        fs = pafs.S3FileSystem(access_key=_ACCESS_KEY, secret_key=_SECRET_KEY, region=_REGION,
                               endpoint_override=endpoint, scheme="http",
                               allow_bucket_creation=True)
        fs.create_dir(_BUCKET)
        yield endpoint, fs, proc.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


def _loaded(impl: str, n: int):
    b = create_backend(impl, key_type="int64")
    st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    for s in range(0, n, 1 << 20):
        k = pa.array(np.arange(s, min(n, s + (1 << 20)), dtype=np.int64))
        st.add_batch(k, k)
    return b


def _median_s(fn) -> float:
    times = []
    for _ in range(_REPEAT):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _cpu_s(pid: int | None = None) -> float | None:
    """CPU seconds (user + system, all threads) used so far by this process (``pid`` None) or
    by process ``pid`` (Linux ``/proc``; None where it cannot be read)."""
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _interleaved(fns: dict, server_pid: int) -> dict:
    """Run each of ``fns`` ({name: fn}) once unmeasured, then ``_ROUNDS`` rounds of each once in
    turn; ``{name: (seconds, CPU seconds of this process, CPU seconds of the server or None)}``,
    medians over the rounds."""
    for fn in fns.values():
        fn()
    got: dict = {name: ([], [], []) for name in fns}
    for _ in range(_ROUNDS):
        for name, fn in fns.items():
            c0, s0, t0 = _cpu_s(), _cpu_s(server_pid), time.perf_counter()
            fn()
            t, c1, s1 = time.perf_counter() - t0, _cpu_s(), _cpu_s(server_pid)
            wall, own, server = got[name]
            wall.append(t)
            own.append(c1 - c0)
            if s0 is not None and s1 is not None:
                server.append(s1 - s0)
    return {name: (statistics.median(w), statistics.median(o),
                   statistics.median(s) if len(s) == _ROUNDS else None)
            for name, (w, o, s) in got.items()}


def _local_figures(store: CheckpointStore, backend, impl: str) -> dict:
    """Seconds (median) of the async and sync writes, the restore and the fetch of a local
    store."""
    snap = backend.snapshot()
    try:
        desc = {}

        def write_async():
            desc["d"] = store.write_snapshot_async(snap, 1, nice=0).result()

        w = _median_s(write_async)
        ws = _median_s(lambda: store.write_snapshot(snap, 1))
    finally:
        snap.release()
    store.commit(1, [desc["d"]])
    restore, fetch = _reads(store, backend, impl)
    return {"write_s": w, "write_sync_s": ws, "restore_s": _median_s(restore),
            "fetch_s": _median_s(fetch), "bytes": desc["d"]["size"]}


def _reads(store: CheckpointStore, backend, impl: str):
    """``(restore, fetch)``: functions restoring version 1 of ``store`` into a fresh backend
    (checking its entry count against ``backend``'s) and reading its key groups alone."""
    n = backend.num_entries()

    def restore():
        fresh = create_backend(impl, key_type="int64")
        store.restore(fresh, 1)
        if fresh.num_entries() != n:
            raise RuntimeError(f"restored {fresh.num_entries()} entries, expected {n}")
        fresh.close()

    def fetch():
        reader = store.open(1)
        try:
            reader.prefetch(0, reader.max_parallelism - 1, wait=True)
        finally:
            reader.release()

    return restore, fetch


def _s3_figures(store: CheckpointStore, fs, server_pid: int, backend, impl: str) -> dict:
    """The figures of an S3 store next to raw transfers of as many bytes through ``fs``: the
    background write alternating with the raw upload, the fetch and the restore with the raw
    download (:func:`_interleaved`), the synchronous write on its own."""
    snap = backend.snapshot()
    try:
        desc = {}

        def write_async():
            desc["d"] = store.write_snapshot_async(snap, 1, nice=0).result()

        write_async()  # the file's size: as many random bytes for the raw transfers
        data = os.urandom(desc["d"]["size"])

        def upload():
            with fs.open_output_stream(f"{_BUCKET}/raw") as f:
                f.write(data)

        up = _interleaved({"write": write_async, "upload": upload}, server_pid)
        ws = _median_s(lambda: store.write_snapshot(snap, 1))
    finally:
        snap.release()
    store.commit(1, [desc["d"]])
    restore, fetch = _reads(store, backend, impl)

    def download():
        with fs.open_input_file(f"{_BUCKET}/raw") as f:
            if len(f.read()) != len(data):
                raise RuntimeError("short raw download")

    down = _interleaved({"fetch": fetch, "restore": restore, "download": download}, server_pid)
    return {"write_s": up["write"][0], "write_cpu_s": up["write"][1],
            "write_server_cpu_s": up["write"][2], "upload_s": up["upload"][0],
            "upload_cpu_s": up["upload"][1], "upload_server_cpu_s": up["upload"][2],
            "write_sync_s": ws, "restore_s": down["restore"][0],
            "restore_cpu_s": down["restore"][1], "restore_server_cpu_s": down["restore"][2],
            "fetch_s": down["fetch"][0], "download_s": down["download"][0],
            "download_cpu_s": down["download"][1],
            "download_server_cpu_s": down["download"][2], "bytes": desc["d"]["size"]}


@case("s3_checkpoint", "checkpoint write and restore MB/s on S3 (moto server on loopback) vs a "
                       "raw pyarrow.fs upload/download of the same bytes and vs local disk; "
                       "native 2M entries")
def s3_checkpoint(size: Size):
    """Records: impl ``local`` and ``s3``: ``write_MB_per_s``, ``write_sync_MB_per_s``,
    ``restore_MB_per_s``, ``fetch_MB_per_s``; impl ``raw_s3``: ``upload_MB_per_s``,
    ``download_MB_per_s``; impl ``s3``: ``file_bytes``, ``ratio_write_over_raw_upload`` and
    ``ratio_fetch_over_raw_download``, ``ratio_restore_over_raw_download`` (goals 0.8),
    ``ratio_restore_over_local``, ``restore_pieces`` (the GETs of the data file); CPU seconds
    per write / raw upload / restore / raw download: ``write_cpu_s``, ``restore_cpu_s`` (impl
    ``s3``) and ``upload_cpu_s``, ``download_cpu_s`` (impl ``raw_s3``) of this process,
    ``*_server_cpu_s`` of the moto server (Linux only); impl ``machine``: ``load_avg_1m`` at the
    start and the end."""
    c = "s3_checkpoint"
    impl = "native" if has_native() else "python"
    n = size.n(2_000_000, 500_000)
    out = [record(c, impl, "entries", n, "entries"),
           record(c, "machine", "load_avg_1m_start", os.getloadavg()[0], "load")]
    with _moto_server() as server:
        if server is None:
            return []
        _, fs, server_pid = server
        backend = _loaded(impl, n)
        try:
            with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
                local = _local_figures(CheckpointStore(d), backend, impl)
            s3 = _s3_figures(CheckpointStore(f"{_BUCKET}/ckpt", filesystem=fs), fs, server_pid,
                             backend, impl)
        finally:
            backend.close()
    mb = s3["bytes"] / 1e6
    for label, f in (("local", local), ("s3", s3)):
        for m in ("write", "write_sync", "restore", "fetch"):
            out.append(record(c, label, f"{m}_MB_per_s", mb / f[f"{m}_s"], "MB/s"))
    up, down = mb / s3["upload_s"], mb / s3["download_s"]
    out += [record(c, "raw_s3", "upload_MB_per_s", up, "MB/s"),
            record(c, "raw_s3", "download_MB_per_s", down, "MB/s")]
    for label, m, raw in (("s3", "write", "upload"), ("s3", "restore", "download")):
        out += [record(c, label, f"{m}_cpu_s", s3[f"{m}_cpu_s"], "s"),
                record(c, "raw_s3", f"{raw}_cpu_s", s3[f"{raw}_cpu_s"], "s")]
        if s3[f"{m}_server_cpu_s"] is not None and s3[f"{raw}_server_cpu_s"] is not None:
            out += [record(c, label, f"{m}_server_cpu_s", s3[f"{m}_server_cpu_s"], "s"),
                    record(c, "raw_s3", f"{raw}_server_cpu_s", s3[f"{raw}_server_cpu_s"], "s")]
    out += [record(c, "s3", "file_bytes", s3["bytes"], "bytes"),
            record(c, "s3", "restore_pieces",
                   max(1, round(s3["bytes"] / readers.REMOTE_PIECE_BYTES)), "GETs"),
            record(c, "s3", "ratio_write_over_raw_upload", (mb / s3["write_s"]) / up, "ratio"),
            record(c, "s3", "goal_min_ratio_write_over_raw_upload", 0.8, "ratio"),
            record(c, "s3", "ratio_fetch_over_raw_download", (mb / s3["fetch_s"]) / down,
                   "ratio"),
            record(c, "s3", "goal_min_ratio_fetch_over_raw_download", 0.8, "ratio"),
            record(c, "s3", "ratio_restore_over_raw_download", (mb / s3["restore_s"]) / down,
                   "ratio"),
            record(c, "s3", "goal_min_ratio_restore_over_raw_download", 0.8, "ratio"),
            record(c, "s3", "ratio_restore_over_local", local["restore_s"] / s3["restore_s"],
                   "ratio"),
            record(c, "machine", "load_avg_1m_end", os.getloadavg()[0], "load")]
    return out
