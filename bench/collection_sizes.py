"""What the one-key collection cases (``list_entries``, ``map_entries``) share: the backends
and collection sizes they run, their batch and operation counts, and the checkpoint measure (the
bytes of a full checkpoint of one big collection, then of the incremental one after a single
change, and the entries that incremental run holds)."""

from __future__ import annotations

import shutil
import tempfile

from bench.common import has_native
from bench.harness import Size, record
from statecore.checkpoint import CheckpointStore

#: Per-record operations a case times on the full collection.
OPS = 2000
#: Rows per Arrow batch of the batch calls.
BATCH = 65536


def impls() -> list:
    """The backends measured: native (when built) and python."""
    return (["native"] if has_native() else []) + ["python"]


def sizes(size: Size, impl: str) -> list:
    """Collection sizes (entries under one key): 10, 1k, 100k and, native only, 1M
    (``--quick``: 10, 1k, 10k for both)."""
    if size.quick:
        return [10, 1000, 10_000]
    return [10, 1000, 100_000] + ([1_000_000] if impl == "native" else [])


def per_us(seconds: float, count: int) -> float:
    """Microseconds per item of ``count`` items that took ``seconds``."""
    return seconds * 1e6 / max(count, 1)


def checkpoint_records(case_name: str, impl: str, n: int, backend, state_name: str,
                       change) -> list:
    """Checkpoint ``backend`` (its collection of ``n`` entries built) as version 1 (full), call
    ``change()`` (one change of the collection under key 0), checkpoint version 2 (incremental)
    into a temporary store, and return the records ``checkpoint_full_bytes_{n}``,
    ``checkpoint_incremental_bytes_{n}`` (bytes) and ``checkpoint_incremental_entries_{n}``
    (entries of ``state_name`` in version 2's own runs). Disposes ``backend``."""
    root = tempfile.mkdtemp(prefix="statecore-bench-")
    try:
        store = CheckpointStore(root)
        full = store.checkpoint(backend, 1)
        backend.set_current_key(0)
        change()
        inc = store.checkpoint(backend, 2)
        d1, d2 = store.describe(1), store.describe(2)
        assert full["files"] and inc["files"]
        return [record(case_name, impl, f"checkpoint_full_bytes_{n}", d1["bytes_added"], "bytes"),
                record(case_name, impl, f"checkpoint_incremental_bytes_{n}", d2["bytes_added"],
                       "bytes"),
                record(case_name, impl, f"checkpoint_incremental_entries_{n}",
                       sum(r["entries"][state_name] for r in d2["run_list"]
                           if r["version"] == 2), "entries")]
    finally:
        backend.dispose()
        shutil.rmtree(root, ignore_errors=True)
