"""Benchmarks of statecore, run by ``statecore bench`` (results and plots go to ``bench/``).

Every case is a function ``case(size: Size) -> list[Record]`` registered with :func:`case`; a
record is ``{"case", "impl", "metric", "value", "unit"}``. All cases of one invocation run in one
process on one machine, so ratios between implementations (native backend, pure-Python backend,
peers) are meaningful; absolute wall-clock numbers on a shared machine are not. Nothing here is
asserted anywhere: tests only check that the harness runs and reports.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from typing import Callable, Dict, List, Optional

Record = dict

__all__ = ["Size", "case", "CASES", "run", "write_json", "plot", "machine"]


@dataclasses.dataclass(frozen=True)
class Size:
    """Problem sizes of a run: ``full`` (default), ``quick`` (a few minutes in all) or a
    ``scale`` factor applied to both (tests use a tiny one)."""

    quick: bool = False
    scale: float = 1.0

    def n(self, full: int, quick: int) -> int:
        """``full`` or ``quick`` entries/rows, times ``scale`` (at least 1)."""
        return max(1, int((quick if self.quick else full) * self.scale))


CASES: Dict[str, tuple] = {}
#: ``{case: panel function}`` of the cases that lay out their own plot (see :func:`case`).
PANELS: Dict[str, Callable[[Record], object]] = {}


def case(name: str, description: str, panel: Optional[Callable[[Record], object]] = None
         ) -> Callable:
    """Register a benchmark case under ``name``. ``panel`` (optional) lays out the case's plot:
    it maps a record to the title of the panel that draws it (whatever its unit), or to
    ``(title, bar label)``, or to None to leave it out. Without it the case gets one panel per
    plottable unit (see :func:`plot`); a case with many configurations needs it, or its bars
    crowd one panel."""

    def wrap(fn):
        CASES[name] = (fn, description)
        if panel is not None:
            PANELS[name] = panel
        return fn

    return wrap


def _layout(r: Record) -> Optional[tuple]:
    """``(panel title, bar label or None)`` of a record of a case with a ``panel`` function, or
    None when the case leaves it out of the plot."""
    got = PANELS[r["case"]](r)
    if got is None:
        return None
    return (got, None) if isinstance(got, str) else (got[0], got[1])


def record(case_name: str, impl: str, metric: str, value: float, unit: str) -> Record:
    return {"case": case_name, "impl": impl, "metric": metric, "value": float(value), "unit": unit}


def timed(fn) -> float:
    """Seconds taken by ``fn()`` (perf_counter)."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def machine() -> dict:
    """The run's machine: platform, cores, Python, and from ``/proc/cpuinfo`` (Linux; absent
    elsewhere) the CPU model and which of the vector extensions the native loops pick at load
    (multiversion.h: AVX-512 or AVX2) it has -- ratios against the C++ reference move with them."""
    out = {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "python": sys.version.split()[0]}
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return out
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and "cpu_model" not in out:
            out["cpu_model"] = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            out["simd"] = [f for f in ("avx2", "avx512f", "avx512dq") if f in flags]
            break
    return out


def _load_cases() -> None:
    from statecore.bench import (  # noqa: F401  (register their cases)
        collection_states, peers, snapshots, spark_e2e, state_ops, ttl, ttl_cleanup, windows)


def run(names: List[str] | None, size: Size, progress=print) -> List[Record]:
    """Run the named cases (all when empty) and return their records. Raises KeyError naming an
    unknown case."""
    _load_cases()
    names = list(names or CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise KeyError(f"unknown benchmark case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    out: List[Record] = []
    for n in names:
        fn, _ = CASES[n]
        recs = fn(size)
        for r in recs:
            progress(f"{r['case']:20s} {r['impl']:20s} {r['metric']:38s} {r['value']:>16,.2f} {r['unit']}")
        out.extend(recs)
    return out


def write_json(records: List[Record], path: str) -> None:
    """Write ``records`` (a JSON list, as ``statecore bench --json`` promises) to ``path``; the
    machine description goes to ``<path>.machine.json`` beside it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
    with open(path + ".machine.json", "w") as f:
        json.dump(machine(), f, indent=1)


def _plot_panels(records: List[Record]) -> List[tuple]:
    """``[(title, unit, bars, goals)]``: one panel per case and plottable unit (rates ``*/s``,
    ``ms``, ``ratio``; title = the case), or as the case's ``panel`` function lays them out
    (title ``case: panel title``, any unit), in record order. ``goal_*`` records are not bars but
    reference lines."""
    _load_cases()  # the panel functions of the cases
    panels: Dict[tuple, tuple] = {}
    for r in records:
        u = r["unit"]
        if r["case"] in PANELS:
            lay = _layout(r)
            if lay is None:
                continue
            title = f"{r['case']}: {lay[0]}"
        elif u.endswith("/s") or u in ("ms", "ratio"):
            title = r["case"]
        else:
            continue
        bars, goals = panels.setdefault((title, u), ([], []))
        (goals if r["metric"].startswith("goal_") else bars).append(r)
    return [(c, u, bars, goals) for (c, u), (bars, goals) in panels.items() if bars]


def plot(records: List[Record], path: str) -> None:
    """One bar chart per case and unit of the rate (``*/s``, log scale), pause (``ms``, log
    scale) and ``ratio`` records, or per panel of a case that lays out its own (``case(...,
    panel=)``; log scale unless ``ratio``); native implementations (impl ``native...``) highlighted,
    ``goal_*`` records drawn as dashed lines. Needs matplotlib (``pip install
    'statecore[bench]'``). Raises ValueError when no record is plottable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _plot_panels(records)
    if not panels:
        raise ValueError("no rate, ms or ratio records to plot")
    cols = min(4, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (c, unit, rs, goals) in zip(axes.flat, panels):
        several = len({r["metric"] for r in rs}) > 1
        if rs[0]["case"] in PANELS:
            # Such a case has many configurations: its own (short) labels, slanted.
            labels = [_layout(r)[1] or r["impl"] for r in rs]
            rotation, ha, fontsize = 30, "right", 7
        else:
            labels = [f"{r['impl']}\n{r['metric']}" if several else r["impl"] for r in rs]
            rotation, ha, fontsize = (30, "right", 6) if several else (0, "center", 8)
        values = [r["value"] for r in rs]
        # Ratios of 0.9 beside ratios of 700 (native against the Spark APIs) vanish on a linear
        # axis: such a panel is drawn on a log scale too, with a line at 1 and labelled bars.
        wide = unit == "ratio" and min(values) > 0 and max(values) / min(values) > 30
        drawn = ax.bar(range(len(rs)), values,
                       color=["#1f77b4" if r["impl"].startswith("native") else "#9a9a9a" for r in rs])
        if rs[0]["case"] in PANELS or wide:
            ax.bar_label(drawn, fmt="%.3g", fontsize=6)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(labels, rotation=rotation, ha=ha, fontsize=fontsize)
        for g in {(r["metric"], r["value"]) for r in goals}:
            ax.axhline(g[1], color="#d62728", linestyle="--", linewidth=1)
            ax.annotate(g[0], (0, g[1]), fontsize=6, color="#d62728", va="bottom")
        if wide:
            ax.set_yscale("log")
            ax.axhline(1.0, color="#555555", linewidth=0.8)
            ax.set_ylim(bottom=min(values) / 3)
        elif unit != "ratio" and all(v > 0 for v in values):
            ax.set_yscale("log")
            # A log axis autoscaled to close values starts just below the smallest bar, which
            # then looks many times shorter than one 5% taller: start a decade below instead.
            low = min(values + [g["value"] for g in goals if g["value"] > 0])
            ax.set_ylim(bottom=low / 10)
        ax.set_title(c, fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(axis="y", labelsize=8)
    m = machine()
    fig.suptitle(f"statecore bench ({m['machine']}, {m['cpus']} cores, Python {m['python']})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the suptitle
    fig.savefig(path, dpi=110)
