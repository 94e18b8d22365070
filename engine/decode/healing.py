"""Token healing: the prompt's last tokens are removed and their text (`healed_text`) must
be regenerated first, token by token, so a cursor after an odd split ("    ", "foo.ba")
does not force the model to continue from a token boundary it never saw in training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from kspec.engine.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    from kspec.engine.cache.prefix_cache import Prefill

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
    `remaining`': its text starts with it, or is a non-empty start of it. Cached per text.

    Tokens starting with `remaining` are one contiguous run of the sorted token texts
    (found by bisection); tokens that are a start of it are looked up by each of its
    prefixes: no scan of the vocabulary per request."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, device: torch.device):
        self.vocab_size, self.device = vocab_size, device  # what a bias [V] of the same logits is built with
        self._index = tokenizer.token_text_index()
        self._cache: dict[str, Tensor] = {}

    def allowed_ids(self, remaining: str) -> list[int]:
        allowed = self._index.starting_with(remaining)
        for end in range(1, len(remaining)):
            allowed.extend(self._index.exactly(remaining[:end]))
        return [i for i in allowed if i < self.vocab_size]

    def __call__(self, remaining: str) -> Tensor:
        if remaining not in self._cache:
            bias = torch.full((self.vocab_size,), float("-inf"), device=self.device)  # [V]
            bias[torch.tensor(self.allowed_ids(remaining), dtype=torch.long, device=self.device)] = 0.0
            self._cache[remaining] = bias
        return self._cache[remaining]


def walk_healing(
    prefill: Callable[[list[int]], "Prefill"],
    tokenizer: Tokenizer,
    ids: list[int],
    healed_text: str,
    bias: HealingBias,
    first: "Prefill | None" = None,
) -> tuple[list[int], str, "Prefill"]:
    """Regenerate the healed text greedily while the model's choice is a strict start of
    it, extending the prompt (cheap with a prefix cache): the k branches then split where
    the healed text ends, not inside it, so they differ in what they add.
    `first`: the prefill of `ids` when the caller already has it.
    -> (prompt ids, healed text still to regenerate, the prompt's prefill)."""
    state = first or prefill(ids)
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
