"""The sorted token-text index answers prefix queries exactly as a scan of the vocabulary would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kspec.engine.models.tokenizer import TokenTextIndex

ALPHABET = st.sampled_from(["a", "b", "ab", "_", " ", "\n", "é", "\x00", "\U0010ffff"])
TEXTS = st.lists(st.lists(ALPHABET, max_size=4).map("".join), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(TEXTS, st.lists(ALPHABET, max_size=3).map("".join))
def test_queries_equal_a_scan(texts: list[str], query: str) -> None:
    index = TokenTextIndex(texts)
    assert sorted(index.starting_with(query)) == [i for i, t in enumerate(texts) if t and t.startswith(query)]
    assert sorted(index.exactly(query)) == ([i for i, t in enumerate(texts) if t == query] if query else [])
    assert sorted(index.continuing(query)) == [(i, t) for i, t in enumerate(texts) if t.startswith(query) and len(t) > len(query)]
