"""The case registry and what every case module needs: :class:`Size`, :func:`case`,
:func:`record` and :func:`timed`.

Every case is a function ``case(size: Size) -> list[Record]`` registered with :func:`case`; a
record is ``{"case", "impl", "metric", "value", "unit"}``. All cases of one invocation run in one
process on one machine, so ratios between implementations (native backend, pure-Python backend,
peers) are meaningful; absolute wall-clock numbers on a shared machine are not. Nothing here is
asserted anywhere: tests only check that the harness runs and reports.

This module imports no case module: :func:`bench.runner.load_cases` imports them, and each
registers its cases here when imported.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, Optional

Record = dict

__all__ = ["Record", "Size", "case", "CASES", "PANELS", "layout", "record", "timed"]


@dataclasses.dataclass(frozen=True)
class Size:
    """Problem sizes of a run: ``full`` (default), ``quick`` (a few minutes in all) or a
    ``scale`` factor applied to both (tests use a tiny one); ``memory_budget``: bytes of key and
    values the tiered mode may hold where a case takes it (None: the case's own share);
    ``block_target_bytes`` and ``compression``: the block size and codec of the checkpoints
    the tiered cases write (None: the tiered mode's block size, the stores' codec)."""

    quick: bool = False
    scale: float = 1.0
    memory_budget: Optional[int] = None
    block_target_bytes: Optional[int] = None
    compression: Optional[str] = None

    def n(self, full: int, quick: int) -> int:
        """``full`` or ``quick`` entries/rows, times ``scale`` (at least 1)."""
        return max(1, int((quick if self.quick else full) * self.scale))


#: ``{case name: (function, one-line description)}`` in registration order.
CASES: Dict[str, tuple] = {}
#: ``{case: panel function}`` of the cases that lay out their own plot (see :func:`case`).
PANELS: Dict[str, Callable[[Record], object]] = {}


def case(name: str, description: str, panel: Optional[Callable[[Record], object]] = None
         ) -> Callable:
    """Register a benchmark case under ``name``. ``panel`` (optional) lays out the case's plot:
    it maps a record to the title of the panel that draws it (whatever its unit), or to
    ``(title, bar label)``, or to None to leave it out. Without it the case gets one panel per
    plottable unit (see :func:`bench.plot.plot`); a case with many configurations needs it, or
    its bars crowd one panel."""

    def wrap(fn):
        CASES[name] = (fn, description)
        if panel is not None:
            PANELS[name] = panel
        return fn

    return wrap


def layout(r: Record) -> Optional[tuple]:
    """``(panel title, bar label or None)`` of a record of a case with a ``panel`` function, or
    None when the case leaves it out of the plot. Raises KeyError when the record's case has no
    panel function."""
    got = PANELS[r["case"]](r)
    if got is None:
        return None
    return (got, None) if isinstance(got, str) else (got[0], got[1])


def record(case_name: str, impl: str, metric: str, value: float, unit: str) -> Record:
    """One result: ``value`` (stored as float) of ``metric`` in ``unit`` for ``impl``."""
    return {"case": case_name, "impl": impl, "metric": metric, "value": float(value), "unit": unit}


def timed(fn) -> float:
    """Seconds taken by ``fn()`` (``time.perf_counter``)."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
