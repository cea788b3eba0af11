"""The fuzz targets (``fuzz/``): every seed of every corpus passes its target, and a bounded
coverage-guided run of each target (atheris) finds nothing -- no exception but StateError, no
crash, no hang."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fuzz.__main__ import CORPUS
from fuzz.targets import TARGETS, run_one

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds each target is fuzzed in the test suite (python -m fuzz TARGET --seconds N for more).
FUZZ_SECONDS = int(os.environ.get("STATECORE_FUZZ_SECONDS", "20"))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_seed_passes(target):
    d = os.path.join(CORPUS, target)
    seeds = sorted(os.listdir(d))
    assert seeds, f"no seeds for {target}"
    for name in seeds:
        with open(os.path.join(d, name), "rb") as f:
            run_one(target, f.read())


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_bounded_fuzz_run_finds_nothing(target, tmp_path):
    pytest.importorskip("atheris")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # A fixed libFuzzer seed: the same code meets the same mutations (python -m fuzz with
    # another --seed, or a longer run, explores others).
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", target, "--seconds", str(FUZZ_SECONDS),
         "--timeout", "60", "--work", str(tmp_path), "--seed", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=FUZZ_SECONDS + 240)
    findings = [p for p in os.listdir(tmp_path) if p.startswith(("crash-", "timeout-", "oom-"))]
    assert proc.returncode == 0 and not findings, (
        f"fuzzing {target} found {findings} (inputs in {tmp_path}):\n{proc.stderr[-4000:]}")
    assert "DONE" in proc.stderr, proc.stderr[-2000:]
