"""The VS Code extension's settings, generated from the option declarations.

Every server option becomes ``fimls.<camelKey>`` with its type, choices, bounds, default
and help; the extension's own settings (the server command, per-language enable) come
first. ``python -m fimls.editorsettings`` rewrites the ``contributes.configuration`` of
``editor-configs/vscode/package.json``; a test fails when that file differs from what this
module makes. The Neovim plugin passes any option through (``init_options``) and its help
points at ``docs/options.md``, generated from the same declarations.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from fimls.config import Options, _field, _value_type, describe, leaves

PACKAGE = Path(__file__).resolve().parents[1] / "editor-configs" / "vscode" / "package.json"

# The extension's own settings: read by the extension, never sent to the server.
CLIENT_PROPERTIES: dict[str, dict[str, Any]] = {
    "fimls.serverCommand": {
        "type": "array", "items": {"type": "string"}, "default": ["fimls", "serve"],
        "markdownDescription": "Command that starts the fimls language server (stdio): the "
                               "full path of the venv's `fimls` if it is not on `PATH`."},
    "fimls.enable": {
        "type": "object", "additionalProperties": {"type": "boolean"},
        "default": {"*": True, "plaintext": False, "markdown": False, "scminput": False},
        "markdownDescription": "Suggestions per language, by language id; `*` is every "
                               "language not named. A disabled language sends no request."},
}


def _type_of(f: dataclasses.Field[Any], kind: type) -> dict[str, Any]:
    """The JSON schema of one option's values."""
    meta = f.metadata
    if meta.get("kind") == "globs":
        return {"type": "array", "items": {"type": "string"}}
    if meta.get("kind") == "path":
        return {"type": ["string", "null"]}
    base: dict[str, Any] = {bool: {"type": "boolean"}, int: {"type": "integer"},
                            float: {"type": "number"}}.get(kind, {"type": "string"})
    base = dict(base)
    if meta.get("choices"):
        base["enum"] = list(meta["choices"])
    if meta.get("min") is not None:
        base["minimum"] = meta["min"]
    if meta.get("max") is not None:
        base["maximum"] = meta["max"]
    if meta.get("words"):
        return {"anyOf": [base, {"type": "string", "enum": list(meta["words"])}]}
    if meta.get("nullable"):
        base["type"] = [base["type"], "null"]
    return base


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def vscode_properties() -> dict[str, dict[str, Any]]:
    """``contributes.configuration.properties``: the extension's settings, then every
    server option in declaration order."""
    props = dict(CLIENT_PROPERTIES)
    where = leaves(Options())
    for key, _flag, default, doc in describe():
        section, name = where[key]
        cls = type(getattr(Options(), section))
        schema = _type_of(_field(cls, name), _value_type(cls, name))
        props[f"fimls.{key}"] = {**schema, "default": _json_value(default),
                                 "markdownDescription": " ".join(doc.replace("``", "`")
                                                                 .split())}
    return props


def updated_package(text: str) -> str:
    """``package.json``'s text with its settings regenerated (everything else kept)."""
    pkg = json.loads(text)
    pkg["contributes"]["configuration"] = {"title": "fimls", "properties": vscode_properties()}
    return json.dumps(pkg, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    """Rewrite the extension's package.json; 0 when it was already up to date."""
    before = PACKAGE.read_text(encoding="utf-8")
    after = updated_package(before)
    if after != before:
        PACKAGE.write_text(after, encoding="utf-8")
        print(f"updated {PACKAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
