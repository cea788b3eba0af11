"""Reader pins: the data files that open readers of a store read, kept by retention.

A :class:`~statecore.checkpoint.readers.CheckpointReader` opens the runs of its version lazily,
long after :meth:`CheckpointStore.open` read the manifest: a tiered backend (docs/tiered.md)
reads its attached version's runs for as long as it stays attached. Meanwhile the driver of the
same store may commit newer versions, compact the attached version (its manifest then lists
new files) and run retention, which deletes every file no retained manifest references. So each
reader a store opens *pins* the runs of the manifest it read until it is released (or garbage
collected), and retention treats pinned files as referenced: RocksDB's rule that a live
iterator or snapshot keeps the SST files of its version (``Version`` reference counts).

Pins are per store object, so per process; across processes the rule is in docs/tiered.md
"Compaction and retention".
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Iterable

__all__ = ["ReaderPins"]


class ReaderPins:
    """Reference counts of pinned file paths (relative to the root). Thread-safe: readers are
    released from any thread, retention reads :meth:`paths` under the store's lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def pin(self, paths: Iterable[str]) -> Callable[[], None]:
        """Pin ``paths``; returns the function that unpins them (idempotent: a second call does
        nothing)."""
        paths = list(dict.fromkeys(paths))
        with self._lock:
            self._counts.update(paths)
        done = []

        def unpin() -> None:
            with self._lock:
                if done:
                    return
                done.append(True)
                self._counts.subtract(paths)
                for p in paths:
                    if self._counts[p] <= 0:
                        del self._counts[p]

        return unpin

    def paths(self) -> set[str]:
        """The paths pinned now (a copy)."""
        with self._lock:
            return set(self._counts)
