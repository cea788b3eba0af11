"""A statecore wheel built from this checkout and a fresh venv that has it installed.

Shared by the tests that run statecore the way a user installs it: from a wheel, in a venv with
no source tree on ``sys.path`` (the wheel test, the standalone-cluster test that ships the venv
to executors with ``venv-pack``).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build_wheel(dest: Path) -> Path:
    """Build a wheel of this checkout for the running Python into ``dest``; return its path.

    Raises ``subprocess.CalledProcessError`` when the build fails."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(REPO)],
        check=True,
    )
    (wheel,) = sorted(dest.glob("statecore-*.whl"))
    return wheel


def make_venv(path: Path, wheel: Path, extras: str = "") -> Path:
    """Create a fresh venv at ``path`` (no system site-packages), install ``wheel`` with
    ``extras`` (e.g. ``"[test]"``) and its dependencies from the package index; return the
    venv's python. Raises ``subprocess.CalledProcessError`` when an install fails."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    python = path / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheel}{extras}"],
        check=True,
    )
    return python
