"""Diverse branches that split where the model hesitates, not only at the first token.

Mode "diverse" gives the k branches k different first tokens. Where the model is sure of its
first token (the rest of a half-typed name, the one keyword that fits), the other first tokens
are misspellings: `json.lo|` → `ads(…)`, `ad(…)`, `a(…)`. So only first tokens the model finds
plausible start branches of their own: a token whose probability is at least `min_ratio` of the
likeliest one's. The other branches start like the likeliest one and wait (`LaterForks`): at the
first position of that greedy path where the model finds other tokens plausible, the waiting
branches take them, the likeliest alternative first, one branch each; branches left over wait
for the next such position. Once the greedy path has written its first line (or ended), each
branch still waiting takes the most likely split the path offered up to there; only where it
offered none does a branch end as a copy of the greedy branch, which deduplication merges: fewer
alternatives only where the model sees no other.

The greedy branch (the lead) decides for them all: its row verifies drafts like any other, and
the splits are read from its logits at every position it verified (`observe`), settled once the
round's tokens are committed (`plan`). A waiting branch does not repeat the lead's path: its row
meanwhile decodes from the best split seen so far that no other waiting branch holds (tentative,
a copy of the lead's KV up to there), so when that split is the one it takes at the end of the
line, its text is already written. A better split seen later, or a plausible one, moves it there
(`SpeculativeRun` rebases the branch: tokens and KV copied from the lead up to the split).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Sequence

import torch
from torch import Tensor

from kspec.engine.api import goes_on_name
from kspec.engine.decode.branches import Branch
from kspec.engine.decode.sampling import distinct_first_tokens
from kspec.engine.models.tokenizer import Tokenizer
from kspec.engine.syntax.rank import dedupe_key


def plausible_first_tokens(
    logits: Tensor, k: int, banned: frozenset[int], min_ratio: float, texts: Sequence[str] = ()
) -> tuple[Tensor, Tensor, int]:
    """logits [V] -> k first tokens [k] and their log-probabilities [k], and how many of them are
    plausible: `distinct_first_tokens`' leading ones at least `min_ratio` times as likely as the best
    (min_ratio 0: all k, as plain diverse mode); the rows after those repeat the best. With `texts`
    (every token's text), a token that is a likelier one's text in other spacing (` []\n` after
    ` []\n\n`; `rank.dedupe_key`, as deduplication compares texts) is passed over: it writes the
    same suggestion."""
    tokens, logprobs = distinct_first_tokens(logits, min(4 * k, logits.shape[-1]) if texts else k, banned)  # likeliest first
    if texts:
        spellings: dict[str, int] = {}  # the text as deduplication compares it -> the first candidate with it
        for at, token in enumerate(tokens.tolist()):
            spellings.setdefault(dedupe_key(texts[token]), at)
        rows = sorted(spellings.values())[:k]
        rows += [0] * (k - len(rows))
        tokens, logprobs = tokens[rows], logprobs[rows]  # [k], [k]
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
    after_line: bool = False  # the path's text holds a whole line already

    @property
    def position(self) -> int:
        return len(self.path)


@dataclass
class LaterForks:
    """The branches still waiting to split from the lead's (greedy) path, the splits seen on it, and
    what each waiting branch explores meanwhile (see the module's text)."""

    min_ratio: float
    banned: frozenset[int]  # never an alternative: stop tokens and whitespace
    word_starts: frozenset[int] = frozenset()  # tokens that begin with an identifier character
    waiting: set[int] = field(default_factory=set)  # branch indices without a split of their own yet
    texts: Sequence[str] = ()  # every token's text: the lead's text at a drafted position
    lead: int = 0  # the greedy branch, whose path the waiting ones split from
    tentative: dict[int, Split] = field(default_factory=dict)  # waiting branch -> the split its row explores meanwhile
    lined: bool = False  # the lead's first line is written: a split seen now is taken at once
    forked: int = 0  # branches that split after their first token
    seen: list[Split] = field(default_factory=list)  # splits the lead's path offered, not taken
    blank_starts: list[Split] = field(default_factory=list)  # whitespace first tokens, likeliest first: where the lead writes nothing
    stops: frozenset[int] = frozenset()  # the stop tokens among `banned`
    _observed: list[Split] = field(default_factory=list)  # this round's alternatives on the lead's row, not settled yet
    _taken: set[tuple[int, int]] = field(default_factory=set)  # (position, token) of splits branches took
    _banned_mask: Tensor | None = None  # [V]: `banned` as a mask, built on first use

    @classmethod
    def starting(cls, min_ratio: float, tokenizer: Tokenizer, candidates: set[int], forced: Collection[int]) -> "LaterForks":
        """The forks of a run whose `candidates` branches start as the best one: they wait to split,
        but those that start `forced` only once their start is undone. Never an alternative: a stop
        token, or whitespace (a formatting variant of the greedy text)."""
        stops = frozenset(tokenizer.stop_ids)
        if not candidates:
            return cls(min_ratio, stops, stops=stops)
        banned = stops | tokenizer.blank_ids()
        return cls(min_ratio, banned, tokenizer.word_start_set(), candidates - set(forced), tokenizer.token_texts(), stops=stops)

    def offer_first(self, first_logits: Tensor, started: list[int], begins_a_word: Callable[[int], bool]) -> None:
        """The first tokens that did not start a branch (first_logits [V], `started`: those that did)
        are splits at position 0 for the waiting branches to go back to: the last resort, however
        unlikely, so that k branches still write k texts where the path offered no other split.
        Only those that `begins_a_word` (not another spelling of text being healed, not whitespace);
        the whitespace ones are kept apart (`blank_starts`), for a lead that writes nothing: at the
        end of a function the model would end it (`\n\n\n`) where the hole wants its body
        (`\n` + `    for ...`: HumanEval/48, no suggestion at all)."""
        self._taken |= {(0, token) for token in started}
        if self.waiting:
            logprobs = torch.log_softmax(first_logits.float(), dim=-1)  # [V]
            wanted = 4 * (len(self.waiting) + len(started))  # room for the ones `begins_a_word` turns down
            self.seen += [s for s in self._alternatives((), logprobs, wanted, floor=float("-inf")) if begins_a_word(s.token)]
            greedy, blanks = int(logprobs.argmax()), sorted(self.banned - self.stops)
            if blanks:
                on_blanks = logprobs[torch.tensor(blanks, dtype=torch.long, device=logprobs.device)]  # [B]
                values, order = on_blanks.topk(min(wanted, len(blanks)))  # [n]
                self.blank_starts = [
                    Split((), blanks[at], value, value - float(logprobs[greedy]))
                    for value, at in zip(values.tolist(), order.tolist())
                    if blanks[at] != greedy and blanks[at] not in started and value > float("-inf")
                ]

    def text_at(self, lead: Branch, drafted: Sequence[int]) -> str:
        """The lead's text with `drafted` tokens after it (each token's own text)."""
        return lead.text + "".join(self.texts[token] for token in drafted)

    def observe(self, logits: Tensor, path: tuple[int, ...], text: str) -> None:
        """The lead's logits [V] at one position it verified, after `path` (its tokens there, whose
        text is `text`): the alternatives there, settled by `plan`."""
        if not self.waiting:
            return
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [V]
        first_word = not text.strip()  # its alternatives, however unlikely, are the last resort
        splits = self._alternatives(path, logprobs, len(self.waiting), floor=float("-inf") if first_word else LOOKBACK_FLOOR)
        if text and goes_on_name(text[-1]):  # inside a name another token is a misspelling of it, not an alternative
            splits = [split for split in splits if split.token not in self.word_starts]
        after_line = wrote_a_line(text)
        self._observed += [replace(split, after_line=after_line) for split in splits]

    def plan(self, lead: Branch) -> dict[int, Split | None]:
        """After the round's tokens were committed: the round's alternatives on the path the lead
        took are settled (a plausible one is taken at once by a waiting branch, lowest index first;
        the others are remembered); the waiting branches hold the best splits left on the first
        line, one each (a branch keeps the one it holds while it stays among them), and once the
        lead wrote its first line those are theirs. A branch left with none waits on: the first
        split seen later is its own; at the lead's end it is a copy of the lead. -> branch -> where
        its row must move: a split (its tokens and KV the lead's up to it, then its token), or None
        (a copy of the lead); branches not named stay."""
        tokens, moves = lead.token_ids, {}
        for split in sorted(self._observed, key=lambda split: split.position):  # likeliest first within a position
            if len(tokens) <= split.position or tuple(tokens[: split.position]) != split.path:
                continue  # the lead did not take that path (it ended before)
            if split.ratio >= math.log(self.min_ratio) and self.waiting:
                index = min(self.waiting)
                self._take(index, split)
                if self.tentative.pop(index, None) != split:
                    moves[index] = split
            else:
                self.seen.append(split)
        self._observed = []
        ranked = [s for s in self._ranked(tokens) if self.lined or not s.after_line]
        if self.lined:  # past the first line: the first place that offers a split, as one-token rounds would meet it
            ranked.sort(key=lambda split: split.position)
        ranked = ranked[: len(self.waiting)]
        free = [split for split in ranked if split not in self.tentative.values()]
        for index in sorted(self.waiting):
            held = self.tentative.get(index)
            if held is not None and held in ranked:
                continue
            if free:
                self.tentative[index] = moves[index] = free.pop(0)
            elif held is not None:
                del self.tentative[index]
                moves[index] = None
        if self.lined or lead.done or wrote_a_line(lead.text):  # what they hold now is theirs
            for index, split in sorted(self.tentative.items()):
                self._take(index, split)
            self.tentative, self.lined = {}, True
        if lead.done and not lead.text.strip():  # it wrote nothing: the others start with other whitespace instead
            for index, split in zip(sorted(self.waiting), self.blank_starts):
                self._take(index, split)
                moves[index] = split
        if lead.done:  # the others: copies of it
            moves.update({index: None for index in self.waiting})
            self.waiting = set()
        return moves

    def _ranked(self, tokens: list[int]) -> list[Split]:
        """The splits seen on the lead's path (`tokens`) that no branch took, the one to take first
        first: at least LOOKBACK_MIN_RATIO as likely as the greedy token, the likeliest, the earliest."""
        fits = [s for s in self.seen if tuple(tokens[: s.position]) == s.path and (s.position, s.token) not in self._taken]
        return sorted(fits, key=lambda s: (s.ratio >= LOOKBACK_FLOOR, round(s.ratio, RATIO_DIGITS), -s.position, -s.token), reverse=True)

    def _alternatives(self, path: tuple[int, ...], logprobs: Tensor, wanted: int, floor: float = LOOKBACK_FLOOR) -> list[Split]:
        """Up to `wanted` tokens other than the likeliest, likeliest first, each at least exp(floor)
        as likely as it, not banned, none taken already, none the greedy token's text in other
        spacing (`)\n` for `)\n\n`: the same suggestion to `rank.dedupe_key`). logprobs [V]."""
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
        out, spelled = [], dedupe_key(self.texts[greedy]) if self.texts else None
        for value, token in ranked:
            if value - best < floor or len(out) == wanted or value == float("-inf"):
                break
            if (len(path), token) not in self._taken and (spelled is None or dedupe_key(self.texts[token]) != spelled):
                out.append(Split(path, token, value, value - best))
        return out

    def _take(self, index: int, split: Split) -> None:
        self.waiting.discard(index)
        self._taken.add((split.position, split.token))
        self.forked += 1
