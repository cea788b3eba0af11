"""Helpers several case modules share: whether the native extension is there, notes on what a
case leaves out, size labels of metric names, and resident-memory probes (this process's RSS,
and a probe function run in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

__all__ = ["has_native", "note", "label", "rss_bytes", "probe_in_child"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
# The checkout's root (the directory holding bench/), put first on a child interpreter's
# PYTHONPATH so that it imports this bench package.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def has_native() -> bool:
    """Whether statecore's compiled extension imports (the native backend is available)."""
    try:
        import statecore._native  # noqa: F401
        return True
    except ImportError:
        return False


def note(msg: str) -> None:
    """A note on what a case leaves out (stderr: the records stay the only stdout)."""
    print(f"note: {msg}", file=sys.stderr, flush=True)


def label(n: int) -> str:
    """1000000 -> '1M', 200000 -> '200k', other counts unchanged (metric names)."""
    for div, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def rss_bytes() -> int:
    """Resident set size of this process in bytes (``/proc/self/statm`` field 2 x page size;
    Linux only)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def probe_in_child(module: str, func: str, *args) -> dict:
    """``module.func(*args)`` in a child interpreter (``args`` and the result JSON-able; the
    checkout's root first on its ``PYTHONPATH``): memory probes need a fresh process, since one
    that already freed memory reuses it and the RSS delta would understate. Raises RuntimeError
    if the child fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    code = ("import importlib,json,sys; "
            "f = getattr(importlib.import_module(sys.argv[1]), sys.argv[2]); "
            "print(json.dumps(f(*json.loads(sys.argv[3]))))")
    proc = subprocess.run([sys.executable, "-c", code, module, func, json.dumps(list(args))],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{func}{args} failed in a child interpreter: "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
