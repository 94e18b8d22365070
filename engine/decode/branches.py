"""The k branches of one request: each one's tokens and text (`Branch`), the rules that
apply a token to a branch (`BranchTracker`: detokenize, stop strings, EOS, budget) and
the limits that end a request's decoding (`DecodeLimits`, `interrupted`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from kspec.engine.api import CancelToken, goes_on_name
from kspec.engine.decode.healing import HealingBias, consume
from kspec.engine.decode.stopping import StopRule
from kspec.engine.models.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class Branch:
    """One of the k sequences: its tokens, text, and why it ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # "", "stop", "eos", "length", "deadline", "cancelled"
    heal_remaining: str = ""  # healed prompt text this branch has yet to regenerate

    @property
    def done(self) -> bool:
        return bool(self.finish_reason)

    @property
    def logprob(self) -> float:
        return float(sum(self.logprobs))


@dataclass(frozen=True)
class DecodeLimits:
    max_new_tokens: int = 48
    deadline: float | None = None  # time.monotonic() value
    ignore_eos: bool = False  # benchmarks: always generate max_new_tokens
    clock: Callable[[], float] = time.monotonic  # what the deadline is compared with

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class DecodeOutput:
    branches: list[Branch]
    prefill_ms: float
    decode_ms: float
    steps: int


def closed_rest(suffix: str) -> str:
    """The rest of the cursor's line when it is only punctuation (`]`, `)`, `):`, `");`: what the
    editor closed), else ''."""
    rest = suffix.split("\n", 1)[0].rstrip()
    return "" if any(goes_on_name(char) or char.isspace() for char in rest) else rest


def suffix_echoes(tokenizer: Tokenizer, healed_text: str, suffix: str) -> frozenset[int]:
    """Where the rest of the cursor's line is only punctuation (`closed_rest`), the first tokens that
    would write only a start of it, whitespace aside (`]`, `]\n\n\n` after `healed_text`): once
    post-processing cuts what the line holds already, a branch that starts so shows nothing.
    Found through the sorted token texts, not by a vocabulary scan."""
    rest = closed_rest(suffix)
    if not rest:
        return frozenset()
    index, texts = tokenizer.token_text_index(), tokenizer.token_texts()
    found: set[int] = set()
    for end in range(1, len(rest) + 1):
        start = healed_text + rest[:end]
        found.update(token for token in index.starting_with(start) if not texts[token][len(start) :].strip())
    return frozenset(found)


class BranchTracker:
    """Applies a token to a branch: detokenize, stop rules, EOS, budget.

    `healed_text` (token healing) is text the first generated token must start with; it
    was already in the document, so it is not part of the branch's visible text. `suffix`
    (the text after the cursor, where the cursor rules apply): a branch that has written nothing
    yet never takes a token that only repeats what the editor closed on the cursor's line
    (`closed_rest`, `suffix_echoes`)."""

    def __init__(
        self, tokenizer: Tokenizer, rule: StopRule, limits: DecodeLimits, prompt_ids: list[int], healed_text: str = "",
        suffix: str = "",
    ):  # fmt: skip
        self.tokenizer, self.rule, self.limits = tokenizer, rule, limits
        self.prompt_ids = prompt_ids
        self.healed_text = healed_text
        self.closed = closed_rest(suffix)  # '' where no token can only echo the suffix: no work per round
        self._echo_biases: dict[str, torch.Tensor | None] = {}  # the healed text still to write -> [V]: -inf at its echoes (None: none)

    def constrain(self, logits: torch.Tensor, branches: list[Branch], healing: HealingBias) -> torch.Tensor:
        """logits [k, V] with rows still regenerating healed text restricted to agreeing tokens, and
        rows that have written nothing yet kept from echoing the suffix."""
        echoes = [self._echo_bias(b.heal_remaining, logits) if self.closed and not b.text.strip() else None for b in branches]
        if not any(branch.heal_remaining for branch in branches) and all(echo is None for echo in echoes):
            return logits
        zeros = torch.zeros_like(logits[0])  # [V]
        biases = [
            (healing(branch.heal_remaining) if branch.heal_remaining else zeros) + (zeros if echo is None else echo)
            for branch, echo in zip(branches, echoes)
        ]  # fmt: skip
        return logits + torch.stack(biases)  # [k, V]

    def _echo_bias(self, heal_remaining: str, logits: torch.Tensor) -> torch.Tensor | None:
        """[V]: -inf at the tokens that would write `heal_remaining` and then only echo the suffix;
        None where there are none. logits [k, V]: the vocabulary's size and device."""
        if heal_remaining not in self._echo_biases:
            ids = [token for token in suffix_echoes(self.tokenizer, heal_remaining, self.closed) if token < logits.shape[-1]]
            bias = None
            if ids:
                bias = torch.zeros_like(logits[0])  # [V]
                bias[torch.tensor(ids, dtype=torch.long, device=logits.device)] = float("-inf")
            self._echo_biases[heal_remaining] = bias
        return self._echo_biases[heal_remaining]

    def new_detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, self.prompt_ids)

    def fresh(self) -> tuple[Branch, IncrementalDetokenizer]:
        """A branch before its first token, and its detokenizer."""
        return Branch(heal_remaining=self.healed_text), self.new_detokenizer()

    def push(self, branch: Branch, detok: IncrementalDetokenizer, token: int, logprob: float) -> None:
        if branch.done:
            return
        if token in self.tokenizer.stop_ids and not self.limits.ignore_eos:
            branch.finish_reason = "eos"
            return
        branch.token_ids.append(token)
        branch.logprobs.append(logprob)
        if branch.heal_remaining:
            branch.heal_remaining = consume(branch.heal_remaining, self.tokenizer.token_texts()[token])
        piece = detok.push(token)
        if piece:
            text, stopped = self.rule.cut(detok.text[len(self.healed_text) :])
            branch.text = text
            if stopped:
                branch.finish_reason = "stop"
                return
        if len(branch.token_ids) >= self.limits.max_new_tokens:
            branch.finish_reason = "length"


def interrupted(branches: list[Branch], limits: DecodeLimits, cancel: CancelToken | None) -> bool:
    """Cancelled or past the deadline: every live branch ends with that reason."""
    reason = ""
    if cancel is not None and cancel.cancelled:
        reason = "cancelled"
    elif limits.deadline is not None and limits.clock() > limits.deadline:
        reason = "deadline"
    if reason:
        for branch in branches:
            if not branch.done:
                branch.finish_reason = reason
    return bool(reason)
