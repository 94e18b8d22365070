"""What the hole must bind, as forced starts (engine/syntax/needs.py)."""

from __future__ import annotations

import pytest

from kspec.engine.syntax import binding_starts, hole_needs


def starts(prefix: str, suffix: str, language: str = "python") -> list[str]:
    return binding_starts(hole_needs(prefix, suffix, language))


@pytest.mark.parametrize(
    "prefix, suffix, language, expected",
    [
        # the suffix reads a name nothing before the cursor binds: bind it
        ("def greet(name):\n    ", "\n    return msg + name\n", "python", ["msg ="]),
        # several: the first one read, then all of them unpacked
        ("def split(xs):\n    ", "\n    return us, them\n", "python", ["us =", "us, them ="]),
        # the next line is deeper: a block header, binding the name read only inside the block
        # (then the headers a hole most often is)
        ("def add(xs):\n    total = 0\n    ", "\n        total += x\n    return total\n", "python", ["for x in", "if", "while"]),
        # a hole cut at column 0 before the next line (HumanEval infilling): that line's depth
        ("def greet(name):\n", "    return msg + name\n", "python", ["    msg ="]),
        # the start of the needed name is typed: go on with it
        ("def greet(name):\n    ms", "\n    return msg + name\n", "python", ["g ="]),
        # JavaScript / TypeScript: a declaration; `let` when the suffix assigns the name again
        ("function f(xs) {\n  ", "\n  return msg;\n}\n", "javascript", ["const msg ="]),
        ("function f(xs) {\n  ", "\n  count += 1;\n  return count;\n}\n", "typescript", ["let count ="]),
    ],
)
def test_starts_bind_what_the_suffix_needs(prefix, suffix, language, expected):
    assert starts(prefix, suffix, language) == expected


@pytest.mark.parametrize(
    "prefix, suffix",
    [
        ("def greet(name):\n    msg = 'hi'\n    ", "\n    return msg + name\n"),  # bound before the cursor
        ("def greet(name):\n    print(", ")\n    return msg\n"),  # mid-line, inside brackets
        ("def greet(name):\n    s = '", "'\n    return msg\n"),  # inside a string
        ("def greet(name):\n    ", "\n    return name\n"),  # nothing needed
        ("def greet(name):\n    ", " + 1\n    return msg\n"),  # code after the cursor on its line
    ],
)
def test_no_start_where_nothing_is_to_bind_or_no_statement_starts(prefix, suffix):
    assert starts(prefix, suffix) == []


def test_no_start_for_languages_without_name_analysis():
    assert starts("int f() {\n  ", "\n  return msg;\n}\n", "cpp") == []
    assert starts("x = ", "\ny = msg\n", None) == []


def test_a_standard_library_module_read_as_one_is_imported():
    suffix = "\n    opts, args = getopt.getopt(sys.argv[1:], 'ib:')\n"
    assert starts("import sys\n\ndef _test():\n    ", suffix) == ["import getopt"]
    assert starts("def f(xs):\n    ", "\n    data.append(1)\n    return data\n") == ["data ="]  # not a module


def test_at_column_0_before_a_block_the_hole_opens_the_statement_goes_at_the_previous_depth():
    prefix = 'def encode(s):\n    """Encode."""\n'
    # the hole opens the block: a header (a single `out = ''` there breaks the file)
    assert starts(prefix, "        out += c\n    return out\n") == ["    for c in", "    if", "    while"]


@pytest.mark.parametrize(
    "prefix, suffix, language, expected",
    [
        # HumanEval/140: after `else:` at 8 the next line is at 16: the hole is a header at 12
        ("def f(text):\n    for c in text:\n        if c:\n            n += 1\n        else:\n",
         "                n -= 1\n            n = 0\n", "python", ["            if", "            for", "            while"]),
        # MBJSP/930: the line after the cursor's is deeper, nothing to bind: a block header
        ("function textMatch(text) {\n    ", "\n        return 'Found';\n    } else {\n        return 'No';\n    }\n}\n",
         "javascript", ["if (", "for (", "while ("]),
        # a body at its header's depth is no block to open
        ("def f(xs):\n    if xs:\n", "        return 1\n    return 0\n", "python", []),
        ("def f(xs):\n  if xs:\n", "    return 1\n  return 0\n", "python", []),  # 2-space code: its step
        ("def f(xs):\n  if xs:\n", "      return 1\n  return 0\n", "python", ["    if", "    for", "    while"]),
        # tab-indented code: the header's indentation in tabs
        ("def f(xs):\n\tfor x in xs:\n", "\t\t\tprint(x)\n", "python", ["\t\tif", "\t\tfor", "\t\twhile"]),
        # ... and the loop binding the name read only in the block the hole opens, depths in columns
        ("def f(xs):\n\tout = 0\n\tfor x in xs:\n", "\t\t\tout += c\n\treturn out\n", "python", ["\t\tfor c in", "\t\tif", "\t\twhile"]),
    ],
)
def test_a_hole_the_code_after_it_is_the_body_of_starts_with_a_block_header(prefix, suffix, language, expected):
    assert starts(prefix, suffix, language) == expected
