"""The early-stop hook: stop a branch once text after its unit exists, never before."""

from __future__ import annotations

import pytest

from kspec.engine.syntax import UnitPredicate, unit_complete
from kspec.engine.syntax.context import build_context
from kspec.engine.syntax.trim import trim

PY_PREFIX = "def total(xs):\n    t = 0\n    for x in xs:\n"
PY_SUFFIX = "    return t\n"


@pytest.mark.parametrize(
    ("so_far", "complete"),
    [
        ("", False),
        ("        t", False),
        ("        t += x", False),
        ("        t += x\n", False),  # the next line may still be part of the unit
        ("        t += x\n        ", False),
        ("        t += x\n        if x:", False),  # the empty body of the `for` is the unit: it goes on
        ("        t += x\n    return t", True),  # dedent (and a repeat of the suffix)
        ("        t += x\n    ret", True),  # the dedent alone decides
        ("        t += x\n\ndef other():", True),
    ],
)
def test_python_line_start(so_far: str, complete: bool) -> None:
    assert unit_complete(PY_PREFIX, so_far, PY_SUFFIX, "python") is complete


def test_clause_keyword_prefix_is_undecided() -> None:
    prefix, suffix = "def f(x):\n", "    return 0\n"
    so_far = "    if x:\n        return 1\n    el"
    assert not unit_complete(prefix, so_far, suffix, "python")  # may become `else:`
    assert not unit_complete(prefix, so_far + "se:\n        return 2\n", suffix, "python")
    assert unit_complete(prefix, so_far + "se:\n        return 2\n    y = 1", suffix, "python")
    # `elapsed` is no clause keyword: the `if` statement ended before it.
    assert unit_complete(prefix, "    if x:\n        return 1\n    elapsed", suffix, "python")
    assert unit_complete(prefix, "    if x:\n        return 1\n    elapsed = 1\n", suffix, "python")


def test_a_body_goes_on_until_the_dedent() -> None:
    # At the start of an empty body the unit is the whole body.
    so_far = "    if x:\n        return 1\n    elapsed = 1\n"
    assert not unit_complete("def f(x):\n", so_far, "", "python")
    assert unit_complete("def f(x):\n", so_far + "print(f(1))", "", "python")


def test_closer_already_in_suffix_stops_at_once() -> None:
    assert not unit_complete("x = foo(", "a, b", ")\n", "python")
    assert unit_complete("x = foo(", "a, b)", ")\n", "python")
    assert unit_complete("const x = foo(", "a, b)", ");\n", "javascript")


def test_mid_line_stops_at_the_next_line() -> None:
    assert not unit_complete("x = ", "1 + 2", "\n", "python")
    assert not unit_complete("x = ", "1 + 2\n", "\n", "python")
    assert unit_complete("x = ", "1 + 2\ny", "\n", "python")
    assert not unit_complete("x = ", "foo(\n    1,\n", "\n", "python")  # open bracket: not yet


def test_c_family_block() -> None:
    prefix = "int f(int x) {\n"
    assert not unit_complete(prefix, "  if (x) {\n    return 1;\n", "}\n", "c")
    assert unit_complete(prefix, "  if (x) {\n    return 1;\n  }\n}", "}\n", "c")


@pytest.mark.parametrize(
    ("prefix", "suffix", "language", "full"),
    [
        (PY_PREFIX, PY_SUFFIX, "python", "        t += x\n    return t\n\nprint(total([1, 2]))\n"),
        ("x = foo(", ")\n", "python", "a, b)\nprint(x)\n"),
        ("int f(int x) {\n", "}\n", "c", "  return x;\n}\n\nint g(void) { return 0; }\n"),
        ("def f(x):\n", "", "python", "    if x:\n        return 1\n    else:\n        return 2\n\n\nf(1)\n"),
    ],
)
def test_stopping_early_keeps_what_trimming_keeps(prefix: str, suffix: str, language: str, full: str) -> None:
    """Decoding stops at the first prefix the hook accepts; trimming that must equal trimming all."""
    ctx = build_context(prefix, suffix, language)
    predicate = UnitPredicate(prefix, suffix, language)
    stop = next((n for n in range(1, len(full) + 1) if predicate(full[:n])), len(full))
    assert stop < len(full)  # it does stop before the end
    assert trim(ctx, full[:stop]) == trim(ctx, full)


def test_unknown_language() -> None:
    assert not unit_complete("SELECT ", "a, b", "\n", None)
    assert unit_complete("SELECT ", "a, b\nFROM t", "\n", None)
