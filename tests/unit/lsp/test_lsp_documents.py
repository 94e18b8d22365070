"""Documents: incremental edits and position encodings against a naive model (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kspec.engine.errors import InputError
from kspec.lsp_server.documents import (
    ENCODINGS,
    UTF8,
    UTF16,
    UTF32,
    Cursor,
    Document,
    DocumentStore,
    clean_text,
    column_from_units,
    split_lines,
    units_from_column,
)

# Text with every kind of line break and characters of 1-4 UTF-8 bytes / 1-2 UTF-16 units.
ALPHABET = st.sampled_from(["a", "b", " ", "\n", "\r", "\r\n", "é", "€", "😀", "𝔸", "\t", "("])
TEXT = st.lists(ALPHABET, max_size=40).map("".join)


def naive_lines(text: str) -> list[str]:
    """Line bodies, splitting on \\r\\n, \\r and \\n only (LSP's line breaks)."""
    lines, current, i = [], "", 0
    while i < len(text):
        if text.startswith("\r\n", i):
            lines.append(current)
            current, i = "", i + 2
        elif text[i] in "\r\n":
            lines.append(current)
            current, i = "", i + 1
        else:
            current += text[i]
            i += 1
    return lines + [current]


def unit_width(char: str, encoding: str) -> int:
    if encoding == UTF8:
        return len(char.encode("utf-8"))
    if encoding == UTF16:
        return 2 if ord(char) > 0xFFFF else 1
    return 1


def naive_offset(text: str, line: int, units: int, encoding: str) -> int:
    """Character offset of (line, units): clamp to the line, round down inside a character."""
    starts, i = [0], 0
    while i < len(text):
        if text.startswith("\r\n", i):
            i += 2
            starts.append(i)
        elif text[i] in "\r\n":
            i += 1
            starts.append(i)
        else:
            i += 1
    if line >= len(starts):
        return len(text)
    body = naive_lines(text)[line]
    column = used = 0
    for char in body:
        width = unit_width(char, encoding)
        if used + width > units:
            break
        used += width
        column += 1
    return starts[line] + column


@given(TEXT)
def test_split_lines_matches_naive_model(text: str) -> None:
    lines = split_lines(text)
    assert "".join(lines) == text
    assert [line.rstrip("\r\n") for line in lines] == naive_lines(text)


@given(TEXT, st.integers(0, 60), st.sampled_from(ENCODINGS))
def test_units_round_trip(text: str, units: int, encoding: str) -> None:
    body = text.replace("\r", "").replace("\n", "")
    column = column_from_units(body, units, encoding)
    assert 0 <= column <= len(body)
    assert units_from_column(body, column, encoding) <= units or column == 0
    assert column_from_units(body, units_from_column(body, column, encoding), encoding) == column
    assert naive_offset(body, 0, units, encoding) == column


@settings(max_examples=300)
@given(TEXT, st.lists(st.tuples(st.integers(0, 8), st.integers(0, 50), st.integers(0, 8), st.integers(0, 50), TEXT), max_size=6), st.sampled_from(ENCODINGS))
def test_incremental_edits_match_naive_model(text: str, edits: list, encoding: str) -> None:
    document = Document.create("file:///t", "python", 1, text)
    expected = text
    for start_line, start_units, end_line, end_units, new_text in edits:
        start = document.clamped_cursor(start_line, start_units, encoding)
        end = document.clamped_cursor(end_line, end_units, encoding)
        document.apply_edit(start, end, new_text)
        a = naive_offset(expected, start_line, start_units, encoding)
        b = naive_offset(expected, end_line, end_units, encoding)
        a, b = min(a, b), max(a, b)
        expected = expected[:a] + new_text + expected[b:]
        assert document.text == expected
        assert document.length == len(expected)
        assert [line.rstrip("\r\n") for line in document.lines] == naive_lines(expected)


@given(TEXT, st.integers(0, 8), st.integers(0, 50), st.sampled_from(ENCODINGS))
def test_offset_and_position_agree_with_naive_model(text: str, line: int, units: int, encoding: str) -> None:
    document = Document.create("file:///t", "python", 1, text)
    if line >= len(document.lines):
        with pytest.raises(InputError):
            document.cursor(line, units, encoding)
        return
    cursor = document.cursor(line, units, encoding)
    assert document.offset(cursor) == naive_offset(text, line, units, encoding)
    back_line, back_units = document.position(cursor, encoding)
    assert back_line == line and back_units <= units
    assert document.cursor(back_line, back_units, encoding) == cursor


def test_astral_character_positions() -> None:
    document = Document.create("file:///t", "python", 1, "x = '😀' + y\n")
    # '😀' is 1 code point, 2 UTF-16 units, 4 UTF-8 bytes; the quote after it is at:
    assert document.cursor(0, 7, UTF16) == Cursor(0, 6)
    assert document.cursor(0, 9, UTF8) == Cursor(0, 6)
    assert document.cursor(0, 6, UTF32) == Cursor(0, 6)
    assert document.cursor(0, 6, UTF16) == Cursor(0, 5)  # inside the surrogate pair: rounded down
    assert document.position(Cursor(0, 6), UTF16) == (0, 7)


def test_lone_surrogates_become_replacement_characters() -> None:
    document = Document.create("file:///t", "python", 1, "a\ud800b")
    assert document.text == "a\ufffdb"
    assert clean_text("\udfff") == "\ufffd"
    document.apply_edit(Cursor(0, 1), Cursor(0, 1), "\udc00")
    assert document.text == "a\ufffd\ufffdb"
    assert document.text.encode("utf-8")  # always encodable


def test_cr_joins_lf_across_an_edit() -> None:
    document = Document.create("file:///t", "python", 1, "a\r\nb")
    document.apply_edit(Cursor(0, 1), Cursor(1, 0), "\r")  # "a" + "\r" + "b"
    assert document.lines == ["a\r", "b"]
    document.apply_edit(Cursor(1, 0), Cursor(1, 0), "\n")  # "\r" then "\n": one break
    assert document.lines == ["a\r\n", "b"]


def test_too_large_document_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    import kspec.lsp_server.documents as documents

    monkeypatch.setattr(documents, "MAX_DOCUMENT_CHARS", 10)
    document = Document.create("file:///t", "python", 1, "x" * 11)
    assert document.too_large and document.lines == [""]
    document.replace_all("small")
    assert not document.too_large and document.text == "small"
    document.apply_edit(Cursor(0, 5), Cursor(0, 5), "y" * 6)
    assert document.too_large


def test_the_store_keeps_kspecs_own_logs_apart(tmp_path) -> None:
    """A log in the engine log's folder, or any document of language `log`, is remembered by URI
    only: no text, not a document, no completions; another document opens as usual."""
    store = DocumentStore()
    engine_log = tmp_path / "engine-1.log"
    log_uri = f"file://{tmp_path}/engine-0.log"
    assert store.open(log_uri, "plaintext", 1, "secret log text", engine_log) is None
    assert store.open("untitled:Untitled-1", "log", 1, "more log text") is None
    assert store.get(log_uri) is None and store.find(log_uri) is None and log_uri not in store
    code = store.open(f"file://{tmp_path}/app.log.py", "python", 1, "x = 1\n", engine_log)
    assert code is not None and store.get(code.uri) is code and store.find(code.uri) is code
    assert [document.uri for document in store.all()] == [code.uri]
    store.close(log_uri)
    with pytest.raises(InputError, match="not open"):
        store.get(log_uri)
    assert store.find("file:///nowhere.py") is None

