"""The C++ reference of the peer benchmarks: ``bench/cpp/hashmap_ref.cpp``, compiled at run time
with the system C++ compiler and run on workload files the Python side writes with numpy. See
the source for its modes and file formats.

:func:`build` compiles it once per source, compiler and map kind into a cache directory
(``$STATECORE_BENCH_CACHE``, else ``$XDG_CACHE_HOME/statecore/bench`` or
``~/.cache/statecore/bench``, else a temporary directory), the binary named after a hash of all
three, so a changed source or compiler rebuilds and concurrent runs never see a half-written
binary. ``absl::flat_hash_map`` (Debian: ``libabsl-dev``) is used when its header compiles,
otherwise ``std::unordered_map``; the impl name says which (``cpp_absl`` /
``cpp_unordered_map``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from typing import List, Optional

import numpy as np

__all__ = ["Reference", "build", "SOURCE"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp", "hashmap_ref.cpp")
_FLAGS = ["-std=c++17", "-O2", "-DNDEBUG"]
# Linked when pkg-config does not know absl (Debian's libabsl-dev ships .pc files): what
# flat_hash_map<int64/std::string, ...> needs from absl 2022-2024.
_ABSL_FALLBACK_LIBS = ["-labsl_hash", "-labsl_city", "-labsl_low_level_hash", "-labsl_raw_hash_set"]
_IMPL = {"absl": "cpp_absl", "std": "cpp_unordered_map"}


@dataclasses.dataclass(frozen=True)
class Reference:
    """A compiled reference: ``path`` of the binary, ``kind`` (``absl`` / ``std``), ``impl``
    (the impl name of its records)."""

    path: str
    kind: str

    @property
    def impl(self) -> str:
        return _IMPL[self.kind]

    def run(self, *args: str) -> dict:
        """Run one mode (``int64``, ``string``, ``binary``, ``list``, ``list_get``, ``map``,
        ``map_get``, ``memory``; see the source) and return its JSON output. Raises RuntimeError
        when the program fails."""
        proc = subprocess.run([self.path, *args], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"C++ reference {' '.join(args[:1])} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # Workload files. Raw little-endian arrays, the formats hashmap_ref.cpp reads.

    def int64_counts(self, keys: np.ndarray, workdir: str, out: bool = False) -> dict:
        """``map[key] += 1`` per row of ``keys`` (int64): ``{"rows", "seconds", "distinct",
        "checksum"}`` plus ``"out"`` (the per-row running counts, int64) when ``out``."""
        kf, of = os.path.join(workdir, "keys.i64"), os.path.join(workdir, "out.i64")
        np.ascontiguousarray(keys, dtype="<i8").tofile(kf)
        got = self.run("int64", kf, of if out else "-")
        if out:
            got["out"] = np.fromfile(of, dtype="<i8")
        _remove(kf, of)
        return got

    def string_counts(self, offsets: np.ndarray, data: np.ndarray, workdir: str,
                      out: bool = False) -> dict:
        """The same with string keys ``data[offsets[i]:offsets[i+1]]`` (``offsets``: n+1 ints
        from 0, ``data``: uint8)."""
        off_f, data_f, of = (os.path.join(workdir, f) for f in ("off.i64", "data.u8", "out.i64"))
        np.ascontiguousarray(offsets, dtype="<i8").tofile(off_f)
        np.ascontiguousarray(data, dtype=np.uint8).tofile(data_f)
        got = self.run("string", off_f, data_f, of if out else "-")
        if out:
            got["out"] = np.fromfile(of, dtype="<i8")
        _remove(off_f, data_f, of)
        return got

    def binary_get_put(self, put_keys: np.ndarray, put_offsets: np.ndarray, put_data: np.ndarray,
                       get_keys: np.ndarray, workdir: str, out: bool = False) -> dict:
        """``map[key] = value`` per put row, then the values of ``get_keys`` gathered into an
        offsets + bytes output: ``{"put_rows", "put_seconds", "get_rows", "get_seconds",
        "distinct", "present", "out_bytes"}`` plus ``"out_offsets"`` / ``"out_data"`` when
        ``out``."""
        names = ("pk.i64", "poff.i64", "pdata.u8", "gk.i64", "ooff.i64", "odata.u8")
        pk, poff, pdata, gk, ooff, odata = (os.path.join(workdir, f) for f in names)
        np.ascontiguousarray(put_keys, dtype="<i8").tofile(pk)
        np.ascontiguousarray(put_offsets, dtype="<i8").tofile(poff)
        np.ascontiguousarray(put_data, dtype=np.uint8).tofile(pdata)
        np.ascontiguousarray(get_keys, dtype="<i8").tofile(gk)
        got = self.run("binary", pk, poff, pdata, gk, ooff if out else "-", odata if out else "-")
        if out:
            got["out_offsets"] = np.fromfile(ooff, dtype="<i8")
            got["out_data"] = np.fromfile(odata, dtype=np.uint8)
        _remove(pk, poff, pdata, gk, ooff, odata)
        return got

    def list_append(self, keys: np.ndarray, values: np.ndarray, workdir: str) -> dict:
        """``map[key].push_back(value)`` per row (int64 both): ``{"rows", "seconds", "distinct",
        "elements"}``."""
        kf, vf = os.path.join(workdir, "keys.i64"), os.path.join(workdir, "values.i64")
        np.ascontiguousarray(keys, dtype="<i8").tofile(kf)
        np.ascontiguousarray(values, dtype="<i8").tofile(vf)
        got = self.run("list", kf, vf)
        _remove(kf, vf)
        return got

    def map_put(self, keys: np.ndarray, user_keys: np.ndarray, values: np.ndarray,
                workdir: str) -> dict:
        """``map[key][user_key] = value`` per row (int64 all; the inner map a sorted vector):
        ``{"rows", "seconds", "distinct", "pairs", "checksum"}`` (checksum: the sum of the values
        held at the end)."""
        names = ("keys.i64", "uks.i64", "values.i64")
        kf, uf, vf = (os.path.join(workdir, f) for f in names)
        np.ascontiguousarray(keys, dtype="<i8").tofile(kf)
        np.ascontiguousarray(user_keys, dtype="<i8").tofile(uf)
        np.ascontiguousarray(values, dtype="<i8").tofile(vf)
        got = self.run("map", kf, uf, vf)
        _remove(kf, uf, vf)
        return got

    def list_get(self, keys: np.ndarray, values: np.ndarray, get_keys: np.ndarray,
                 workdir: str) -> dict:
        """The lists of :meth:`list_append` built untimed, then every get key's elements
        appended to one output (list<int64> layout): ``{"rows", "seconds", "elements"}``."""
        names = ("keys.i64", "values.i64", "get.i64")
        kf, vf, gf = (os.path.join(workdir, f) for f in names)
        for arr, f in ((keys, kf), (values, vf), (get_keys, gf)):
            np.ascontiguousarray(arr, dtype="<i8").tofile(f)
        got = self.run("list_get", kf, vf, gf)
        _remove(kf, vf, gf)
        return got

    def map_get(self, keys: np.ndarray, user_keys: np.ndarray, values: np.ndarray,
                get_keys: np.ndarray, get_user_keys: np.ndarray, workdir: str) -> dict:
        """The maps of :meth:`map_put` built untimed, then the value of every (get key, get
        user key) into an int64 output with a validity byte: ``{"rows", "seconds", "found"}``."""
        names = ("keys.i64", "uks.i64", "values.i64", "get.i64", "getuks.i64")
        files = [os.path.join(workdir, f) for f in names]
        for arr, f in zip((keys, user_keys, values, get_keys, get_user_keys), files):
            np.ascontiguousarray(arr, dtype="<i8").tofile(f)
        got = self.run("map_get", *files)
        _remove(*files)
        return got

    def rss_probe(self, n: int) -> dict:
        """Insert keys 0..n-1 (value = key) in a fresh process: ``{"entries", "rss_delta"}``."""
        return self.run("memory", str(int(n)))


def _remove(*paths: str) -> None:
    for p in paths:
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def _cache_dir() -> str:
    d = os.environ.get("STATECORE_BENCH_CACHE")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "statecore", "bench")
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = os.path.join(tempfile.gettempdir(), f"statecore-bench-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def _compiler() -> Optional[str]:
    """``$CXX`` if set, else ``g++`` from PATH; None when neither is there."""
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def _absl_libs() -> List[str]:
    if shutil.which("pkg-config"):
        proc = subprocess.run(["pkg-config", "--libs", "absl_hash", "absl_raw_hash_set"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.split()
    return list(_ABSL_FALLBACK_LIBS)


def _has_absl_header(cxx: str) -> bool:
    proc = subprocess.run([cxx, "-std=c++17", "-E", "-x", "c++", "-o", os.devnull, "-"],
                          input="#include <absl/container/flat_hash_map.h>\n",
                          capture_output=True, text=True)
    return proc.returncode == 0


def _compile(cxx: str, kind: str) -> Reference:
    """Compile (or find cached) the reference of ``kind``. Raises RuntimeError with the
    compiler's message when it fails."""
    extra = ["-DSTATECORE_REF_ABSL"] if kind == "absl" else []
    libs = _absl_libs() if kind == "absl" else []
    with open(SOURCE, "rb") as f:
        src = f.read()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256(b"\0".join([src, cxx.encode(), version.encode(),
                                   " ".join(_FLAGS + extra + libs).encode()])).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"hashmap_ref-{kind}-{h}")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        proc = subprocess.run([cxx, *_FLAGS, *extra, SOURCE, "-o", tmp, *libs],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            _remove(tmp)
            raise RuntimeError(f"compiling the C++ reference ({kind}) failed: "
                               f"{proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)  # atomic: a concurrent run sees the old state or the whole binary
    return Reference(path, kind)


def build(kind: str = "auto", note=None) -> Optional[Reference]:
    """The compiled reference, or None when it cannot be built (no compiler; ``note`` -- a
    callable taking a message, e.g. ``print`` -- is told why). ``kind``: ``absl``, ``std`` or
    ``auto`` (absl when its header is found and the absl build links, else std). Raises
    RuntimeError when an explicitly requested ``kind`` (or, under ``auto``, the std fallback)
    does not compile."""
    cxx = _compiler()
    if cxx is None:
        if note:
            note("no C++ compiler (g++ or $CXX) found: the C++ reference is skipped")
        return None
    if kind == "auto":
        if _has_absl_header(cxx):
            try:
                return _compile(cxx, "absl")
            except RuntimeError as exc:
                if note:
                    note(f"absl found but the absl build failed, using std::unordered_map: {exc}")
        elif note:
            note("absl/container/flat_hash_map.h not found (Debian: libabsl-dev): the C++ "
                 "reference uses std::unordered_map")
        return _compile(cxx, "std")
    if kind not in _IMPL:
        raise ValueError(f"unknown reference kind {kind!r}; expected 'auto', 'absl' or 'std'")
    return _compile(cxx, kind)
