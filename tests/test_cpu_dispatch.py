"""STATECORE_CPU lowers the x86-64 level of the native core's vectorized loops (the Spark key
groups of int64 keys, native/src/multiversion.h): the baseline path, the AVX2 one and the
default (the CPU's best) must place every key in the same key group with the same state, equal
to the python reference backend. Each level runs in its own process: the level is read once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("statecore._native")

# Puts int64 keys into value states through the batch API (the vectorized key-group pass) at
# power-of-two and other max parallelisms; prints the dispatch and each snapshot's dump.
SCRIPT = r"""
import hashlib, json, sys
import numpy as np
import pyarrow as pa
from statecore import ValueStateDescriptor, create_backend, _native
from statecore.testing.helpers import dump_backend

rng = np.random.default_rng(20240611)
edges = [0, 1, -1, 2**63 - 1, -2**63, 2**32, -2**32]
keys = np.concatenate([rng.integers(-2**63, 2**63 - 1, 3001, dtype=np.int64), edges])
out = {"dispatch": _native.cpu_dispatch(), "dumps": {}}
for kind in sys.argv[1:]:
    for key_type in ("int64", "uint64"):
        ks = pa.array(keys.view(np.uint64) if key_type == "uint64" else keys)
        for maxp in (128, 32768, 100, 12345):
            b = create_backend(kind, key_type=key_type, max_parallelism=maxp)
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            v.put_batch(ks, pa.array(np.arange(len(keys), dtype=np.int64)))
            dump = dump_backend(b)
            groups = {kg: len(rows) for kg, rows in dump["v"].items()}
            out["dumps"][f"{kind} {key_type} {maxp}"] = [
                hashlib.sha256(repr(dump).encode()).hexdigest(), len(groups)]
print(json.dumps(out))
"""


def _run(level: str | None, *kinds: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "STATECORE_CPU"}
    if level is not None:
        env["STATECORE_CPU"] = level
    p = subprocess.run([sys.executable, "-c", SCRIPT, *kinds], env=env, text=True,
                       capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_every_level_gives_the_reference_key_groups():
    default = _run(None, "native", "python")
    detected = default["dispatch"]["detected"]
    assert default["dispatch"]["level"] == detected
    reference = {k.split(" ", 1)[1]: d for k, d in default["dumps"].items() if k[0] == "p"}
    assert all(n > 1 for _, n in reference.values())  # keys spread over many key groups
    native = {k.split(" ", 1)[1]: d for k, d in default["dumps"].items() if k[0] == "n"}
    assert native == reference
    levels = ["baseline", "x86-64-v3", "x86-64-v4"]
    for level in levels:
        got = _run(level, "native")
        # Never a level above what the CPU has.
        expect = levels[min(levels.index(level), levels.index(detected))]
        assert got["dispatch"] == {"level": expect, "detected": detected}
        assert {k.split(" ", 1)[1]: d for k, d in got["dumps"].items()} == reference, level


def test_an_unknown_level_fails_at_import():
    env = dict(os.environ, STATECORE_CPU="avx9")
    p = subprocess.run([sys.executable, "-c", "import statecore.backends.native"], env=env,
                       text=True, capture_output=True, timeout=300)
    assert p.returncode != 0
    assert "InvalidInputError: STATECORE_CPU='avx9' is not a CPU level" in p.stderr, p.stderr
