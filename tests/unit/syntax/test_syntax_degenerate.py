"""Degenerate alternatives (a model in a loop) rank below every sane one, in every language,
with the whole file or a window of it."""

from __future__ import annotations

import pytest

from kspec.engine.api import Completion
from kspec.engine.syntax import rank_alternatives
from kspec.engine.syntax.degenerate import degeneration


@pytest.mark.parametrize(
    ("text", "prefix"),
    [
        ("include_include_include_include_", ""),  # a unit again and again
        ("foo(foo(foo(foo(x))))", ""),
        ("print(x)\nprint(x)\nprint(x)\n", ""),  # a line three times
        ("self self self self self self", ""),  # a run of one word
        ("((((((((((", ""),  # a run of one character
        ("    total += x\n    count += 1", "def f(xs):\n    for x in xs:\n        total += x\n        count += 1\n"),
        ("count += 1", "    count += 1\n    "),  # the line above, again
        # a line that grows by a unit each time
        ("const result = 0;\n  const result_pow = 1;\n  const result_pow_pow = 1;\n  const result_pow_pow_pow = 1;", ""),
    ],
)
def test_degenerate(text: str, prefix: str) -> None:
    assert degeneration(text, prefix) is not None


@pytest.mark.parametrize(
    "text",
    [
        "return None, None, None",  # three times is still code
        "x = [0, 0, 0, 0, 0, 0, 0, 0]",  # numbers are data
        "assert f(1) == 1\n    assert f(2) == 2",
        "    total += x\n    return total",
        '"-" * 40',
        "include_header(include_dirs)",
        "a = [0, 0]\n    b = [0, 0, 0]\n    c = [0, 0, 0, 0]",  # numbers are data
        "x_min = 0\n    x_max = 1\n    x_mid = 2",  # alike lines, no unit repeated
    ],
)
def test_sane(text: str) -> None:
    assert degeneration(text, "def f(xs):\n    total = 0\n    for x in xs:\n") is None


# (language, prefix, suffix, a sane alternative, a degenerate one) with windows that start
# inside a docstring / block comment, inside brackets, and mid-statement.
CASES = [
    ("python", 'he paths.\n    """\n    out = []\n    for p in paths:\n        ', "\n    return out\n",
     "out.append(p)", "include_include_include_include_include_"),
    ("python", "ength(a,\n           b)\n    if x:\n        ", "\n    return x\n",
     "x += 1", "x += 1\n        x += 1\n        x += 1\n        x += 1"),
    ("javascript", " * Sum the items.\n */\nfunction sum(items) {\n  let total = 0;\n  ", "\n  return total;\n}\n",
     "for (const item of items) total += item;", "total = total = total = total = total = total;"),
    ("javascript", "ems.length; i++) {\n    ", "\n  }\n  return total;\n}\n",
     "total += items[i];", "total += items[items[items[items[items[i]]]]];"),
    ("java", "     * Sum the items.\n     */\n    int sum(int[] items) {\n        int total = 0;\n        ", "\n        return total;\n    }\n",
     "for (int item : items) total += item;", "total += total += total += total += total;"),
    ("java", " total = 0;\n        for (int i = 0; i < n; i++) {\n            ", "\n        }\n        return total;\n",
     "total += i;", "total += i;\n            total += i;\n            total += i;"),
]


@pytest.mark.parametrize(("language", "prefix", "suffix", "sane", "degenerate"), CASES)
def test_degenerate_alternatives_rank_last_even_when_the_model_prefers_them(
    language: str, prefix: str, suffix: str, sane: str, degenerate: str
) -> None:
    candidates = [Completion(degenerate, logprob=-0.01, n_tokens=30), Completion(sane, logprob=-5.0, n_tokens=10)]  # far more likely
    ranked = [r.completion.text for r in rank_alternatives(prefix, suffix, language, candidates)]
    assert ranked[0] == sane
    assert len(ranked) == 1 or degeneration(ranked[-1], prefix) is not None
