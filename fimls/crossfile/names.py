"""Which names near a cursor to look up in other files, and what a file imports and
binds for itself (regular expressions, as the definition index)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fimls.crossfile.chunks import _COMMON, _IDENT, _STRINGS

MIN_NAME = 3  # shorter names near the cursor are locals (i, e, it), not looked up
NEAR_BEFORE = 24  # lines before the cursor whose identifiers are looked up
NEAR_AFTER = 4

_HASH_COMMENT = (".py", ".pyi", ".sh", ".bash", ".rb", ".r", ".pl", ".yaml", ".yml", ".toml",
                 ".jl", ".ex", ".exs", ".nim", ".cmake", ".mk")
# Names a file imports: Python's ``from m import a, b`` (parenthesised over lines too) and
# JavaScript/TypeScript's ``import {a, b} from`` / ``import a from``.
_IMPORTS = re.compile(
    r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\(([^)]*)\)|([^\n]+))"
    r"|^[ \t]*import[ \t]*\{([^}]*)\}[ \t]*from"
    r"|^[ \t]*import[ \t]+(\w+)[ \t]+from", re.M)
_MODULE_IMPORT = re.compile(
    r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+"
    r"(?:[ \t]+as[ \t]+\w+)?)*)[ \t]*(?:#.*)?$"
    r"|^[ \t]*import[ \t]+(\*)[ \t]+as[ \t]+(\w+)", re.M)
# What a function binds for itself: a parameter list's opening, an assignment inside a
# block (indented; tuple targets too), a loop variable, ``with ... as x`` / ``except ... as x``.
_FUNC_OPEN = re.compile(r"\b(?:def|function|func|fn)\s+[A-Za-z_]\w*\s*\(")
_LOCAL_ASSIGN = re.compile(
    r"^[ \t]+(?:(?:const|let|var)\s+)?(?P<names>[A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)"
    r"[ \t]*(?::[^=\n]*)?=(?!=)", re.M)
_LOCAL_BIND = re.compile(
    r"\bfor[ \t]+\(?(?P<loop>[A-Za-z_]\w*(?:[ \t]*,[ \t]*[A-Za-z_]\w*)*)\)?[ \t]+in\b"
    r"|\b(?:with|except)\b[^\n]*?\bas[ \t]+(?P<alias>[A-Za-z_]\w*)")
# The first name of the dotted chain that ends where a search stops (``a.b.`` -> ``a``).
_CHAIN_ROOT = re.compile(r"([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)*\.$")


def imported_names(text: str, prefix: str, exclude: set[str] | None = None) -> list[str]:
    """The names ``text`` imports (see _IMPORTS), those not used in ``prefix`` outside
    import lines first, each once, without ``exclude``."""
    names: list[str] = []
    for m in _IMPORTS.finditer(text[:200_000]):
        group = next(g for g in m.groups() if g is not None)
        for part in group.replace("\n", ",").split(","):
            words = _IDENT.findall(part)
            # ``a as b``: the definition is under ``a``.
            if words and words[0] not in names and words[0] not in _COMMON:
                names.append(words[0])
    if exclude:
        names = [n for n in names if n not in exclude]
    used = set(_IDENT.findall(_IMPORTS.sub("", prefix[-200_000:])))
    return [n for n in names if n not in used] + [n for n in names if n in used]


def is_test_path(path: str) -> bool:
    """Whether pytest collects ``path`` as a test module or conftest (``test_*.py``,
    ``*_test.py``, ``conftest.py``): only there are parameters filled with fixtures."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return base == "conftest.py" or (base.endswith(".py") and (
        base.startswith("test_") or base.endswith("_test.py")))


def is_fixture(lines: list[str], at: int) -> bool:
    """Whether the definition at ``at`` is decorated as a pytest fixture."""
    i = at - 1
    while i >= 0 and at - i <= 6:
        line = lines[i].strip()
        if line.startswith("@") and "fixture" in line:
            return True
        # A decorator's own continuation lines, or another decorator above it.
        if not line or not (line.startswith("@") or indented(lines[i]) or line[0] in ")]"):
            return False
        i -= 1
    return False


def local_names(text: str) -> set[str]:
    """The names ``text`` binds inside its functions: parameters, assignments in a block,
    loop variables, ``as`` targets.

    A bare name near the cursor that the file binds itself (and does not import) is one of
    its locals: a definition of that name in another file (a test module's
    ``app = Starlette(...)`` for an ``app`` parameter) is a different thing, and showing
    it misleads the model. Regular expressions, as the definition index: a parameter list
    is read to its closing bracket; a generic or a receiver (``fn f<T>(``, Go's
    ``func (r T) f(``) is not matched, so its parameters are not taken for locals.
    """
    out: set[str] = set()
    text = text[:200_000]
    for m in _FUNC_OPEN.finditer(text):
        # One pass to the closing bracket, split at the commas of the outermost level.
        depth = 1
        part: list[str] = []
        params: list[str] = []
        for ch in text[m.end():m.end() + 2000]:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
                if depth == 0:
                    break
            if ch == "," and depth == 1:
                params.append("".join(part))
                part = []
            else:
                part.append(ch)
        params.append("".join(part))
        for p in params:
            words = _IDENT.findall(p.split(":", 1)[0].split("=", 1)[0])
            if words:
                out.add(words[-1] if len(words) > 1 and words[0] in ("const", "mut") else words[0])
    for m in _LOCAL_ASSIGN.finditer(text):
        out.update(_IDENT.findall(m.group("names")))
    for m in _LOCAL_BIND.finditer(text):
        out.update(_IDENT.findall(m.group("loop") or m.group("alias") or ""))
    return out


def indented(line: str) -> bool:
    return line[:1] in (" ", "\t")


def module_aliases(text: str) -> set[str]:
    """The names ``text`` binds to whole modules: ``import a.b`` (``a``), ``import a as
    b`` (``b``), JavaScript's ``import * as b from``."""
    out: set[str] = set()
    for m in _MODULE_IMPORT.finditer(text[:200_000]):
        if m.group(3):
            out.add(m.group(3))
            continue
        for part in m.group(1).split(","):
            words = part.split()
            if len(words) == 3 and words[1] == "as":
                out.add(words[2])
            elif words:
                out.add(words[0].split(".")[0])
    return out


def comment_mark(path: str) -> str:
    """The line-comment mark of ``path``'s language (``#`` when unknown)."""
    if "." not in path.rsplit("/", 1)[-1]:
        return "#"
    return "#" if path.lower().endswith(_HASH_COMMENT) else "//"


@dataclass
class NearNames:
    """The identifiers near a cursor to look up in other files, closest first."""

    names: list[str] = field(default_factory=list)  # bare: another file's definition
    bound: list[str] = field(default_factory=list)  # bare, but bound by the file itself
    attrs: list[str] = field(default_factory=list)  # after a dot: some object's attribute


def names_near(prefix: str, suffix: str, near: tuple[int, int], *, own: dict[str, list[int]],
               local: set[str], modules: set[str], path: str) -> NearNames:
    """The identifiers of the ``near`` lines before and after the cursor: the current
    line's, then upwards, then below; not those ``own`` defines, nor words of comments and
    strings, nor the names of import statements (those come with the imported names)."""
    before = prefix.splitlines()[-near[0]:] if near[0] else []
    # Import statements name what the file may use, not what it uses here.
    before = _IMPORTS.sub(lambda m: "\n" * m.group().count("\n"),
                          "\n".join(before)).split("\n") if before else []
    after = suffix.splitlines()[:near[1] + 1]
    out = NearNames()
    # (Python's ``//`` divides.)
    comment = re.compile(re.escape(comment_mark(path)) + ".*")
    for ln in [*reversed(before), *after]:
        ln = comment.sub("", _STRINGS.sub('""', ln))
        for m in reversed(list(_IDENT.finditer(ln))):
            _classify(out, ln, m, own, local, modules)
    return out


def _classify(out: NearNames, ln: str, m: re.Match[str], own: dict[str, list[int]],
              local: set[str], modules: set[str]) -> None:
    """File one identifier of line ``ln``. A name after a dot (``f.close``) is some
    object's attribute: a method of that name in another file is a guess, so it comes after
    the bare names (``Type::name`` likewise); ``httpx.Client``, a module's name, is as good
    as bare. What the file binds for itself is bound, unless it also imports that name."""
    name = m.group()
    if (len(name) < MIN_NAME or name in _COMMON or name in own or name in out.names
            or name in out.bound):
        return
    attr = m.start() > 0 and ln[m.start() - 1] in ".:"
    if attr:
        root = _CHAIN_ROOT.search(ln, 0, m.start())
        attr = root is None or root.group(1) not in modules
    if attr:
        if name not in out.attrs:
            out.attrs.append(name)
        return
    if name in out.attrs:
        out.attrs.remove(name)
    (out.bound if name in local else out.names).append(name)
