"""Which workspace files a document's imports bring in, and which are never read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fimls.crossfile import ContextStore
from fimls.crossfile.ignore import GitIgnore, looks_secret, parse_rules
from fimls.crossfile.workspace import MAX_FILES, Workspace


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _rels(root: Path, doc: str) -> list[str]:
    ws = Workspace([root])
    return [f.rel for f in ws.imported_files(root / doc, (root / doc).read_text())]


def test_python_imports_absolute_relative_and_submodules(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "pkg/__init__.py": "", "pkg/util.py": "def helper(): ...\n",
        "pkg/sub/__init__.py": "", "pkg/sub/mod.py": "class Thing: ...\n",
        "src/lib2/core.py": "def core(): ...\n",
        "pkg/app.py": "import os\nfrom .util import helper\nfrom pkg.sub import mod\n"
                      "import lib2.core as c\nfrom . import util\n",
    })
    assert _rels(tmp_path, "pkg/app.py") == [
        "pkg/util.py", "pkg/sub/__init__.py", "pkg/sub/mod.py", "src/lib2/core.py",
        "pkg/__init__.py"]


def test_typescript_relative_specifiers_only(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "src/a.ts": "import { b } from './b.js'\nimport x from 'react'\n"
                    "import { c } from '../lib/c'\nconst d = require('./d')\n",
        "src/b.ts": "export const b = 1\n", "lib/c/index.tsx": "export const c = 2\n",
        "src/d.js": "module.exports = 3\n", "node_modules/react/index.js": "",
    })
    assert _rels(tmp_path, "src/a.ts") == ["src/b.ts", "lib/c/index.tsx", "src/d.js"]


def test_go_package_siblings_and_module_packages(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "go.mod": "module example.com/m\n\ngo 1.22\n",
        "cmd/main.go": 'package main\n\nimport (\n\t"fmt"\n\tx "example.com/m/internal/x"\n)\n',
        "cmd/flags.go": "package main\n", "cmd/main_test.go": "package main\n",
        "internal/x/x.go": "package x\n", "internal/x/x_test.go": "package x\n",
    })
    assert _rels(tmp_path, "cmd/main.go") == ["cmd/flags.go", "internal/x/x.go"]


def test_rust_mod_and_use_paths(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "Cargo.toml": "[package]\n", "src/lib.rs": "mod de;\nuse crate::ser::Serializer;\n",
        "src/de.rs": "pub struct D;\n", "src/ser/mod.rs": "pub struct Serializer;\n",
    })
    assert _rels(tmp_path, "src/lib.rs") == ["src/de.rs", "src/ser/mod.rs"]


def test_java_imports_and_named_classes_of_the_package(tmp_path: Path) -> None:
    _tree(tmp_path, {
        "src/main/java/com/x/App.java": "package com.x;\nimport com.x.util.Strings;\n"
                                        "class App { Helper h; }\n",
        "src/main/java/com/x/util/Strings.java": "package com.x.util;\n",
        "src/main/java/com/x/Helper.java": "package com.x;\n",
        "src/main/java/com/x/Unused.java": "package com.x;\n",
    })
    assert _rels(tmp_path, "src/main/java/com/x/App.java") == [
        "src/main/java/com/x/util/Strings.java", "src/main/java/com/x/Helper.java"]


def test_never_ignored_secret_outside_large_or_more_than_the_cap(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    names = [f"m{i}" for i in range(MAX_FILES + 3)]
    _tree(root, {
        ".gitignore": "build/\n*.gen.py\n!keep.gen.py\n",
        "build/out.py": "", "a.gen.py": "", "keep.gen.py": "", "secrets.py": "",
        "big.py": "x = 1\n" * 50_000, **{f"{n}.py": "" for n in names},
        "app.py": "import build.out, a_gen, secrets, big, keep\nfrom .. import outside\n"
                  "from ... import far\n" + "".join(f"import {n}\n" for n in names),
    })
    (root / "a_gen.py").symlink_to(tmp_path / "outside.py")
    (tmp_path / "outside.py").write_text("")
    rels = _rels(root, "app.py")
    assert rels == [f"{n}.py" for n in names[:MAX_FILES]]


def test_a_file_is_read_once_and_again_when_it_changes(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "from b import f\n", "b.py": "def f(): ...\n"})
    ws = Workspace([tmp_path])
    first = ws.imported_files(tmp_path / "a.py", "from b import f\n")
    again = ws.imported_files(tmp_path / "a.py", "from b import f\n")
    assert first[0].text is again[0].text
    (tmp_path / "b.py").write_text("def f(x): ...\n")
    os.utime(tmp_path / "b.py", ns=(1, 1))
    assert ws.imported_files(tmp_path / "a.py", "from b import f\n")[0].text == "def f(x): ...\n"


def test_no_workspace_folder_no_files(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "from b import f\n", "b.py": "def f(): ...\n"})
    assert Workspace([tmp_path / "elsewhere"]).imported_files(tmp_path / "a.py", "import b\n") \
        == []


@pytest.mark.parametrize(("rules", "path", "is_ignored"), [
    ("*.log\n", "a/b/x.log", True),
    ("/top.py\n", "top.py", True),
    ("/top.py\n", "a/top.py", False),
    ("docs/*.md\n", "docs/a.md", True),
    ("docs/*.md\n", "docs/sub/a.md", False),
    ("**/gen\n", "a/b/gen/x.py", True),
    ("a/**/z.py\n", "a/b/c/z.py", True),
    ("out/\n", "out", False),  # a file named like the folder rule
    ("out/\n", "src/out/x.py", True),
    ("*.py\n!keep.py\n", "keep.py", False),
    ("# comment\n\n", "x.py", False),
    ("x[0-9].py\n", "x5.py", True),
    ("node_modules\n", "node_modules/react/index.js", True),
])
def test_gitignore_rules(tmp_path: Path, rules: str, path: str, is_ignored: bool) -> None:
    (tmp_path / ".gitignore").write_text(rules)
    assert GitIgnore(tmp_path).ignored(Path(path)) is is_ignored


def test_a_deeper_gitignore_overrides_and_git_is_ignored(tmp_path: Path) -> None:
    _tree(tmp_path, {".gitignore": "*.py\n", "pkg/.gitignore": "!*.py\n"})
    ignore = GitIgnore(tmp_path)
    assert ignore.ignored(Path("a.py")) and not ignore.ignored(Path("pkg/a.py"))
    assert ignore.ignored(Path(".git/config"))
    assert len(parse_rules("a\n!b\nc/\n")) == 3


@pytest.mark.parametrize(("path", "secret"), [
    (".env", True), (".env.local", True), ("config/prod.env", True), ("id_rsa", True),
    ("certs/server.pem", True), ("aws_credentials.py", True), ("app/secrets.py", True),
    (".ssh/config", True), ("tokenizer.py", False), ("src/env.py", False),
    ("settings.py", False), ("keys.py", False),
])
def test_secret_names(path: str, secret: bool) -> None:
    assert looks_secret(path) is secret


def test_disk_files_give_definitions_after_open_buffers() -> None:
    store = ContextStore()
    store.open("file:///w/a.py", "a.py", lambda: "from util import parse\n\nx = parse(")
    disk = [("file:///w/util.py", "util.py", "import re\n\n\ndef parse(text: str) -> int:\n"
                                             "    return int(text)\n")]
    prefix = "from util import parse\n\nx = parse("
    assert store.select("file:///w/a.py", prefix, "", 2000) == []
    chosen = store.select("file:///w/a.py", prefix, "", 2000, disk=disk)
    assert [(c.path, c.source) for c in chosen] == [("util.py", "definition")]
    assert chosen[0].text.startswith("def parse(text: str) -> int:")
