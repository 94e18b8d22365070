"""Windows of a file cut anywhere: what the engine receives from an editor or an API client.

Every case cuts the same file three ways — the window starts inside a docstring / block
comment, inside brackets, and in the middle of a statement (and ends inside one too) —
and checks that a right alternative is still shown, a broken one is still dropped, and
the window module finds the state, repair and region it should.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kspec.engine.api import Completion
from kspec.engine.syntax import postprocess
from kspec.engine.syntax.checks import Checker
from kspec.engine.syntax.context import build_context
from kspec.engine.syntax.languages import SPECS
from kspec.engine.syntax.trim import trim
from kspec.engine.syntax.window import MAX_AFTER, MAX_BEFORE, closing_tail, crop, find_region, repair, start_state

PYTHON = '''import os


def read_config(path):
    """Read the configuration at `path`.

    Returns a dict of (key, value) pairs, one per line
    of the file, skipping comments.
    """
    result = {}
    with open(path) as handle:
        for line in handle:
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


def main(argv):
    config = read_config(argv[1])
    values = [
        config.get("name"),
        config.get("size"),
    ]
    print(values)
'''

JAVASCRIPT = '''/**
 * Count the words of `text`.
 * Words are separated by spaces.
 */
function countWords(text) {
  const counts = {};
  for (const word of text.split(" ")) {
    counts[word] = (counts[word] || 0) + 1;
  }
  return counts;
}

const totals = [
  countWords("a b"),
  countWords("c d"),
];
'''

JAVA = '''import java.util.*;

class WordCount {
    /**
     * Count the words of a text.
     * Words are separated by spaces.
     */
    public static Map<String, Integer> count(String text) {
        Map<String, Integer> counts = new HashMap<>();
        for (String word : text.split(" ")) {
            counts.put(word, counts.getOrDefault(word, 0) + 1);
        }
        return counts;
    }

    public static List<Integer> sizes(List<String> words) {
        List<Integer> out = new ArrayList<>(
            words.size());
        return out;
    }
}
'''


@dataclass(frozen=True)
class Hole:
    language: str
    text: str
    reference: str  # a line of `text`: the hole is its code, the cursor after its indentation
    good: str  # another right alternative
    broken: str  # an alternative that breaks the file


HOLES = {
    "python": Hole("python", PYTHON, "result[key.strip()] = value.strip()", "result[key] = value", "result[key.strip( = value"),
    "javascript": Hole("javascript", JAVASCRIPT, "counts[word] = (counts[word] || 0) + 1;", "counts[word] = 1;", "counts[word] = (counts[word] || 0 + 1;"),
    "java": Hole("java", JAVA, "counts.put(word, counts.getOrDefault(word, 0) + 1);", "counts.put(word, 1);", "counts.put(word, 1;"),
}

# Where windows start (a snippet of the file and an offset into it) and end, per language:
# inside the docstring / block comment, inside brackets, mid-statement.
STARTS = {
    "python": {"docstring": ("configuration at", 4), "brackets": ("(key, value)", 3), "statement": ("def read_config", 6)},
    "javascript": {"docstring": ("Count the words", 3), "brackets": ('text.split(" ")', 6), "statement": ("const counts", 4)},
    "java": {"docstring": ("Count the words", 3), "brackets": ("Map<String, Integer> count(", 27), "statement": ("Map<String, Integer> counts", 9)},
}
ENDS = {
    "python": {"docstring": ("values = [", 12), "brackets": ('config.get("name")', 4), "statement": ("print(values)", 3)},
    "javascript": {"docstring": ("return counts", 3), "brackets": ('countWords("a b")', 5), "statement": ("const totals", 4)},
    "java": {"docstring": ("return counts", 3), "brackets": ("new ArrayList<>(", 17), "statement": ("List<Integer> out", 6)},
}
CUTS = ["docstring", "brackets", "statement"]


def window(hole: Hole, start_cut: str, end_cut: str) -> tuple[str, str]:
    text = hole.text
    cursor = text.index(hole.reference)
    start = text.index(STARTS[hole.language][start_cut][0]) + STARTS[hole.language][start_cut][1]
    end_snippet, end_offset = ENDS[hole.language][end_cut]
    end = text.index(end_snippet) + end_offset
    assert start < cursor < end
    return text[start:cursor], text[cursor + len(hole.reference) : end]


def shown(prefix: str, suffix: str, language: str, *texts: str) -> list[str]:
    candidates = [Completion(text, logprob=-1.0 - i, n_tokens=8) for i, text in enumerate(texts)]
    return [c.text for c in postprocess(prefix, suffix, language, candidates)]


@pytest.mark.parametrize("language", sorted(HOLES))
@pytest.mark.parametrize("start_cut", CUTS)
@pytest.mark.parametrize("end_cut", CUTS)
def test_a_cut_window_keeps_right_alternatives_and_drops_broken_ones(language: str, start_cut: str, end_cut: str) -> None:
    hole = HOLES[language]
    prefix, suffix = window(hole, start_cut, end_cut)
    assert shown(prefix, suffix, language, hole.reference, hole.good) == [hole.reference, hole.good]
    assert shown(prefix, suffix, language, hole.broken, hole.reference) == [hole.reference]


@pytest.mark.parametrize("language", sorted(HOLES))
def test_the_whole_file_still_judges_the_same(language: str) -> None:
    hole = HOLES[language]
    cursor = hole.text.index(hole.reference)
    prefix, suffix = hole.text[:cursor], hole.text[cursor + len(hole.reference) :]
    assert shown(prefix, suffix, language, hole.reference, hole.good) == [hole.reference, hole.good]
    assert shown(prefix, suffix, language, hole.broken) == []


@pytest.mark.parametrize(
    ("language", "text", "inside"),
    [
        ("python", 'the result.\n    """\n    return 1\n', True),  # a closer after prose
        ("python", 'ing.\n\n    """\n    return 1\n', True),  # alone, after prose, not after a header
        ("python", '    """\n    return 1\n', True),  # alone on the first line, code after it: it closes one
        ("python", '    """\n    l = len(s)\n    for i in range(2, l):\n', True),  # code, its last block cut by the cursor
        ("python", '    """\n    Summary of it (more).\n\n    Args:\n', False),  # prose after it: it opens one
        ("python", '    """\n    Summary\n    """\n    x = 1\n', False),  # a name alone up to the next quote: prose
        ("python", 'def f():\n    """Doc.\n\n    More.\n    """\n', False),  # the opener after a header
        ("python", 'x = 1\ny = """a\nb"""\n', False),  # an opener after `=`
        ("python", '    """One line."""\n    return 1\n', False),  # a whole string on one line
        ("java", " the text.\n     */\n    int f() {}\n", True),
        ("java", "/** Doc. */\nint f() {}\n", False),
        ("javascript", "x = 1; // a */ in a comment\n", True),  # approximate: the first */ decides
    ],
)
def test_start_state_of_a_window(language: str, text: str, inside: bool) -> None:
    assert (start_state(text, SPECS[language]) is not None) == inside


def test_repair_closes_what_the_window_cut_and_leaves_the_hole_its_own() -> None:
    # Starts inside a docstring; ends inside a list the suffix opens.
    prefix = 'ng.\n    """\n    total(a,\n          b)\n    x = foo('
    suffix = ')\n    y = [1,\n'
    fixed = repair(prefix, suffix, "python")
    assert fixed.head == '"""'  # the docstring; `total(` is whole in the window
    assert fixed.tail == "]"  # the list the suffix opens; `foo(` is the hole's (the suffix closes it)
    # Starts inside two blocks it closes; ends inside a call and inside the `if` block
    # (the suffix's last line is indented deeper than the `if` and `function` lines).
    prefix = "x;\n  }\n  return 1;\n}\nfunction g() {\n  if (a) {\n    "
    suffix = "\n  }\n  f(1,\n    2"
    js = repair(prefix, suffix, "javascript")
    assert js.head == "{{"
    assert js.tail == ")}"  # the call, then `g`'s block; the `if` block the suffix closes
    assert closing_tail(prefix, suffix, "javascript", "while (b) {", None) == ")}}"  # and what the hole opens
    assert closing_tail(prefix, "\n  }\n}\n", "javascript", "", None) == ""  # the window ends at its end


def test_a_lost_header_is_the_holes_not_the_windows() -> None:
    # The stray `}` is indented like the cursor's line: the hole lost the `if (...) {`.
    prefix = "function f(text) {\n    "
    suffix = "\n        return 1;\n    } else {\n        return 2;\n    }\n}\n"
    # `{` is what the first line (which does not parse alone) leaves open; no opener is
    # added for the stray `}`, so the statement that does not fill the hole is still dropped.
    assert repair(prefix, suffix, "javascript").head == "{"
    assert shown(prefix, suffix, "javascript", "let match = false;") == []


def test_region_starts_at_the_function_around_the_cursor_and_ends_with_it() -> None:
    prefix = PYTHON[: PYTHON.index("            result[key")]
    suffix = PYTHON[PYTHON.index("            result[key") :]
    region = find_region(prefix, suffix)
    assert prefix[region.start :].startswith("def read_config(path):")
    assert suffix[: region.end].rstrip().endswith("return result")
    assert region.indent == 0 and not region.open_end


def test_region_of_a_window_cut_inside_a_function() -> None:
    prefix, suffix = window(HOLES["python"], "docstring", "statement")
    prefix += "            "  # the cursor after the indentation
    region = find_region(prefix, suffix)
    assert prefix[region.start :].startswith("    result = {}")  # the first whole statement
    assert region.indent == 4


def test_a_python_window_starting_in_a_docstring_is_checked_by_cpython() -> None:
    prefix, suffix = window(HOLES["python"], "docstring", "docstring")
    checker = Checker(prefix, suffix, "python")
    assert checker.window is not None and checker.window.judges
    assert checker.check("result[key.strip()] = value.strip()").breaks_parse is False
    assert checker.check("result[key.strip()] = value.strip() +").breaks_parse


def test_crop_keeps_a_window_of_whole_lines_around_the_cursor() -> None:
    prefix = "".join(f"line {i}\n" for i in range(2000))
    suffix = "".join(f"after {i}\n" for i in range(1000))
    start, end = crop(prefix, suffix)
    assert len(prefix) - start <= MAX_BEFORE and end <= MAX_AFTER
    assert prefix[start - 1] == "\n" and suffix[end - 1] == "\n"
    assert crop("short\n", "also short") == (0, len("also short"))


@pytest.mark.parametrize(
    ("prefix", "suffix", "text", "window_errors"),
    [
        # Module-level code: the checks parse the whole window, error included.
        (
            "urn self.cache[key]\nexcept KeyError:\n    value = None\n\nresult = []\nfor value in values:\n    ",
            "\nprint(result)\n", "result.append(value * 2)\n    print(result)\ndone = True\n", 1,
        ),
        # A method below the error: only the method is parsed (`checks.checked_span`).
        (
            "urn self.cache[key]\n        except KeyError:\n            return None\n\n"
            "    def scale(self, values, factor):\n        result = []\n        for value in values:\n            ",
            "\n        return result\n", "result.append(value * factor)\n            print(result)\n        done = True\n", 0,
        ),
    ],
)
def test_an_error_of_the_window_away_from_the_hole_sends_no_alternative_through_other_cuts(
    prefix: str, suffix: str, text: str, window_errors: int,
) -> None:
    """A window cut inside a `try` body leaves an `except` without its `try`: every completion
    leaves that error, which none can mend, so the first cut that adds no error and leaves
    none at the cursor is taken as is, not re-checked at each later line end."""
    from kspec.engine.syntax.memo import forget_requests
    from kspec.engine.syntax.postprocess import DEFAULT_CONFIG, analysis, trim_and_check

    forget_requests()
    request = analysis(prefix, suffix, "python")
    assert request.checker.window_errors == window_errors
    checked: list[str] = []
    check = request.checker.check
    request.checker.check = lambda text, names=True: checked.append(text) or check(text, names=names)  # type: ignore[method-assign]
    found = trim_and_check(request, Completion(text, logprob=-1.0, n_tokens=12), DEFAULT_CONFIG)
    assert found is not None and found.completion.text == text[: text.index("\n", text.index("print"))]
    assert found.check.unfixed_at_cursor == 0 and not found.check.breaks_parse
    assert checked == [found.completion.text]


def test_a_window_that_starts_on_a_docstrings_closing_line_is_code_after_it() -> None:
    """HumanEval/82 in a window whose first line is the docstring's closing `\"\"\"`: taken for an
    opener, the cursor was inside a string and the model's `\"\"\"` lines after `return True` were
    kept as part of its answer; the window is code after that line, so the statement is the unit."""
    prefix = '    """\n    l = len(string)\n    if l == 0 or l == 1:\n        return False\n    for i in range(2, l):\n        if l % i == 0:\n            return False\n'
    assert build_context(prefix, "", "python").start_state is None
    completion = '    return True\n    """\n    """\n    l = len(string)\n'
    assert trim(build_context(prefix, "", "python"), completion) == "    return True"


def test_a_window_that_starts_in_a_docstring_takes_the_closers_indentation_for_the_body() -> None:
    """HumanEval/48 in a window that starts inside the docstring, with only blank lines between its
    closing quotes and the cursor: the indentation was read as the module's (0), so every body line
    (the reference too) was an unexpected indent and nothing was shown."""
    prefix = "me('aaaaa')\n    True\n    >>> is_palindrome('zbcd')\n    False\n    \"\"\"\n\n"
    context = build_context(prefix, "", "python")
    assert context.start_state is None and context.indent_stack == (0, 4)
    reference = "    for i in range(len(text)):\n        if text[i] != text[len(text) - 1 - i]:\n            return False\n    return True\n"
    assert not Checker(prefix, "", "python").check(reference).breaks_parse
