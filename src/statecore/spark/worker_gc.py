"""Python worker process tuning for statecore tasks: freezing the garbage collector's view of
what a reused PySpark worker already holds.

PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused worker
(``pyspark/daemon.py``). With pyspark, pyarrow and pandas loaded that walks tens of thousands of
long-lived objects while holding the GIL, right when the task's background checkpoint write
needs it and the driver waits for that write. :func:`freeze_worker_gc` moves those objects to
the interpreter's permanent generation so the collection skips them.

This affects the whole worker process (the user's other tasks in it included); the operator
calls it only with ``StatefulOperator(freeze_worker_gc=True)``, its default.
"""

from __future__ import annotations

import gc
import sys
from typing import Optional

__all__ = ["freeze_worker_gc", "frozen_object_count"]

# len(sys.modules) at this process's last freeze (None: not frozen yet), and how many times it
# froze: at most _GC_MAX_FREEZES, so code that imports something new in every task cannot make
# every task freeze (and keep) its predecessors' leftovers.
_GC_FROZEN_MODULES: Optional[int] = None
_GC_FREEZES = 0
_GC_MAX_FREEZES = 4
# gc.get_freeze_count() right after this process's last freeze: the call walks the whole
# permanent generation, too slow to repeat in every task's report.
_GC_FROZEN_COUNT = 0


def freeze_worker_gc() -> None:
    """Move every object this Python worker holds now to the interpreter's permanent generation
    (``gc.freeze``, CPython >= 3.7) at its first statecore task, and again at the start of a
    later task when modules were imported since the last freeze, so later cyclic collections
    skip them.

    Why: PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker,
    holding the GIL for the whole walk over every tracked object -- right when the task's
    background checkpoint write needs the GIL, and the driver waits for that write before it
    commits.

    Why again after imports: the first task imports statecore's backends and checkpoint store
    (and pyarrow may import pandas on first use), objects a freeze at its start cannot include;
    left outside the permanent generation they are walked again after every task. A task starts
    right after the daemon's collection that followed the previous task, so what is frozen then
    survived a full collection: live objects, not garbage. At most ``_GC_MAX_FREEZES`` (4)
    freezes per process.

    What is frozen is what exists at those task starts (modules, their globals, PySpark's
    worker state, the cached state of earlier tasks): cyclic garbage among those objects is
    never collected (reference counting still frees the rest; cached backends are closed
    explicitly, which frees their native memory), a bounded cost: a process freezes again only
    when its set of modules grew, and only a few times. Objects created later are collected as
    usual."""
    global _GC_FROZEN_MODULES, _GC_FROZEN_COUNT, _GC_FREEZES
    modules = len(sys.modules)
    if _GC_FROZEN_MODULES != modules and _GC_FREEZES < _GC_MAX_FREEZES:
        _GC_FROZEN_MODULES = modules
        _GC_FREEZES += 1
        gc.freeze()
        _GC_FROZEN_COUNT = gc.get_freeze_count()


def frozen_object_count() -> int:
    """``gc.get_freeze_count()`` of this process right after its last :func:`freeze_worker_gc`
    freeze (0 without one); a task reports it as ``gc_frozen_objects``."""
    return _GC_FROZEN_COUNT
