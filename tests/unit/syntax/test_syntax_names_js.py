"""JavaScript / TypeScript names (jsnames.py) on windows of a file cut inside a doc comment,
inside brackets and mid-statement: names from above the window are not blamed, a name
defined nowhere is, and the name the code after the cursor needs ranks the alternative
that defines it first."""

from __future__ import annotations

import re

import pytest

from kspec.engine.api import Completion
from kspec.engine.syntax import rank_alternatives
from kspec.engine.syntax.checks import Checker

JS_FILE = '''import { readFileSync } from "fs";

/**
 * Load the JSON document at `path`.
 *
 * Falls back to `fallback` when the file is missing.
 */
function load(path, fallback) {
  let data;
  try {
    data = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    data = fallback;
  }
  if (!data) {
    throw new Error(message);
  }
  return data;
}

const DEFAULTS = load(
  "defaults.json", {}
);
'''

TS_FILE = '''import { readFileSync } from "fs";

/**
 * Count the lines of the file at `path` that match `pattern`.
 */
export function countMatches(path: string, pattern: RegExp): number {
  const lines: string[] = readFileSync(path, "utf8").split("\\n");
  for (const line of lines) {
    if (pattern.test(line)) {
      count += 1;
    }
  }
  return count;
}

export const TOTAL = countMatches(
  "notes.txt", /todo/
);
'''


def _windows(text: str, comment: str, bracket: str, statement: tuple[str, str]) -> dict[str, tuple[int, int]]:
    """The whole file, and windows that start inside the doc comment, inside brackets (and
    end inside the last call's string), and mid-statement at both ends."""
    return {
        "whole": (0, len(text)),
        "doc comment": (text.index(comment), len(text)),
        "brackets": (text.index(bracket) + len(bracket), text.rindex('"') - 2),
        "statement": (text.index(statement[0]) + 3, text.index(statement[1]) + 4),
    }


# (language, file, the cursor's line, windows, names each window vouches for)
FILES = {
    "javascript": (
        "javascript", JS_FILE, "  if (!data) {",
        _windows(JS_FILE, "JSON document", "readFileSync(", ("data = fallback", "return data")),
        {"whole": "path, fallback, data, readFileSync", "doc comment": "path, fallback, data, readFileSync",
         "brackets": "path, fallback, data", "statement": "fallback, data"},
        "message",
    ),
    "typescript": (
        "typescript", TS_FILE, "  for (const line of lines) {",
        _windows(TS_FILE, "lines of the file", "readFileSync(", ("const lines", "return count")),
        {"whole": "path, pattern, lines, readFileSync", "doc comment": "path, pattern, lines, readFileSync",
         "brackets": "path, lines", "statement": "lines"},
        "count",
    ),
}  # fmt: skip
CASES = [(language, window) for language in FILES for window in ("whole", "doc comment", "brackets", "statement")]


def cut(language: str, window: str) -> tuple[str, str]:
    _, text, cursor_line, windows, _, _ = FILES[language]
    cursor = text.index(cursor_line)
    start, end = windows[window]
    return text[start:cursor], text[cursor:end]


@pytest.mark.parametrize(("language", "window"), CASES)
def test_names_the_window_vouches_for_are_not_blamed(language: str, window: str) -> None:
    prefix, suffix = cut(language, window)
    known = FILES[language][4][window]
    checker = Checker(prefix, suffix, language)
    # The window's names, the language's globals, properties and object keys.
    result = checker.check(f"  console.log({known}, Math.max(1, 2), JSON.stringify({{ known: 1 }}).length);\n")
    assert result.undefined_names == ()


@pytest.mark.parametrize(("language", "window"), CASES)
def test_a_name_defined_nowhere_is_blamed(language: str, window: str) -> None:
    prefix, suffix = cut(language, window)
    checker = Checker(prefix, suffix, language)
    assert checker.check("  console.log(lenght);\n").undefined_names == ("lenght",)
    # ... unless the alternative binds it itself.
    assert checker.check("  const lenght = 2;\n  console.log(lenght);\n").undefined_names == ()


@pytest.mark.parametrize(("language", "window"), CASES)
def test_what_the_suffix_needs(language: str, window: str) -> None:
    prefix, suffix = cut(language, window)
    needed = FILES[language][5]
    checker = Checker(prefix, suffix, language)
    for binding in (f"  let {needed} = 0;\n", f"  {needed} = 0;\n", f"  const [{needed}] = [0];\n", f"  const {{ {needed} }} = {{ {needed}: 0 }};\n"):
        defines = checker.check(binding)
        assert defines.needs_defined == (needed,) and needed not in defines.needs_missing, binding
    leaves = checker.check("  console.log(1);\n")
    assert leaves.needs_defined == () and needed in leaves.needs_missing
    # A window cut below a binding cannot tell its name from one the hole should define:
    # the only other names needed are those of bindings above the window.
    text, start = FILES[language][1], FILES[language][3][window][0]
    assert set(leaves.needs_missing) - {needed} <= set(re.findall(r"\w+", text[:start]))


@pytest.mark.parametrize(("language", "window"), CASES)
def test_the_alternative_that_defines_what_the_suffix_needs_ranks_first(language: str, window: str) -> None:
    prefix, suffix = cut(language, window)
    needed = FILES[language][5]
    candidates = [
        Completion("  console.log(1);\n", logprob=-1.0, n_tokens=5),  # more likely, leaves the needed name undefined
        Completion(f"  let {needed} = 0;\n", logprob=-1.3, n_tokens=5),
    ]
    ranked = rank_alternatives(prefix, suffix, language, candidates)
    assert [r.completion.text for r in ranked] == [f"  let {needed} = 0;\n", "  console.log(1);\n"]


@pytest.mark.parametrize("window", ["whole", "doc comment", "brackets"])
def test_a_mid_word_completion_that_invents_a_name_ranks_below_one_that_does_not(window: str) -> None:
    # `dat` -> `datum`: the model finishes the word into a name that exists nowhere.
    prefix, suffix = cut("javascript", window)
    prefix, suffix = prefix + "  if (!dat", suffix[len("  if (!data") :]
    ranked = rank_alternatives(prefix, suffix, "javascript", [Completion("um", logprob=-0.5, n_tokens=1), Completion("a", logprob=-0.6, n_tokens=1)])
    assert [r.completion.text for r in ranked] == ["a", "um"]
    assert ranked[-1].check.undefined_names == ("datum",)


def test_jsx_tags_and_types_are_not_read_names() -> None:
    prefix = "function View(props) {\n  return "
    checker = Checker(prefix, "\n}\n", "javascript")
    assert checker.check("<div className={props.name}><Label /></div>;").undefined_names == ("Label",)
    checker = Checker("function f(xs: number[]) {\n  ", "\n}\n", "typescript")
    assert checker.check("const m: Map<string, Widget> = new Map();").undefined_names == ()


def test_python_names_are_not_judged_by_the_javascript_rules() -> None:
    # `$` is a word character in JavaScript only; Python keeps its own checks.
    checker = Checker("def f(xs):\n    ", "\n    return total\n", "python")
    assert checker.check("total = sum(xs)\n").needs_defined == ("total",)


def test_an_import_above_the_window_vouches_for_its_name_when_the_caller_has_the_file() -> None:
    # The engine crops what it is given to a window (window.crop); the words above it still count.
    filler = "".join(f"function helper{i}(x) {{\n  return x + {i};\n}}\n\n" for i in range(200))
    prefix = 'import { useState } from "react";\n\n' + filler + "function Counter() {\n  "
    suffix = "\n  return count;\n}\n"
    alternative = "const [count, setCount] = useState(0);"
    ranked = rank_alternatives(prefix, suffix, "javascript", [Completion(alternative, logprob=-1.0, n_tokens=9)])
    assert ranked[0].check.undefined_names == () and ranked[0].check.needs_defined == ("count",)
    # With the window alone, nothing in it spells `useState`.
    window = prefix[-3000:]
    assert Checker(window, suffix, "javascript").check(alternative).undefined_names == ("useState",)
