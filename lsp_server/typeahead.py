"""Typeahead: the user types the start of a suggestion already shown -> serve the rest.

An entry remembers where the engine answered (cursor offset, document length, the
prefix and suffix it saw) and its alternatives (the engine's `Completion`s, as shown). A later request at offset `o + i` in a
document of length `n + i + j` is a hit for an alternative `c` when the prefix is the
old prefix plus `c[:i]` (the user typed the first i characters of `c`) and the suffix is
j characters plus the old suffix, where those j characters are closers the editor
auto-inserted (the `)` after a typed `(`) that the rest of `c` writes again, in order.
The answer is `c[i:]` for every alternative that matches (the alternative with that text), with no engine call (its
range then replaces those closers, see edits.py). Backspacing inside a suggestion is a
hit too (smaller i).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from kspec.engine.api import Completion
from kspec.engine.syntax.rank import dedupe_key
from kspec.lsp_server.cursor_window import EditorContext
from kspec.lsp_server.edits import CLOSERS


@dataclass(frozen=True)
class Entry:
    context: EditorContext
    prefix_chars: int
    suffix_chars: int
    alternatives: tuple[Completion, ...]  # best first


@dataclass(frozen=True)
class Hit:
    alternatives: tuple[Completion, ...]  # each matching alternative with what is left of its text, best first
    typed: int  # characters typed since the engine answered


def rewrites(text: str, inserted: str) -> bool:
    """`inserted` is closers only, and `text` writes them all again in order."""
    position = 0
    for char in inserted:
        if char not in CLOSERS or (position := text.find(char, position) + 1) == 0:
            return False
    return True


def typed_since(old: EditorContext, context: EditorContext, prefix_chars: int, suffix_chars: int) -> tuple[str, str] | None:
    """(typed, inserted): the characters typed at `old`'s cursor to reach `context`, and the
    closers the editor inserted right of the cursor meanwhile; None when `context` is not
    `old` with text typed at its cursor (`prefix_chars` / `suffix_chars`: the budgets both
    contexts were cut with)."""
    typed = context.offset - old.offset
    inserted = context.length - old.length - typed  # after the cursor (auto-closed brackets)
    if typed < 0 or inserted < 0 or typed > len(context.prefix):
        return None
    chars = context.prefix[len(context.prefix) - typed :]
    if context.prefix != (old.prefix + chars)[-prefix_chars:]:
        return None
    if inserted > len(context.suffix) or context.suffix[inserted:] != old.suffix[: suffix_chars - inserted]:
        return None
    closers = context.suffix[:inserted]
    return (chars, closers) if all(char in CLOSERS for char in closers) else None


def _rest(text: str, typed: str, inserted: str) -> str | None:
    """What is left of alternative `text` once `typed` was typed (and `inserted` closers put right of the cursor)."""
    if len(typed) >= len(text) or not text.startswith(typed):
        return None
    rest = text[len(typed) :]
    if inserted and not rewrites(rest, inserted):
        return None
    return rest


class TypeaheadCache:
    """A few recent engine answers per document, newest first; bounded in documents and entries."""

    def __init__(self, per_document: int = 4, documents: int = 64) -> None:
        self.per_document = per_document
        self.documents = documents
        self._entries: OrderedDict[str, list[Entry]] = OrderedDict()

    def store(self, uri: str, entry: Entry) -> None:
        if not entry.alternatives:
            return
        # A newer answer at the same place (an interim answer grown, the final one) replaces the older.
        entries = [old for old in self._entries.pop(uri, []) if old.context != entry.context]
        entries.insert(0, entry)
        del entries[self.per_document :]
        self._entries[uri] = entries
        while len(self._entries) > self.documents:
            self._entries.popitem(last=False)

    def lookup(self, uri: str, context: EditorContext, prefix_chars: int, suffix_chars: int, k: int | None = None) -> Hit | None:
        """The newest answer that goes on from what was typed since, its alternatives' rests (at most `k`)."""
        for entry in self._entries.get(uri, ()):
            if (entry.prefix_chars, entry.suffix_chars) != (prefix_chars, suffix_chars):
                continue
            found = typed_since(entry.context, context, prefix_chars, suffix_chars)  # once per entry, not per alternative
            if found is None:
                continue
            left: list[Completion] = []
            keys: set[str] = set()
            for alternative in entry.alternatives:
                rest = _rest(alternative.text, *found)
                # Distinct as the engine's deduplication sees text: `x = 1` and `x= 1` both
                # leave `= 1` once `x` is typed.
                if rest is not None and dedupe_key(rest) not in keys:
                    keys.add(dedupe_key(rest))
                    left.append(replace(alternative, text=rest))
            if left:
                self._entries.move_to_end(uri)
                return Hit(tuple(left[:k]), context.offset - entry.context.offset)
        return None

    def forget(self, uri: str) -> None:
        self._entries.pop(uri, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._entries.values())
