"""Privacy and safety, observed from outside a real ``fimls serve`` session.

One session with the real model, in a workspace that holds files the editor never opened.
The server and its engine worker run with PEP 578 audit hooks (tests/audit) and, where the
machine allows ptrace, under ``strace -f`` (which also sees native code). Checked:

* no network: no AF_INET/AF_INET6 socket is created, nothing connects anywhere but to a
  local (AF_UNIX) socket, no name lookup;
* no document text in the latency log or on stderr at the default log level;
* document content is never executed: it is never compiled, and the payload it carries
  does not run;
* no file is read beyond what the client opened and the workspace files the opened one
  imports: in the workspace only the imported file that git does not ignore and whose name
  is not a secret's, and the ``.gitignore`` rules; every file opened at all is the Python
  installation, fimls itself, the model, fimls's cache and state directories, or system
  files (/proc, /sys, /dev, /etc, /usr, /lib).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types

from fimls.models import cache_dir
from tests.figures import report
from tests.lsp_helpers import end_position, inline, insert, open_doc, session

pytestmark = pytest.mark.asyncio

MARKER = "zq_private_marker_7f3a"
AUDIT = Path(__file__).resolve().parent / "audit"
ROOT = Path(__file__).resolve().parents[1]


def _strace_works() -> bool:
    if not shutil.which("strace"):
        return False
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=none", "true"],
                          capture_output=True, timeout=30)
    return proc.returncode == 0


async def test_no_network_no_text_in_logs_no_execution_no_stray_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    executed = tmp_path / "executed"
    payload = f"__import__('pathlib').Path({str(executed)!r}).write_text('ran')"
    (ws / "secret.py").write_text(f"API_KEY = '{MARKER}_secret'\n")
    (ws / "README.md").write_text("never opened\n")
    (ws / ".env").write_text("TOKEN=abc\n")
    (ws / ".gitignore").write_text("generated.py\n")
    (ws / "generated.py").write_text(f"GEN = '{MARKER}_generated'\n")
    (ws / "helpers.py").write_text(f"# {MARKER}_helpers\ndef read_config(path):\n    ...\n")
    opened = ws / "app.py"
    prefix = (f"# {MARKER}_prefix\n{payload}\nimport os\nimport helpers, generated, secret\n"
              "from env import TOKEN\n\n"
              "def load_settings(path):\n    ")
    suffix = f"\n\nexec({payload!r})\n# {MARKER}_suffix\n"
    opened.write_text(prefix + suffix)

    audit_log = tmp_path / "audit.jsonl"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(AUDIT), os.environ.get(
        "PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("FIMLS_AUDIT_LOG", str(audit_log))
    log = tmp_path / "lat.jsonl"
    cmd = [sys.executable, "-m", "fimls", "serve", "--latency-log", str(log),
           "--min-confidence", "0"]
    strace_out = tmp_path / "strace.txt"
    traced = _strace_works()
    if traced:
        cmd = ["strace", "-f", "-qq", "-o", str(strace_out), "-e",
               "trace=socket,connect,bind,sendto,sendmsg", *cmd]

    async with session(command=cmd, workspace=ws) as (client, _):
        uri = opened.as_uri()
        open_doc(client, uri, prefix + suffix)
        other = (tmp_path / "scratch.py").as_uri()  # an unsaved buffer: an other-buffer source
        open_doc(client, other, f"# {MARKER}_other\nvalue = {payload}\n")
        line, col = end_position(prefix)
        res = await inline(client, uri, line, col)
        assert res is not None
        insert(client, uri, 2, line, col, "r")
        res = await inline(client, uri, line, col + 1)
        assert res is not None
        comp = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=col + 1)))
        assert comp is not None

    err = capfd.readouterr().err
    # No document text in the logs (default log level).
    assert MARKER not in err
    assert log.exists() and MARKER not in log.read_text()
    assert "load_settings" not in log.read_text() and "load_settings" not in err
    # Never executed, never compiled.
    assert not executed.exists()
    events = [json.loads(line) for line in audit_log.read_text().splitlines()]
    pids = {e["pid"] for e in events}
    assert len(pids) >= 2, "the audit hook did not reach the server and its worker"
    compiled = [e for e in events if e["e"] == "compile" and MARKER in (e.get("src") or "")]
    assert not compiled
    # No network, as Python sees it.
    inet = [e for e in events if e["e"] == "socket.__new__" and e["family"] in (2, 10)]
    lookups = [e for e in events if e["e"] in ("socket.connect", "socket.getaddrinfo",
                                               "socket.sendto", "socket.bind")]
    assert not inet and not lookups, inet + lookups
    assert not [e for e in events if e["e"] in ("subprocess.Popen", "os.system")
                and "fimls.engine.worker" not in e.get("args", "")]
    # No network, as the kernel sees it (native code included).
    if traced:
        calls = strace_out.read_text().splitlines()
        bad = [c for c in calls if ("AF_INET" in c or "AF_INET6" in c or "AF_NETLINK" in c
                                    or ("connect(" in c and "AF_UNIX" not in c))]
        assert not bad, bad[:5]
    # No reads beyond what the client opened.
    paths = {Path(e["path"]).resolve() for e in events
             if e["e"] == "open" and not e["path"].isdigit()}
    read = {p.relative_to(ws.resolve()).as_posix() for p in paths
            if p.is_relative_to(ws.resolve())}
    assert read <= {"helpers.py", ".gitignore", ".git/info/exclude"}, read
    assert "helpers.py" in read
    allowed = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), ROOT,
               cache_dir().resolve(), (tmp_path / "state").resolve(), log.resolve(),
               audit_log.resolve(), *(Path(p) for p in ("/proc", "/sys", "/dev", "/etc",
                                                         "/usr", "/lib", "/lib64"))]
    stray = sorted(str(p) for p in paths if not any(p.is_relative_to(a) for a in allowed)
                   and not p.is_relative_to(ws.resolve()))
    assert not stray, stray
    report(f"privacy: {len(events)} audited events in {len(pids)} processes, "
          f"{len(paths)} files opened, in the workspace {sorted(read)}; strace: "
          f"{'no inet sockets' if traced else 'not available'}")
