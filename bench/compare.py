"""How the peer cases (:mod:`bench.peers`, :mod:`bench.collection_states`,
:mod:`bench.windows`) compare implementations: the optional peers (rocksdict, the compiled C++
reference), best-of timing (native and the C++ reference alternated), the ``rows_per_s_*`` /
``ratio_over_*`` / ``goal_*`` records and the plot layout they share.

Timing: rows/s = rows / seconds of the best of up to :data:`MAX_RUNS` runs (fewer when the runs
so far took more than :data:`BUDGET_S`), each on fresh state: the first run in a process is
slower, and best-of filters the noise of a shared machine. Native and the C++ reference, whose
ratio is a goal, run alternately (:func:`best_interleaved`), so both see the machine in the same
state.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

from bench import cpp_reference
from bench.common import note
from bench.harness import record

__all__ = ["BUDGET_S", "MAX_RUNS", "PAIRED_RUNS", "GOAL_OVER_PYTHON", "rocksdict_module",
           "TempRdict", "reference", "best", "best_interleaved", "measure", "ratio_records",
           "goal_min", "peer_panel"]

BUDGET_S = 15.0  # no further best-of run once the runs so far took this long (seconds)
MAX_RUNS = 3
PAIRED_RUNS = 5  # rounds of native and the C++ reference, alternated (best_interleaved)
#: The goal of native over the pure-Python backend on batches (a ratio of rows/s).
GOAL_OVER_PYTHON = 20.0


# --------------------------------------------------------------------------- optional peers

def rocksdict_module():
    """The rocksdict module, or None (with a note) when it is not installed."""
    try:
        import rocksdict
        return rocksdict
    except ImportError:
        note("rocksdict is not importable (pip install 'statecore[bench]'): rocksdict left out")
        return None


class TempRdict:
    """Context manager: an ``Rdict`` of ``rocksdict`` in a fresh temporary directory with the
    write-ahead log off (a stream processor's state backend relies on its checkpoints, as
    Flink's RocksDB backend does); closed and removed on exit."""

    def __init__(self, rocksdict):
        self.rocksdict = rocksdict

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="statecore-bench-rocksdict-")
        self.db = self.rocksdict.Rdict(self.dir)
        wo = self.rocksdict.WriteOptions()
        wo.disable_wal = True
        self.db.set_write_options(wo)
        return self.db

    def __exit__(self, *exc):
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_REF_CACHE: Dict[str, Optional[cpp_reference.Reference]] = {}


def reference() -> Optional[cpp_reference.Reference]:
    """The compiled C++ reference (built once per process), or None with a note."""
    if "ref" not in _REF_CACHE:
        try:
            _REF_CACHE["ref"] = cpp_reference.build("auto", note=note)
        except RuntimeError as exc:
            note(f"{exc}: the C++ reference is left out")
            _REF_CACHE["ref"] = None
    return _REF_CACHE["ref"]


# --------------------------------------------------------------------------- timing

def best(run_once: Callable[[], float]) -> float:
    """Fewest seconds of up to :data:`MAX_RUNS` calls of ``run_once`` (each returns the seconds
    of its timed part), stopping early once :data:`BUDGET_S` seconds have been spent."""
    got, spent, runs = float("inf"), 0.0, 0
    while runs < MAX_RUNS and (runs == 0 or spent < BUDGET_S):
        t = time.perf_counter()
        got = min(got, run_once())
        spent += time.perf_counter() - t
        runs += 1
        gc.collect()
    return got


def best_interleaved(fns: Dict[str, Callable[[], float]]) -> Dict[str, float]:
    """Fewest seconds of each of ``fns`` over up to :data:`PAIRED_RUNS` rounds, each round
    running every function once (in reverse order every other round), stopping early once a
    round ends past :data:`BUDGET_S` seconds in all with at least :data:`MAX_RUNS` rounds done.
    For the two implementations a goal compares (native and the C++ reference): run minutes
    apart, each would catch a shared machine in another state and their ratio would swing;
    alternated, both see the same."""
    got = {name: float("inf") for name in fns}
    order, spent, rounds = list(fns), 0.0, 0
    while rounds < PAIRED_RUNS and (rounds < MAX_RUNS or spent < BUDGET_S):
        t = time.perf_counter()
        for name in (order if rounds % 2 == 0 else order[::-1]):
            got[name] = min(got[name], fns[name]())
            gc.collect()
        spent += time.perf_counter() - t
        rounds += 1
    return got


def measure(c: str, tag: str, runs: List[Tuple[str, int, Callable[[], float]]],
            ref_impl: Optional[str]) -> Tuple[Dict[str, float], list]:
    """``({impl: rows/s}, records)`` of every ``(impl, rows, run_once)`` of ``runs``, the records
    ``rows_per_s_<tag>`` and ``rows_measured_<tag>`` of case ``c``: native and ``ref_impl`` (the
    C++ reference, None: none) interleaved (:func:`best_interleaved`), every other impl
    :func:`best`."""
    paired = {impl: fn for impl, _, fn in runs if ref_impl and impl in ("native", ref_impl)}
    secs = best_interleaved(paired) if len(paired) == 2 else {}
    rates: Dict[str, float] = {}
    out: list = []
    for impl, n, fn in runs:
        rates[impl] = n / (secs[impl] if impl in secs else best(fn))
        out.append(record(c, impl, f"rows_per_s_{tag}", rates[impl], "rows/s"))
        out.append(record(c, impl, f"rows_measured_{tag}", n, "rows"))
    return rates, out


# --------------------------------------------------------------------------- records

def ratio_records(c: str, tag: str, rates: Dict[str, float], ref_impl: Optional[str],
                  cpp_goal: Optional[float]) -> list:
    """Ratio records of every impl over the C++ reference (``ratio_over_cpp_<tag>``) and over
    python (``ratio_over_python_<tag>``), and the goals of native: ``cpp_goal`` (min ratio over
    the reference, None: no such goal) and >= :data:`GOAL_OVER_PYTHON` x python."""
    out = []
    for impl, rate in rates.items():
        if ref_impl and impl != ref_impl:
            out.append(record(c, impl, f"ratio_over_cpp_{tag}", rate / rates[ref_impl], "ratio"))
        if "python" in rates and impl != "python":
            out.append(record(c, impl, f"ratio_over_python_{tag}", rate / rates["python"], "ratio"))
    if "native" in rates:
        if ref_impl and cpp_goal is not None:
            out += goal_min(c, f"ratio_over_cpp_{tag}", rates["native"] / rates[ref_impl], cpp_goal)
        if "python" in rates:
            out += goal_min(c, f"ratio_over_python_{tag}", rates["native"] / rates["python"],
                            GOAL_OVER_PYTHON)
    return out


def goal_min(c: str, metric: str, value: float, goal: float) -> list:
    """The records of a minimum goal of native on ``metric``: ``goal_min_<metric>`` (the
    threshold, drawn as a dashed line) and ``goal_met_<metric>_ge_<goal>`` (1 met, 0 not)."""
    return [record(c, "native", f"goal_min_{metric}", goal, "ratio"),
            record(c, "native", f"goal_met_{metric}_ge_{goal:g}", float(value >= goal), "bool")]


def peer_panel(r: dict):
    """Plot layout of the peer cases (``bench.harness.case`` ``panel``): per workload size one
    panel of rows/s, one of ratios over the C++ reference and one over python (with the goal
    lines); bytes per entry in one panel."""
    m = r["metric"]
    if m.startswith("goal_met_"):
        return None
    if m.startswith(("rss_bytes_per_entry_", "goal_max_rss_bytes_per_entry_")):
        return f"{m.rsplit('_', 2)[-2]} entries int64 -> int64\nbytes per entry (RSS)", r["impl"]
    base = m[len("goal_min_"):] if m.startswith("goal_min_") else m
    if base.startswith("ratio_over_python_") and r["impl"].startswith("cpp_"):
        return None  # 50-200x: it would flatten the bars the goal line is about (JSON keeps it)
    for what, title in (("ratio_over_cpp_", "ratio over C++ ref"),
                        ("ratio_over_python_", "ratio over python"),
                        ("rows_per_s_", "rows/s")):
        if base.startswith(what):
            return f"{base[len(what):].replace('_', ' ')}\n{title}", r["impl"]
    return None
