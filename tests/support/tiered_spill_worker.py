"""Run by test_tiered_spill's kill test in a fresh interpreter, to be SIGKILLed at a random
moment: a tiered backend with a budget of a few entries attaches the latest committed version
of a checkpoint (or starts empty), then checkpoints one version after another -- each the state
of the previous one plus the operations of :func:`ops`, whose changes exceed the budget many
times over, so every version spills several runs -- and prints ``committed V`` (flushed) once
``V``'s checkpoint returned. The state of every version is a function of the version alone
(:func:`expected`).

Usage: ``python tiered_spill_worker.py STORE SPILL_DIR``."""

import random
import sys

import pyarrow as pa

from statecore import create_backend
from statecore.checkpoint import CheckpointStore
from statecore.descriptors import ReducingStateDescriptor, ValueStateDescriptor

KEYS = 600
BUDGET = 40 * 18  # 40 int64 -> int64 entries


def ops(version: int) -> list:
    """The operations of ``version``: ``(key, value or None for a removal)``."""
    rng = random.Random(version)
    return [(rng.randrange(KEYS), None if rng.random() < 0.15 else version * 1000 + i)
            for i in range(rng.randint(100, 300))]


def expected(version: int) -> dict:
    """``{key: (value, count)}`` after versions ``1..version``: the last value written and the
    writes counted since the key's last removal."""
    state: dict = {}
    for v in range(1, version + 1):
        for k, val in ops(v):
            if val is None:
                state.pop(k, None)
            else:
                state[k] = (val, state.get(k, (None, 0))[1] + 1)
    return state


def states(backend):
    return (backend.get_state(ValueStateDescriptor("v", "int64")),
            backend.get_state(ReducingStateDescriptor("n", "sum", "int64")))


def main(store_path: str, spill_dir: str) -> None:
    store = CheckpointStore(store_path)
    b = create_backend("native", key_type="int64", memory_budget=BUDGET, checkpoint=store,
                       spill_dir=spill_dir)
    version = store.latest_version() or 0
    if version:
        store.restore(b, version)
    v, n = states(b)
    while True:
        version += 1
        # Writes between two removals go as one batch (rows apply in order); each removal
        # clears its key.
        segment: list = []
        for k, x in ops(version) + [(None, None)]:
            if x is not None:
                segment.append((k, x))
                continue
            if segment:
                keys = pa.array([k for k, _ in segment], pa.int64())
                v.put_batch(keys, pa.array([x for _, x in segment], pa.int64()))
                n.add_batch(keys, pa.array([1] * len(segment), pa.int64()))
                segment = []
            if k is not None:
                one = pa.array([k], pa.int64())
                v.clear_batch(one)
                n.clear_batch(one)
        store.checkpoint(b, version)
        print(f"committed {version}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
