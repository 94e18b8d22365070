"""Token healing: the prompt's last tokens are removed and their text (`healed_text`) must
be regenerated first, token by token, so a cursor after an odd split ("    ", "foo.ba")
does not force the model to continue from a token boundary it never saw in training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.prefix_cache import Prefill

MAX_HEALED_TOKENS = 4


def split_for_healing(tokenizer: Tokenizer, ids: list[int]) -> tuple[list[int], str]:
    """Drop trailing tokens up to and including the first one that is not whitespace
    (at most MAX_HEALED_TOKENS, always leaving one): (kept ids, their removed text)."""
    cut = len(ids)
    while cut > 1 and len(ids) - cut < MAX_HEALED_TOKENS:
        cut -= 1
        if tokenizer.decode(ids[cut:]).strip():
            break
    return ids[:cut], tokenizer.decode(ids[cut:])


def consume(remaining: str, token_text: str) -> str:
    """What is left of `remaining` to regenerate after a token with `token_text`."""
    return remaining[len(token_text) :] if remaining.startswith(token_text) else ""


class HealingBias:
    """Additive logit biases [V] (0 allowed, -inf not) for 'the next token must agree with
    `remaining`': its text starts with it, or is a non-empty start of it. Cached per text."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, device: torch.device):
        self._tokenizer, self._vocab_size, self._device = tokenizer, vocab_size, device
        self._cache: dict[str, Tensor] = {}

    def __call__(self, remaining: str) -> Tensor:
        if remaining not in self._cache:
            texts = self._tokenizer.token_texts()[: self._vocab_size]
            allowed = [
                i for i, text in enumerate(texts) if text and (text.startswith(remaining) or remaining.startswith(text))
            ]
            bias = torch.full((self._vocab_size,), float("-inf"), device=self._device)  # [V]
            bias[torch.tensor(allowed, dtype=torch.long, device=self._device)] = 0.0
            self._cache[remaining] = bias
        return self._cache[remaining]


def walk_healing(
    prefill: Callable[[list[int]], "Prefill"], tokenizer: Tokenizer, ids: list[int], healed_text: str, bias: HealingBias
) -> tuple[list[int], str, "Prefill"]:
    """Regenerate the healed text greedily while the model's choice is a strict start of
    it, extending the prompt (cheap with a prefix cache): the k branches then split where
    the healed text ends, not inside it, so they differ in what they add.
    -> (prompt ids, healed text still to regenerate, the prompt's prefill)."""
    state = prefill(ids)
    remaining = healed_text
    while remaining:
        token = int((state.last_logits + bias(remaining)).argmax())
        text = tokenizer.token_texts()[token]
        if len(text) >= len(remaining):
            break
        ids = ids + [token]
        remaining = consume(remaining, text)
        state = prefill(ids)
    return ids, remaining, state
