"""Static checks: syntax errors introduced (all languages), Python names and indentation."""

from __future__ import annotations

import ast

import pytest
from pyflakes import checker as pyflakes_checker
from pyflakes import messages as pyflakes_messages

from kspec.engine.syntax.checks import CheckResult, Checker
from kspec.engine.syntax.hole_errors import error_nodes
from kspec.engine.syntax.languages import new_parser

# ---------------------------------------------------------------------------- syntax errors

BROKEN_AND_FINE = [
    # (language, prefix, suffix, fine completion, broken completion)
    ("python", "x = foo(", ")\n", "1, 2", "1, , 2"),
    ("javascript", "const x = foo(", ");\n", "1, 2", "1 +"),
    ("typescript", "let x: number = ", ";\n", "1 + 2", "1 + : 2"),
    ("tsx", "const a = <div>{", "}</div>;\n", "x", "x +"),
    ("go", "package main\n\nfunc f() int {\n\treturn ", "\n}\n", "1 + 2", "1 + (2"),
    ("rust", "fn f() -> i32 {\n    ", "\n}\n", "1 + 2", "1 + {"),
    ("java", "class A {\n    int f() {\n        return ", ";\n    }\n}\n", "1 + 2", "1 +"),
    ("c", "int f(void) {\n    return ", ";\n}\n", "1 + 2", "1 + (2"),
    ("cpp", "int f() {\n    return ", ";\n}\n", "std::max(1, 2)", "std::max(1, "),
]


@pytest.mark.parametrize("case", BROKEN_AND_FINE, ids=lambda case: case[0])
def test_syntax_errors_introduced(case: tuple[str, str, str, str, str]) -> None:
    language, prefix, suffix, fine, broken = case
    checker = Checker(prefix, suffix, language)
    assert checker.check(fine, names=False).syntax_errors == 0
    assert checker.check(broken, names=False).syntax_errors > 0


def test_errors_the_file_already_had_are_not_counted() -> None:
    checker = Checker("a = 0\nx = 1 2\n\ny = ", "\n\nz = 3\n", "python")
    assert error_nodes(checker.baseline.root_node)  # `x = 1 2` is broken before the cursor
    assert checker.check("3", names=False).syntax_errors == 0
    assert checker.check("3 +", names=False).syntax_errors > 0
    assert checker.check("(3", names=False).syntax_errors > 0


def test_an_error_at_the_cursor_that_the_completion_fixes() -> None:
    checker = Checker("x = [1, 2", "\n\nz = 3\n", "python")
    assert error_nodes(checker.baseline.root_node)  # the list is not closed
    assert checker.check("]", names=False).syntax_errors == 0
    assert checker.check(", 3]", names=False).syntax_errors == 0


@pytest.mark.parametrize(
    "completion",
    ["a +", "a.", "a and", "not", "a if"],
)
def test_python_line_ending_in_an_operator(completion: str) -> None:
    # tree-sitter-python reads `x = a +` NEWLINE `y = 2` as one expression; CPython does not.
    checker = Checker("def f(a):\n    x = ", "\n    y = 2\n    return x\n", "python")
    assert checker.check(completion, names=False).syntax_errors > 0
    assert checker.check("a + ...", names=False).syntax_errors == 0


def test_python2_print_statement_is_an_error() -> None:
    checker = Checker("def f(a):\n    ", "\n", "python")
    assert checker.check("print a", names=False).syntax_errors > 0
    assert checker.check("print(a)", names=False).syntax_errors == 0


@pytest.mark.parametrize("completion", ["1", "1 +", "foo(\n", "[1,\n 2]", "'é'", "(((", "\n\ndef g():\n    pass"])
def test_incremental_reparse_agrees_with_a_fresh_parse(completion: str) -> None:
    prefix, suffix = "def f():\n    x = ", "\n    return x\n\n\nclass A:\n    pass\n"
    checker = Checker(prefix, suffix, "python")
    tree, _ = checker.parse(completion)
    fresh = new_parser("python").parse((prefix + completion + suffix).encode())
    assert str(tree.root_node) == str(fresh.root_node)


def test_unknown_language_is_never_flagged() -> None:
    assert Checker("x = (", ")", None).check("((((").syntax_errors == 0


# ------------------------------------------------------------------------ Python indentation

@pytest.mark.parametrize(
    ("completion", "errors"),
    [
        ("        total += n\n", 0),
        ("        if n:\n", 1),  # a header whose body never comes
        ("        if n:\n            total += n\n", 0),
        ("        a = 1\n            b = 2\n", 1),  # unexpected indent
        ("        a = 1\n      b = 2\n", 1),  # dedent to a level never opened
    ],
)
def test_python_indentation(completion: str, errors: int) -> None:
    prefix = "def f(numbers):\n    total = 0\n    for n in numbers:\n"
    checker = Checker(prefix, "    return total\n", "python")
    assert checker.check(completion, names=False).syntax_errors == errors


def test_python_block_header_at_end_of_file() -> None:
    # The document (or the window) ends there: the header is not an error, but it leaves
    # the hole open, which post-processing holds against a text the budget cut short.
    checker = Checker("def f(x):\n", "", "python")
    header = checker.check("    if x:", names=False)
    assert header.syntax_errors == 0 and header.unfixed_at_cursor == 1
    assert checker.check("    return x", names=False) == CheckResult()
    assert checker.check("    return x +", names=False).breaks_parse


# ---------------------------------------------------------------------------- Python names

MODULE = "import os\nfrom typing import List as L\n\n\ndef helper(a, *rest, key=None, **kw):\n    local = 1\n    return local\n\n\n"


@pytest.mark.parametrize(
    ("prefix", "completion", "suffix", "undefined"),
    [
        (MODULE + "def g(xs):\n    ", "return len(xs) + sum(xs)", "\n", ()),
        (MODULE + "def g(xs):\n    ", "return os.path.join(*xs)", "\n", ()),
        (MODULE + "def g(xs: L[int]):\n    ", "return helper(xs, key=1)", "\n", ()),
        (MODULE + "def g(xs):\n    ", "return later(xs)", "\n\n\ndef later(v):\n    return v\n", ()),
        (MODULE + "def g(xs):\n    ", "return [y * 2 for y in xs if y]", "\n", ()),
        (MODULE + "def g(xs):\n    ", "return [y for y in xs] + [y]", "\n", ("y",)),
        (MODULE + "def g(xs):\n    ", "return sorted(xs, key=lambda v: -v)", "\n", ()),
        (MODULE + "def g(xs):\n    ", "n = len(xs)\n    return n", "\n", ()),
        (MODULE + "def g(xs):\n    ", "return local", "\n", ("local",)),  # helper's local
        (MODULE + "def g(xs):\n    ", "return numpy.array(xs)", "\n", ("numpy",)),
        (MODULE + "def g(xs):\n    ", "return rest + kw", "\n", ("rest", "kw")),
        (MODULE + "def g(xs):\n    ", "return self.value", "\n", ("self",)),
        ("from os import *\n\ndef g():\n    ", "return getcwd()", "\n", ()),
        ("class A:\n    def f(self):\n        ", "return self.g(__class__)", "\n", ()),
        ("def g(xs):\n    ", "with open(xs) as fh:\n        return fh.read()", "\n", ()),
        ("def g(xs):\n    ", "try:\n        pass\n    except OSError as err:\n        print(err)", "\n", ()),
        ("def g(xs):\n    ", 'return f"{xs!r} {missing}"', "\n", ("missing",)),
        ("def g(xs):\n    ", "if (n := len(xs)) > 1:\n        return n", "\n", ()),
        ("def g(", "a, b=1):\n    return a + b", "\n", ()),  # parameters the completion writes
        ("from os import (", "sep, getcwd)\n\nprint(sep)", "\n", ()),  # names it imports
    ],
)
def test_undefined_names(prefix: str, completion: str, suffix: str, undefined: tuple[str, ...]) -> None:
    check = Checker(prefix, suffix, "python").check(completion)
    assert check.syntax_errors == 0
    assert check.undefined_names == undefined


@pytest.mark.parametrize(
    ("prefix", "completion", "suffix", "unused"),
    [
        ("def g(xs):\n    ", "n = len(xs)", "\n    return xs\n", ("n",)),
        ("def g(xs):\n    ", "n = len(xs)", "\n    return n\n", ()),
        ("def g(xs):\n    ", "n: int = len(xs)", "\n    return xs\n", ("n",)),
        ("def g(xs):\n    ", "n = 0\n    n += 1", "\n", ()),  # augmented assignment reads it
        ("def g(xs):\n    ", "a, b = xs", "\n", ()),  # unpacking: pyflakes does not report it either
        ("def g(xs):\n    ", "_ = len(xs)", "\n", ()),
        ("def g(xs):\n    global n\n    ", "n = len(xs)", "\n", ()),
        ("", "n = 1", "\n", ()),  # module level
        ("def g(xs):\n    ", "n = len(xs)", "\n    def h():\n        return n\n    return h\n", ()),
    ],
)
def test_unused_variables(prefix: str, completion: str, suffix: str, unused: tuple[str, ...]) -> None:
    check = Checker(prefix, suffix, "python").check(completion)
    assert check.unused_variables == unused


AGREEMENT = [
    ("import math\n\ndef area(r):\n    ", "return math.pi * r * r", "\n"),
    ("def f(xs):\n    ", "total = 0\n    for x in xs:\n        total += x", "\n    return total\n"),
    ("def f(xs):\n    ", "result = []\n    for x in xs:\n        result.append(x)", "\n    return xs\n"),
    ("def f(xs):\n    ", "count = len(xs)\n    return sum(xs) / length", "\n"),
    ("def f(xs):\n    ", "best = max(xs, key=abs)\n    return best", "\n"),
    ("def f(s):\n    ", "words = s.split()\n    return [w.upper() for w in words]", "\n"),
    ("def f(s):\n    ", "words = s.split()\n    return [w.upper() for w in wrds]", "\n"),
    ("def f(d):\n    ", "for k, v in d.items():\n        print(k, value)", "\n"),
    ("import re\n\ndef f(s):\n    ", "m = re.match(pattern, s)\n    return m", "\n"),
    ("def f(n):\n    ", "tmp = n * 2\n    other = tmp + 1\n    return n", "\n"),
]


def _pyflakes(source: str, names_in: str) -> tuple[set[str], set[str]]:
    """pyflakes' undefined names and unused variables whose name occurs in `names_in`."""
    report = pyflakes_checker.Checker(ast.parse(source), filename="x.py")
    undefined, unused = set(), set()
    for message in report.messages:
        name = message.message_args[0]
        if name not in names_in:
            continue
        if isinstance(message, pyflakes_messages.UndefinedName):
            undefined.add(name)
        elif isinstance(message, pyflakes_messages.UnusedVariable):
            unused.add(name)
    return undefined, unused


@pytest.mark.parametrize("case", AGREEMENT, ids=lambda case: case[1].split("\n")[0][:30])
def test_agrees_with_pyflakes(case: tuple[str, str, str]) -> None:
    prefix, completion, suffix = case
    check = Checker(prefix, suffix, "python").check(completion)
    assert (set(check.undefined_names), set(check.unused_variables)) == _pyflakes(
        prefix + completion + suffix, completion
    )


def test_a_read_before_the_assignment_reads_another_binding() -> None:
    # pyflakes: `cache` in the test is the global; the local assignment is never read after.
    prefix, suffix = "cache = None\n\ndef get():\n    ", "\n    return 1\n"
    completion = "if cache is None:\n        cache = {}"
    assert Checker(prefix, suffix, "python").check(completion).unused_variables == ("cache",)
    assert _pyflakes(prefix + completion + suffix, completion)[1] == {"cache"}
