"""Running cases and writing their records: :func:`load_cases`, :func:`run`,
:func:`write_json` and the description of the run's machine (:func:`machine`)."""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import List

from bench.harness import CASES, Record, Size

__all__ = ["load_cases", "run", "write_json", "machine"]


def load_cases() -> None:
    """Import every case module, which registers its cases in :data:`bench.harness.CASES`. The
    order of the imports is the order of ``--list`` and of a run of all cases: the state
    operations first, then snapshots and checkpoints, TTL, the peer comparisons, and the Spark
    end-to-end case last."""
    from bench import (
        collection_states,  # noqa: F401
        external,  # noqa: F401
        external_store,  # noqa: F401
        list_entries,  # noqa: F401
        lookup,  # noqa: F401
        map_entries,  # noqa: F401
        object_store,  # noqa: F401
        offline,  # noqa: F401
        peers,  # noqa: F401
        snapshots,  # noqa: F401
        spark_e2e,  # noqa: F401
        spark_external,  # noqa: F401
        spark_tiered,  # noqa: F401
        state_ops,  # noqa: F401  (each import registers the module's cases)
        tiered,  # noqa: F401
        ttl,  # noqa: F401
        ttl_cleanup,  # noqa: F401
        windows,  # noqa: F401
    )


def run(names: List[str] | None, size: Size, progress=print) -> List[Record]:
    """Run the named cases (all when empty) in order and return their records; each record is
    passed to ``progress`` as a line as it comes. Raises KeyError naming an unknown case."""
    load_cases()
    names = list(names or CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise KeyError(f"unknown benchmark case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    out: List[Record] = []
    for n in names:
        fn, _ = CASES[n]
        recs = fn(size)
        for r in recs:
            progress(f"{r['case']:20s} {r['impl']:20s} {r['metric']:38s} "
                     f"{r['value']:>16,.2f} {r['unit']}")
        out.extend(recs)
    return out


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


def write_json(records: List[Record], path: str) -> None:
    """Write ``records`` (a JSON list, as ``python -m bench --json`` promises) to ``path``; the
    machine description (:func:`machine`) goes to ``<path>.machine.json`` beside it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
    with open(path + ".machine.json", "w") as f:
        json.dump(machine(), f, indent=1)
