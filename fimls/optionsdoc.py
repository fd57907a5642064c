"""``docs/options.md``, the options reference, written from the options' declarations
(:mod:`fimls.config`): ``python -m fimls.optionsdoc > docs/options.md``. A test fails when
the file differs from what this prints, so the reference cannot drift from the code."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any

from fimls.config import Options, describe, leaves

HEADER = """\
# fimls options

Every option is a flag of `fimls serve` and `fimls complete` (`--kebab-case`) and a key of
the editor's settings: `initializationOptions` and `workspace/didChangeConfiguration`, in
camelCase, flat (`{"maxTokens": 32}`), nested by section (`{"completion": {"maxTokens":
32}}`) or under a `fimls` key. An invalid value is reported once (`window/showMessage`) and
the option keeps its previous value. Changing a model option at run time reloads the model.

This file is generated from `fimls/config.py` (`python -m fimls.optionsdoc >
docs/options.md`); a test checks that the two agree.
"""


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    return json.dumps(value) if not isinstance(value, str) else value


def render() -> str:
    """The whole reference, in Markdown."""
    opts = Options()
    section_of = {key: sec for key, (sec, _name) in leaves(opts).items()}
    out = [HEADER]
    for sec in dataclasses.fields(opts):
        cls = type(getattr(opts, sec.name))
        out.append(f"## {sec.name}\n\n{(cls.__doc__ or '').strip()}\n")
        for key, flag, default, doc in describe():
            if section_of[key] != sec.name:
                continue
            text = " ".join(doc.split())
            out.append(f"### `{key}`\n\n`{flag} VALUE` · default `{_default(default)}`\n\n"
                       + textwrap.fill(text, 90) + "\n")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
