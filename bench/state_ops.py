"""State-operation benchmark: native backend vs pure-Python backend vs a bare Python dict.

Run:  python bench/state_ops.py [--keys 200000] [--rows 2000000] [--json bench/results/state_ops.json]
                                [--plot bench/results/state_ops.png]

Cases (all measured in one run, so ratios between implementations are meaningful):
- ``add_batch_int64``: running sum per row (ReducingState "sum", int64 keys, Arrow batches of
  64k rows) — native kernel vs PythonBackend.add_batch vs a dict loop over the same rows.
- ``per_record``: set_current_key + ValueState.value()/update() per row (int64 -> int64).
- ``snapshot_pause``: wall time of ``backend.snapshot()`` with N entries (synchronous part only).
- ``checkpoint_write``: bytes and MB/s of writing that snapshot through CheckpointStore.

Prints a table and writes JSON records ``{"case", "impl", "metric", "value", "unit"}``.
Timings are wall-clock on a shared machine: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from statecore import CheckpointStore, ReducingStateDescriptor, ValueStateDescriptor, create_backend


def _batches(keys: int, rows: int, batch: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        out.append((pa.array(rng.integers(0, keys, n, dtype=np.int64)), pa.array(np.ones(n, np.int64))))
    return out


def bench_add_batch(keys: int, rows: int, records: list) -> None:
    batches = _batches(keys, rows, 65536)
    for impl in ("native", "python"):
        b = create_backend(impl, key_type="int64")
        st = b.get_state(ReducingStateDescriptor("count", "sum", "int64"))
        n = rows if impl == "native" else min(rows, 400_000)
        t = time.perf_counter()
        done = 0
        for k, v in batches:
            if done >= n:
                break
            st.add_batch(k, v)
            done += len(k)
        dt = time.perf_counter() - t
        records.append(dict(case="add_batch_int64", impl=impl, metric="rows_per_s", value=done / dt, unit="rows/s"))
        if impl == "native":
            records.append(dict(case="add_batch_int64", impl=impl, metric="state_bytes_per_entry",
                                value=b.state_bytes() / max(1, b.num_entries()), unit="bytes"))
    d: dict = {}
    t = time.perf_counter()
    done = 0
    for k, v in batches:
        if done >= min(rows, 1_000_000):
            break
        out = []
        for key, val in zip(k.to_numpy().tolist(), v.to_numpy().tolist()):
            acc = d.get(key, 0) + val
            d[key] = acc
            out.append(acc)
        pa.array(out, pa.int64())
        done += len(k)
    records.append(dict(case="add_batch_int64", impl="dict", metric="rows_per_s",
                        value=done / (time.perf_counter() - t), unit="rows/s"))


def bench_per_record(keys: int, records: list, n: int = 200_000) -> None:
    rng = np.random.default_rng(11)
    ks = rng.integers(0, keys, n, dtype=np.int64).tolist()
    for impl in ("native", "python"):
        b = create_backend(impl, key_type="int64")
        st = b.get_state(ValueStateDescriptor("v", "int64", default=0))
        t = time.perf_counter()
        for k in ks:
            b.set_current_key(k)
            st.update(st.value() + 1)
        records.append(dict(case="per_record", impl=impl, metric="records_per_s",
                            value=n / (time.perf_counter() - t), unit="records/s"))


def bench_snapshot(entries: int, records: list) -> None:
    for impl in ("native", "python"):
        b = create_backend(impl, key_type="int64")
        st = b.get_state(ValueStateDescriptor("v", "int64"))
        step = 1_000_000
        for s in range(0, entries, step):
            k = pa.array(np.arange(s, min(entries, s + step), dtype=np.int64))
            st.put_batch(k, k)
        t = time.perf_counter()
        snap = b.snapshot()
        pause = time.perf_counter() - t
        records.append(dict(case="snapshot_pause", impl=impl, metric=f"pause_at_{entries}_entries",
                            value=pause * 1e3, unit="ms"))
        with tempfile.TemporaryDirectory() as d:
            store = CheckpointStore(d)
            t = time.perf_counter()
            desc = store.write_snapshot(snap, 1)
            dt = time.perf_counter() - t
            size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
        raw = b.state_bytes()
        records.append(dict(case="checkpoint_write", impl=impl, metric="MB_per_s", value=raw / dt / 1e6, unit="MB/s"))
        records.append(dict(case="checkpoint_write", impl=impl, metric="file_bytes", value=size, unit="bytes"))
        snap.release()
        del desc


def plot(records: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r["unit"] in ("rows/s", "records/s")]
    labels = [f"{r['case']}\n{r['impl']}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(labels, [r["value"] for r in rows], color=["#1f77b4" if r["impl"] == "native" else "#999" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("rows or records per second (log)")
    ax.set_title(f"statecore state operations ({platform.machine()}, {os.cpu_count()} cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--snapshot-entries", type=int, default=1_000_000)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    records: list = []
    bench_add_batch(a.keys, a.rows, records)
    bench_per_record(a.keys, records)
    bench_snapshot(a.snapshot_entries, records)
    for r in records:
        print(f"{r['case']:18s} {r['impl']:7s} {r['metric']:28s} {r['value']:>16,.2f} {r['unit']}")
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                   "python": sys.version.split()[0]}, "records": records}, f, indent=1)
    if a.plot:
        plot(records, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
