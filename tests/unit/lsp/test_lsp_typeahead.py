"""Typeahead: typing the start of a suggestion serves the rest of every alternative that still matches."""

from __future__ import annotations

from kspec.engine.api import Completion
from kspec.lsp_server.cursor_window import Budgets, EditorContext, editor_context
from kspec.lsp_server.documents import Cursor, Document
from kspec.lsp_server.typeahead import Entry, Hit, TypeaheadCache, typed_since

BUDGETS = Budgets(prefix_chars=16, suffix_chars=8)


def context_at(text: str, offset: int) -> EditorContext:
    document = Document.create("file:///t", "python", 1, text)
    line = text.count("\n", 0, offset)
    column = offset - (text.rfind("\n", 0, offset) + 1)
    return editor_context(document, Cursor(line, column), BUDGETS)


def shown(*texts: str) -> tuple[Completion, ...]:
    """An answer's alternatives, best first (scores falling)."""
    return tuple(Completion(text, score=-rank) for rank, text in enumerate(texts))


def cache_with(text: str, offset: int, alternatives: tuple[str, ...]) -> TypeaheadCache:
    cache = TypeaheadCache()
    cache.store("file:///t", Entry(context_at(text, offset), BUDGETS.prefix_chars, BUDGETS.suffix_chars, shown(*alternatives)))
    return cache


def lookup(cache: TypeaheadCache, text: str, offset: int):
    return cache.lookup("file:///t", context_at(text, offset), BUDGETS.prefix_chars, BUDGETS.suffix_chars)


def left(hit: Hit | None) -> tuple[str, ...] | None:
    """What is left of each matching alternative's text (None: a miss)."""
    return None if hit is None else tuple(alternative.text for alternative in hit.alternatives)


def test_typing_a_suggestion_serves_every_matching_alternative() -> None:
    before = "import os\nresult = \n"
    cursor = before.index("= ") + 2
    cache = cache_with(before, cursor, ("compute(x)", "compare(y)", "total"))
    typed = before[:cursor] + "com" + before[cursor:]
    hit = lookup(cache, typed, cursor + 3)
    assert hit is not None and left(hit) == ("pute(x)", "pare(y)") and hit.typed == 3
    assert [alternative.score for alternative in hit.alternatives] == [0, -1]  # the alternatives, their rest of text
    assert left(lookup(cache, before, cursor)) == ("compute(x)", "compare(y)", "total")  # same place again
    backspaced = before[:cursor] + "co" + before[cursor:]
    assert left(lookup(cache, backspaced, cursor + 2)) == ("mpute(x)", "mpare(y)")


def test_a_long_prefix_is_compared_through_the_budget_window() -> None:
    before = "x" * 100 + "\nvalue = "
    cache = cache_with(before, len(before), ("compute()",))
    typed = before + "comp"
    assert left(lookup(cache, typed, len(typed))) == ("ute()",)


def test_auto_closed_bracket_right_of_the_cursor_still_matches() -> None:
    before = "call"
    cache = cache_with(before, 4, ("(a, b)",))
    # The user types "(" and the editor inserts ")" after the cursor.
    hit = lookup(cache, "call()", 5)
    assert left(hit) == ("a, b)",)


def test_misses() -> None:
    before = "value = \n"
    cache = cache_with(before, 8, ("compute()",))
    assert lookup(cache, "value = cx\n", 10) is None  # typed something else
    assert lookup(cache, "value = compute()\n", 17) is None  # typed all of it: nothing left
    assert lookup(cache, "value = \nextra", 8) is None  # the suffix changed
    assert lookup(cache, "# new\nvalue = com\n", 17) is None  # text inserted before the cursor
    assert cache.lookup("file:///other", context_at(before, 8), 16, 8) is None
    assert cache.lookup("file:///t", context_at(before, 8), 17, 8) is None  # other budgets


def test_bounded_and_forgettable() -> None:
    cache = TypeaheadCache(per_document=2, documents=2)
    for uri in ("a", "b", "c"):
        for offset, text in ((1, "x"), (2, "y"), (3, "z")):  # three places
            cache.store(uri, Entry(context_at("abc", offset), 16, 8, shown(text)))
    context = context_at("abc", 3)
    assert len(cache) == 4  # two documents, two entries each
    assert cache.lookup("a", context, 16, 8) is None  # evicted
    assert left(cache.lookup("c", context, 16, 8)) == ("z",)  # newest first
    cache.forget("c")
    assert cache.lookup("c", context, 16, 8) is None
    cache.store("d", Entry(context, 16, 8, shown()))  # empty answers are not stored
    assert cache.lookup("d", context, 16, 8) is None


def test_inserted_text_that_is_not_a_closer_the_suggestion_writes_is_a_miss() -> None:
    cache = cache_with("call", 4, ("(a, b)",))
    assert lookup(cache, "call(]", 5) is None  # "]" is not in "a, b)"
    assert lookup(cache, "call(x", 5) is None  # not a closer


def test_what_is_left_is_distinct_as_deduplication_sees_text() -> None:
    before = "import os\nresult \n"
    cursor = before.index("result ") + 7
    cache = cache_with(before, cursor, ("x = 1", "x= 1", "y = 2"))  # distinct keys: `x = 1`, `x= 1`
    typed = before[:cursor] + "x" + before[cursor:]
    assert left(lookup(cache, typed, cursor + 1)) == (" = 1",)


def test_a_newer_answer_at_the_same_place_replaces_the_older() -> None:
    """Interim answers grow while the engine decodes on: the newest serves the keystrokes."""
    before = "result = \n"
    cache = cache_with(before, 9, ("com",))
    cache.store("file:///t", Entry(context_at(before, 9), BUDGETS.prefix_chars, BUDGETS.suffix_chars, shown("compute(x)")))
    assert len(cache) == 1
    typed = "result = comp\n"
    assert left(lookup(cache, typed, 13)) == ("ute(x)",)  # past the end of the older, shorter answer


def test_typed_since_tells_what_was_typed_at_the_cursor() -> None:
    def since(old_text: str, old_offset: int, text: str, offset: int):
        return typed_since(context_at(old_text, old_offset), context_at(text, offset), BUDGETS.prefix_chars, BUDGETS.suffix_chars)

    assert since("x = \n", 4, "x = ab\n", 6) == ("ab", "")
    assert since("x = \n", 4, "x = \n", 4) == ("", "")
    assert since("f\n", 1, "f()\n", 2) == ("(", ")")  # the editor closed the bracket
    assert since("x = \n", 4, "x = ab\n", 5) is None  # `b` right of the cursor is no closer
    assert since("x = \n", 4, "y = ab\n", 6) is None  # an edit before the cursor
    assert since("x = \nz\n", 4, "x = a\nq\n", 5) is None  # an edit after it
    assert since("x = a\n", 5, "x = \n", 4) is None  # backspace
