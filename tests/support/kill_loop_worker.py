"""Run by test_sigkill_loop in a fresh interpreter, to be SIGKILLed at a random moment: it
restores the latest committed version of a checkpoint (or starts empty), then checkpoints one
version after another -- each the state of the previous one plus the operations of
:func:`ops` -- compacting, retaining and restoring on the way, and prints ``committed V`` (flushed)
once ``V``'s commit has returned. The state of every version is a function of the version alone
(:func:`expected`), so whoever kills it can check what is left."""

import random
import sys

import pyarrow as pa

import statecore
from statecore import CheckpointStore, ListStateDescriptor, ValueStateDescriptor

KEYS = 400


def ops(version: int) -> list:
    """The operations of ``version``: ``(key, value or None for a removal, appended element)``."""
    rng = random.Random(version)
    return [(rng.randrange(KEYS), None if rng.random() < 0.2 else version * 1000 + i, version)
            for i in range(rng.randint(1, 120))]


def expected(version: int) -> dict:
    """``{key: (value, list)}`` after versions ``0..version``."""
    state: dict = {}
    for v in range(version + 1):
        for k, val, elem in ops(v):
            value, lst = state.get(k, (None, []))
            value = val
            lst = lst + [elem] if val is not None else []
            if value is None:
                state.pop(k, None)
            else:
                state[k] = (value, lst)
    return state


def backend(kind: str):
    b = statecore.create_backend(kind, key_type="int64", max_parallelism=32)
    return (b, b.get_state(ValueStateDescriptor("v", "int64")),
            b.get_state(ListStateDescriptor("l", "int64")))


def contents(b, v, lst) -> dict:
    out = {}
    for k in b.keys("v"):
        b.set_current_key(k)
        out[k] = (v.value(), lst.get())
    return out


def apply(v, lst, b, version: int) -> None:
    rows = ops(version)
    for k, val, elem in rows:
        b.set_current_key(k)
        if val is None:
            v.clear()
            lst.clear()
        else:
            v.update(val)
            lst.add(elem)
    # and the same through the batch API, idempotently: re-put the surviving values
    live: dict = {}
    for k, val, _ in rows:
        if val is None:
            live.pop(k, None)
        else:
            live[k] = val
    if live:
        v.put_batch(pa.array(list(live), pa.int64()), pa.array(list(live.values()), pa.int64()))


def main(root: str, kind: str, seed: int) -> None:
    rng = random.Random(seed)
    store = CheckpointStore(root, max_runs=3)
    b, v, lst = backend(kind)
    latest = store.latest_version()
    if latest is None:
        version = 0
    else:
        store.restore(b, latest)
        if contents(b, v, lst) != expected(latest):
            sys.exit(f"version {latest} restored wrong contents")
        version = latest + 1
    while True:
        apply(v, lst, b, version)
        store.checkpoint(b, version)
        print(f"committed {version}", flush=True)
        r = rng.random()
        if r < 0.2:
            store.retain(rng.randint(1, 4))
        elif r < 0.35:
            store.compact(version, max_runs=1)
        elif r < 0.45:  # a restore in the middle, as a restart would
            b.dispose()
            b, v, lst = backend(kind)
            store.restore(b, version)
        version += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
