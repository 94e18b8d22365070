"""Which language a buffer is in, and what the rest of `kspec.engine.syntax` needs to know about it.

One `LanguageSpec` per supported language: how to load its tree-sitter grammar (from the
per-language wheel, e.g. `tree_sitter_python`), which lexical family it belongs to, and the
few keywords the line-based trimming cares about. Languages and parsers are cheap to create;
the `Language` objects are cached because they are immutable.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter

LANGUAGES = ("python", "javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp")


@dataclass(frozen=True)
class LanguageSpec:
    name: str
    module: str  # the grammar wheel's import name
    entry: str  # the function in that module that returns the language pointer
    family: str  # lexical family: "python" or "c" (braces, // and /* */ comments)
    # Words that continue a compound statement on a new line at the same indentation.
    clause_keywords: frozenset[str]
    # Line prefixes that never finish a unit on their own (decorators, attributes).
    annotation_prefixes: tuple[str, ...] = ()
    # Kinds of string literal the lexer knows besides "..." (see lexer.py).
    single_quote_strings: bool = False  # '...' is a string (JS/TS/Python), not a char literal
    template_strings: bool = False  # `...${}...` (JS/TS)
    raw_backtick_strings: bool = False  # `...` raw string (Go)
    text_blocks: bool = False  # """...""" (Java)
    rust_strings: bool = False  # r#"..."#, and 'a lifetimes
    cpp_raw_strings: bool = False  # R"delim(...)delim"


_C_CLAUSES = frozenset({"else", "catch", "finally", "while"})

SPECS: dict[str, LanguageSpec] = {
    "python": LanguageSpec(
        "python", "tree_sitter_python", "language", "python",
        frozenset({"else", "elif", "except", "finally", "case"}),
        annotation_prefixes=("@",), single_quote_strings=True,
    ),
    "javascript": LanguageSpec(
        "javascript", "tree_sitter_javascript", "language", "c", _C_CLAUSES,
        annotation_prefixes=("@",), single_quote_strings=True, template_strings=True,
    ),
    "typescript": LanguageSpec(
        "typescript", "tree_sitter_typescript", "language_typescript", "c", _C_CLAUSES,
        annotation_prefixes=("@",), single_quote_strings=True, template_strings=True,
    ),
    "tsx": LanguageSpec(
        "tsx", "tree_sitter_typescript", "language_tsx", "c", _C_CLAUSES,
        annotation_prefixes=("@",), single_quote_strings=True, template_strings=True,
    ),
    "go": LanguageSpec(
        "go", "tree_sitter_go", "language", "c", frozenset({"else", "case", "default"}),
        raw_backtick_strings=True,
    ),
    "rust": LanguageSpec(
        "rust", "tree_sitter_rust", "language", "c", frozenset({"else"}),
        annotation_prefixes=("#[", "#!["), rust_strings=True,
    ),
    "java": LanguageSpec(
        "java", "tree_sitter_java", "language", "c", _C_CLAUSES,
        annotation_prefixes=("@",), text_blocks=True,
    ),
    "c": LanguageSpec("c", "tree_sitter_c", "language", "c", frozenset({"else", "while"})),
    "cpp": LanguageSpec(
        "cpp", "tree_sitter_cpp", "language", "c", _C_CLAUSES, cpp_raw_strings=True,
    ),
}

# LSP languageIds (and a few common aliases) -> canonical name.
_LANGUAGE_IDS: dict[str, str] = {
    "python": "python", "py": "python", "python3": "python",
    "javascript": "javascript", "js": "javascript", "javascriptreact": "javascript",
    "jsx": "javascript", "node": "javascript",
    "typescript": "typescript", "ts": "typescript",
    "typescriptreact": "tsx", "tsx": "tsx",
    "go": "go", "golang": "go",
    "rust": "rust", "rs": "rust",
    "java": "java",
    "c": "c",
    "cpp": "cpp", "c++": "cpp", "cxx": "cpp", "cuda-cpp": "cpp",
}

# File extensions -> canonical name. `.h` is taken as C++: the C++ grammar parses nearly all C
# headers, the C grammar rejects C++ ones.
_EXTENSIONS: dict[str, str] = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "cpp", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp",
    ".hh": "cpp", ".hpp": "cpp", ".hxx": "cpp", ".h++": "cpp", ".ipp": "cpp", ".cu": "cpp",
}


def detect_language(language_id: str, path: str) -> str | None:
    """Canonical language name from an LSP languageId, else from the file extension; None if unknown.

    The languageId wins when it is known; a generic or unknown id ("plaintext", "") falls back
    to the extension. Never raises.
    """
    by_id = _LANGUAGE_IDS.get((language_id or "").strip().lower())
    if by_id is not None:
        return by_id
    _, ext = os.path.splitext(path or "")
    return _EXTENSIONS.get(ext.lower())


def normalize_language(language: str | None) -> str | None:
    """Accept a canonical name or an LSP languageId; anything else is None (unknown)."""
    if language is None:
        return None
    if language in SPECS:
        return language
    return detect_language(language, "")


def spec_for(language: str | None) -> LanguageSpec | None:
    name = normalize_language(language)
    return SPECS.get(name) if name is not None else None


@lru_cache(maxsize=None)
def ts_language(name: str) -> tree_sitter.Language:
    """The tree-sitter `Language` for a canonical name (immutable, so cached)."""
    spec = SPECS[name]
    module = importlib.import_module(spec.module)
    return tree_sitter.Language(getattr(module, spec.entry)())


def new_parser(name: str) -> tree_sitter.Parser:
    """A fresh parser (parsers hold state, so callers own theirs; creating one costs ~1 µs)."""
    return tree_sitter.Parser(ts_language(name))
