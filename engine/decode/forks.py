"""Diverse branches that split where the model hesitates, not only at the first token.

Mode "diverse" gives the k branches k different first tokens. Where the model is sure of its
first token (the rest of a half-typed name, the one keyword that fits), the other first tokens
are misspellings: `json.lo|` → `ads(…)`, `ad(…)`, `a(…)`. So only first tokens the model finds
plausible start branches of their own: a token whose probability is at least `min_ratio` of the
likeliest one's. The other branches start like the likeliest one and wait (`LaterForks`): at the
first position of that greedy path where the model finds other tokens plausible, the waiting
branches take them, the likeliest alternative first, one branch each; branches left over wait
for the next such position. A waiting branch that reaches the greedy path's end, or the end of its
first line, without one goes back to the most likely split its path offered (its KV rolled back to that position) and decodes
from there; only where the path offered none does it end as a copy of the greedy branch, which
deduplication merges: fewer alternatives only where the model sees no other.

A waiting branch decodes one token a round (no drafts): the decision is made on the target's
logits at position 0 of its row, where `SpeculativeRun.accept` applies its constraints. The
forced token keeps its own log-probability (the ranking reads it), not the constraint's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Collection

import torch
from torch import Tensor

from kspec.engine.api import goes_on_name
from kspec.engine.decode.branches import Branch
from kspec.engine.decode.sampling import distinct_first_tokens
from kspec.engine.models.tokenizer import Tokenizer


def plausible_first_tokens(logits: Tensor, k: int, banned: frozenset[int], min_ratio: float) -> tuple[Tensor, Tensor, int]:
    """logits [V] -> k first tokens [k] and their log-probabilities [k], and how many of them are
    plausible: `distinct_first_tokens`' leading ones at least `min_ratio` times as likely as the best
    (min_ratio 0: all k, as plain diverse mode); the rows after those repeat the best."""
    tokens, logprobs = distinct_first_tokens(logits, k, banned)  # [k], [k]: likeliest first
    floor = float(logprobs[0]) + math.log(min_ratio) if min_ratio > 0 else float("-inf")
    ids, values = tokens.tolist(), logprobs.tolist()
    plausible = 1
    while plausible < k and ids[plausible] != ids[0] and values[plausible] >= floor:
        plausible += 1
    tokens[plausible:], logprobs[plausible:] = tokens[0], logprobs[0]
    return tokens, logprobs, plausible


_A_LINE = re.compile(r"\S[^\n]*\n")
RATIO_DIGITS = 2  # splits are compared at this precision (log-space): a batch's rounding must not reorder near-ties
LOOKBACK_MIN_RATIO = 0.01  # a split found looking back: its token at least this likely relative to the greedy one
LOOKBACK_FLOOR = math.log(LOOKBACK_MIN_RATIO)


def begins_a_word(text: str, healed: str) -> bool:
    """Whether a first token's `text` writes something after the healed text (not only more of its
    spelling or whitespace), and does not go on with a name the healed text ends inside (that is
    another spelling of the name being typed: `retu` -> `reture`)."""
    written = text[len(healed) :]
    in_name = bool(healed) and goes_on_name(healed[-1]) and bool(written) and goes_on_name(written[0])
    return text.startswith(healed) and bool(written.strip()) and not in_name


def wrote_a_line(text: str) -> bool:
    """Whether `text` holds a whole line with something on it (the greedy path's first line is done)."""
    return _A_LINE.search(text) is not None


@dataclass(frozen=True)
class Split:
    """Where a waiting branch leaves the greedy path: after `path`, `token` instead of the greedy one."""

    path: tuple[int, ...]  # the branch's tokens before the split
    token: int
    logprob: float
    ratio: float  # log(p(token) / p(greedy token)) <= 0

    @property
    def position(self) -> int:
        return len(self.path)


@dataclass
class LaterForks:
    """The branches still waiting to split from the greedy path, the splits seen on it, and the
    forced tokens of this round. A waiting branch splits at once where an alternative is at least
    `min_ratio` as likely as the greedy token; one that reaches its end without such a place goes
    back to the best split its path offered (`take_split`: at least LOOKBACK_MIN_RATIO as likely,
    not taken by another branch) and decodes from there."""

    min_ratio: float
    banned: frozenset[int]  # never an alternative: stop tokens and whitespace
    word_starts: frozenset[int] = frozenset()  # tokens that begin with an identifier character
    waiting: set[int] = field(default_factory=set)  # branch indices
    taken_logprobs: dict[int, float] = field(default_factory=dict)  # row -> the forced token's own log-probability (this round)
    forked: int = 0  # branches that split after their first token
    seen: list[Split] = field(default_factory=list)  # splits the waiting branches' paths offered, not taken
    _taken: set[tuple[int, int]] = field(default_factory=set)  # (position, token) of splits branches took
    _banned_mask: Tensor | None = None  # [V]: `banned` as a mask, built on first use

    @classmethod
    def starting(cls, min_ratio: float, tokenizer: Tokenizer, candidates: set[int], forced: Collection[int]) -> "LaterForks":
        """The forks of a run whose `candidates` branches start as the best one: they wait to split,
        but those that start `forced` only once their start is undone. Never an alternative: a stop
        token, or whitespace (a formatting variant of the greedy text)."""
        if not candidates:
            return cls(min_ratio, tokenizer.stop_ids)
        return cls(min_ratio, tokenizer.stop_ids | tokenizer.blank_ids(), tokenizer.word_start_set(), candidates - set(forced))

    def offer_first(self, first_logits: Tensor, started: list[int], begins_a_word: Callable[[int], bool]) -> None:
        """The first tokens that did not start a branch (first_logits [V], `started`: those that did)
        are splits at position 0 for the waiting branches to go back to: the last resort, however
        unlikely, so that k branches still write k texts where the path offered no other split.
        Only those that `begins_a_word` (not another spelling of text being healed, not whitespace)."""
        self._taken |= {(0, token) for token in started}
        if self.waiting:
            logprobs = torch.log_softmax(first_logits.float(), dim=-1)  # [V]
            wanted = 4 * (len(self.waiting) + len(started))  # room for the ones `begins_a_word` turns down
            self.seen += [s for s in self._alternatives((), logprobs, wanted, floor=float("-inf")) if begins_a_word(s.token)]

    def rows(self, live: list[int], branches: list[Branch]) -> set[int]:
        """The rows (of `live`, the branch of each row) that wait and are free to split now."""
        return {row for row, index in enumerate(live) if index in self.waiting and not branches[index].heal_remaining}

    def constrain(self, first: Tensor, live: list[int], branches: list[Branch]) -> Tensor:
        """first [k', V]: position 0's logits of the live rows -> the same with each waiting row that
        splits here made to take its alternative (it becomes the row's argmax)."""
        self.taken_logprobs = {}
        rows = sorted(self.rows(live, branches))
        if not rows:
            return first
        groups: dict[tuple[int, ...], list[int]] = {}
        for row in rows:  # rows on the same path see the same logits and share its alternatives
            groups.setdefault(tuple(branches[live[row]].token_ids), []).append(row)
        first = first.clone()
        for path, members in groups.items():
            logprobs = torch.log_softmax(first[members[0]].float(), dim=-1)  # [V]
            text = branches[live[members[0]]].text
            first_word = not text.strip()  # its alternatives, however unlikely, are the last resort
            splits = self._alternatives(path, logprobs, len(members), floor=float("-inf") if first_word else LOOKBACK_FLOOR)
            if text and goes_on_name(text[-1]):  # inside a name another token is a misspelling of it, not an alternative
                splits = [split for split in splits if split.token not in self.word_starts]
            now = [split for split in splits if split.ratio >= math.log(self.min_ratio)]
            self.seen += [split for split in splits if split not in now]
            for row, split in zip(members, now):
                first[row, split.token] = first[row].max() + 1.0
                self.taken_logprobs[row] = split.logprob
                self._take(live[row], split)
        return first

    def _alternatives(self, path: tuple[int, ...], logprobs: Tensor, wanted: int, floor: float = LOOKBACK_FLOOR) -> list[Split]:
        """Up to `wanted` tokens other than the likeliest, likeliest first, each at least exp(floor)
        as likely as it, not banned, none taken already. logprobs [V]."""
        if self._banned_mask is None or self._banned_mask.shape != logprobs.shape:
            self._banned_mask = torch.zeros_like(logprobs, dtype=torch.bool)  # [V]
            ids = [i for i in self.banned if i < logprobs.shape[-1]]
            if ids:
                self._banned_mask[torch.tensor(ids, dtype=torch.long, device=logprobs.device)] = True
        greedy = int(logprobs.argmax())
        allowed = logprobs.masked_fill(self._banned_mask, float("-inf"))  # [V]
        allowed[greedy] = float("-inf")
        best = float(logprobs[greedy])
        values, indices = allowed.topk(min(wanted + len(self._taken) + 4, allowed.shape[-1]))  # [n]
        ranked = sorted(zip(values.tolist(), indices.tolist()), key=lambda pair: (-round(pair[0] - best, RATIO_DIGITS), pair[1]))
        out = []
        for value, token in ranked:
            if value - best < floor or len(out) == wanted or value == float("-inf"):
                break
            if (len(path), token) not in self._taken:
                out.append(Split(path, token, value, value - best))
        return out

    def _take(self, index: int, split: Split) -> None:
        self.waiting.discard(index)
        self._taken.add((split.position, split.token))
        self.forked += 1

    def take_split(self, index: int, tokens: list[int], longest: int) -> Split | None:
        """For waiting branch `index` that ended on the greedy path (`tokens`): the likeliest plausible
        split its path offered at a position <= `longest` that no branch took (else the likeliest
        first token left), now taken; None if there is none."""
        if index not in self.waiting:
            return None
        fits = [s for s in self.seen if s.position <= longest and tuple(tokens[: s.position]) == s.path and (s.position, s.token) not in self._taken]
        if not fits:
            return None
        split = max(fits, key=lambda s: (s.ratio >= LOOKBACK_FLOOR, round(s.ratio, RATIO_DIGITS), -s.position, -s.token))
        self._take(index, split)
        return split

    def keep_own_logprobs(self, logprobs: list[list[float]]) -> None:
        """Round's log-probabilities per row: a forced token's is the model's own, not the constraint's."""
        for row, value in self.taken_logprobs.items():
            logprobs[row][0] = value
        self.taken_logprobs = {}
