"""Identifier tokens and their Jaccard similarity: how Copilot's neighbouring-tab snippets and
llama.vim's ring buffer rank chunks against the lines around the cursor."""

from __future__ import annotations

import re

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MIN_LENGTH = 2  # `i`, `x`: shared by every chunk, they rank nothing
COMMON = frozenset(
    "self cls def class return if else elif for while in not and or is None True False import from as with try except "
    "finally pass raise lambda yield async await const let var function new this null undefined true false func package "
    "type struct interface fn pub use mut impl match public private static void int str bool".split()
)


def identifiers(text: str) -> frozenset[str]:
    """The distinct identifiers of `text`, without keywords and one-letter names."""
    return frozenset(word for word in IDENTIFIER.findall(text) if len(word) >= MIN_LENGTH and word not in COMMON)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b|; 0 for two empty sets."""
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)
