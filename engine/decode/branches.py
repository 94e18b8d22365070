"""The k branches of one request: each one's tokens and text (`Branch`), the rules that
apply a token to a branch (`BranchTracker`: detokenize, stop strings, EOS, budget) and
the limits that end a request's decoding (`DecodeLimits`, `interrupted`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from kspec.engine.api import CancelToken
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


class BranchTracker:
    """Applies a token to a branch: detokenize, stop rules, EOS, budget.

    `healed_text` (token healing) is text the first generated token must start with; it
    was already in the document, so it is not part of the branch's visible text."""

    def __init__(
        self, tokenizer: Tokenizer, rule: StopRule, limits: DecodeLimits, prompt_ids: list[int], healed_text: str = ""
    ):
        self.tokenizer, self.rule, self.limits = tokenizer, rule, limits
        self.prompt_ids = prompt_ids
        self.healed_text = healed_text

    def constrain(self, logits: torch.Tensor, branches: list[Branch], healing: HealingBias) -> torch.Tensor:
        """logits [k, V] with rows still regenerating healed text restricted to agreeing tokens."""
        if not any(branch.heal_remaining for branch in branches):
            return logits
        biases = [healing(b.heal_remaining) if b.heal_remaining else torch.zeros_like(logits[0]) for b in branches]
        return logits + torch.stack(biases)  # [k, V]

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
