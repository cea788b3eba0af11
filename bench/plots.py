"""The PNG bar chart of a run's records (``python -m bench --plot FILE``): :func:`panels` lays
the records out, :func:`plot` draws them. Needs matplotlib (``pip install 'statecore[bench]'``)."""

from __future__ import annotations

from typing import Dict, List

from bench.harness import PANELS, Record, layout
from bench.runner import load_cases, machine

__all__ = ["panels", "plot"]


def panels(records: List[Record]) -> List[tuple]:
    """``[(title, unit, bars, goals)]``: one panel per case and plottable unit (rates ``*/s``,
    ``ms``, ``ratio``; title = the case), or as the case's ``panel`` function lays them out
    (title ``case: panel title``, any unit), in record order. ``goal_*`` records are not bars but
    reference lines."""
    load_cases()  # the panel functions of the cases
    got: Dict[tuple, tuple] = {}
    for r in records:
        u = r["unit"]
        if r["case"] in PANELS:
            lay = layout(r)
            if lay is None:
                continue
            title = f"{r['case']}: {lay[0]}"
        elif u.endswith("/s") or u in ("ms", "ratio"):
            title = r["case"]
        else:
            continue
        bars, goals = got.setdefault((title, u), ([], []))
        (goals if r["metric"].startswith("goal_") else bars).append(r)
    return [(c, u, bars, goals) for (c, u), (bars, goals) in got.items() if bars]


def plot(records: List[Record], path: str) -> None:
    """One bar chart per case and unit of the rate (``*/s``, log scale), pause (``ms``, log
    scale) and ``ratio`` records, or per panel of a case that lays out its own (``case(...,
    panel=)``; log scale unless ``ratio``); native implementations (impl ``native...``) highlighted,
    ``goal_*`` records drawn as dashed lines; written to ``path`` as PNG. Raises ImportError
    without matplotlib and ValueError when no record is plottable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    laid = panels(records)
    if not laid:
        raise ValueError("no rate, ms or ratio records to plot")
    cols = min(4, len(laid))
    rows = (len(laid) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(laid):]:
        ax.set_visible(False)
    for ax, (c, unit, rs, goals) in zip(axes.flat, laid):
        several = len({r["metric"] for r in rs}) > 1
        if rs[0]["case"] in PANELS:
            # Such a case has many configurations: its own (short) labels, slanted.
            labels = [layout(r)[1] or r["impl"] for r in rs]
            rotation, ha, fontsize = 30, "right", 7
        else:
            labels = [f"{r['impl']}\n{r['metric']}" if several else r["impl"] for r in rs]
            rotation, ha, fontsize = (30, "right", 6) if several else (0, "center", 8)
        values = [r["value"] for r in rs]
        # Ratios of 0.9 beside ratios of 700 (native against the Spark APIs) vanish on a linear
        # axis: such a panel is drawn on a log scale too, with a line at 1 and labelled bars.
        wide = unit == "ratio" and min(values) > 0 and max(values) / min(values) > 30
        drawn = ax.bar(range(len(rs)), values,
                       color=["#1f77b4" if r["impl"].startswith("native") else "#9a9a9a"
                              for r in rs])
        if rs[0]["case"] in PANELS or wide:
            ax.bar_label(drawn, fmt="%.3g", fontsize=6)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(labels, rotation=rotation, ha=ha, fontsize=fontsize)
        by_value: dict = {}
        for r in goals:
            by_value.setdefault(r["value"], set()).add(r["metric"])
        for value, names in by_value.items():
            # Several goals at one value share a line and one label (they would overprint).
            label = names.pop() if len(names) == 1 else f"goal {value:g} ({len(names)} goals)"
            ax.axhline(value, color="#d62728", linestyle="--", linewidth=1)
            ax.annotate(label, (0, value), fontsize=6, color="#d62728", va="bottom")
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
    fig.suptitle(f"statecore bench ({m['machine']}, {m['cpus']} cores, Python {m['python']})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the suptitle
    fig.savefig(path, dpi=110)
