"""Other files' text before the file's own in the prompt: the model family's repository format
where its tokenizer has one, file names as comments otherwise.

- Qwen2.5-Coder (`<|repo_name|>`, `<|file_sep|>`): `<|repo_name|>kspec\\n<|file_sep|>a.py\\n...`
  `<|file_sep|>cursor.py\\n` then the FIM prompt, as its repository-level training data;
- StarCoder2 (`<file_sep>`): `<file_sep>a.py\\n...` then `<file_sep>cursor.py\\n`;
- any other model (the small SmolLM2, whose vocabulary has `<file_sep>` but which was not
  trained to fill in with it, DeepSeek-Coder, CodeLlama): each file headed by a
  comment with its path in the cursor's language, then a comment naming the cursor's file.

The block depends only on the pieces and the cursor's path, never on the cursor's text, so
consecutive keystrokes with the same pieces share its tokens at the start of the prompt and
the prefix cache keeps them. Pieces that do not fit the budget are dropped from the front:
the caller orders them most relevant last (nearest the cursor's file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kspec.engine.api import ContextFile
from kspec.engine.syntax.languages import detect_language

if TYPE_CHECKING:  # the package of models imports torch: a language server with a remote engine stays light
    from kspec.engine.models.tokenizer import Tokenizer

QWEN_REPO, QWEN_FILE = "<|repo_name|>", "<|file_sep|>"
STARCODER_FILE = "<file_sep>"
LINE_COMMENT = {"python": "#", "ruby": "#", "bash": "#"}  # every other language kspec parses writes `//`
REPO_NAME = "workspace"


@dataclass(frozen=True)
class ContextBlock:
    ids: list[int]
    files: tuple[str, ...]  # the paths that went in, in prompt order


def _comment(language: str, path: str) -> str:
    mark = LINE_COMMENT.get(language or "", "//" if language else "#")
    return f"{mark} {path}\n"


def display_path(cursor_path: str, context: tuple[ContextFile, ...]) -> str:
    """The cursor's file as the pieces name theirs: an absolute path from the folder the pieces'
    relative paths start in (`/home/u/ws/pkg/m.py` beside `pkg/utils.py`: `pkg/m.py`), else its name."""
    parts = cursor_path.replace(os.sep, "/").split("/")
    if not os.path.isabs(cursor_path):
        return cursor_path or "file"
    firsts = {p.path.split("/", 1)[0] for p in context if not os.path.isabs(p.path)}
    for at in range(len(parts) - 1, 0, -1):
        if parts[at] in firsts:
            return "/".join(parts[at:])
    return parts[-1] or "file"


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") or not text else text + "\n"


def _pieces(tokenizer: Tokenizer, context: tuple[ContextFile, ...], cursor_path: str, language: str) -> tuple[list[list[int]], list[int], list[int]]:
    """(each piece's ids, the head before all pieces, the tail naming the cursor's file)."""
    # only a model trained on the format: SmolLM2's vocabulary has `<file_sep>` but no FIM tokens
    has = tokenizer.special_id
    qwen_file = has(QWEN_FILE) if has("<|fim_prefix|>") is not None else None
    star_file = has(STARCODER_FILE) if has("<fim_prefix>") is not None else None
    name = display_path(cursor_path, context)
    if qwen_file is not None:
        repo = tokenizer.special_id(QWEN_REPO)
        head = [repo, *tokenizer.encode(REPO_NAME + "\n")] if repo is not None else []
        pieces = [[qwen_file, *tokenizer.encode(f"{p.path}\n{_with_newline(p.text)}")] for p in context]
        return pieces, head, [qwen_file, *tokenizer.encode(f"{name}\n")]
    if star_file is not None:
        pieces = [[star_file, *tokenizer.encode(f"{p.path}\n{_with_newline(p.text)}")] for p in context]
        return pieces, [], [star_file, *tokenizer.encode(f"{name}\n")]
    language = detect_language(language, cursor_path) or ""
    pieces = [tokenizer.encode(_commented(language, p)) for p in context]
    return pieces, [], tokenizer.encode(_comment(language, name))


def _commented(language: str, piece: ContextFile) -> str:
    """A piece in the comment layout: a comment with its path, its text, a blank line."""
    return _comment(language, piece.path) + _with_newline(piece.text) + "\n"


def comment_block(context: tuple[ContextFile, ...], cursor_path: str, language: str) -> str:
    """The comment layout as text, for an engine kspec does not tokenize for (an OpenAI-compatible
    server: its own prefix cache keeps this stable start); '' without context."""
    if not context:
        return ""
    language = detect_language(language, cursor_path) or ""
    return "".join(_commented(language, p) for p in context) + _comment(language, display_path(cursor_path, context))


def context_block(tokenizer: Tokenizer, context: tuple[ContextFile, ...], cursor_path: str, language: str, budget: int) -> ContextBlock:
    """The tokens put before the file's own text for `context`, at most `budget` of them
    (whole pieces only); empty when there is no context or none fits."""
    if not context or budget <= 0:
        return ContextBlock([], ())
    pieces, head, tail = _pieces(tokenizer, context, cursor_path, language)
    room = budget - len(head) - len(tail)
    kept: list[int] = []
    for at in range(len(pieces) - 1, -1, -1):  # most relevant last: keep from the end
        if len(pieces[at]) > room:
            break
        room -= len(pieces[at])
        kept.append(at)
    if not kept:
        return ContextBlock([], ())
    kept.reverse()
    ids = [*head, *(token for at in kept for token in pieces[at]), *tail]
    return ContextBlock(ids, tuple(context[at].path for at in kept))
