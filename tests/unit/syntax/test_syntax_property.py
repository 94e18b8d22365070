"""Property: trimming never leaves an error that the untrimmed text has after the unit ended.

Hypothesis builds a valid unit for a cursor position (an expression mid-line, a statement
at a line start, a whole body at the start of an empty body), appends garbage that starts
after the unit has ended (a line at or below the unit's indentation, never a clause that
would continue it) and always breaks the parse, and checks that trimming gives back exactly
the unit, which fits its file without a new syntax error.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kspec.engine.syntax.checks import Checker
from kspec.engine.syntax.context import build_context
from kspec.engine.syntax.trim import trim

SETTINGS = settings(
    max_examples=120, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# ------------------------------------------------------------------------------ Python

PY_NAMES = st.sampled_from(["a", "b", "xs", "total", "n"])
PY_ATOMS = st.one_of(PY_NAMES, st.integers(0, 99).map(str), st.sampled_from(['"s"', "'t'", "None", '"(["']))


def _py_expr(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(["+", "-", "*", "and", "or", "==", "<"]), children).map(" ".join),
        st.tuples(PY_NAMES, children, children).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        st.tuples(children, children).map(lambda t: f"[{t[0]}, {t[1]}]"),
        children.map(lambda e: f"({e})"),
        st.tuples(PY_NAMES, children).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(children, children).map(lambda t: f"max(\n        {t[0]},\n        {t[1]},\n    )"),
    )


PY_EXPR = st.recursive(PY_ATOMS, _py_expr, max_leaves=6)


def py_simple(expr: str, name: str, kind: int) -> str:
    return [f"{name} = {expr}", f"return {expr}", f"{name} += {expr}", f"print({expr})", "pass"][kind]


@st.composite
def py_statement(draw: st.DrawFn, indent: int) -> str:
    """A statement whose first line has no indentation and whose other lines are absolute."""
    pad = " " * (indent + 4)
    simple = lambda: py_simple(draw(PY_EXPR).replace("\n    ", "\n" + pad[:-4] + "    ").replace("\n)", "\n" + pad[:-4] + ")"),  # noqa: E731
                               draw(PY_NAMES), draw(st.integers(0, 4)))
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return simple()
    body = "\n".join(pad + simple() for _ in range(draw(st.integers(1, 2))))
    if kind == 1:
        text = f"if {draw(PY_NAMES)}:\n{body}"
        if draw(st.booleans()):
            text += f"\n{' ' * indent}else:\n{pad}{simple()}"
        return text
    if kind == 2:
        return f"for {draw(PY_NAMES)} in {draw(PY_NAMES)}:\n{body}"
    return f"while {draw(PY_NAMES)}:\n{body}"


GARBAGE_TOKENS = st.sampled_from([")", "(", "]", ":", "def", "x =", "+", "foo(", "return", "1", "{", "'"])


@st.composite
def garbage(draw: st.DrawFn, max_indent: int, forbidden: frozenset[str]) -> str:
    """Text that starts after the unit: its first line at or below `max_indent`, never a clause."""
    first = " ".join(draw(st.lists(GARBAGE_TOKENS, min_size=1, max_size=5)))
    assume(first.split()[0] not in forbidden)
    indent = draw(st.integers(0, max_indent // 2)) * 2
    lines = [" " * indent + first + " ) ]"]  # always unbalanced: the untrimmed text is broken
    lines += [" " * draw(st.integers(0, 8)) + " ".join(draw(st.lists(GARBAGE_TOKENS, max_size=4)))
              for _ in range(draw(st.integers(0, 2)))]
    return "\n".join(lines) + "\n"


PY_HEADER = "def f(a, b, xs, total, n):\n    a = 1\n"
PY_CLAUSES = frozenset({"else", "elif", "except", "finally", "case"})


def check_property(prefix: str, unit: str, junk: str, suffix: str, language: str) -> None:
    checker = Checker(prefix, suffix, language)
    assert checker.check(unit, names=False).syntax_errors == 0  # the unit itself is valid
    untrimmed = unit + "\n" + junk
    assert checker.check(untrimmed, names=False).syntax_errors > 0  # the garbage breaks it
    trimmed = trim(build_context(prefix, suffix, language), untrimmed)
    assert trimmed == unit.rstrip()
    assert checker.check(trimmed, names=False).syntax_errors == 0


@SETTINGS
@given(st.data())
def test_python_statement_at_line_start(data: st.DataObject) -> None:
    unit = data.draw(py_statement(4))
    junk = data.draw(garbage(4, PY_CLAUSES))
    check_property(PY_HEADER + "    ", unit, junk, "\n    return 42  # end\n", "python")


@SETTINGS
@given(st.data())
def test_python_body_start(data: st.DataObject) -> None:
    statements = [data.draw(py_statement(4)) for _ in range(data.draw(st.integers(1, 3)))]
    unit = "\n    ".join(statements)
    junk = data.draw(garbage(0, PY_CLAUSES))
    check_property("def f(a, b, xs, total, n):\n    ", unit, junk, "\n\n\nprint(f)\n", "python")


@SETTINGS
@given(st.data())
def test_python_mid_line(data: st.DataObject) -> None:
    unit = data.draw(PY_EXPR)
    junk = data.draw(garbage(4, PY_CLAUSES))
    check_property(PY_HEADER + "    x = ", unit, junk, "\n    return 42  # end\n", "python")


# -------------------------------------------------------------------------- JavaScript

JS_NAMES = st.sampled_from(["a", "b", "xs", "total", "n"])
JS_ATOMS = st.one_of(JS_NAMES, st.integers(0, 99).map(str), st.sampled_from(["'s'", '"t"', "null", "'{('"]))


def _js_expr(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(children, st.sampled_from(["+", "-", "*", "&&", "||", "===", "<"]), children).map(" ".join),
        st.tuples(JS_NAMES, children, children).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        st.tuples(children, children).map(lambda t: f"[{t[0]}, {t[1]}]"),
        children.map(lambda e: f"({e})"),
        st.tuples(children, children, children).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        st.tuples(children, children).map(lambda t: f"Math.max(\n    {t[0]},\n    {t[1]},\n  )"),
    )


JS_EXPR = st.recursive(JS_ATOMS, _js_expr, max_leaves=6)


@st.composite
def js_statement(draw: st.DrawFn) -> str:
    """A statement at indentation 2 (first line unindented, the rest absolute)."""
    expr = lambda: draw(JS_EXPR).replace("\n    ", "\n      ").replace("\n  )", "\n    )")  # noqa: E731
    simple = lambda: [f"x = {expr()};", f"return {expr()};", f"foo({expr()});"][draw(st.integers(0, 2))]  # noqa: E731
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return simple()
    if kind == 1:
        text = f"if ({expr()}) {{\n    {simple()}\n  }}"
        if draw(st.booleans()):
            text += f" else {{\n    {simple()}\n  }}"
        return text
    return f"for (const v of xs) {{\n    {simple()}\n  }}"


JS_HEADER = "function f(a, b, xs, total, n) {\n  let x = 0;\n  "
JS_CLAUSES = frozenset({"else", "catch", "finally", "while"})


@SETTINGS
@given(st.data())
def test_javascript_statement_at_line_start(data: st.DataObject) -> None:
    unit = data.draw(js_statement())
    junk = data.draw(garbage(2, JS_CLAUSES))
    check_property(JS_HEADER, unit, junk, "\n  return 42;\n}\n", "javascript")


@SETTINGS
@given(st.data())
def test_javascript_mid_line(data: st.DataObject) -> None:
    unit = data.draw(JS_EXPR) + ";"
    junk = data.draw(garbage(2, JS_CLAUSES))
    check_property(JS_HEADER + "const y = ", unit, junk, "\n  return 42;\n}\n", "javascript")
