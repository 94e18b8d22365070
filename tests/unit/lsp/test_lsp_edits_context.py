"""What a suggestion replaces right of the cursor; the cursor context under budgets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kspec.lsp_server.cursor_window import Budgets, editor_context, looks_binary
from kspec.lsp_server.documents import Cursor, Document
from kspec.lsp_server.edits import replaced_chars


@pytest.mark.parametrize(
    ("text", "line_suffix", "expected"),
    [
        ("a, b)", ")", 1),  # foo(|) -> foo(a, b)
        ("hello\")", "\")", 2),  # print("|") -> print("hello")
        ("x]", "])", 1),  # only what the suggestion writes again
        ("x])", "])", 2),
        ("a) + 1", ") + 1", 5),  # ends with the whole rest of the line
        ("a) + 1", ") + 1   ", 8),  # trailing blanks go too
        ("a)", ") + 1", 1),  # ")" written again, " + 1" kept
        ("y = compute(x)", "x = 1", 0),  # not closers: untouched
        ("anything", "", 0),
        ("", ")", 0),
        ("abc", ")", 0),  # ")" not written again
        ("a, b", "  )", 0),  # blanks alone are never replaced
        ("f(x)\n    return y", ")", 1),  # multi-line: the ")" on the first line
    ],
)
def test_replaced_chars(text: str, line_suffix: str, expected: int) -> None:
    assert replaced_chars(text, line_suffix) == expected


def _is_subsequence(needle: str, haystack: str) -> bool:
    position = 0
    for char in needle:
        position = haystack.find(char, position) + 1
        if position == 0:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab )]}\"',;:\t\n+", max_size=12), line_suffix=st.text(alphabet="ab )]}\"',;:\t+", max_size=8))
def test_replacement_never_loses_text(text: str, line_suffix: str) -> None:
    """Whatever is replaced reappears, in order, in the suggestion (trailing blanks of the
    line aside); and nothing is replaced by an empty suggestion."""
    n = replaced_chars(text, line_suffix)
    assert 0 <= n <= len(line_suffix)
    assert _is_subsequence(line_suffix[:n].rstrip(), text), (text, line_suffix, n)
    if not text:
        assert n == 0


def test_subsequence_helper_can_say_no() -> None:
    assert _is_subsequence(")]", "a)b]") and not _is_subsequence("])", "a)b]")


def test_context_under_budgets() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    document = Document.create("file:///t", "python", 1, text)
    cursor = Cursor(50, 4)
    context = editor_context(document, cursor, Budgets(prefix_chars=30, suffix_chars=20))
    offset = sum(len(f"line {i}\n") for i in range(50)) + 4
    assert context.prefix == text[offset - 30 : offset]
    assert context.suffix == text[offset : offset + 20]
    assert context.line_suffix == " 50"
    assert context.offset == offset and context.length == len(text)


def test_context_at_document_edges() -> None:
    document = Document.create("file:///t", "python", 1, "ab\r\ncd")
    start = editor_context(document, Cursor(0, 0), Budgets(10, 10))
    assert (start.prefix, start.suffix, start.line_suffix) == ("", "ab\r\ncd", "ab")
    end = editor_context(document, Cursor(1, 2), Budgets(10, 10))
    assert (end.prefix, end.suffix, end.line_suffix) == ("ab\r\ncd", "", "")
    assert editor_context(document, Cursor(1, 1), Budgets(10, 0)).suffix == ""


def test_a_python_windows_context_names_what_the_file_binds_outside_it() -> None:
    """A window of a long file: the imports at its top and a function defined below the window go
    with the request (`outside_names`), a module-level name inside the window does not, and
    neither does a function's local; a line the prefix's budget cut counts as outside (its
    start is), and so does one the suffix's budget cut (its end is). Another language sends none."""
    body = "".join(f"    x{i} = {i}\n" for i in range(40))
    text = (
        "import json\nfrom os import path as p\n\ndef helper(a):\n    hidden = a\n" + "def long():\n" + body
        + "CUT_LINE = 1\nINSIDE = 2\ndef here():\n    return \n\n" + "def later():\n" + body + "LATER = 3\n"
    )
    lines = text.split("\n")
    cursor = Cursor(lines.index("    return "), 11)
    context = editor_context(Document.create("file:///big.py", "python", 1, text), cursor, Budgets(prefix_chars=40, suffix_chars=8))
    assert context.prefix.startswith("E = 1\nINSIDE") and context.suffix == "\n\ndef la"
    assert context.outside_names == ("CUT_LINE", "LATER", "helper", "json", "later", "long", "p")
    assert editor_context(Document.create("file:///big.js", "javascript", 1, text), cursor, Budgets(40, 30)).outside_names == ()
    assert editor_context(Document.create("file:///small.py", "python", 1, text), cursor, Budgets(10**6, 10**6)).outside_names == ()


def test_binary_context() -> None:
    document = Document.create("file:///t", "python", 1, "PK\x03\x04\x00\x00junk")
    assert looks_binary(editor_context(document, Cursor(0, 3), Budgets(10, 10)))
    assert not looks_binary(editor_context(Document.create("u", "python", 1, "plain"), Cursor(0, 1), Budgets(10, 10)))
