"""The shape of the code base: no import cycles among ``statecore`` modules, no module using
another module's private names, and no trace in tracked files of how the work was organised.

These read the source tree of the checkout (``src/statecore``, ``bench/``, ``fuzz/``), not the
installed package, and are skipped where the tree is not there (tests run from an unpacked sdist,
say).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"

pytestmark = pytest.mark.skipif(
    not (SRC / "statecore" / "__init__.py").exists(), reason="no source tree beside the tests"
)


def _modules(top: Path, package: str) -> dict[str, Path | None]:
    """Module name -> source file (None for a compiled extension, known only by its .pyx)."""
    mods: dict[str, Path | None] = {}
    for path in sorted(top.rglob("*.py")):
        parts = path.relative_to(top.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    for path in sorted(top.rglob("*.pyx")):
        parts = path.relative_to(top.parent).with_suffix("").parts
        mods.setdefault(".".join(parts), None)
    assert package in mods
    return mods


def _owner(name: str, mods) -> str:
    """The module that defines ``name`` (a dotted path that may end in a non-module name)."""
    while name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _absolute(module: str | None, level: int, current: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


class _Imports(ast.NodeVisitor):
    """Every import of a module (function-local ones included) and every private name it takes
    from another module, by ``from m import _x`` or by ``m._x`` on an imported module."""

    def __init__(self, current: str, is_package: bool, mods, roots: tuple[str, ...]):
        self.current, self.is_package, self.mods, self.roots = current, is_package, mods, roots
        self.edges: set[str] = set()
        self.private: list[str] = []
        self.aliases: dict[str, str] = {}

    def _ours(self, name: str) -> bool:
        return name.split(".")[0] in self.roots

    def visit_Import(self, node):
        for alias in node.names:
            if self._ours(alias.name):
                target = _owner(alias.name, self.mods)
                self.edges.add(target)
                if alias.asname:
                    self.aliases[alias.asname] = target

    def visit_ImportFrom(self, node):
        base = _absolute(node.module, node.level, self.current, self.is_package)
        if not self._ours(base):
            return
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in self.mods:
                self.edges.add(full)
                self.aliases[alias.asname or alias.name] = full
                continue
            owner = _owner(base, self.mods)
            self.edges.add(owner)
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if private and owner != self.current:
                self.private.append(f"{self.current}: from {owner} import {alias.name}")

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.aliases:
            owner = self.aliases[node.value.id]
            name = node.attr
            private = name.startswith("_") and not name.startswith("__")
            if private and f"{owner}.{name}" not in self.mods and owner != self.current:
                self.private.append(f"{self.current}: {owner}.{name}")
        self.generic_visit(node)


_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w ,]+)|import\s+([\w.]+))", re.M)


def _cython_imports(top: Path, name: str, mods) -> set[str]:
    """Modules a compiled extension imports at run time: the Python ``import`` statements of
    its ``.pyx`` and of the ``.pxi`` files it includes (``cimport`` is compile time only)."""
    stem = name.rsplit(".", 1)[-1]
    folder = top.parent.joinpath(*name.split(".")[:-1])
    sources = [folder / f"{stem}.pyx", *sorted(folder.glob(f"{stem}_*.pxi"))]
    found: set[str] = set()
    for source in sources:
        for module, names, plain in _CYTHON_IMPORT.findall(source.read_text(encoding="utf-8")):
            base = module or plain
            if base.split(".")[0] != top.name:
                continue
            for item in names.split(",") if module else [""]:
                item = item.strip().split(" ")[0]
                full = f"{base}.{item}" if item else base
                found.add(full if full in mods else _owner(base, mods))
    found.discard(name)
    return found


def _graph(top: Path, package: str):
    mods = _modules(top, package)
    edges: dict[str, set[str]] = {}
    private: list[str] = []
    for name, path in mods.items():
        if path is None:
            edges[name] = _cython_imports(top, name, mods)
            continue
        visitor = _Imports(name, path.name == "__init__.py", mods, (package,))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        edges[name] = {e for e in visitor.edges if e in mods and e != name}
        private.extend(visitor.private)
    return mods, edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_in_statecore():
    _, edges, _ = _graph(SRC / "statecore", "statecore")
    assert _cycles(edges) == []


def test_the_extension_s_imports_are_seen():
    mods, edges, _ = _graph(SRC / "statecore", "statecore")
    assert "statecore._native" in mods
    assert "statecore.errors" in edges["statecore._native"]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_uses_another_modules_private_names():
    _, _, private = _graph(SRC / "statecore", "statecore")
    assert private == []


@pytest.mark.parametrize("package", ["bench", "fuzz"])
def test_harnesses_use_no_private_names_of_each_other(package):
    if not (REPO / package / "__init__.py").exists():
        pytest.skip(f"no {package}/ package in this tree")
    _, _, private = _graph(REPO / package, package)
    assert private == []


def test_the_private_name_finder_sees_both_forms(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_hidden = 1\n")
    (pkg / "b.py").write_text("from pkg.a import _hidden\nfrom pkg import a\nx = a._hidden\n")
    _, _, private = _graph(pkg, "pkg")
    assert private == ["pkg.b: from pkg.a import _hidden", "pkg.b: pkg.a._hidden"]


# Work-organisation words: numbered work steps, issue numbers, notes outside the repository.
_WORDS = re.compile(r"\bstops? [0-9]+|\bissues? [0-9]+|\.\./shared", re.IGNORECASE)


def _tracked_text_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    files = []
    for rel in filter(None, out.split("\0")):
        if rel.startswith("tests/data/"):
            continue
        path = REPO / rel
        try:
            files.append((rel, path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (plots) and files deleted in the work tree
    return files


def test_tracked_files_carry_no_work_organisation_words():
    hits = [
        f"{rel}:{n}: {line.strip()}"
        for rel, text in _tracked_text_files()
        for n, line in enumerate(text.splitlines(), 1)
        if _WORDS.search(line)
    ]
    assert hits == []


def test_tracked_files_carry_no_path_of_this_machine():
    holder = str(REPO.parent)
    if holder in ("/", "/tmp", "/var/tmp"):
        pytest.skip(f"the checkout's folder {holder!r} is too common a path to search for")
    hits = [rel for rel, text in _tracked_text_files() if holder + "/" in text]
    assert hits == []
