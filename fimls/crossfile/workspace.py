"""The workspace files a document imports, read from disk for their definitions.

Users' code calls what their repository defines, in files they have not opened. For a
document inside a workspace folder, this module resolves the document's own import
statements to source files inside that same folder and reads them:

* Python: ``import a.b`` and ``from a.b import c`` (relative ones too) as ``a/b.py`` or
  ``a/b/__init__.py`` (and ``a/b/c.py``) under the workspace folder, its ``src/`` or
  ``lib/``, or the folder above the document's top package;
* JavaScript / TypeScript: relative specifiers (``./x``, ``../y``) with the usual
  extensions and ``index`` files (a package name is never looked up);
* Go: the other non-test files of the document's package, and the packages it imports
  under the module path of the workspace's ``go.mod``;
* Rust: ``mod x;`` and ``use crate::…`` / ``use super::…`` / ``use self::…`` paths;
* Java: ``import a.b.C;`` below the document's source root, and the classes of its
  package that the document names;
* C / C++: ``#include "x.h"`` beside the document or under ``include/``.

Never read: anything outside the document's workspace folder, anything git ignores there
(:mod:`fimls.crossfile.ignore`), anything whose name looks like a secret, a file over
``MAX_BYTES``. Besides the imported files, only ``.gitignore`` files and a Go workspace's
``go.mod`` are read.
At most ``MAX_FILES`` files per document. A file is read once and read again only when
its size or modification time changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fimls.crossfile.ignore import GitIgnore, looks_secret

MAX_FILES = 8
MAX_BYTES = 256 * 1024

_PY_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([\w, \t]*)", re.M)
_PY_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?"
                        r"(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*)", re.M)
_JS_SPEC = re.compile(r"""(?:\bfrom|\bimport|\brequire\(|\bimport\()\s*['"](\.\.?/[^'"\n]+)['"]""")
_JS_EXT = (".ts", ".tsx", ".d.ts", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts")
_GO_BLOCK = re.compile(r"^import\s*\(([^)]*)\)", re.M)
_GO_ONE = re.compile(r'^import\s+(?:[\w.]+\s+)?"([^"]+)"', re.M)
_GO_QUOTED = re.compile(r'"([^"]+)"')
_GO_MODULE = re.compile(r"^module\s+(\S+)", re.M)
_RS_MOD = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", re.M)
_RS_USE = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?use\s+((?:crate|super|self)(?:::\w+)+)",
                     re.M)
_JAVA_PACKAGE = re.compile(r"^\s*package\s+([\w.]+)\s*;", re.M)
_JAVA_IMPORT = re.compile(r"^\s*import\s+(?!static\b)([\w.]+)\s*;", re.M)
_C_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class DiskFile:
    """One workspace file read for a document."""

    path: Path  # absolute
    rel: str  # relative to its workspace folder: what the model is shown
    text: str


def _python(doc: Path, text: str, root: Path) -> Iterator[Path]:
    package_root = doc.parent
    while (package_root / "__init__.py").is_file() and package_root != root:
        package_root = package_root.parent
    bases = [root, root / "src", root / "lib", package_root]
    modules: list[tuple[int, list[Path], str]] = []
    for m in _PY_FROM.finditer(text):
        dots, name, names = len(m.group(1)), m.group(2), m.group(3)
        if dots > len(doc.parents):
            continue
        here = [doc.parents[dots - 1]] if dots else bases
        modules.append((m.start(), here, name))
        modules += [(m.start(), here, f"{name}.{n}" if name else n)
                    for n in _WORD.findall(names) if n != "as"]
    for m in _PY_IMPORT.finditer(text):
        modules += [(m.start(), bases, part.split()[0]) for part in m.group(1).split(",")]
    modules.sort(key=lambda entry: entry[0])  # stable: in the file's order
    for _at, here, name in modules:
        rel = Path(*name.split(".")) if name else Path()
        for base in here:
            if name:
                yield (base / rel).with_suffix(".py")
            yield base / rel / "__init__.py"


def _javascript(doc: Path, text: str, root: Path) -> Iterator[Path]:
    for spec in _JS_SPEC.findall(text):
        p = doc.parent / spec
        yield p
        for old, new in ((".js", ".ts"), (".jsx", ".tsx"), (".mjs", ".mts"), (".cjs", ".cts")):
            if spec.endswith(old):
                yield p.with_suffix(new)
        for ext in _JS_EXT:
            yield p.with_name(p.name + ext)
            yield p / f"index{ext}"


def _go_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.glob("*.go") if not p.name.endswith("_test.go"))
    except OSError:
        return []


_GO_MODULES: dict[Path, tuple[int, str | None]] = {}  # go.mod -> (mtime, module path)


def _go_module(root: Path) -> str | None:
    """The module path ``root/go.mod`` declares (read again only when it changes)."""
    path = root / "go.mod"
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    cached = _GO_MODULES.get(path)
    if cached is None or cached[0] != stamp:
        try:
            found = _GO_MODULE.search(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            found = None
        cached = (stamp, found.group(1) if found else None)
        _GO_MODULES[path] = cached
    return cached[1]


def _go(doc: Path, text: str, root: Path) -> Iterator[Path]:
    yield from (p for p in _go_files(doc.parent) if p != doc)
    module = _go_module(root)
    if module is None:
        return
    paths = _GO_ONE.findall(text)
    for block in _GO_BLOCK.findall(text):
        paths += _GO_QUOTED.findall(block)
    prefix = module + "/"
    for path in paths:
        if path.startswith(prefix):
            yield from _go_files(root / path[len(prefix):])


def _rust(doc: Path, text: str, root: Path) -> Iterator[Path]:
    own = doc.parent if doc.stem in ("mod", "lib", "main") else doc.parent / doc.stem
    for name in _RS_MOD.findall(text):
        yield own / f"{name}.rs"
        yield own / name / "mod.rs"
    crate = next((p / "src" for p in doc.parents if (p / "Cargo.toml").is_file()), root / "src")
    for path in _RS_USE.findall(text):
        head, *parts = path.split("::")
        base = {"crate": crate, "self": own, "super": own.parent}[head]
        for n in range(len(parts), 0, -1):
            yield base.joinpath(*parts[:n]).with_suffix(".rs")
            yield base.joinpath(*parts[:n], "mod.rs")


def _java(doc: Path, text: str, root: Path) -> Iterator[Path]:
    package = _JAVA_PACKAGE.search(text)
    depth = len(package.group(1).split(".")) if package else 0
    source_root = doc.parents[depth] if depth < len(doc.parents) else root
    for name in _JAVA_IMPORT.findall(text):
        yield source_root.joinpath(*name.split(".")).with_suffix(".java")
    words = set(_WORD.findall(text))
    try:
        siblings = sorted(doc.parent.glob("*.java"))
    except OSError:
        siblings = []
    yield from (p for p in siblings if p != doc and p.stem in words)


def _c(doc: Path, text: str, root: Path) -> Iterator[Path]:
    for name in _C_INCLUDE.findall(text):
        yield doc.parent / name
        yield root / "include" / name
        yield root / name


_RESOLVERS: dict[str, Callable[[Path, str, Path], Iterator[Path]]] = {
    ".py": _python, ".pyi": _python,
    **{ext: _javascript for ext in (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts",
                                    ".cts")},
    ".go": _go, ".rs": _rust, ".java": _java,
    **{ext: _c for ext in (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx")},
}


@dataclass
class Workspace:
    """The workspace folders a server may read imported files from, and what it read."""

    roots: Sequence[Path]
    _ignores: dict[Path, GitIgnore] = field(default_factory=dict)
    _read: dict[Path, tuple[tuple[int, int], str | None]] = field(default_factory=dict)

    def root_of(self, doc: Path) -> Path | None:
        """The innermost workspace folder holding ``doc``."""
        holding = [r for r in self.roots if doc.is_relative_to(r)]
        return max(holding, key=lambda r: len(r.parts)) if holding else None

    def imported_files(self, doc: Path, text: str) -> list[DiskFile]:
        """The files ``text`` (the document at ``doc``) imports, as far as they may be
        read (see the module's docstring); the document itself never."""
        root = self.root_of(doc)
        resolver = _RESOLVERS.get(doc.suffix.lower())
        if root is None or resolver is None:
            return []
        out: list[DiskFile] = []
        seen = {doc}
        for candidate in resolver(doc, text, root):
            path = Path(*_normalise(candidate.parts))
            if path in seen or not path.is_relative_to(root):
                continue
            seen.add(path)
            found = self._file(path, root)
            if found is not None:
                out.append(found)
                if len(out) >= MAX_FILES:
                    break
        return out

    def _file(self, path: Path, root: Path) -> DiskFile | None:
        rel = path.relative_to(root)
        if looks_secret(str(rel)):
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        if not path.is_file() or st.st_size > MAX_BYTES:
            return None
        # A link out of the workspace is not the workspace's.
        if not path.resolve().is_relative_to(root.resolve()):
            return None
        ignore = self._ignores.setdefault(root, GitIgnore(root))
        if ignore.ignored(rel):
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._read.get(path)
        if cached is None or cached[0] != stamp:
            try:
                text: str | None = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
            cached = (stamp, text)
            self._read[path] = cached
        return DiskFile(path, rel.as_posix(), cached[1]) if cached[1] is not None else None


def _normalise(parts: Sequence[str]) -> list[str]:
    """``a/b/../c`` as ``a/c`` (without touching the disk)."""
    out: list[str] = []
    for part in parts:
        if part == "..":
            if len(out) > 1:
                out.pop()
        elif part != ".":
            out.append(part)
    return out
