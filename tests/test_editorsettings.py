"""The VS Code extension's settings are generated from the server's option declarations."""

from __future__ import annotations

import json

from fimls.config import Options, describe
from fimls.editorsettings import PACKAGE, updated_package, vscode_properties


def test_the_extension_declares_exactly_the_generated_settings() -> None:
    """Fails when an option was added, renamed or changed without
    ``python -m fimls.editorsettings``."""
    text = PACKAGE.read_text(encoding="utf-8")
    assert text == updated_package(text), "run: python -m fimls.editorsettings"


def test_every_server_option_is_a_setting_with_its_default() -> None:
    props = vscode_properties()
    for key, _flag, default, _doc in describe():
        prop = props[f"fimls.{key}"]
        want = list(default) if isinstance(default, tuple) else default
        assert prop["default"] == want, key
        assert prop["markdownDescription"], key
    assert props["fimls.speculative"]["enum"] == ["auto", "off", "lookup", "model"]
    assert props["fimls.maxTokens"] == {**props["fimls.maxTokens"], "type": "integer",
                                        "minimum": 1}
    assert props["fimls.nGpuLayers"]["anyOf"][1] == {"type": "string", "enum": ["auto"]}
    assert props["fimls.engine"]["type"] == ["string", "null"]
    assert props["fimls.disabledGlobs"]["type"] == "array"
    assert "catalogue name" in props["fimls.model"]["markdownDescription"]


def test_the_extensions_own_settings_are_not_sent_as_options() -> None:
    from fimls.config import CLIENT_KEYS, apply_dict

    pkg = json.loads(PACKAGE.read_text(encoding="utf-8"))
    own = {k.split(".", 1)[1] for k in pkg["contributes"]["configuration"]["properties"]
           if k.split(".", 1)[1] not in {key for key, *_ in describe()}}
    assert own == {"serverCommand", "enable"} and own <= CLIENT_KEYS
    opts, warnings = apply_dict(Options(), {"fimls": {"enable": {"*": True},
                                                      "serverCommand": ["fimls"]}})
    assert warnings == [] and opts == Options()
