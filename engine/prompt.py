"""The prompt for a cursor: the text before it (and after it, through the model's FIM
template when it has one) under a token budget."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kspec.engine.decode.healing import split_for_healing
from kspec.engine.models.tokenizer import Tokenizer

CHARS_PER_TOKEN_BOUND = 8  # no tokenizer here averages more; used to pre-cut text before encoding


@dataclass(frozen=True)
class PromptBudget:
    max_tokens: int = 1536
    suffix_share: float = 0.25  # of max_tokens, when the model has FIM tokens

    def __post_init__(self) -> None:
        if self.max_tokens < 16:
            raise ValueError(f"prompt budget must be >= 16 tokens, got {self.max_tokens}")
        if not 0.0 <= self.suffix_share < 1.0:
            raise ValueError(f"suffix_share must be in [0, 1), got {self.suffix_share}")


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    uses_fim: bool
    healed_text: str = ""  # text of the prompt's last token, removed so the model can re-choose it (token healing)


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


LINE_GRID = 32  # the prompt starts at a line whose number is a multiple of this


def _stable_tail_tokens(tokenizer: Tokenizer, text: str, budget: int) -> list[int]:
    """The tokens of text from the earliest line start on a fixed grid (every LINE_GRID
    lines of the document) that fits the budget. While the user types, that start stays
    put until the text outgrows it, so consecutive keystrokes share the beginning of
    their prompt and the prefix cache hits; a start that moved with every keystroke
    would make every prompt new."""
    if len(text) <= budget:  # fewer characters than tokens allowed: all of it fits
        return tokenizer.encode(text)
    line_starts = [0] + [match.end() for match in re.finditer("\n", text)]
    grid = [start for number, start in enumerate(line_starts) if number % LINE_GRID == 0]
    # no tokenizer packs more than CHARS_PER_TOKEN_BOUND characters into a token: skip starts that cannot fit
    candidates = [start for start in grid if len(text) - start <= budget * CHARS_PER_TOKEN_BOUND]
    low, high, best = 0, len(candidates) - 1, None
    while low <= high:  # later start -> fewer tokens: find the earliest that fits
        middle = (low + high) // 2
        ids = tokenizer.encode(text[candidates[middle] :])
        if len(ids) <= budget:
            best, high = ids, middle - 1
        else:
            low = middle + 1
    return best if best is not None else _tail_tokens(tokenizer, text, budget)


def _head_tokens(tokenizer: Tokenizer, text: str, budget: int) -> list[int]:
    text = text[: budget * CHARS_PER_TOKEN_BOUND]
    return tokenizer.encode(text)[:budget]


def build_prompt(tokenizer: Tokenizer, prefix: str, suffix: str, budget: PromptBudget) -> Prompt:
    """The prefix's last tokens are held back for token healing (engine/decode/healing.py)."""
    fim = tokenizer.fim
    suffix_ids: list[int] = []
    if fim is not None:
        suffix_budget = int(budget.max_tokens * budget.suffix_share)
        suffix_ids = _head_tokens(tokenizer, suffix, suffix_budget) if suffix_budget else []
    prefix_ids = _stable_tail_tokens(tokenizer, prefix, budget.max_tokens - len(suffix_ids) - 3)
    prefix_ids, healed_text = split_for_healing(tokenizer, prefix_ids)
    if fim is None:
        return Prompt(prefix_ids, uses_fim=False, healed_text=healed_text)
    # PSM order, shared by Qwen2.5-Coder, StarCoder2, DeepSeek-Coder and CodeLlama
    return Prompt([fim.prefix, *prefix_ids, fim.suffix, *suffix_ids, fim.middle], uses_fim=True, healed_text=healed_text)
