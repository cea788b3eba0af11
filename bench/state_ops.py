"""State-operation cases: native backend vs pure-Python backend vs a bare Python dict."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa

from bench.harness import Size, case, record, timed
from statecore import CheckpointStore, ReducingStateDescriptor, ValueStateDescriptor, create_backend


def _batches(keys: int, rows: int, batch: int = 65536, seed: int = 7):
    rng = np.random.default_rng(seed)
    return [(pa.array(rng.integers(0, keys, min(batch, rows - s), dtype=np.int64)),
             pa.array(np.ones(min(batch, rows - s), np.int64)))
            for s in range(0, rows, batch)]


@case("add_batch_int64",
      "running sum per row (ReducingState sum, int64 keys, 64k-row Arrow batches)")
def add_batch_int64(size: Size):
    keys, rows = size.n(200_000, 50_000), size.n(2_000_000, 400_000)
    batches = _batches(keys, rows)
    out = []
    for impl, limit in (("native", rows), ("python", min(rows, size.n(400_000, 100_000)))):
        b = create_backend(impl, key_type="int64")
        st = b.get_state(ReducingStateDescriptor("count", "sum", "int64"))
        todo = [bv for i, bv in enumerate(batches) if i * 65536 < limit]
        n = sum(len(k) for k, _ in todo)
        dt = timed(lambda: [st.add_batch(k, v) for k, v in todo])
        out.append(record("add_batch_int64", impl, "rows_per_s", n / dt, "rows/s"))
        if impl == "native":
            out.append(record("add_batch_int64", impl, "state_bytes_per_entry",
                              b.state_bytes() / max(1, b.num_entries()), "bytes"))

    def dict_loop(todo):
        d = {}
        for k, v in todo:
            res = []
            for key, val in zip(k.to_numpy().tolist(), v.to_numpy().tolist()):
                acc = d.get(key, 0) + val
                d[key] = acc
                res.append(acc)
            pa.array(res, pa.int64())

    todo = [bv for i, bv in enumerate(batches) if i * 65536 < min(rows, size.n(1_000_000, 200_000))]
    n = sum(len(k) for k, _ in todo)
    out.append(record("add_batch_int64", "dict", "rows_per_s", n / timed(lambda: dict_loop(todo)),
                      "rows/s"))
    return out


@case("per_record", "set_current_key + ValueState.value()/update() per record (int64 -> int64), "
                    "native vs python, and the goal native >= python")
def per_record(size: Size):
    """records/s of ``set_current_key(k)`` then ``update(value() + 1)`` per record over random
    int64 keys (200k records over 200k possible keys; ``--quick`` 50k), best of three runs each
    on a fresh backend (the first run in a process is measurably slower, and one run of a
    shared machine is noisy). Also ``ratio_over_python`` (native over python records/s) and the
    goal that the per-record API be no slower than the pure-Python backend:
    ``goal_min_ratio_over_python`` (1.0) and ``goal_met_ratio_over_python_ge_1`` (1 met, 0
    not)."""
    n = size.n(200_000, 50_000)
    ks = np.random.default_rng(11).integers(0, size.n(200_000, 50_000), n, dtype=np.int64).tolist()
    out = []
    rates = {}
    for impl in ("native", "python"):
        best = float("inf")
        for _ in range(3):
            b = create_backend(impl, key_type="int64")
            st = b.get_state(ValueStateDescriptor("v", "int64", default=0))

            def loop():
                for k in ks:
                    b.set_current_key(k)
                    st.update(st.value() + 1)

            best = min(best, timed(loop))
            b.close()
        rates[impl] = n / best
        out.append(record("per_record", impl, "records_per_s", rates[impl], "records/s"))
    ratio = rates["native"] / rates["python"]
    out += [record("per_record", "native", "ratio_over_python", ratio, "ratio"),
            record("per_record", "native", "goal_min_ratio_over_python", 1.0, "ratio"),
            record("per_record", "native", "goal_met_ratio_over_python_ge_1", float(ratio >= 1.0),
                   "bool")]
    return out


@case("snapshot",
      "synchronous snapshot() pause, then a full checkpoint write of it (int64 -> int64)")
def snapshot(size: Size):
    entries = size.n(1_000_000, 200_000)
    out = []
    for impl in ("native", "python"):
        b = create_backend(impl, key_type="int64")
        st = b.get_state(ValueStateDescriptor("v", "int64"))
        for s in range(0, entries, 1_000_000):
            k = pa.array(np.arange(s, min(entries, s + 1_000_000), dtype=np.int64))
            st.put_batch(k, k)
        snap = None

        def take():
            nonlocal snap
            snap = b.snapshot()

        pause = timed(take)
        out.append(record("snapshot", impl, f"pause_ms_at_{entries}_entries", pause * 1e3, "ms"))
        with tempfile.TemporaryDirectory() as d:
            store = CheckpointStore(d)
            dt = timed(lambda: store.write_snapshot(snap, 1))
            size_on_disk = sum(os.path.getsize(os.path.join(r, f))
                               for r, _, fs in os.walk(d) for f in fs)
        out.append(record("checkpoint_write", impl, "state_MB_per_s", b.state_bytes() / dt / 1e6,
                          "MB/s"))
        out.append(record("checkpoint_write", impl, "file_bytes", size_on_disk, "bytes"))
        snap.release()
    return out
