"""Byte buffers reused across checkpoint reads: the stored bytes a reader reads from a data file
and the arrays ``decode_blocks`` decodes them into.

Why: a standby catch-up reads and decodes megabytes of changes every micro-batch. Freshly
allocated each time, those bytes come from memory the allocators have given back to the OS since
the previous micro-batch (glibc trims a freed heap top and unmaps large blocks; pyarrow's
mimalloc purges freed pages shortly after they are freed), so every 4 KiB page is faulted in
again, and touching fresh memory is many times slower than rewriting mapped memory. Reused
buffers stay mapped.

A buffer is lent out as a view (:func:`take`) and is free again once nothing refers to it but
this module: every view of a NumPy array, and every Arrow buffer over such a view, holds a
reference to the array, so its CPython reference count says whether it is in use. At most
:data:`MAX_RETAINED_BYTES` are kept; requests below :data:`MIN_BYTES` are plain allocations,
as is every request in a free-threaded interpreter. Thread-safe.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["take", "retained_bytes", "MAX_RETAINED_BYTES", "MIN_BYTES"]

#: Requests smaller than this (bytes) are not pooled: the allocators keep small blocks mapped.
MIN_BYTES = 256 << 10
#: Most bytes kept for reuse per process (room for the buffers of a catch-up of a large
#: partition).
MAX_RETAINED_BYTES = 64 << 20

_LOCK = threading.Lock()
_BUFFERS: list = []  # uint8 arrays owned here, lent out as views
# Reuse is decided by reference counts, which a free-threaded interpreter (no GIL) does not
# keep exact: there every request is a plain allocation.
_POOLING = getattr(sys, "_is_gil_enabled", lambda: True)()


def _free(i: int) -> bool:
    # The list's reference and getrefcount's argument: nothing else holds it (module docstring).
    return sys.getrefcount(_BUFFERS[i]) == 2


def take(nbytes: int) -> np.ndarray:
    """A writable ``uint8`` array of ``nbytes`` bytes (contents undefined) that may share memory
    with an earlier one nothing refers to any more. Its memory is reused once the array and
    everything made from it (views, ``pa.py_buffer`` over it) are gone. Raises ValueError for a
    negative size, MemoryError when none is left."""
    if nbytes < 0:
        raise ValueError(f"negative buffer size {nbytes}")
    if nbytes < MIN_BYTES or not _POOLING:
        return np.empty(nbytes, np.uint8)
    with _LOCK:
        # By index: a loop variable (or enumerate's reused tuple) would hold a reference.
        pick, pick_size = None, 0
        for i in range(len(_BUFFERS)):
            size = _BUFFERS[i].nbytes
            if size >= nbytes and (pick is None or size < pick_size) and _free(i):
                pick, pick_size = i, size
        if pick is not None:
            return _BUFFERS[pick][:nbytes]
        # Room for a new one: drop free buffers, smallest first (a bigger one serves more).
        held = sum(a.nbytes for a in _BUFFERS)
        for i in sorted(range(len(_BUFFERS)), key=lambda j: _BUFFERS[j].nbytes):
            if held + nbytes <= MAX_RETAINED_BYTES:
                break
            if _free(i):
                held -= _BUFFERS[i].nbytes
                _BUFFERS[i] = None
        _BUFFERS[:] = [a for a in _BUFFERS if a is not None]
        fresh = np.empty(nbytes, np.uint8)
        if held + nbytes <= MAX_RETAINED_BYTES:
            _BUFFERS.append(fresh)
            return fresh[:nbytes]
        return fresh


def retained_bytes() -> tuple[int, int]:
    """``(kept, lent)``: bytes of the buffers kept for reuse, and of those lent out now."""
    with _LOCK:
        lent = sum(_BUFFERS[i].nbytes for i in range(len(_BUFFERS)) if not _free(i))
        return sum(a.nbytes for a in _BUFFERS), lent
