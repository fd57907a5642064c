"""Loaded by every Python process of a privacy test (PYTHONPATH): the server and its engine
worker. Records, through PEP 578 audit hooks, every file opened, every socket event and
every compile() of source text, as JSON lines in $FIMLS_AUDIT_LOG."""

from __future__ import annotations

import json
import os
import sys

_path = os.environ.get("FIMLS_AUDIT_LOG")
_EVENTS = ("open", "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
           "socket.sendto", "compile", "subprocess.Popen", "os.system", "os.exec")

if _path:
    _fh = open(_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (process lifetime)
    _busy = False

    def _hook(event: str, args: tuple) -> None:
        global _busy
        if _busy or not event.startswith(_EVENTS):
            return
        _busy = True
        try:
            if event == "open":
                rec = {"e": event, "path": str(args[0]), "mode": str(args[1])}
            elif event == "compile":
                src = args[0]
                if isinstance(src, bytes):
                    src = src.decode("utf-8", "replace")
                rec = {"e": event, "src": src if isinstance(src, str) else None,
                       "file": str(args[1])}
            elif event == "socket.__new__":
                rec = {"e": event, "family": int(args[1])}
            else:
                rec = {"e": event, "args": repr(args)[:300]}
            rec["pid"] = os.getpid()
            _fh.write(json.dumps(rec) + "\n")
        except Exception:
            pass
        finally:
            _busy = False

    sys.addaudithook(_hook)
