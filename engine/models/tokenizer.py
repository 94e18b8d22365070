"""The model's own tokenizer (HF `tokenizers`, local tokenizer.json only), FIM tokens, and
incremental detokenization that never splits a multi-byte character."""

from __future__ import annotations

import bisect
import json
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from kspec.engine.api import goes_on_name
from kspec.engine.errors import ModelLoadError


REPLACEMENT_CHAR = "\ufffd"

# FIM token spellings per model family: (prefix, suffix, middle)
FIM_SPELLINGS: tuple[tuple[str, str, str], ...] = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder / StarCoder2
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama
)
# Tokens that end a completion: end of text or turn, and the repository format's separators (a
# model that writes `<|file_sep|>` / `<|repo_name|>` has left the file). Qwen2.5-Coder's are
# `<|endoftext|>`, `<|im_end|>`, `<|fim_pad|>`, `<|file_sep|>`, `<|repo_name|>`.
STOP_TOKEN_SPELLINGS = (
    "<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>",
    "<|file_separator|>", "<file_sep>", "<EOT>", "<｜end▁of▁sentence｜>", "</s>",
)  # fmt: skip


class TokenTextIndex:
    """The token texts sorted, for prefix queries without a scan of the vocabulary: the tokens
    whose text starts with (or is) a string are one contiguous run, found by bisection. Holds the
    sorted texts (the tokenizer's own strings) and their ids as a compact array: ~2.5 MB for a
    152k vocabulary, where a dict of id lists by text took ~30 MB."""

    def __init__(self, texts: list[str]):
        order = sorted((text, i) for i, text in enumerate(texts) if text)
        self.texts = [text for text, _ in order]
        self.ids = array("l", [i for _, i in order])

    def _starts(self, text: str) -> tuple[int, int]:
        """[low, high) of the texts that start with `text`: from `text` to the first string after
        every such text (its last character that can grow, grown by one)."""
        grown = text.rstrip(chr(sys.maxunicode))
        high = bisect.bisect_left(self.texts, grown[:-1] + chr(ord(grown[-1]) + 1)) if grown else len(self.texts)
        return bisect.bisect_left(self.texts, text), high

    def starting_with(self, text: str) -> list[int]:
        """The ids of the tokens whose text starts with `text` (itself included)."""
        low, high = self._starts(text)
        return list(self.ids[low:high])

    def exactly(self, text: str) -> list[int]:
        """The ids of the tokens whose text is `text`."""
        low, high = bisect.bisect_left(self.texts, text), bisect.bisect_right(self.texts, text)
        return list(self.ids[low:high])

    def continuing(self, text: str) -> list[tuple[int, str]]:
        """(id, token text) of the tokens whose text starts with `text` and is longer."""
        low, high = self._starts(text)
        return [(self.ids[at], self.texts[at]) for at in range(low, high) if len(self.texts[at]) > len(text)]


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, eos_ids: tuple[int, ...]):
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.fim = self._find_fim()
        stops = {tid for tid in (tokenizer.token_to_id(s) for s in STOP_TOKEN_SPELLINGS) if tid is not None}
        if self.fim is not None:  # a FIM token written inside the hole is never part of the answer
            stops |= {self.fim.prefix, self.fim.suffix, self.fim.middle}
        self.stop_ids: frozenset[int] = frozenset(stops | set(eos_ids))
        self._token_texts: list[str] | None = None
        self._text_index: TokenTextIndex | None = None
        self._word_starts: list[int] | None = None
        self._name_ends: list[int] | None = None
        self._blanks: frozenset[int] | None = None
        self._word_start_set: frozenset[int] | None = None

    @classmethod
    def from_folder(cls, folder: Path, eos_ids: tuple[int, ...] = ()) -> "Tokenizer":
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no tokenizer.json (the model's fast-tokenizer file is required)")
        try:
            tokenizer = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ModelLoadError(f"{path}: unreadable tokenizer ({exc})") from exc
        config_path = folder / "tokenizer_config.json"
        if config_path.is_file():
            try:
                eos = json.loads(config_path.read_text()).get("eos_token")
                eos_text = eos.get("content") if isinstance(eos, dict) else eos
                eos_id = tokenizer.token_to_id(eos_text) if isinstance(eos_text, str) else None
                eos_ids = eos_ids + ((eos_id,) if eos_id is not None else ())
            except (OSError, json.JSONDecodeError):
                pass
        return cls(tokenizer, eos_ids)

    def _find_fim(self) -> FimTokens | None:
        for spelling in FIM_SPELLINGS:
            ids = [self._tok.token_to_id(s) for s in spelling]
            if all(i is not None for i in ids):
                return FimTokens(*ids)  # type: ignore[arg-type]
        return None

    def special_id(self, spelling: str) -> int | None:
        """The id of a special token (`<|file_sep|>`, ...) when the vocabulary has it."""
        return self._tok.token_to_id(spelling)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_texts(self) -> list[str]:
        """The text of every token id on its own (computed once per tokenizer)."""
        if self._token_texts is None:
            self._token_texts = [self._tok.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)]
        return self._token_texts

    def word_start_ids(self) -> list[int]:
        """The tokens whose text begins with an identifier character (`goes_on_name`): after a
        whole name, these would run it on into another (computed once)."""
        if self._word_starts is None:
            self._word_starts = [i for i, text in enumerate(self.token_texts()) if goes_on_name(text[:1])]
        return self._word_starts

    def word_start_set(self) -> frozenset[int]:
        """`word_start_ids` as a set (computed once)."""
        if self._word_start_set is None:
            self._word_start_set = frozenset(self.word_start_ids())
        return self._word_start_set

    def blank_ids(self) -> frozenset[int]:
        """The tokens whose text is only whitespace (indentation, line ends; computed once)."""
        if self._blanks is None:
            self._blanks = frozenset(i for i, text in enumerate(self.token_texts()) if text and not text.strip())
        return self._blanks

    def name_end_ids(self) -> list[int]:
        """The tokens with text that does not begin with an identifier character: a name ends
        before them (computed once)."""
        if self._name_ends is None:
            self._name_ends = [i for i, text in enumerate(self.token_texts()) if text and not goes_on_name(text[0])]
        return self._name_ends

    def token_text_index(self) -> TokenTextIndex:
        """The token texts sorted for prefix queries (computed once)."""
        if self._text_index is None:
            self._text_index = TokenTextIndex(self.token_texts())
        return self._text_index

    def vocabulary(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)


class IncrementalDetokenizer:
    """Turns a growing token list into text pieces; holds back bytes of an unfinished character.

    Decodes a short window (a few tokens before the last emitted point) rather than the
    whole sequence, so the cost per token stays constant.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: list[int] | None = None):
        self._tokenizer = tokenizer
        self._ids: list[int] = list(context_ids or [])[-4:]
        self._prefix_offset = 0  # window start
        self._read_offset = len(self._ids)  # tokens up to here are already emitted
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; returns the newly completed text (maybe empty)."""
        self._ids.append(token_id)
        before = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""  # an unfinished multi-byte character: wait for its next bytes
        piece = after[len(before) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self.text += piece
        return piece
