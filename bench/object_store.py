"""Checkpoints on S3-compatible object storage: write and restore of a checkpoint through a real
S3 protocol server (moto in server mode, its own process) next to raw ``pyarrow.fs`` uploads and
downloads of the same number of bytes to the same server in the same run, and next to the local
disk. Two server conditions, one after the other on the same server: loopback (``s3`` /
``raw_s3``), and behind a network like S3's (``s3_net`` / ``raw_s3_net``): the loopback proxy
``tests/support/tcp_proxy.py``, in a process of its own, adds :data:`NET_LATENCY_S` (20 ms) to
the first bytes of every answer and caps each connection at :data:`NET_BYTES_PER_S` (80 MB/s)
each way, below the 85-90 MB/s per connection of AWS's "Best Practices Design Patterns:
Optimizing Amazon S3 Performance" ("Horizontal Scaling and Request Parallelization for High
Throughput"). On loopback the moto server is as fast as this process's CPU and reads the whole
object for each ranged GET; behind the proxy each connection's rate and each request's round
trip bound the transfers, as on S3.

Workload: one ReducingState ``sum`` over int64 keys and values, keys ``0 .. n-1``, native backend
(python when the extension is missing), n = 2M entries (``--quick``: 500k). Every figure is the
median (of three repetitions; of five rounds for the alternating ones below; ``--quick``: one),
in MB/s of data-file bytes (1e6 bytes per MB):

* ``write``: ``write_snapshot_async(..., nice=0).result()`` (the Spark operator tasks' write, at
  normal priority: the figure is the write, not how it yields to processing) of a full
  snapshot into a new data file; ``write_sync``: ``write_snapshot``.
* ``restore``: ``CheckpointStore.restore`` into a fresh backend (read the manifest, fetch the
  data file, decode and load it); ``fetch``: those reads alone (``CheckpointStore.open`` and
  ``CheckpointReader.prefetch(..., wait=True)`` of every key group). On S3 the restore asks for
  all of the run's key groups, so the data file is fetched whole as it is opened, in
  ``restore_pieces`` ranged GETs (``readers.REMOTE_PIECE_BYTES``; the footer's piece first,
  or all at once from a store slow to open a file, ``readers.REMOTE_FAR_OPEN_S``), and the key
  groups of each piece are loaded as it arrives while the rest downloads; locally it is a
  header, a trailer, a footer and a key-group read. ``load``: ``backend.restore`` from a reader
  whose data file arrived whole before (untimed): the loading alone. ``overlap_of_fetch_and_load``
  is ``(fetch + load - restore) / min(fetch, load)`` in seconds: 1 where the restore takes the
  longer of the two, 0 where it takes their sum (below 0: longer still, the two competing for
  the cores).
* ``upload`` (raw): ``open_output_stream().write()`` of as many random bytes (pyarrow uploads
  its 10 MiB parts in the background, several at once); ``download``:
  ``open_input_file().read()`` of them (one GET), and ``download_ranged``: the same pieces
  as the restore's, all at once, as ``read_at`` calls on threads of a pool (one GET each, as a
  careful user of ``pyarrow.fs`` reads a large object from S3); the floor of the ratios is the
  faster of the two downloads.

The S3 write and the raw upload alternate (write, upload, write, upload, ... after one unmeasured
round of each), and so do the fetch, the restore and the raw downloads: on a shared machine the
load drifts within a run, and a ratio of two figures taken seconds apart would measure the
drift. Next to the times the case records the CPU seconds (medians) each S3 write, raw upload,
restore and raw download cost this process (all its threads: serializer, writer, pyarrow's
transfers, the loading) and the moto server (Linux: ``/proc/PID/stat``): moto is a Python server
sharing the machine's cores, so on a busy machine our CPU work (serializing, decoding) and the
server's compete, which a raw transfer does not. The proxy's CPU time counts in neither.

Goals (records ``goal_min_*``, never asserted): write >= 0.8 of the raw upload, and fetch and
restore >= 0.8 of the raw download floor, next to restore on local disk. ``load_avg_1m``
records the machine's load when the case ran: a restore overlaps loading with the download only
where a core is free for it.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from bench.common import has_native
from bench.harness import Size, case, record
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
from statecore.checkpoint import readers

_ACCESS_KEY, _SECRET_KEY, _REGION, _BUCKET = "bench", "bench-secret", "us-east-1", "bench"
_REPEAT = 3
#: Rounds of the alternating S3 / raw transfer measures (``--quick``: one, and one repetition
#: of the others): each is under a second, and a shared machine's noise needs more of them
#: than three.
_ROUNDS = 5
#: The second server condition's network (module docstring): first-byte latency added to the
#: answer of every request, seconds, and bandwidth per connection and direction, bytes/s.
NET_LATENCY_S = 0.020
NET_BYTES_PER_S = 80e6
_PROXY = Path(__file__).resolve().parents[1] / "tests" / "support" / "tcp_proxy.py"


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


@contextlib.contextmanager
def _network_proxy(target: str):
    """The endpoint of a ``tests/support/tcp_proxy.py`` process (:data:`NET_LATENCY_S`,
    :data:`NET_BYTES_PER_S`) in front of ``target`` (``host:port`` on loopback), ended on exit.
    A process of its own in this process's scheduling group (Linux autogroup: its priority): its
    threads neither count in this process's CPU seconds nor take its GIL."""
    proc = subprocess.Popen([sys.executable, str(_PROXY), target.rsplit(":", 1)[1],
                             "--latency-ms", str(NET_LATENCY_S * 1000),
                             "--mb-per-s", str(NET_BYTES_PER_S / 1e6)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"network proxy did not start: {line!r}")
        yield f"127.0.0.1:{line.split()[1]}"
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def _store(root: str, fs) -> CheckpointStore:
    """A store on ``root`` of ``fs`` that takes its lease without the takeover delay: this case
    is the root's only driver, and the delay would only lengthen its first commit."""
    return CheckpointStore(root, filesystem=fs, takeover_delay_s=0)


def _loaded(impl: str, n: int):
    b = create_backend(impl, key_type="int64")
    st = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
    for s in range(0, n, 1 << 20):
        k = pa.array(np.arange(s, min(n, s + (1 << 20)), dtype=np.int64))
        st.add_batch(k, k)
    return b


def _median_s(fn, repeat: int = _REPEAT) -> float:
    times = []
    for _ in range(repeat):
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


def _interleaved(fns: dict, server_pid: int, rounds: int) -> dict:
    """Run each of ``fns`` ({name: fn}) once unmeasured, then ``rounds`` rounds of each once in
    turn; ``{name: (seconds, CPU seconds of this process, CPU seconds of the server or None)}``,
    medians over the rounds."""
    for fn in fns.values():
        fn()
    got: dict = {name: ([], [], []) for name in fns}
    for _ in range(rounds):
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
                   statistics.median(s) if len(s) == rounds else None)
            for name, (w, o, s) in got.items()}


def _local_figures(store: CheckpointStore, backend, impl: str, repeat: int) -> dict:
    """Seconds (median of ``repeat``) of the async and sync writes, the restore and the fetch
    of a local store."""
    snap = backend.snapshot()
    try:
        desc = {}

        def write_async():
            desc["d"] = store.write_snapshot_async(snap, 1, nice=0).result()

        w = _median_s(write_async, repeat)
        ws = _median_s(lambda: store.write_snapshot(snap, 1), repeat)
    finally:
        snap.release()
    store.commit(1, [desc["d"]])
    restore, fetch = _reads(store, backend, impl)
    return {"write_s": w, "write_sync_s": ws, "restore_s": _median_s(restore, repeat),
            "fetch_s": _median_s(fetch, repeat), "bytes": desc["d"]["size"]}


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


def _load_s(store: CheckpointStore, backend, impl: str, repeat: int) -> float:
    """Seconds (median of ``repeat``) of ``backend.restore`` into a fresh backend from a reader
    of version 1 whose data file arrived whole before (``prefetch(..., wait=True)``, untimed):
    the loading alone, as a restore does it from that store (on an object store in slices on
    several threads), next to which the restore's overlap of loading and download is judged."""
    n = backend.num_entries()
    times = []
    for _ in range(repeat):
        reader = store.open(1)
        fresh = create_backend(impl, key_type="int64")
        try:
            reader.prefetch(0, reader.max_parallelism - 1, wait=True)
            t = time.perf_counter()
            fresh.restore(reader)
            times.append(time.perf_counter() - t)
            if fresh.num_entries() != n:
                raise RuntimeError(f"loaded {fresh.num_entries()} entries, expected {n}")
        finally:
            reader.release()
            fresh.close()
    return statistics.median(times)


def _s3_figures(store: CheckpointStore, fs, server_pid: int, backend, impl: str,
                rounds: int) -> dict:
    """The figures of an S3 store next to raw transfers of as many bytes through ``fs``: the
    background write alternating with the raw upload, the fetch and the restore with the raw
    downloads (:func:`_interleaved`, ``rounds`` rounds), the synchronous write on its own."""
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

        up = _interleaved({"write": write_async, "upload": upload}, server_pid, rounds)
        ws = _median_s(lambda: store.write_snapshot(snap, 1), min(_REPEAT, rounds))
    finally:
        snap.release()
    store.commit(1, [desc["d"]])
    restore, fetch = _reads(store, backend, impl)

    def download():
        with fs.open_input_file(f"{_BUCKET}/raw") as f:
            if len(f.read()) != len(data):
                raise RuntimeError("short raw download")

    # The same pieces as the restore's GETs, all in flight at once: a careful user's parallel
    # ranged reads (one request per piece, each on a connection of its own).
    pieces = max(1, round(len(data) / readers.REMOTE_PIECE_BYTES))
    cuts = [len(data) * i // pieces for i in range(pieces + 1)]
    ranges = [(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]
    fns = {"fetch": fetch, "restore": restore, "download": download}
    with ThreadPoolExecutor(pieces) as pool:
        def download_ranged():
            with fs.open_input_file(f"{_BUCKET}/raw") as f:
                got = list(pool.map(lambda r: f.read_at(r[1], r[0]), ranges))
            if sum(len(g) for g in got) != len(data):
                raise RuntimeError("short raw ranged download")

        if pieces > 1:
            fns["download_ranged"] = download_ranged
        down = _interleaved(fns, server_pid, rounds)
    down.setdefault("download_ranged", down["download"])
    load = _load_s(store, backend, impl, min(_REPEAT, rounds))
    return {"write_s": up["write"][0], "write_cpu_s": up["write"][1],
            "write_server_cpu_s": up["write"][2], "upload_s": up["upload"][0],
            "upload_cpu_s": up["upload"][1], "upload_server_cpu_s": up["upload"][2],
            "write_sync_s": ws, "restore_s": down["restore"][0],
            "restore_cpu_s": down["restore"][1], "restore_server_cpu_s": down["restore"][2],
            "fetch_s": down["fetch"][0], "load_s": load, "download_s": down["download"][0],
            "download_cpu_s": down["download"][1],
            "download_server_cpu_s": down["download"][2],
            "download_ranged_s": down["download_ranged"][0], "pieces": pieces,
            "bytes": desc["d"]["size"]}


def _condition_records(c: str, ours: str, raw: str, s3: dict, local: dict) -> list:
    """The records of one server condition: ``ours`` (statecore's figures) and ``raw`` (the
    raw transfers') impl labels."""
    mb = s3["bytes"] / 1e6
    out = [record(c, ours, f"{m}_MB_per_s", mb / s3[f"{m}_s"], "MB/s")
           for m in ("write", "write_sync", "restore", "fetch", "load")]
    up, down = mb / s3["upload_s"], mb / s3["download_s"]
    floor = mb / min(s3["download_s"], s3["download_ranged_s"])
    out += [record(c, raw, "upload_MB_per_s", up, "MB/s"),
            record(c, raw, "download_MB_per_s", down, "MB/s"),
            record(c, raw, "download_ranged_MB_per_s", mb / s3["download_ranged_s"], "MB/s"),
            record(c, raw, "download_floor_MB_per_s", floor, "MB/s")]
    for m, t in (("write", "upload"), ("restore", "download")):
        out += [record(c, ours, f"{m}_cpu_s", s3[f"{m}_cpu_s"], "s"),
                record(c, raw, f"{t}_cpu_s", s3[f"{t}_cpu_s"], "s")]
        if s3[f"{m}_server_cpu_s"] is not None and s3[f"{t}_server_cpu_s"] is not None:
            out += [record(c, ours, f"{m}_server_cpu_s", s3[f"{m}_server_cpu_s"], "s"),
                    record(c, raw, f"{t}_server_cpu_s", s3[f"{t}_server_cpu_s"], "s")]
    out += [record(c, ours, "file_bytes", s3["bytes"], "bytes"),
            record(c, ours, "restore_pieces", s3["pieces"], "GETs"),
            record(c, ours, "ratio_write_over_raw_upload", (mb / s3["write_s"]) / up, "ratio"),
            record(c, ours, "goal_min_ratio_write_over_raw_upload", 0.8, "ratio"),
            record(c, ours, "ratio_fetch_over_raw_download", (mb / s3["fetch_s"]) / floor,
                   "ratio"),
            record(c, ours, "goal_min_ratio_fetch_over_raw_download", 0.8, "ratio"),
            record(c, ours, "ratio_restore_over_raw_download", (mb / s3["restore_s"]) / floor,
                   "ratio"),
            record(c, ours, "goal_min_ratio_restore_over_raw_download", 0.8, "ratio"),
            record(c, ours, "ratio_restore_over_local", local["restore_s"] / s3["restore_s"],
                   "ratio"),
            record(c, ours, "overlap_of_fetch_and_load",
                   (s3["fetch_s"] + s3["load_s"] - s3["restore_s"])
                   / min(s3["fetch_s"], s3["load_s"]), "ratio")]
    return out


def _panel(r) -> object:
    """Rates and ratios, one panel each per server condition (the local disk's rates next to
    the loopback ones); the network's settings are not bars."""
    if r["unit"] not in ("MB/s", "ratio") or r["metric"].startswith("net_"):
        return None
    where = "S3-like network" if r["impl"].endswith("_net") else "loopback"
    m = r["metric"].removesuffix("_MB_per_s").removeprefix("goal_min_").removeprefix("ratio_")
    return f"{where}, {r['unit']}", f"{r['impl'].removesuffix('_net')} {m}"


@case("s3_checkpoint", "checkpoint write and restore MB/s on S3 (moto server on loopback, and "
                       "behind an S3-like network) vs raw pyarrow.fs uploads/downloads of the "
                       "same bytes and vs local disk; native 2M entries", panel=_panel)
def s3_checkpoint(size: Size):
    """Records, for each server condition (impls ``s3`` / ``raw_s3``: moto on loopback;
    ``s3_net`` / ``raw_s3_net``: the same server behind the network proxy): impl ``s3*`` and
    ``local``: ``write_MB_per_s``, ``write_sync_MB_per_s``, ``restore_MB_per_s``,
    ``fetch_MB_per_s``; impl ``raw_s3*``: ``upload_MB_per_s``, ``download_MB_per_s`` (one GET),
    ``download_ranged_MB_per_s`` (the restore's pieces as parallel ranged GETs),
    ``download_floor_MB_per_s`` (the faster of the two); impl ``s3*``: ``file_bytes``,
    ``ratio_write_over_raw_upload`` and ``ratio_fetch_over_raw_download``,
    ``ratio_restore_over_raw_download`` (over the download floor; goals 0.8),
    ``ratio_restore_over_local``, ``restore_pieces`` (the GETs of the data file),
    ``load_MB_per_s`` (the loading of fetched bytes alone) and ``overlap_of_fetch_and_load``
    (module docstring); CPU seconds
    per write / raw upload / restore / raw download (one GET): ``write_cpu_s``,
    ``restore_cpu_s`` (impl ``s3*``) and ``upload_cpu_s``, ``download_cpu_s`` (impl
    ``raw_s3*``) of this process, ``*_server_cpu_s`` of the moto server (Linux only); impl
    ``s3_net``: ``net_first_byte_latency_ms``, ``net_MB_per_s_per_connection``; impl
    ``machine``: ``load_avg_1m`` at the start and the end."""
    c = "s3_checkpoint"
    impl = "native" if has_native() else "python"
    n = size.n(2_000_000, 500_000)
    rounds = 1 if size.quick else _ROUNDS
    out = [record(c, impl, "entries", n, "entries"),
           record(c, "machine", "load_avg_1m_start", os.getloadavg()[0], "load")]
    with _moto_server() as server:
        if server is None:
            return []
        endpoint, fs, server_pid = server
        backend = _loaded(impl, n)
        try:
            with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
                local = _local_figures(CheckpointStore(d), backend, impl, min(_REPEAT, rounds))
            s3 = _s3_figures(_store(f"{_BUCKET}/ckpt", fs), fs, server_pid,
                             backend, impl, rounds)
            with _network_proxy(endpoint) as net_endpoint:
                net_fs = pafs.S3FileSystem(access_key=_ACCESS_KEY, secret_key=_SECRET_KEY,
                                           region=_REGION, endpoint_override=net_endpoint,
                                           scheme="http")
                net = _s3_figures(_store(f"{_BUCKET}/ckpt-net", net_fs),
                                  net_fs, server_pid, backend, impl, rounds)
        finally:
            backend.close()
    mb = s3["bytes"] / 1e6
    for m in ("write", "write_sync", "restore", "fetch"):
        out.append(record(c, "local", f"{m}_MB_per_s", mb / local[f"{m}_s"], "MB/s"))
    out += _condition_records(c, "s3", "raw_s3", s3, local)
    out += _condition_records(c, "s3_net", "raw_s3_net", net, local)
    out += [record(c, "s3_net", "net_first_byte_latency_ms", NET_LATENCY_S * 1000, "ms"),
            record(c, "s3_net", "net_MB_per_s_per_connection", NET_BYTES_PER_S / 1e6,
                   "MB/s"),
            record(c, "machine", "load_avg_1m_end", os.getloadavg()[0], "load")]
    return out
