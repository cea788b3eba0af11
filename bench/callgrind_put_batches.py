"""Instruction counts per row of the native put kernels under callgrind (instruction counts are
steady where a shared machine's timings are not, so they show small changes).

    python -m bench.callgrind_put_batches CASE [run|setup]

CASE: ``map`` (MapState.put_batch, 1M rows over 100k int64 keys, int64 user keys 0..15 ->
int64, the ``map_put`` bench workload), ``list`` (ListState.append_batch of int64 elements,
the ``list_append`` workload) or ``binary`` (ValueState.put_batch of 64-byte binary values,
2M rows over 1M int64 keys, the ``binary_values`` put phase); all through the native backend
in the bench's 64k-row batches. ``setup`` builds the same inputs and backend without the puts.
Instructions per row = (Ir of ``run`` - Ir of ``setup``) / rows, e.g. from the checkout's root::

    valgrind --tool=callgrind --callgrind-out-file=map.out \\
        python -m bench.callgrind_put_batches map run
    valgrind --tool=callgrind --callgrind-out-file=map0.out \\
        python -m bench.callgrind_put_batches map setup

(rows: 1,000,000 for map and list, 2,000,000 for binary).
"""

import sys

import numpy as np
import pyarrow as pa

from bench.workloads import binary_values, int64_keys, row_order, slices
from statecore import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor, create_backend


def main(case: str, mode: str) -> None:
    """Build the inputs of ``case`` and, when ``mode`` is ``run``, put them. Raises SystemExit
    for an unknown case or mode."""
    b = create_backend("native", key_type="int64")
    if case in ("map", "list"):
        distinct = 100_000
        keys = int64_keys(distinct, seed=11)[row_order(distinct, 10, seed=12)]
        uks = np.random.default_rng(13).integers(0, 16, len(keys)).astype(np.int64)
        vals = np.arange(len(keys), dtype=np.int64)
        cols = [pa.array(keys)] + ([pa.array(uks)] if case == "map" else []) + [pa.array(vals)]
        batches = list(zip(*(slices(a) for a in cols)))
        if case == "map":
            st = b.get_state(MapStateDescriptor("m", "int64", "int64"))
            run = lambda: [st.put_batch(k, u, v) for k, u, v in batches]  # noqa: E731
        else:
            st = b.get_state(ListStateDescriptor("l", "int64"))
            run = lambda: [st.append_batch(k, v) for k, v in batches]  # noqa: E731
    elif case == "binary":
        distinct = 1_000_000
        keys = int64_keys(distinct, seed=3)
        pk = pa.array(keys[row_order(distinct, 2, seed=4)])
        batches = list(zip(slices(pk), slices(binary_values(len(pk)))))
        st = b.get_state(ValueStateDescriptor("v", "binary"))
        run = lambda: [st.put_batch(k, v) for k, v in batches]  # noqa: E731
    else:
        raise SystemExit(f"unknown case {case!r} (map, list, binary)")
    if mode == "run":
        run()
    elif mode != "setup":
        raise SystemExit(f"unknown mode {mode!r} (run, setup)")
    b.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "run")
