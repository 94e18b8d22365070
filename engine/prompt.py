"""The prompt for a cursor: the text before it (and after it, through the model's FIM
template when it has one) under a token budget."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kspec.engine.api import CONTEXT_SHARE, SUFFIX_SHARE, ContextFile
from kspec.engine.context_prompt import context_block
from kspec.engine.decode.healing import split_for_healing
from kspec.engine.models.tokenizer import Tokenizer

CHARS_PER_TOKEN_BOUND = 8  # no tokenizer here averages more; used to pre-cut text before encoding


@dataclass(frozen=True)
class PromptBudget:
    max_tokens: int = 1536
    suffix_share: float = SUFFIX_SHARE  # of max_tokens, when the model has FIM tokens
    context_share: float = CONTEXT_SHARE  # other files' context before the file's text: at most this share of max_tokens
    suffix_tokens: int | None = None  # and at most this many (the machine fit's: machine_fit.SUFFIX_REREAD_MS)

    def __post_init__(self) -> None:
        if self.max_tokens < 16:
            raise ValueError(f"prompt budget must be >= 16 tokens, got {self.max_tokens}")
        if not 0.0 <= self.suffix_share < 1.0:
            raise ValueError(f"suffix_share must be in [0, 1), got {self.suffix_share}")
        if not 0.0 <= self.context_share <= 1.0:
            raise ValueError(f"context_share must be in [0, 1], got {self.context_share}")
        if self.suffix_tokens is not None and self.suffix_tokens < 0:
            raise ValueError(f"suffix_tokens must be >= 0, got {self.suffix_tokens}")

    @property
    def suffix_budget(self) -> int:
        """Tokens of the text after the cursor, at most."""
        share = int(self.max_tokens * self.suffix_share)
        return share if self.suffix_tokens is None else min(share, self.suffix_tokens)


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    uses_fim: bool
    healed_text: str = ""  # text of the prompt's last token, removed so the model can re-choose it (token healing)
    context_tokens: int = 0  # of ids, other files' context at the start
    context_files: tuple[str, ...] = ()  # the paths of that context


def _tail_tokens(tokenizer: Tokenizer, text: str, budget: int) -> list[int]:
    """The last <= budget tokens of text, cut at a line start where possible."""
    text = text[-budget * CHARS_PER_TOKEN_BOUND :]
    ids = tokenizer.encode(text)
    while len(ids) > budget:
        excess_chars = (len(ids) - budget) * 2  # a token holds >= 1 char; cutting 2 per excess token converges fast
        next_line = text.find("\n", excess_chars)
        text = text[next_line + 1 :] if next_line != -1 else text[excess_chars:]
        ids = tokenizer.encode(text)
    return ids


FRESH_SHARE = 0.8  # a new prompt start leaves this share of the budget used: the rest is room to type into
ANCHOR_CHARS = 256  # the text a remembered start is found again by
REMEMBERED_STARTS = 32


class PromptStarts:
    """Where recent prompts began, remembered by the text there (up to `ANCHOR_CHARS`) and by
    what the prompt put before it (`lead`: other files' context), the most recent first: the
    next keystroke's prompt begins at the same place while the text from there still fits its
    budget, so that it shares its beginning with the prompt the prefix cache holds. A start
    found by position instead would move: `prefix` is often a window cut a fixed number of
    characters before the cursor (the language server's `prefixChars`), whose start slides with
    every keystroke. A start remembered behind another lead is not used: the cache does not hold
    the text after a changed context anyway, and that start, fitted to another budget, may leave
    no room to type into (the next keystroke would move it and prefill the file again). One per
    engine; not thread-safe (requests are prepared one at a time)."""

    def __init__(self, remembered: int = REMEMBERED_STARTS) -> None:
        self.remembered = remembered
        self._anchors: OrderedDict[tuple[int, str], None] = OrderedDict()

    def found_in(self, text: str, lead: Sequence[int] = ()) -> list[int]:
        """Line starts of `text` where a start remembered behind `lead` is, most recently used first."""
        places = []
        key = _lead_key(lead)
        for lead_key, anchor in reversed(self._anchors):
            at = text.find(anchor) if lead_key == key else -1
            if at > 0 and text[at - 1] == "\n":
                places.append(at)
        return places

    def remember(self, text: str, start: int, lead: Sequence[int] = ()) -> None:
        """`text[start:]` begins a prompt (a line start before the cursor's line), after `lead`."""
        anchor = text[start : min(start + ANCHOR_CHARS, text.rfind("\n") + 1)]
        if not anchor:
            return
        key = (_lead_key(lead), anchor)
        self._anchors.pop(key, None)
        self._anchors[key] = None
        while len(self._anchors) > self.remembered:
            self._anchors.popitem(last=False)


def _lead_key(lead: Sequence[int]) -> int:
    return hash(tuple(lead))


def _stable_tail_tokens(
    tokenizer: Tokenizer, text: str, budget: int, starts: PromptStarts | None = None, lead: Sequence[int] = ()
) -> list[int]:
    """The tokens of text from a line start, within the budget: where a recent prompt began
    (`starts`) if the text from there still fits, else the earliest line start whose tokens
    fit `FRESH_SHARE` of the budget (remembered in `starts`). While the user types, the start
    stays put until the text outgrows the budget, so consecutive keystrokes share the
    beginning of their prompt and the prefix cache hits; a start that moved with every
    keystroke would make every prompt new. The text's first line (a window's, cut anywhere)
    is never a start. `lead`: the tokens the prompt puts before the text (see PromptStarts)."""
    if len(text) <= budget:  # fewer characters than tokens allowed: all of it fits
        return tokenizer.encode(text)
    # no tokenizer packs more than CHARS_PER_TOKEN_BOUND characters into a token: skip starts that cannot fit
    reach = len(text) - budget * CHARS_PER_TOKEN_BOUND
    for start in starts.found_in(text, lead) if starts is not None else ():
        if start >= reach and len(ids := tokenizer.encode(text[start:])) <= budget:
            starts.remember(text, start, lead)  # type: ignore[union-attr]
            return ids
    candidates = [m.end() for m in re.finditer("\n", text) if m.end() >= reach]
    fresh = max(1, int(budget * FRESH_SHARE))
    low, high, best = 0, len(candidates) - 1, None
    while low <= high:  # later start -> fewer tokens: find the earliest that fits
        middle = (low + high) // 2
        ids = tokenizer.encode(text[candidates[middle] :])
        if len(ids) <= fresh:
            best, high = (candidates[middle], ids), middle - 1
        else:
            low = middle + 1
    if best is None:
        return _tail_tokens(tokenizer, text, budget)
    if starts is not None:
        starts.remember(text, best[0], lead)
    return best[1]


def _head_tokens(tokenizer: Tokenizer, text: str, budget: int) -> list[int]:
    text = text[: budget * CHARS_PER_TOKEN_BOUND]
    return tokenizer.encode(text)[:budget]


def build_prompt(
    tokenizer: Tokenizer, prefix: str, suffix: str, budget: PromptBudget, starts: PromptStarts | None = None,
    context: tuple[ContextFile, ...] = (), path: str = "", language: str = "",
) -> Prompt:  # fmt: skip
    """The prefix's last tokens are held back for token healing (engine/decode/healing.py).
    `starts`: where recent prompts began (the engine's), so that this one begins there too
    while it fits. `context` (other files) goes first, within `budget.context_share`, so that
    it stays at the start of consecutive keystrokes' prompts (engine/context_prompt.py); the
    file's text gets the rest of the budget."""
    fim = tokenizer.fim
    block = context_block(tokenizer, context, path, language, int(budget.max_tokens * budget.context_share))
    suffix_ids: list[int] = []
    if fim is not None:
        suffix_ids = _head_tokens(tokenizer, suffix, budget.suffix_budget) if budget.suffix_budget else []
    prefix_ids = _stable_tail_tokens(tokenizer, prefix, budget.max_tokens - len(block.ids) - len(suffix_ids) - 3, starts, block.ids)
    prefix_ids, healed_text = split_for_healing(tokenizer, prefix_ids)
    extra = {"context_tokens": len(block.ids), "context_files": block.files}
    if fim is None:
        return Prompt([*block.ids, *prefix_ids], uses_fim=False, healed_text=healed_text, **extra)
    # PSM order, shared by Qwen2.5-Coder, StarCoder2, DeepSeek-Coder and CodeLlama
    ids = [*block.ids, fim.prefix, *prefix_ids, fim.suffix, *suffix_ids, fim.middle]
    return Prompt(ids, uses_fim=True, healed_text=healed_text, **extra)
