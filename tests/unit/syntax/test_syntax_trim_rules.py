"""The individual trim rules: suffix repeats, truncated lines, dedents, newlines, fallbacks."""

from __future__ import annotations

import pytest

from kspec.engine.syntax.context import build_context
from kspec.engine.syntax.languages import detect_language
from kspec.engine.api import Completion
from kspec.engine.syntax.postprocess import postprocess
from kspec.engine.syntax.trim import BRACKET, DEDENT, REPEAT, REPEAT_INLINE, drop_truncated_line, find_cut, trim


def trimmed(prefix: str, completion: str, suffix: str, language: str | None, **kw: bool) -> str | None:
    return trim(build_context(prefix, suffix, language), completion, **kw)


# --------------------------------------------------------------------------- suffix repeat

def test_cut_where_completion_repeats_the_next_suffix_lines() -> None:
    prefix = "def f(xs):\n    ys = sorted(xs)\n"
    suffix = "    return ys[0] + ys[-1]\n"
    completion = "    ys.reverse()\n    return ys[0] + ys[-1]\n\n\nprint(f([1]))\n"
    ctx = build_context(prefix, suffix, "python")
    cut = find_cut(ctx, completion)
    assert cut is not None and cut.reason == REPEAT
    # The cursor was before code on its line: the suggestion ends with a line break.
    assert trim(ctx, completion) == "    ys.reverse()\n"


def test_repeat_must_match_the_indentation_too() -> None:
    # `return 1` at a deeper indentation is the body of the new `if`, not the suffix's line.
    prefix = "def f(x):\n"
    suffix = "    return 1\n"
    completion = "    if x:\n        return 1\n    return 1\n"
    assert trimmed(prefix, completion, suffix, "python") == "    if x:\n        return 1\n"


def test_cut_where_completion_repeats_the_rest_of_the_cursor_line() -> None:
    prefix = "def f(x):\n    if x >"
    suffix = ":\n        return x\n"
    ctx = build_context(prefix, suffix, "python")
    cut = find_cut(ctx, " 0 and x < 10:\n        return x\n")
    assert cut is not None and cut.reason == REPEAT_INLINE
    assert trim(ctx, " 0 and x < 10:\n        return x\n") == " 0 and x < 10"


def test_a_closer_of_the_completions_own_bracket_is_no_repeat_of_the_suffix() -> None:
    """`return [|]` (the editor closed the bracket): the first `]` of `[a, b] for a in xs]` closes
    the completion's own `[`; the one that repeats the suffix is the last (seen with Qwen2.5-Coder:
    `[item.name, item.price` was shown, a syntax error, and dropped)."""
    assert trimmed("def f(xs):\n    return [", "[a, b] for a in xs]\n", "]\n", "python") == "[a, b] for a in xs"
    assert trimmed("def f(xs):\n    return [", "a for a in xs]\n", "]\n", "python") == "a for a in xs"


def test_repeat_of_a_word_only_counts_at_a_word_boundary() -> None:
    # The suffix rest is "x)": "max)" contains it but not at a boundary, so the bracket rule decides.
    assert trimmed("y = f(", "max)\n", "x)\n", "python") == "max"


@pytest.mark.parametrize(
    ("prefix", "suffix", "language", "written", "shown"),
    [
        # the model took an assignment for a header: the `:` alone broke the line
        ("def f(node):\n    have_extends = node.find(nodes.", "\n    return have_extends\n", "python", "Extends):", "Extends)"),
        ("function f(node) {\n  const found = node.find(", "\n  return found;\n}\n", "javascript", "Extends) {", "Extends)"),
        # a header whose body the suffix holds keeps its opener
        ("def f(xs):\n    for x in ", "\n        print(x)\n", "python", "xs:", "xs:"),
    ],
)
def test_a_one_line_answer_loses_the_block_opener_its_statement_cannot_take(prefix: str, suffix: str, language: str, written: str, shown: str) -> None:
    completions = postprocess(prefix, suffix, language, [Completion(written, logprob=-1.0, n_tokens=3, finish_reason="stop")])
    assert [c.text for c in completions] == [shown]


def test_completion_that_only_repeats_the_suffix_is_dropped() -> None:
    prefix = "def f():\n"
    suffix = "    return 1\n"
    assert trimmed(prefix, "    return 1\n", suffix, "python") is None


# ----------------------------------------------------------------------------- brackets

def test_closer_the_suffix_does_not_have_is_kept_and_ends_the_unit() -> None:
    assert trimmed("x = max(a, ", "b)\ny = 2\n", "\n", "python") == "b)"


def test_mismatched_closer_cuts() -> None:
    ctx = build_context("x = [1, ", "\n", "python")
    cut = find_cut(ctx, "2)\n")
    assert cut is not None and cut.reason == BRACKET
    assert trim(ctx, "2)\n") == "2"


def test_brackets_the_completion_opens_span_lines() -> None:
    completion = "foo(\n    1,\n    2,\n)\nbar()\n"
    assert trimmed("x = ", completion, "\n", "python") == "foo(\n    1,\n    2,\n)"


def test_brackets_inside_strings_and_comments_do_not_count() -> None:
    completion = 'foo(")", 1)  # (\nbar()\n'
    assert trimmed("x = ", completion, "\n", "python") == 'foo(")", 1)  # ('


# ------------------------------------------------------------------------------ dedents

def test_stop_at_a_dedent_below_the_cursor_block() -> None:
    prefix = "class A:\n    def f(self):\n"
    completion = "        a = 1\n        return a\n\n    def g(self):\n        pass\n"
    ctx = build_context(prefix, "", "python")
    cut = find_cut(ctx, completion)
    assert cut is not None and cut.reason == DEDENT
    assert trim(ctx, completion) == "        a = 1\n        return a"


def test_c_family_body_start_without_closer_in_suffix_keeps_the_closer() -> None:
    completion = "  return 1;\n}\n\nint g(void) { return 2; }\n"
    assert trimmed("int f(void) {\n", completion, "", "c") == "  return 1;\n}"


def test_go_without_semicolons_cuts_at_the_line_end() -> None:
    prefix = "package main\n\nfunc f() int {\n\tx := 1\n\t"
    assert trimmed(prefix, "y := x + 1\n\treturn y\n}\n", "\n}\n", "go") == "y := x + 1"


def test_continuation_lines_belong_to_the_statement() -> None:
    prefix = "function f(p) {\n  "
    completion = "return p\n    .then(a)\n    .catch(b);\n  g();\n}\n"
    suffix = "\n  return 0;\n}\n"
    assert trimmed(prefix, completion, suffix, "javascript") == "return p\n    .then(a)\n    .catch(b);"


# ---------------------------------------------------------------- truncation, whitespace

def test_last_line_cut_by_the_token_budget_is_dropped() -> None:
    assert drop_truncated_line("a = 1\nb = foo(1, 2") == "a = 1\n"
    assert drop_truncated_line("a = foo(1, 2") == "a = foo(1, 2"  # nothing else to show
    prefix = "def f():\n"
    completion = "    a = 1\n    b = 2\n    return a + b +"
    assert trimmed(prefix, completion, "", "python", truncated=True) == "    a = 1\n    b = 2"
    assert trimmed(prefix, completion, "", "python") == "    a = 1\n    b = 2\n    return a + b +"


@pytest.mark.parametrize("completion", ["", " ", "\n\n", "\t\n  \n"])
def test_never_empty_or_whitespace_only(completion: str) -> None:
    for language in ("python", "c", None):
        assert trimmed("x = ", completion, "\n", language) is None
        assert trimmed("def f():\n    ", completion, "\n", language) is None


def test_line_start_before_existing_code_ends_with_newline_and_indent() -> None:
    prefix = "def f():\n    "
    suffix = "return x\n"
    assert trimmed(prefix, "x = 1\n    return x\n", suffix, "python") == "x = 1\n    "


# --------------------------------------------------------------------- unknown language

def test_unknown_language_falls_back_to_lines() -> None:
    assert trimmed("SELECT * FROM t WHERE ", "a = 1\nORDER BY b\n", "\n", None) == "a = 1"
    block = "  step one\n  step two\ndone\n"
    assert trimmed("task:\n", block, "", "cobol") == "  step one"
    assert trimmed("x = (", "1, 2)\n", ")\n", "plaintext") == "1, 2"  # the suffix-repeat rule


# ------------------------------------------------------------------------------ language

@pytest.mark.parametrize(
    ("language_id", "path", "expected"),
    [
        ("python", "", "python"),
        ("typescriptreact", "x.txt", "tsx"),
        ("javascriptreact", "", "javascript"),
        ("", "src/main.rs", "rust"),
        ("plaintext", "a/B.java", "java"),
        ("", "x.H", "cpp"),
        ("", "x.c", "c"),
        ("cpp", "x.c", "cpp"),  # the languageId wins
        ("", "kernel.cu", "cpp"),
        ("go", "", "go"),
        ("", "x.mts", "typescript"),
        ("", "Makefile", None),
        ("haskell", "x.hs", None),
        ("", "", None),
    ],
)
def test_detect_language(language_id: str, path: str, expected: str | None) -> None:
    assert detect_language(language_id, path) == expected


def test_closer_that_reopens_on_the_same_line_is_no_cut() -> None:
    # `} else {` ends the prefix's block but opens another that the suffix's `}` then closes.
    prefix = "void f(int x) {\n    if (x) {\n        a();\n    "
    suffix = "\n        b();\n    }\n}\n"
    assert trimmed(prefix, "} else {\n        b();\n    }\n}\n", suffix, "java") == "} else {"
    assert trimmed(prefix, "}\n}\n", suffix, "java") is None  # only closes what the suffix closes


# ------------------------------------------------------------------- context on big files

def _contexts_agree(source: str, language: str, step: int) -> int:
    """build_context lexes from the last top-level construct; lexing everything must agree."""
    from kspec.engine.syntax.context import MAX_OPEN_BRACKETS
    from kspec.engine.syntax.languages import SPECS
    from kspec.engine.syntax.lexer import lex, unmatched_openers

    spec = SPECS[language]
    checked = 0
    for cursor in range(0, len(source), step):
        prefix = source[:cursor]
        ctx = build_context(prefix, source[cursor:], language)
        whole = lex(prefix, spec, newlines=False)
        assert ctx.start_state == whole.end_state, cursor
        expected = tuple(t.char for t in unmatched_openers(whole.tokens))[-MAX_OPEN_BRACKETS:]
        assert ctx.open_brackets == expected, cursor
        checked += 1
    return checked


def test_context_of_a_large_python_file_matches_lexing_all_of_it() -> None:
    import importlib

    source = open(importlib.import_module("kspec.engine.syntax.trim").__file__, encoding="utf-8").read()
    assert _contexts_agree(source, "python", 211) > 50


def test_context_of_a_large_c_file_matches_lexing_all_of_it() -> None:
    unit = 'static int f{n}(int x) {{\n    if (x > {n}) {{\n        return g("}}{{", x);\n    }}\n    return 0;\n}}\n\n'
    source = "#include <stdio.h>\n\n" + "".join(unit.format(n=n) for n in range(40))
    assert _contexts_agree(source, "c", 29) > 50


def test_block_header_whose_body_the_suffix_already_has() -> None:
    # The hole is the header line; the model writes it and then the body the suffix has.
    prefix = "class A {\n    void f(List<String> xs) {\n        for (String s : xs) {\n            "
    suffix = "\n                out.add(s);\n            }\n        }\n    }\n}\n"
    completion = "if (s.isEmpty()) {\n                out.add(s);\n            }\n        }\n"
    assert trimmed(prefix, completion, suffix, "java") == "if (s.isEmpty()) {"
    py_prefix = 'def f():\n    """Doc."""\n\n'
    py_suffix = "        1: 'one',\n        2: 'two',\n    }\n    return d\n"
    py_completion = "    d = {\n        1: 'one',\n        2: 'two',\n    }\n    return d\n"
    assert trimmed(py_prefix, py_completion, py_suffix, "python") == "    d = {\n"


def test_a_line_the_code_needs_twice_is_no_repeat() -> None:
    # The hole's line equals the suffix's next line; the completion goes on with the suffix.
    prefix = "int main() {\n    x += 1;\n    "
    suffix = "\n    x += 1;\n    return x;\n}\n"
    assert trimmed(prefix, "x += 1;\n    x += 1;\n    return x;\n}\n", suffix, "c") == "x += 1;"
    assert trimmed(prefix, "x += 1;\n    return x;\n}\n", suffix, "c") is None  # this one only repeats


# A call whose arguments the model puts on the next lines: the line rule ends the branch at that
# newline, leaving `Message(` open, and the alternative used to be dropped (an empty answer for a
# cross-file hole, `return _adapters.Message(` + newline). The name alone fills the hole.
_CALL_PREFIX = "from . import _adapters\n\n\nclass Dist:\n    def metadata(self, text):\n        return _adapters."
_CALL_SUFFIX = "\n\n    def name(self):\n        return 1\n"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("Message(", ["Message"]),
        ("Message(\n", ["Message"]),
        ("Message.from_text(", ["Message.from_text"]),
        ("Message(text", []),  # arguments begun: not just a name's call left for the next line
        ("Message (", []),  # no call on a name right before the bracket
        ("Message(text)", ["Message(text)"]),  # whole: shown as it is
    ],
)
def test_a_call_opened_at_the_line_end_shows_its_name(raw: str, shown: list[str]) -> None:
    completions = postprocess(_CALL_PREFIX, _CALL_SUFFIX, "python", [Completion(raw, logprob=-1.0, n_tokens=3, finish_reason="stop")])
    assert [c.text for c in completions] == shown


def test_a_name_of_an_open_call_comes_after_the_whole_alternatives() -> None:
    candidates = [Completion("Message(", logprob=-0.5, n_tokens=3, finish_reason="stop"), Completion("Other(text)", logprob=-6.0, n_tokens=4, finish_reason="stop")]
    assert [c.text for c in postprocess(_CALL_PREFIX, _CALL_SUFFIX, "python", candidates)] == ["Other(text)", "Message"]


# --------------------------------------------------------------------------- a block's body at the opener's depth

def test_a_body_written_at_its_openers_depth_moves_one_unit_under_it() -> None:
    prefix = "def f(month, day):\n    try:\n        if month < 1:\n            return False\n        if month == 2 and day > 29:\n"
    suffix = "    except ValueError:\n        return False\n    return True\n"
    texts = postprocess(prefix, suffix, "python", [Completion("        return False", logprob=-1.0, n_tokens=5, finish_reason="stop")])
    assert [c.text for c in texts] == ["            return False\n"]  # was: no suggestion (an expected indented block)


def test_a_moved_body_keeps_its_own_nesting_and_the_files_unit() -> None:
    from kspec.engine.syntax.trim import under_block_opener

    prefix = "def f(xs):\n  for x in xs:\n"  # two-space file
    ctx = build_context(prefix, "", "python")
    assert under_block_opener(prefix, ctx, "  if x:\n    print(x)\n\n  y = 1") == "    if x:\n      print(x)\n\n    y = 1"
    assert under_block_opener(prefix, ctx, "    print(x)") is None  # already under the opener
    assert under_block_opener("x = 1\n", build_context("x = 1\n", "", "python"), "y = 2") is None  # no opener above
    assert under_block_opener("a {\n", build_context("a {\n", "", "javascript"), "b();") is None  # braces decide there


# --------------------------------------------------------------------------- the name at the cursor written again

_USERS_PREFIX = "interface User { email: string; }\n\nfunction find(users: User[], email: string) {\n  return users."
_USERS_SUFFIX = "\n}\n"


@pytest.mark.parametrize(
    ("line_prefix", "written", "kept"),
    [
        ("  return users.", "users.find(u)", "find(u)"),
        ("        retu", "return x", "rn x"),
        ("x = get", "get_value()", "_value()"),
        ("a = os.path.jo", "os.path.join(a)", "in(a)"),
        ("  self.", "self.a = 1", "a = 1"),
        ("x = b", "box", "box"),  # shorter than MIN_STUTTER: `bbox` is a word
        ("p = node.next.", "next.val", "next.val"),  # a part of the chain again is code (`node.next.next`)
        ("x = (users.", "find(u)", "find(u)"),  # no copy: as written
        ("y = 1 + ", "1", "1"),  # no name at the cursor
    ],
)
def test_a_copy_of_the_name_at_the_cursor_goes(line_prefix: str, written: str, kept: str) -> None:
    from kspec.engine.syntax.trim import without_stutter

    assert without_stutter(line_prefix, written) == kept


def test_an_alternative_that_writes_the_qualifier_again_joins_the_one_that_does_not() -> None:
    candidates = [
        Completion("find(u => u.email === email);", logprob=-1.0, n_tokens=8, finish_reason="stop"),
        Completion("users.find(u => u.email === email);", logprob=-4.0, n_tokens=9, finish_reason="stop"),
    ]
    shown = postprocess(_USERS_PREFIX, _USERS_SUFFIX, "typescript", candidates)
    assert [c.text for c in shown] == ["find(u => u.email === email);"]  # was: also `users.users.find(...)`
