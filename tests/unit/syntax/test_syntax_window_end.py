"""Windows that end just past the hole, inside a block or a bracket the file closes later.

The window's suffix is blank where the file has `}` (or `]`, `)`) and more: the repair
closes what the window leaves open, so an alternative that opens a block it does not close,
or closes a bracket opened before the cursor's line, looks whole in the window but breaks
the file. Such an alternative is cut back to its last line end where its brackets are
balanced, or, when nothing is left, shown only if no other alternative is.
"""

from __future__ import annotations

import pytest

from kspec.engine.api import Completion
from kspec.engine.syntax import postprocess
from kspec.engine.syntax.window import end_balance

JAVA = """class Digits {
    public static int maxDigits(String input) {
        int max = 0;
        int digit = 0;
        for (int i = 0; i < input.length(); i++) {
            char temp = input.charAt(i);
            if (Character.isDigit(temp)) {
                digit = digit * 10 + temp - '0';
            } else {
                max = Math.max(max, digit);
                """
CPP = """#include <bits/stdc++.h>
using namespace std;

bool isSumOfPowersOfTwo(int n) {
    """
JAVASCRIPT = """function countWords(text) {
  const counts = {};
  for (const word of text.split(" ")) {
    """
PYTHON = """def main(argv):
    values = [
        config.get("name"),
        """


def shown(prefix: str, suffix: str, language: str, *texts: str) -> list[str]:
    candidates = [Completion(text, logprob=-1.0 - i, n_tokens=8) for i, text in enumerate(texts)]
    return [c.text for c in postprocess(prefix, suffix, language, candidates)]


@pytest.mark.parametrize(
    ("language", "prefix", "good", "closes"),
    [
        ("java", JAVA, "digit = 0;", "}"),
        ("javascript", JAVASCRIPT, "counts[word] = 1;", "counts[word] = 1;\n  }\n  return counts;\n}"),
        ("cpp", CPP, "return n > 0;", "return n > 0;\n}"),
        ("python", PYTHON, 'config.get("size"),', 'config.get("size")]'),
    ],
)
def test_closing_a_bracket_opened_before_the_cursor_line_is_not_shown_beside_others(
    language: str, prefix: str, good: str, closes: str
) -> None:
    # The file goes on after the window (`}` / `]` follow): closing it here breaks the file.
    result = shown(prefix, "\n", language, closes, good)
    assert closes not in result
    assert result[0] == good


@pytest.mark.parametrize(
    ("language", "prefix", "completion", "kept"),
    [
        (
            "cpp", CPP,
            "if (n <= 0) {\n        return false;\n    }\n    int sum = 1;\n    for (int i = 1; i <= n; i++) {",
            "if (n <= 0) {\n        return false;\n    }\n    int sum = 1;",
        ),
        ("javascript", JAVASCRIPT, "counts[word] = 1;\n    while (word) {\n      word = word.slice(1);", "counts[word] = 1;"),
        ("java", JAVA, "digit = 0;\n                for (int j = 0; j < 3; j++) {\n                    max++;", "digit = 0;"),
        ("python", PYTHON, 'config.get("size"),\n        config.get(\n            "kind",', 'config.get("size"),'),
    ],
)
def test_a_block_opened_and_left_open_at_the_windows_end_is_cut_back(
    language: str, prefix: str, completion: str, kept: str
) -> None:
    assert shown(prefix, "\n", language, completion) == [kept]


@pytest.mark.parametrize(
    ("language", "prefix", "suffix", "completion"),
    [
        ("cpp", CPP, "\n}\n", "if (n <= 0) {\n        return false;\n    }\n    return true;"),
        ("javascript", JAVASCRIPT, "\n  }\n  return counts;\n}\n", "counts[word] = (counts[word] || 0) + 1;"),
        ("python", PYTHON, '\n        config.get("size"),\n    ]\n', 'config.get("kind"),'),
    ],
)
def test_a_window_that_closes_what_it_opens_is_judged_as_before(language: str, prefix: str, suffix: str, completion: str) -> None:
    assert shown(prefix, suffix, language, completion) == [completion]


def test_at_the_document_level_a_block_the_completion_opens_stays() -> None:
    # Nothing is open before the cursor: a blank suffix is the end of the document, and a
    # block begun there is open by nature (its body comes next).
    prefix = "function f() {\n  return 1;\n}\n\n"
    assert shown(prefix, "", "javascript", "function g(a) {\n  if (a) {") == ["function g(a) {\n  if (a) {"]


def test_end_balance() -> None:
    # Brackets on the cursor's line are the hole's to close.
    assert end_balance("  f(a,\n  g(b, ", "\n", "javascript", "c);") == (3, False)
    assert end_balance("  f(a,\n  g(b, ", "\n", "javascript", "c));") == (4, True)  # `f(` is an earlier line's
    assert end_balance(CPP, "\n", "cpp", "x = 1;\n    }") == (6, False)
    assert end_balance(CPP, "\n", "cpp", "}") == (1, True)
    assert end_balance(CPP, "\n", "cpp", "while (x) {") == (11, True)
    assert end_balance(CPP, "\n}\n", "cpp", "while (x) {") == (11, False)  # the window shows the end
    assert end_balance(CPP, "\n    x--;\n    }\n", "cpp", "while (x) {") == (11, False)  # the suffix closes it


JAVA_BODY_PREFIX = """    public static List<List<String>> sortSublists(List<List<String>> inputList) {
        List<List<String>> outList = new ArrayList<>();
        """
JAVA_BODY_SUFFIX = """
            if (list.size() == 0) {
                continue;
            }
            Collections.sort(l"""  # the window ends mid-statement, inside the loop's body
CPP_BODY_PREFIX = """int minimumLength(string s) {
  if (s == "mnm") {
    return 1;
  }
  """
CPP_BODY_SUFFIX = "\n    return 3"
JS_BODY_PREFIX = """function countVowels(text) {
  let count = 0;
  """
JS_BODY_SUFFIX = """
    if ("aeiou".includes(text[i])) {
      count += 1"""
PY_BODY_PREFIX = '''def total(values):
    """Sum of the values that are not None,
    skipping the others."""
    result = 0
    '''
PY_BODY_SUFFIX = """
        if value is None:
            continue
        result += val"""


@pytest.mark.parametrize(
    ("language", "prefix", "suffix", "completion", "header"),
    [
        (
            "java", JAVA_BODY_PREFIX, JAVA_BODY_SUFFIX,
            "for (int i = 0; i < inputList.size(); i++) {\n            outList.add(inputList.get(i));\n        }",
            "for (int i = 0; i < inputList.size(); i++) {",
        ),
        ("cpp", CPP_BODY_PREFIX, CPP_BODY_SUFFIX, "if (s.length() < 3) {\n    return 1;\n  }", "if (s.length() < 3) {"),
        (
            "javascript", JS_BODY_PREFIX, JS_BODY_SUFFIX,
            "for (let i = 0; i < text.length; i++) {\n    count++;\n  }",
            "for (let i = 0; i < text.length; i++) {",
        ),
    ],
)
def test_a_header_whose_body_the_suffix_holds_is_cut_after_the_header(
    language: str, prefix: str, suffix: str, completion: str, header: str
) -> None:
    # The window ends inside the body the hole's header opens (a bracket or a block the file
    # closes later). The model wrote the header and a body and close of its own: whole, that
    # leaves the suffix's body without a header; cut after the header it fills the hole.
    assert shown(prefix, suffix, language, completion) == [header]


def test_in_python_the_suffixs_body_continues_the_block_the_completion_opens() -> None:
    # Indentation, not a closing bracket, ends a Python block: the suffix's deeper lines
    # continue the body the completion began, so header and body together fill the hole.
    completion = "for value in values:\n        result += value"
    assert shown(PY_BODY_PREFIX, PY_BODY_SUFFIX, "python", completion) == [completion]


def test_a_complete_statement_is_not_cut_to_a_header_the_suffix_does_not_continue() -> None:
    # The suffix's next line is not indented deeper: the whole block is the hole's fill.
    suffix = "\n  return count;\n}\n"
    completion = "for (let i = 0; i < text.length; i++) {\n    count++;\n  }"
    assert shown(JS_BODY_PREFIX, suffix, "javascript", completion) == [completion]
