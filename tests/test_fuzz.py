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
FUZZ_SECONDS = int(os.environ.get("STATECORE_FUZZ_SECONDS", "15"))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_seed_passes(target):
    d = os.path.join(CORPUS, target)
    seeds = sorted(os.listdir(d))
    assert seeds, f"no seeds for {target}"
    for name in seeds:
        with open(os.path.join(d, name), "rb") as f:
            run_one(target, f.read())


def _bounded_run(target: str, work: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    # A fixed libFuzzer seed: the same code meets the same mutations (python -m fuzz with
    # another --seed, or a longer run, explores others).
    return subprocess.run(
        [sys.executable, "-m", "fuzz", target, "--seconds", str(FUZZ_SECONDS),
         "--timeout", "60", "--work", work, "--seed", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=FUZZ_SECONDS + 240)


@pytest.fixture(scope="module")
def bounded_runs(tmp_path_factory):
    """``{target: (work directory, Future of its bounded run)}``: every target's run started
    at once, two at a time (each is one process; most of its time goes to importing and
    instrumenting the code under test), so the module's tests wait for a fraction of the sum."""
    pytest.importorskip("atheris")
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=2)
    runs = {}
    for target in sorted(TARGETS):
        work = str(tmp_path_factory.mktemp(f"fuzz-{target}"))
        runs[target] = (work, pool.submit(_bounded_run, target, work))
    yield runs
    pool.shutdown(wait=True)


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_bounded_fuzz_run_finds_nothing(target, bounded_runs):
    work, run = bounded_runs[target]
    proc = run.result()
    findings = [p for p in os.listdir(work) if p.startswith(("crash-", "timeout-", "oom-"))]
    assert proc.returncode == 0 and not findings, (
        f"fuzzing {target} found {findings} (inputs in {work}):\n{proc.stderr[-4000:]}")
    assert "DONE" in proc.stderr, proc.stderr[-2000:]
