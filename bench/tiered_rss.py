"""The resident memory of a tiered backend's running count, measured in a fresh interpreter (so
that nothing the benchmark process allocated before counts): ``python -m bench.tiered_rss
STORE KEYS_NPY BUDGET CACHE BATCH [SPILL_DIR]`` attaches version 1 of the checkpoint store at
``STORE`` with ``memory_budget=BUDGET`` and ``cache_bytes=CACHE`` (bytes), runs the running count
(``ReducingState`` sum of int64, ``add_batch`` of ``BATCH`` rows) over the keys saved at
``KEYS_NPY`` and prints one JSON object: ``baseline_rss_bytes`` (``VmRSS`` after the imports and
the attach), ``peak_rss_bytes`` (``VmHWM`` at the end, so every transient peak counts),
``rss_delta_bytes`` (their difference: what the run added), ``state_bytes_max`` (the most key
and value bytes held after a batch), and the backend's ``tiered_statistics()``. Linux only
(``/proc/self/status``). Used by :func:`bench.tiered.tiered_running_count`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["measure", "proc_status_bytes"]


def proc_status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure(store: Path, keys_npy: Path, budget: int, cache_bytes: int, batch: int,
            spill_dir: Path | None = None) -> dict | None:
    """Run this module on the arguments in a fresh interpreter; its JSON result, or None where
    ``/proc/self/status`` does not exist."""
    if not os.path.exists("/proc/self/status"):
        return None
    args = [sys.executable, "-m", "bench.tiered_rss", str(store), str(keys_npy), str(budget),
            str(cache_bytes), str(batch)] + ([str(spill_dir)] if spill_dir is not None else [])
    out = subprocess.run(args, check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, env=dict(os.environ))
    return json.loads(out.stdout)


def _main(store: str, keys_npy: str, budget: str, cache: str, batch: str,
          spill_dir: str | None = None):
    import numpy as np
    import pyarrow as pa

    from statecore import CheckpointStore, ReducingStateDescriptor, create_backend

    keys = np.load(keys_npy)
    b, n = int(budget), int(batch)
    st = CheckpointStore(store)
    tb = create_backend("native", key_type="int64", memory_budget=b, checkpoint=st,
                        cache_bytes=int(cache), spill_dir=spill_dir)
    st.restore(tb, 1)
    state = tb.get_state(ReducingStateDescriptor("c", "sum", "int64"))
    ones = pa.array(np.ones(n, dtype=np.int64))
    batches = [pa.array(keys[i:i + n]) for i in range(0, len(keys) - n + 1, n)]
    baseline = proc_status_bytes("VmRSS")
    held = 0
    for k in batches:
        state.add_batch(k, ones)
        held = max(held, tb.state_bytes())
    peak = proc_status_bytes("VmHWM")
    stats = tb.tiered_statistics()
    stats.pop("lookup", None)
    tb.close()
    print(json.dumps({"baseline_rss_bytes": baseline, "peak_rss_bytes": peak,
                      "rss_delta_bytes": peak - baseline, "state_bytes_max": held,
                      "stats": stats}))


if __name__ == "__main__":
    _main(*sys.argv[1:])
