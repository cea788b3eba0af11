"""The release wheel of this checkout and a fresh venv that has it installed.

Shared by the tests that run statecore the way a user installs it: from a wheel, in a venv with
no source tree on ``sys.path`` (the wheel test, the standalone-cluster test that ships the venv
to executors with ``venv-pack``).

The wheel is the release one (``wheels/build.py``: zig's clang for glibc 2.17, ``auditwheel
repair`` to manylinux_2_17) for the running Python only, so the test run exercises the release
build once instead of compiling a second, plain wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The release build compiles the C++ core and the extension with zig; a cold zig cache builds
# its libc++ first. Minutes on 2 busy cores, bounded all the same.
BUILD_TIMEOUT_S = 1800
INSTALL_TIMEOUT_S = 900


def build_wheel(dest: Path) -> Path:
    """Build the release wheel of this checkout for the running Python into ``dest`` with
    ``wheels/build.py``; return its path. Raises ``subprocess.CalledProcessError`` (with the
    build's output) when the build or its ``auditwheel`` check fails."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(REPO / "wheels" / "build.py"), "--python", sys.executable,
         "--out", str(dest)],
        check=True, timeout=BUILD_TIMEOUT_S,
    )
    (wheel,) = sorted(dest.glob("statecore-*.whl"))
    return wheel


def auditwheel_show(wheel: Path) -> str:
    """``auditwheel show`` of ``wheel`` (the auditwheel that ``wheels/build.py`` installed),
    whitespace collapsed."""
    tool = REPO / "build" / "wheel-tools" / "bin" / "auditwheel"
    out = subprocess.run([str(tool), "show", str(wheel)], check=True, text=True,
                         capture_output=True, timeout=300)
    return " ".join(out.stdout.split())


def manylinux_policy(show: str) -> tuple[int, int]:
    """(glibc major, minor) of the platform tag that ``auditwheel show`` text places a wheel in;
    raises ValueError when it names none (e.g. a plain ``linux_x86_64`` wheel)."""
    m = re.search(r'platform tag: "manylinux_(\d+)_(\d+)_\w+"', show)
    if m is None:
        raise ValueError(f"auditwheel show names no manylinux tag: {show}")
    return int(m.group(1)), int(m.group(2))


def make_venv(path: Path, wheel: Path, extras: str = "") -> Path:
    """Create a fresh venv at ``path`` (no system site-packages), install ``wheel`` with
    ``extras`` (e.g. ``"[test]"``) and its dependencies from the package index; return the
    venv's python. Raises ``subprocess.CalledProcessError`` when an install fails."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    python = path / "bin" / "python"
    env = isolated_env()
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheel}{extras}"],
        check=True, timeout=INSTALL_TIMEOUT_S, env=env,
    )
    # pip counts a requirement found anywhere on sys.path as installed: check where it went.
    where = subprocess.run(
        [str(python), "-c", "import statecore, pyarrow; print(statecore.__file__)"],
        check=True, text=True, capture_output=True, timeout=300, env=env, cwd=str(path),
    ).stdout.strip()
    if not where.startswith(str(path)):
        raise RuntimeError(f"statecore in the venv at {path} imports from {where}")
    return python


def isolated_env() -> dict:
    """This process's environment without what would let a venv's python see other installs:
    ``PYTHONPATH`` (a local SparkSession puts this checkout's package root on it, for its
    workers), ``PYTHONHOME``, pip's install-location overrides."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_TARGET", "PIP_PREFIX", "PIP_USER")}
