"""Offline state cases: writing version 0 of a checkpoint from Arrow data.

``bootstrap``: ``statecore.offline.bootstrap_checkpoint`` against the way a job without it
would get the same checkpoint, loading the rows into a backend with its batch API and
checkpointing it (``CheckpointStore.checkpoint``). Two workloads, keys ``k0 .. k{n/10-1}``
(string keys, max parallelism 128): a value state of int64 values, one row per key (``n/10``
rows), and a list state of string elements, ten rows per key (``n`` rows; the backends append
them with one ``append_batch``). Rates are input rows per second,
end to end (encoding, sorting, the data file and the manifest).
"""

from __future__ import annotations

import tempfile

import pyarrow as pa

from bench.common import has_native, note
from bench.harness import Size, case, record, timed
from statecore import CheckpointStore, ListStateDescriptor, ValueStateDescriptor, create_backend
from statecore.offline import StateInput, bootstrap_checkpoint

_MP = 128


def _inputs(n: int):
    keys = n // 10
    names = pa.array([f"k{i}" for i in range(keys)], pa.string())
    value = pa.table({"key": names, "value": pa.array(range(keys), pa.int64())})
    lists = pa.table({"key": pa.concat_arrays([names] * 10),
                      "value": pa.array([f"element-{i}" for i in range(keys * 10)], pa.string())})
    return {"value": (ValueStateDescriptor("v", "int64"), value),
            "list": (ListStateDescriptor("l", "string"), lists)}


def _load_and_checkpoint(kind: str, descriptor, table: pa.Table, root: str) -> None:
    b = create_backend(kind, key_type="string", max_parallelism=_MP)
    st = b.get_state(descriptor)
    if descriptor.kind == "value":
        st.put_batch(table.column("key"), table.column("value"))
    else:
        st.append_batch(table.column("key"), table.column("value"))
    CheckpointStore(root).checkpoint(b, 0, incremental=False)
    b.dispose()


@case("bootstrap", "write version 0 of a checkpoint from an Arrow table: rows/s of "
                   "offline.bootstrap_checkpoint vs loading a backend and checkpointing it; a "
                   "value state (100k rows) and a list state (1M elements)")
def bootstrap(size: Size):
    """Records per workload (``value``, ``list``) and impl (``bootstrap``, ``native+checkpoint``,
    ``python+checkpoint``): ``rows_per_s_<workload>`` (input rows / seconds, one run) and
    ``file_bytes_<workload>`` (the version's data files)."""
    n = size.n(1_000_000, 200_000)
    inputs = _inputs(n)
    impls = ["bootstrap"] + (["native+checkpoint"] if has_native() else []) + \
        ["python+checkpoint"]
    if not has_native():
        note("bootstrap: the native extension is missing; native+checkpoint left out")
    out = []
    for workload, (descriptor, table) in inputs.items():
        for impl in impls:
            with tempfile.TemporaryDirectory(prefix="statecore-bench-") as root:
                if impl == "bootstrap":
                    s = timed(lambda: bootstrap_checkpoint(
                        root, [StateInput(descriptor, table)], key_type="string",
                        max_parallelism=_MP))
                else:
                    kind = impl.split("+")[0]
                    s = timed(lambda: _load_and_checkpoint(kind, descriptor, table, root))
                files = CheckpointStore(root).manifest(0)["files"]
                out.append(record("bootstrap", impl, f"rows_per_s_{workload}", len(table) / s,
                                  "rows/s"))
                out.append(record("bootstrap", impl, f"file_bytes_{workload}",
                                  sum(int(f["size"]) for f in files), "bytes"))
    return out
