"""Drafters propose up to γ tokens per branch each round; the target verifies them.

A drafter sees each live branch's history (its generated tokens, the last one not yet
verified) and returns one `Draft` per branch. `keep(rows)` follows the target when
finished branches leave the batch.

* `PromptLookupDrafter` — no model: the branch's last n tokens are looked up in the
  prompt and the branch's own text, then in its sibling branches' text (the k branches part at
  their first token and often write the same line after it); the tokens that followed the
  latest match are the draft, the longest n-gram first (up to 6: on code the draft after a
  6-token match is accepted far more often than after a 1-token one).
* `ModelDrafter` — a small model with the target's tokenizer, with its own shared-prefix
  KV for the same k branches. It keeps, per branch, the tokens whose KV it holds and
  rolls back to the longest common prefix with the branch's history, so rejected drafts
  are undone without any message from the verifier.
* `NoDrafter` — proposes nothing (plain decoding through the same loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from kspec.engine.cache.kv import BranchKVCache
from kspec.engine.models.transformer import EarlyExit, Transformer
from kspec.engine.cache.prefix_cache import PrefixCache, common_prefix_length
from kspec.engine.decode.sampling import SamplingParams, probabilities
from kspec.kernels.transfer import to_device

GAMMA_LIMIT = 16  # the longest draft any drafter is asked for


@dataclass
class Draft:
    tokens: list[int]
    q: Tensor | None = None  # [len(tokens), V] the drafter's distributions (None: deterministic draft)
    evidence: str = ""  # what found it (its tokens' chances: engine/decode/speculative.py DraftBudget); "" not said

    def cut(self, length: int) -> None:
        """Keep the first `length` tokens (and their distributions)."""
        self.tokens = self.tokens[:length]
        self.q = self.q[:length] if self.q is not None and length > 0 else None


class Drafter(Protocol):
    name: str

    def begin(self, prompt_ids: list[int], k: int, max_new_tokens: int) -> None: ...

    def propose(self, histories: list[list[int]], gamma: int) -> list[Draft]: ...

    def keep(self, rows: list[int]) -> None: ...


class NoDrafter:
    name = "none"

    def begin(self, prompt_ids: list[int], k: int, max_new_tokens: int) -> None:
        pass

    def propose(self, histories: list[list[int]], gamma: int) -> list[Draft]:
        return [Draft([]) for _ in histories]

    def keep(self, rows: list[int]) -> None:
        pass


@dataclass(frozen=True)
class LookupConfig:
    max_ngram: int = 6
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")


class PromptLookupDrafter:
    name = "lookup"

    def __init__(self, config: LookupConfig = LookupConfig()):
        self.config = config
        self._prompt: list[int] = []
        self._prompt_places: dict[int, list[int]] = {}  # token -> its positions in the prompt, ascending

    def begin(self, prompt_ids: list[int], k: int, max_new_tokens: int) -> None:
        self._prompt = list(prompt_ids)
        self._prompt_places = _places(self._prompt)

    def propose(self, histories: list[list[int]], gamma: int) -> list[Draft]:
        drafts = []
        for row, history in enumerate(histories):
            siblings = [other for other_row, other in enumerate(histories) if other_row != row]
            drafts.append(self._lookup(history, siblings, gamma))
        return drafts

    def _lookup(self, history: list[int], siblings: list[list[int]], gamma: int) -> Draft:
        """The γ tokens after the latest earlier occurrence of the sequence's (prompt + history)
        last n-gram in the sequence itself, else in a sibling's generated tokens; the longest n
        with a match wins. Each text's candidates are the places of the sequence's last token,
        and how far back each agrees with the sequence's end."""
        prompt, top, bottom = self._prompt, self.config.max_ngram, self.config.min_ngram
        sequence_length = len(prompt) + len(history)
        if sequence_length <= bottom:
            return Draft([])

        def at(i: int) -> int:  # the sequence's token i, not building prompt + history
            return prompt[i] if i < len(prompt) else history[i - len(prompt)]

        last = at(sequence_length - 1)
        longest = min(top, sequence_length - 1)  # an n-gram needs a token after it

        def agreement(text_at: Callable[[int], int], end: int) -> int:  # tokens ending at `end` equal to the sequence's end
            n = 1
            while n < longest and end - n >= 0 and text_at(end - n) == at(sequence_length - 1 - n):
                n += 1
            return n

        # (match length, end) in the sequence: prompt places of the last token, then the history's
        own = [(agreement(at, end), end) for end in self._prompt_places.get(last, []) if end < sequence_length - 1]
        own += [(agreement(at, end), end) for end in range(len(prompt), sequence_length - 1) if history[end - len(prompt)] == last]
        by_sibling = [
            [(agreement(sibling.__getitem__, end), end) for end in range(len(sibling) - 1) if sibling[end] == last]
            for sibling in siblings
        ]
        for n in range(longest, bottom - 1, -1):
            ends = [end for length, end in own if length >= n]
            if ends:  # the latest one (ends ascending)
                start = ends[-1] + 1
                return Draft([at(i) for i in range(start, min(start + gamma, sequence_length))], evidence=f"own{n}")
            for sibling, found in zip(siblings, by_sibling):
                ends = [end for length, end in found if length >= n]
                if ends:
                    return Draft(sibling[ends[-1] + 1 : ends[-1] + 1 + gamma], evidence=f"sibling{n}")
        return Draft([])

    def keep(self, rows: list[int]) -> None:
        pass


def _places(tokens: list[int]) -> dict[int, list[int]]:
    """token -> its positions in tokens, ascending."""
    places: dict[int, list[int]] = {}
    for position, token in enumerate(tokens):
        places.setdefault(token, []).append(position)
    return places


class ModelDrafter:
    name = "model"

    def __init__(self, model: Transformer | EarlyExit, params: SamplingParams, prefix_cache: PrefixCache | None = None):
        self.model, self.params = model, params
        self.prefix_cache = prefix_cache or PrefixCache()
        self._generator = torch.Generator().manual_seed(params.seed + 1)
        self._cache: BranchKVCache | None = None
        self._cached: list[list[int]] = []  # per branch: generated tokens whose KV the draft cache holds

    def begin(self, prompt_ids: list[int], k: int, max_new_tokens: int) -> None:
        prefill = self.prefix_cache.prefill(self.model, prompt_ids)
        self._cache = BranchKVCache.from_prompt(prefill.cache, k, max_new_tokens + GAMMA_LIMIT + 2)
        self._cached = [[] for _ in range(k)]

    def propose(self, histories: list[list[int]], gamma: int) -> list[Draft]:
        cache = self._cache
        if cache is None:
            raise RuntimeError("ModelDrafter.propose before begin")
        if gamma == 0:
            return [Draft([]) for _ in histories]
        # roll each branch back to what it shares with its verified history, then feed the rest
        # (always at least the branch's last, unverified token)
        pending: list[list[int]] = []
        for row, history in enumerate(histories):
            shared = common_prefix_length(tuple(self._cached[row]), history[:-1])
            cache.truncate(row, shared)
            self._cached[row] = history[:shared]
            pending.append(history[shared:])
        steps: list[Tensor] = []  # each step's tokens [k], kept on the device until the end
        distributions: list[Tensor] = []  # each step's q [k, V] (sampling)
        with torch.inference_mode():
            logits = self._feed(cache, pending)  # [k, V]
            for step in range(gamma):
                tokens, q = self._choose(logits)  # [k], [k, V] or None
                steps.append(tokens)
                if q is not None:
                    distributions.append(q)
                if step == gamma - 1:
                    break
                logits = self.model.step(tokens[:, None], cache)
            drafted: list[list[int]] = torch.stack(steps, dim=1).tolist()  # [k, γ]: the drafts' one transfer
            q_rows = torch.stack(distributions, dim=1) if distributions else None  # [k, γ, V]
        for row, history in enumerate(histories):  # the cache now holds the history and all drafts but the last
            self._cached[row] = history + drafted[row][:-1]
        return [Draft(tokens, q_rows[row] if q_rows is not None else None) for row, tokens in enumerate(drafted)]

    def _feed(self, cache: BranchKVCache, pending: list[list[int]]) -> Tensor:
        """Write each branch's pending tokens (ragged, >= 1 each); logits after the last of each [k, V]."""
        counts = [len(p) for p in pending]
        width = max(counts)
        padded = to_device([p + [0] * (width - len(p)) for p in pending], torch.int64, self.model.device)  # [k, T]
        hidden = self.model(padded, cache)  # [k, T, dim]
        cache.advance(counts)
        last = to_device(counts, torch.int64, self.model.device) - 1
        return self.model.logits(hidden[torch.arange(len(pending), device=last.device), last])

    def _choose(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.params.greedy:
            return logits.argmax(dim=-1), None
        q = probabilities(logits, self.params)  # [k, V]
        return torch.multinomial(q, 1, generator=self._generator).squeeze(-1), q

    def keep(self, rows: list[int]) -> None:
        if self._cache is not None:
            self._cache.keep(rows)
            self._cached = [self._cached[row] for row in rows]

