"""Tests for fimls.crossfile: the definition index, chunk choice and what closing forgets."""

from __future__ import annotations

import ast

from fimls.crossfile import ContextStore, definitions, sources_of
from fimls.crossfile.chunks import definition_chunk
from fimls.crossfile.names import is_test_path, local_names
from fimls.crossfile.store import RING_SIZE

UTIL = '''import os

class Store(Base):
    """Keeps things."""
    def __init__(self, root, *, ttl=60):
        self.root = root
        self.items = {}
    def put(self, key, value):
        self.items[key] = value

def compute_total(items, tax=0.1):
    """The sum, taxed."""
    return sum(items) * (1 + tax)

LIMIT = 3
'''


def store_with(texts: dict[str, str]) -> ContextStore:
    """A store whose buffers read from ``texts`` (edit the dict to edit a buffer)."""
    store = ContextStore()
    for uri in texts:
        store.open(uri, uri.rsplit("/", 1)[-1], lambda u=uri: texts.get(u))
    return store


def test_definitions_index_functions_classes_and_assignments() -> None:
    defs = definitions(UTIL)
    assert defs["Store"] == [2] and defs["compute_total"] == [10] and defs["LIMIT"] == [14]
    assert defs["put"] == [7]  # methods too: a call may name them
    assert "os" not in defs and "self" not in defs


def test_a_function_chunk_is_its_head_and_a_class_chunk_its_signatures() -> None:
    lines = UTIL.splitlines()
    assert definition_chunk(lines, 10) == ('def compute_total(items, tax=0.1):\n'
                                           '    """The sum, taxed."""\n'
                                           '    return sum(items) * (1 + tax)\n')
    # As a stub: each method's body is ``...``, so the next signature does not read as it.
    assert definition_chunk(lines, 2) == ('class Store(Base):\n    """Keeps things."""\n'
                                          '    def __init__(self, root, *, ttl=60): ...\n'
                                          '    def put(self, key, value): ...\n')


EDITOR = '''class Editor:
    """Opens an editor."""

    def __init__(
        self,
        editor: str | None = None,
        require_save: bool = True,
    ) -> None:
        self.editor = editor

    def edit_files(
        self, filenames: list[str]
    ) -> None:
        pass


def wrap_text(
    text: str,
    width: int = 78,
) -> str:
    """Wraps text."""
    return text
'''


def test_signatures_over_several_lines_are_kept_whole() -> None:
    """A call needs all the parameters, not the line that opens them."""
    lines = EDITOR.splitlines()
    cls = definition_chunk(lines, 0)
    assert "        require_save: bool = True,\n    ) -> None: ...\n" in cls
    assert "    def edit_files(\n        self, filenames: list[str]\n    ) -> None: ...\n" in cls
    assert "self.editor = editor" not in cls and "pass" not in cls
    fn = definition_chunk(lines, lines.index("def wrap_text("), max_lines=2)
    assert fn == ('def wrap_text(\n    text: str,\n    width: int = 78,\n) -> str:\n'
                  '    """Wraps text."""\n')
    js = "function f(a,\n           b) {\n  return a;\n}\nclass K {\n  m() {}\n}".splitlines()
    assert definition_chunk(js, 0) == "function f(a,\n           b) {\n  return a;\n}\n"
    assert definition_chunk(js, 4).startswith("class K {\n")


STUBBED = '''class Headers(Mapping[str, str]):
    """
    An immutable, case-insensitive multidict.
    """

    def __setitem__(self, key: str, value: str) -> None:
        """
        name: not a field
        """
        found_indexes: list[int] = []

        def inner(x):
            return x

    @property
    def raw(self) -> list[tuple[bytes, bytes]]:  # the bytes
        return self._list

    @property
    def last(self) -> str:
        return ""


def long_doc(a, b):
    """Line 1.

    Line 3.
    Line 4.
    """
    return a
'''


def test_a_chunk_reads_as_code() -> None:
    """A class's docstring closed on its line (left open, every method after it read as
    its text), its methods as stubs, a method's locals and nested functions left out, a
    decorator without its method dropped, a docstring cut off closed: the chunk parses."""
    lines = STUBBED.splitlines()
    cls = definition_chunk(lines, 0, max_lines=0)
    assert cls == ('class Headers(Mapping[str, str]):\n'
                   '    """An immutable, case-insensitive multidict."""\n'
                   '    def __setitem__(self, key: str, value: str) -> None: ...\n'
                   '    @property\n'
                   '    def raw(self) -> list[tuple[bytes, bytes]]: ...  # the bytes\n')
    fn = definition_chunk(lines, lines.index("def long_doc(a, b):"), max_lines=4)
    assert fn.endswith('    Line 3.\n    """\n')
    for chunk in (cls, fn):
        ast.parse(chunk)


def test_definitions_of_names_near_the_cursor_come_first() -> None:
    filler = "".join(f"N{i} = {i}\n" for i in range(40))
    texts = {"file:///w/util.py": UTIL + filler, "file:///w/app.py": "import util\n\n"}
    store = store_with(texts)
    store.changed("file:///w/util.py", 40)  # a recent edit there: chosen after definitions
    got = store.select("file:///w/app.py", "s = Store('/tmp')\nx = compute_total(", ")\n",
                       4000)
    assert [(c.source, c.line) for c in got][:2] == [("definition", 10), ("definition", 2)]
    assert got[2].source == "recent"
    assert sources_of(got) == "definition:2,recent:1"
    assert all(c.path == "util.py" for c in got)
    # A tight budget keeps the first that fit, in order, and cuts the next at a line end
    # to what is left.
    small = store.select("file:///w/app.py", "x = compute_total(", ")\n", 120)
    assert [c.line for c in small] == [10, 34]
    assert small[0].text.endswith("return sum(items) * (1 + tax)\n")
    assert len(small[1].text) <= 120 - len(small[0].text) and small[1].text.endswith("\n")
    tiny = store.select("file:///w/app.py", "x = compute_total(", ")\n", 40)
    assert [c.text for c in tiny] == ["def compute_total(items, tax=0.1):\n"]
    assert store.select("file:///w/app.py", "x = compute_total(", "", 0) == []


def test_names_defined_in_the_current_file_are_not_looked_up() -> None:
    texts = {"file:///w/util.py": UTIL,
             "file:///w/app.py": "def compute_total(x):\n    return x\n"}
    store = store_with(texts)
    got = store.select("file:///w/app.py", "y = compute_total(", "", 4000)
    assert not [c for c in got if c.source == "definition"]


def test_an_edit_refreshes_the_index() -> None:
    texts = {"file:///w/util.py": UTIL, "file:///w/app.py": ""}
    store = store_with(texts)
    assert not store.select("file:///w/app.py", "fresh_name(", "", 4000)
    texts["file:///w/util.py"] = UTIL + "\ndef fresh_name(a):\n    return a\n"
    store.changed("file:///w/util.py", None)
    got = store.select("file:///w/app.py", "fresh_name(", "", 4000)
    assert got[0].text.startswith("def fresh_name(a):")


def test_ring_chunks_from_where_the_user_asked_and_closing_forgets_all() -> None:
    other = "".join(f"line_{i} = {i}\n" for i in range(400))
    texts = {"file:///w/a.py": other, "file:///w/b.py": "x = 1\n"}
    store = store_with(texts)
    store.asked("file:///w/a.py", 200)
    store.asked("file:///w/a.py", 202)  # typing on: no second chunk for the same place
    store.changed("file:///w/a.py", 10)  # the last place there (a "recent" chunk)
    got = store.select("file:///w/b.py", "x = ", "", 100_000)
    ring = [c for c in got if c.source == "ring"]
    assert len(ring) == 1 and "line_200 = 200" in ring[0].text
    assert [c.source for c in got] == ["recent", "ring"]
    for i in range(RING_SIZE + 4):
        store.asked("file:///w/a.py", i * 20 % 400)
    assert len(store._ring) <= RING_SIZE
    store.close("file:///w/a.py")
    assert store.select("file:///w/b.py", "line_200", "", 100_000) == []
    assert store.uris() == ["file:///w/b.py"] and store._ring == []


def test_the_server_keeps_a_set_while_typing_and_forgets_closed_buffers() -> None:
    """The server's choice of when a set changes (no model: requests are only built)."""
    from lsprotocol import types as T

    from fimls.config import Options
    from fimls.documents import Pos, TextDocument
    from fimls.server import FimlsServer

    ls = FimlsServer(Options(), lambda *a, **k: None)  # type: ignore[arg-type,return-value]

    def opened(uri: str, text: str) -> None:
        ls.on_open(T.DidOpenTextDocumentParams(text_document=T.TextDocumentItem(
            uri=uri, language_id="python", version=1, text=text)))

    def doc(uri: str) -> TextDocument:
        d = ls.docs.get(uri)
        assert d is not None
        return d

    util, app = "file:///w/util.py", "file:///w/app.py"
    body = "from util import compute_total\n" + "".join(f"v{i} = {i}\n" for i in range(100))
    opened(util, UTIL)
    opened(app, body + "x = compute_total(")
    end = Pos(101, len("x = compute_total("))
    first = ls.make_request(doc(app), end)
    assert (first.context[0].source, first.context[0].line) == ("definition", 10)
    ls.on_change(T.DidChangeTextDocumentParams(
        text_document=T.VersionedTextDocumentIdentifier(uri=app, version=2),
        content_changes=[T.TextDocumentContentChangePartial(
            range=T.Range(start=T.Position(line=101, character=end.character),
                          end=T.Position(line=101, character=end.character)), text="1")]))
    typed = ls.make_request(doc(app), Pos(101, end.character + 1))
    assert typed.context == first.context  # typing keeps the prompt's front
    # At the top of the file (60+ lines away): chosen anew, from what is near there (only
    # the import line: the name is imported, not used there).
    top = ls.make_request(doc(app), Pos(1, 0))
    assert [(c.source, c.line) for c in top.context] == [("imported", 10)]
    ls.on_close(T.DidCloseTextDocumentParams(text_document=T.TextDocumentIdentifier(uri=util)))
    assert ls.make_request(doc(app), Pos(101, end.character + 1)).context == []
    assert ls.context.uris() == [app]


def test_imported_names_not_used_yet_come_first() -> None:
    from fimls.crossfile.names import imported_names

    head = ("from pkg.money import (convert, Rate as R,\n    round_to)\n"
            "from .errors import BadValue\nimport os\n")
    assert imported_names(head, head + "x = convert(1)\n") == ["Rate", "round_to",
                                                               "BadValue", "convert"]
    texts = {"file:///w/money.py": UTIL.replace("compute_total", "round_to"),
             # The imports far above the cursor: not among the names near it.
             "file:///w/app.py": head + "".join(f"n{i} = {i}\n" for i in range(30))
             + "\n\ndef f(v):\n    return "}
    store = store_with(texts)
    got = store.select("file:///w/app.py", texts["file:///w/app.py"], "\n", 4000)
    assert [(c.source, c.line) for c in got] == [("imported", 10)]
    assert got[0].text.startswith("def round_to(items, tax=0.1):")


def test_a_bare_name_means_a_top_level_definition_and_comments_name_nothing() -> None:
    util = ("def close(stream):\n    pass\n\n"
            "class Stream:\n    def close(self):\n        pass\n\n"
            "def flush(stream):\n    \"\"\"Write what is buffered.\"\"\"\n\n"
            "def _safecall(func):\n    return func\n")
    texts = {"file:///w/util.py": util, "file:///w/app.py": ""}
    store = store_with(texts)
    # ``flush`` only in a comment and a string: not looked up; ``close`` bare: the
    # function, not the method.
    got = store.select("file:///w/app.py",
                       "# flush out\nlabel = 'flush'\nclose(f)\nx = _safecall(", ")\n", 4000)
    assert [(c.source, c.line) for c in got] == [("definition", 10), ("definition", 0)]
    # After a dot the name is some object's: a method, and after the bare names.
    got = store.select("file:///w/app.py", "s.close()\nx = _safecall(", ")\n", 4000)
    assert [(c.source, c.line) for c in got] == [("definition", 10), ("definition", 4)]
    assert got[1].text.startswith("    def close(self):")


def test_a_name_after_an_imported_module_is_as_good_as_bare_and_imports_are_not_uses() -> None:
    from fimls.crossfile.names import module_aliases

    assert module_aliases("import os, numpy as np\nimport a.b\nimport * as R from 'r'\n"
                          "from q import z\n") == {"os", "np", "a", "R"}
    util = ("class Headers:\n    def items(self):\n        pass\n\n"
            "def parse(text):\n    return text\n")
    texts = {"file:///w/util.py": util}
    store = store_with(texts)
    store.open("file:///w/app.py", "app.py", lambda: texts.get("file:///w/app.py"))

    def select(prefix: str) -> list[tuple[str, int]]:
        texts["file:///w/app.py"] = prefix + "\n"
        store.changed("file:///w/app.py", None)
        return [(c.source, c.line) for c in store.select("file:///w/app.py", prefix, "\n",
                                                         4000)]

    # ``util.Headers``: the module's class, as a bare name; ``h.items``'s method after it
    # though it is nearer the cursor.
    assert select("import util\nh = util.Headers()\nh.items()\nx = ") == [
        ("definition", 0), ("definition", 1)]
    # Not a module: ``h.Headers`` is some object's attribute, looked up after the rest.
    assert select("h = h.Headers()\nx = parse(") == [("definition", 4), ("definition", 0)]
    # A name only in an import line near the cursor is an imported name, not a use.
    assert select("from util import parse, Headers\nh = Headers()\n") == [
        ("definition", 0), ("imported", 4)]


def test_a_class_chunk_shows_its_fields_and_its_whole_constructor() -> None:
    params = [f"        option_{i}: int = {i}," for i in range(24)]
    lines = ["class Settings:", '    """Many options.', "", "    name: not a field", '    """',
             "    kind: str", "    size: int = 3", "    def __init__(", "        self,", *params,
             "    ) -> None:", "        self.x = 1", "    def other(", *params[:20],
             "    ):", "        pass"]
    chunk = definition_chunk(lines, 0, max_lines=6).splitlines()
    # The docstring's first lines, the fields (not the docstring's ``name: ...``), all 24
    # parameters and the close: a call of Settings needs them.
    assert chunk[:6] == ["class Settings:", '    """Many options."""', "    kind: str",
                         "    size: int = 3", "    def __init__(", "        self,"]
    assert chunk[6:30] == params and chunk[30] == "    ) -> None: ..."
    # Another method's signature that does not close within 16 lines: its first 16.
    assert definition_chunk(lines, len(lines) - 23).splitlines()[1:16] == params[:15]


def test_comments_by_the_files_language() -> None:
    util = "def per_item(x):\n    return x\n"
    texts = {"file:///w/util.py": util, "file:///w/app.py": "", "file:///w/app.js": ""}
    store = store_with(texts)
    # In Python ``//`` divides: the call after it is code.
    got = store.select("file:///w/app.py", "n = total // per_item(y)\nx = ", "\n", 4000)
    assert [(c.source, c.line) for c in got] == [("definition", 0)]
    # In JavaScript it starts a comment; ``#`` does not.
    assert store.select("file:///w/app.js", "n = 1 // per_item(y)\nx = ", "\n", 4000) == []
    assert len(store.select("file:///w/app.js", "n = a.#b + per_item(y)\nx = ", "\n",
                            4000)) == 1


def test_how_the_other_buffers_call_a_definition_shown_comes_after_the_definitions() -> None:
    errors = ('class BadParameter(Exception):\n    def __init__(self, message, ctx=None,'
              ' param=None):\n        self.param = param\n\n\n'
              'def check(value, ctx, param):\n    if not value:\n'
              '        raise BadParameter(\n            "empty",\n            ctx=ctx,\n'
              '            param=param,\n        )\n'
              '    # BadParameter(...) in a comment is no call\n'
              '        raise BadParameter("empty", ctx=ctx, param=param)\n'
              '    raise x.BadParameter("a method of that name")\n')
    prefix = "from errors import BadParameter\n\ndef run(v, ctx, p):\n    raise "
    texts = {"file:///w/errors.py": errors, "file:///w/app.py": prefix + "\n"}
    store = store_with(texts)
    got = store.select("file:///w/app.py", prefix, "\n", 4000)
    assert [c.source for c in got] == ["imported", "usage"]
    usage = got[-1]
    # Each call whole (its brackets closed), dedented; the same call text once; not the
    # definition, a comment or an attribute's call.
    assert usage.text == ('raise BadParameter(\n    "empty",\n    ctx=ctx,\n    param=param,\n'
                          ')\nraise BadParameter("empty", ctx=ctx, param=param)\n')
    assert usage.line == 7 and usage.path == "errors.py"
    # A call inside a chunk already chosen (check's body, shown whole) is not repeated.
    prefix = "x = check(v, ctx, p)\nraise BadParameter("
    texts["file:///w/app.py"] = prefix + "\n"
    store.changed("file:///w/app.py", 1)
    assert [c.source for c in store.select("file:///w/app.py", prefix, "\n", 4000)] == [
        "definition", "definition"]


def test_local_names_are_parameters_block_assignments_loop_and_as_targets() -> None:
    text = ('LIMIT = 3\n'
            'def handle(app, scope: dict[str, int] = {}, *args, **kwargs) -> None:\n'
            '    conn, peer = open_it(scope)\n'
            '    for item, key in pairs:\n'
            '        with lock() as held:\n'
            '            total: int = 0\n'
            '    try:\n        pass\n    except OSError as err:\n        pass\n'
            'function run(el, opts = {}) {\n  const node = el;\n}\n')
    assert local_names(text) == {"app", "scope", "args", "kwargs", "conn", "peer", "item",
                                 "key", "held", "total", "err", "el", "opts", "node"}


def test_a_parameter_named_like_another_files_definition_is_a_local_unless_a_fixture() -> None:
    """An ``app`` parameter is not a test module's ``app``; a pytest fixture is passed as
    a parameter of its name, so conftest.py's fixture is shown (after the imports)."""
    server = ("from routing import Route\n\nclass Gate:\n    def __init__(self, app):\n"
              "        self.app = app\n\n    def __call__(self, scope):\n"
              "        self.app(scope)\n        route = ")
    texts = {
        "file:///w/routing.py": "class Route:\n    def __init__(self, path, endpoint):\n"
                                "        self.path = path\n",
        "file:///w/test_app.py": "def app():\n    return make()\n",
        "file:///w/conftest.py": "import pytest\n\n@pytest.fixture(\n    scope='module')\n"
                                "def client_factory():\n    return make()\n",
        "file:///w/server.py": server + "\n",
    }
    store = store_with(texts)
    got = store.select("file:///w/server.py", server, "\n", 4000)
    assert [(c.source, c.path) for c in got] == [("imported", "routing.py")]
    test = ("from routing import Route\n\ndef test_it(client_factory):\n"
            "    client = client_factory()\n    r = ")
    texts["file:///w/test_it.py"] = test + "\n"
    store.open("file:///w/test_it.py", "test_it.py", lambda: texts["file:///w/test_it.py"])
    got = store.select("file:///w/test_it.py", test, "\n", 4000)
    assert [(c.source, c.path) for c in got][:2] == [("imported", "routing.py"),
                                                     ("definition", "conftest.py")]
    assert got[1].text.startswith("def client_factory():")
    # Outside a test module no parameter is filled with a fixture: an application's
    # ``client_factory`` parameter is its own.
    app = test.replace("def test_it(", "def serve(")
    texts["file:///w/server2.py"] = app + "\n"
    store.open("file:///w/server2.py", "pkg/server2.py",
               lambda: texts["file:///w/server2.py"])
    got = store.select("file:///w/server2.py", app, "\n", 4000)
    assert [(c.source, c.path) for c in got] == [("imported", "routing.py")]


def test_pytest_collects_test_modules_and_conftest_only() -> None:
    assert is_test_path("tests/test_app.py") and is_test_path("pkg/app_test.py")
    assert is_test_path("C:\\w\\tests\\conftest.py") and is_test_path("conftest.py")
    assert not is_test_path("starlette/testclient.py")
    assert not is_test_path("tests/helpers.py") and not is_test_path("test_data.json")
