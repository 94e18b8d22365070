"""The suggest widget's selected item (LSP 3.18 `InlineCompletionContext.selectedCompletionInfo`):
with the widget open, an inline completion must extend the text that item inserts, over the
same range, or the editor does not show it. So the engine is asked at the place the item would
leave the cursor (the document with the item's text put over its range, a copy), and each
alternative is written as the item's text followed by the model's continuation, replacing the
item's range (and the closers right of it that the continuation writes again, edits.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from lsprotocol import types as lsp

from kspec.engine.api import Completion, goes_on_name, spells_word
from kspec.lsp_server.accept_stats import item_command
from kspec.lsp_server.documents import Cursor, Document, line_body, units_from_column
from kspec.lsp_server.edits import replaced_chars

NAME_END = re.compile(r"[\w$]+$")  # the name the item's text ends in
NAME_START = re.compile(r"[\w$]*")  # the part of a name a continuation starts with

if TYPE_CHECKING:
    from kspec.lsp_server.completion_flow import Query


@dataclass(frozen=True)
class SelectedItem:
    document: Document  # a copy of the document with the item's text over its range
    cursor: Cursor  # in that copy: the end of the item's text
    text: str  # what the item inserts
    line: int  # the item's range, in the real document: its line
    start: int  # code-point columns of the range in that line's body
    end: int
    body: str  # that line's body in the real document

    def items(self, query: Query, alternatives: list[Completion], encoding: str) -> list[lsp.InlineCompletionItem]:
        """Each alternative as the item's text then the model's continuation, over the item's range;
        none that runs the item's name into a name the document never writes (`y` selected, `ym...`
        written: the model heals the item's last token and its branches differ in how they go on),
        while `item` selected and `items` written, a name the file holds, shows."""
        language = query.document.language_id
        texts = [alternative.text for alternative in alternatives if self.keeps_name(alternative.text)]
        items = []
        for rank, text in enumerate(texts):
            end = self.end + replaced_chars(text, query.context.line_suffix)
            edit = lsp.Range(
                start=lsp.Position(line=self.line, character=units_from_column(self.body, self.start, encoding)),
                end=lsp.Position(line=self.line, character=units_from_column(self.body, end, encoding)),
            )
            whole = self.text + text
            items.append(lsp.InlineCompletionItem(insert_text=whole, range=edit, command=item_command(rank, language, len(whole))))
        return items

    def keeps_name(self, text: str) -> bool:
        """`text` either starts a new token after the item or runs the item's name into one that
        the document writes elsewhere (its copy holds the item's name at the cursor, not the longer one)."""
        ran_on = NAME_END.search(self.text)
        if not (ran_on and text and goes_on_name(text[0])):
            return True
        start = NAME_START.match(text)
        name = ran_on.group() + (start.group() if start else "")
        return spells_word(self.document_text, name)

    @cached_property
    def document_text(self) -> str:
        """The copy's text, joined once per request (only where an alternative runs the name on)."""
        return self.document.text


def selected_item(document: Document, position: lsp.Position, selected: lsp.Range, text: str, encoding: str) -> SelectedItem | None:
    """The widget's item as a place to complete at; None when its range is not on the cursor's line
    around the cursor (no inline completion could then agree with it)."""
    if document.too_large or not (selected.start.line == selected.end.line == position.line < len(document.lines)):
        return None
    body = line_body(document.lines[position.line])
    cursor = document.cursor(position.line, position.character, encoding)
    start = document.cursor(selected.start.line, selected.start.character, encoding).column
    end = document.cursor(selected.end.line, selected.end.character, encoding).column
    if not start <= cursor.column <= end:
        return None
    copy = Document(document.uri, document.language_id, document.version, list(document.lines), document.length)
    copy.apply_edit(Cursor(position.line, start), Cursor(position.line, end), text)
    written = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if len(written) == 1:
        after = Cursor(position.line, start + len(text))
    else:
        after = Cursor(position.line + len(written) - 1, len(written[-1]))
    return SelectedItem(copy, after, text, position.line, start, end, body)
