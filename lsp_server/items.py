"""A request's alternatives (the engine's `Completion`s) as LSP items: inline completion items and, for clients without inline
completion, completion items; each item's range also covers what it writes again right of the
cursor (edits.py), and carries the `kspec.accepted` command (accept_stats.py)."""

from __future__ import annotations

from lsprotocol import types as lsp

from kspec.engine.api import Completion
from kspec.lsp_server.accept_stats import item_command
from kspec.lsp_server.completion_flow import Query
from kspec.lsp_server.documents import units_from_column
from kspec.lsp_server.edits import replaced_chars


def edit_range(query: Query, text: str, encoding: str) -> lsp.Range:
    column = query.cursor.column
    end = column + replaced_chars(text, query.context.line_suffix)
    line = query.cursor.line
    return lsp.Range(
        start=lsp.Position(line=line, character=units_from_column(query.body, column, encoding)),
        end=lsp.Position(line=line, character=units_from_column(query.body, end, encoding)),
    )


def inline_items(query: Query, alternatives: list[Completion], encoding: str) -> list[lsp.InlineCompletionItem]:
    language = query.document.language_id
    return [
        lsp.InlineCompletionItem(insert_text=text, range=edit_range(query, text, encoding), command=item_command(rank, language, len(text)))
        for rank, text in enumerate(alternative.text for alternative in alternatives)
    ]


def completion_items(query: Query, alternatives: list[Completion], encoding: str, markdown: bool) -> list[lsp.CompletionItem]:
    """The fallback's items: a short label, the whole text as documentation (Markdown where the client renders it)."""
    language = query.document.language_id
    return [
        lsp.CompletionItem(
            label=short_label(text),
            kind=lsp.CompletionItemKind.Text,
            detail="kspec",
            documentation=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=f"```{language}\n{text}\n```") if markdown else text,
            sort_text=f"{index:04d}",
            filter_text=text,
            preselect=index == 0,
            insert_text_format=lsp.InsertTextFormat.PlainText,
            text_edit=lsp.TextEdit(range=edit_range(query, text, encoding), new_text=text),
            command=item_command(index, language, len(text)),
        )
        for index, text in enumerate(alternative.text for alternative in alternatives)
    ]


def renders_markdown(capabilities: lsp.ClientCapabilities) -> bool:
    """Whether the client says it renders Markdown in a completion item's documentation."""
    document = capabilities.text_document
    completion = document.completion.completion_item if document and document.completion else None
    return bool(completion and lsp.MarkupKind.Markdown in (completion.documentation_format or ()))


def short_label(text: str, width: int = 40) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    label = lines[0] if lines else text.strip()
    if len(label) > width:
        return label[: width - 1] + "…"
    return label + (" …" if len(lines) > 1 else "")
