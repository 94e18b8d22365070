"""BASS: batched speculative decoding of k branches over one shared prompt.

Each round:
  1. the drafter proposes up to γ tokens for every live branch (branches may differ);
  2. the target scores all live branches' [last token, drafts...] in ONE forward pass on
     the shared-prefix cache (bifurcated attention);
  3. each branch accepts its own number of drafts (greedy: the longest run that matches
     the target's argmax; sampling: exact speculative sampling; a sampling run's leading
     greedy branches, `SamplingParams.greedy_branches`: the greedy rule), then takes one
     token of the target's own (the correction or the bonus token);
  4. each branch keeps the KV of what it accepted (ragged advance: the rejected drafts'
     entries are simply not counted), finished branches leave the batch, the deadline
     and the cancel token are checked.

γ adapts (see `adapt_gamma`), greedy runs stop drafting while drafts do not pay for
their verification on this machine (see `DraftPayoff`), and a greedy round verifies only the
drafted tokens whose measured chances pay for their rows (see `DraftBudget`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from kspec.engine.api import CancelToken
from kspec.engine.decode.acceptance import HeadPlan, RoundAcceptance, accept_drafts, accept_greedy_by_position
from kspec.engine.decode.drafters import GAMMA_LIMIT, Draft, Drafter
from kspec.engine.decode.branches import Branch, BranchTracker, DecodeOutput, interrupted
from kspec.engine.decode.healing import HealingBias
from kspec.engine.cache.kv import BranchKVCache
from kspec.engine.models.tokenizer import IncrementalDetokenizer, Tokenizer
from kspec.engine.models.transformer import Transformer
from kspec.engine.cache.prefix_cache import Prefill, prefill_uncached
from kspec.engine.decode.sampling import SamplingParams, first_tokens
from kspec.engine.config import SteeringConfig
from kspec.engine.decode.member_constraint import MemberConstraint
from kspec.engine.decode.steering import ForcedStarts, NameEndBias
from kspec.engine.decode.forks import LaterForks, Split, begins_a_word, plausible_first_tokens
from kspec.kernels.transfer import to_device

UnitDone = Callable[[str], bool]  # early-stop hook: this branch's text has completed its unit


GAMMA_RULES = ("mean", "max", "fixed")
PAYOFF_FIRST_PAUSE = 2  # rounds without drafts after drafting was measured not to pay; doubles each time
PAYOFF_MAX_PAUSE = 16  # ... up to this, then drafting is tried again (the text may have turned repetitive)
PAYOFF_SMOOTHING = 0.5  # weight of the newest round in each measured rate
CHANCE_PRIOR = (1.8, 2.0)  # (accepted, offered) before any round: 0.9, so a kind of draft is verified until measured
CHANCE_MEMORY = 200  # offers counted per (evidence, place); past it the counts halve, so the chances follow the text
PLACES = 4  # a draft's places 0 .. PLACES - 2 apart, the later ones together
COST_SMOOTHING = 0.3  # weight of a round's time in its row count's estimate
COST_MEMORY = 400  # rounds (~15 keystrokes' requests) a row count's estimate is kept without a new measurement


@dataclass(frozen=True)
class SpeculationConfig:
    gamma: int = 4  # starting draft length
    gamma_min: int = 1
    gamma_max: int = 8
    rule: str = "mean"  # how γ adapts between rounds, see adapt_gamma
    cost_aware: bool = True  # greedy runs: draft only while drafting pays (DraftPayoff)

    def __post_init__(self) -> None:
        if not 1 <= self.gamma_min <= self.gamma <= self.gamma_max <= GAMMA_LIMIT:
            raise ValueError(
                f"need 1 <= gamma_min <= gamma <= gamma_max <= {GAMMA_LIMIT}, "
                f"got {self.gamma_min}, {self.gamma}, {self.gamma_max}"
            )
        if self.rule not in GAMMA_RULES:
            raise ValueError(f"gamma rule must be one of {', '.join(GAMMA_RULES)}, got {self.rule!r}")


def adapt_gamma(gamma: int, drafted: list[int], accepted: list[int], config: SpeculationConfig) -> int:
    """The next round's γ from this round's acceptance, one step at a time.

    "max" (the BASS paper's idea): grow when some branch accepted its whole full-length
    draft, shrink when no branch accepted anything. With many branches one lucky branch
    keeps γ high while the others waste the verification of long drafts.
    "mean" (default): grow when the branches accepted at least half of γ on average,
    shrink when they accepted less than a quarter; the batch's verification cost grows
    with k·(γ+1), so γ follows the typical branch, not the best one.
    "fixed": never change."""
    if config.rule == "fixed" or not drafted:
        return gamma
    if config.rule == "max":
        if any(a == d == gamma for a, d in zip(accepted, drafted)):
            return min(gamma + 1, config.gamma_max)
        if all(a == 0 for a in accepted):
            return max(gamma - 1, config.gamma_min)
        return gamma
    mean_accepted = sum(accepted) / len(accepted)
    if mean_accepted >= 0.5 * gamma:
        return min(gamma + 1, config.gamma_max)
    if mean_accepted < 0.25 * gamma:
        return max(gamma - 1, config.gamma_min)
    return gamma


@dataclass
class DraftPayoff:
    """Whether drafting pays for itself here, measured on the run's own rounds: tokens per
    millisecond (drafting + the target's forward) of rounds that verified drafts vs rounds of
    one token per branch. Verifying k x (γ+1) rows costs little more than k rows where a step
    reads weights (a GPU, a CPU with fast many-row matmuls) and up to ~(γ+1)x where it is bound
    by per-row work (a 2-core CPU): there a few accepted lookup tokens lose to plain batched
    decoding. After a drafted round measured slower than plain ones, the next rounds do not
    draft (2, then 4, ... up to 16), then drafting is tried again; the first drafted round is
    followed by one plain round to have both rates. Greedy outputs do not depend on which
    rounds draft (acceptance keeps exactly the target's argmax tokens); sampled runs keep a
    fixed schedule, so a seed gives the same text on any machine."""

    plain_rate: float | None = None  # tokens per ms, rounds without drafts
    drafted_rate: float | None = None  # tokens per ms, rounds that verified drafts
    pause: int = 0  # rounds left without drafts
    next_pause: int = PAYOFF_FIRST_PAUSE

    def draft_now(self) -> bool:
        """Called once per round, before proposing."""
        if self.pause > 0:
            self.pause -= 1
            return False
        return not (self.drafted_rate is not None and self.plain_rate is None)  # measure one plain round

    def record(self, drafted: bool, tokens: int, ms: float) -> None:
        rate = tokens / max(ms, 1e-3)
        if drafted:
            self.drafted_rate = _smoothed(self.drafted_rate, rate)
        else:
            self.plain_rate = _smoothed(self.plain_rate, rate)
        if not drafted or self.plain_rate is None or self.drafted_rate is None:
            return
        if self.drafted_rate < self.plain_rate:
            self.pause, self.next_pause = self.next_pause, min(2 * self.next_pause, PAYOFF_MAX_PAUSE)
        else:
            self.next_pause = PAYOFF_FIRST_PAUSE


class DraftPayoffs:
    """An engine's DraftPayoff per k: what drafting was measured to be worth carries over from
    one request to the next, so a keystroke's request does not pay again for measuring it
    (a request's ~30 rounds would spend a sixth of them probing)."""

    def __init__(self) -> None:
        self._by_k: dict[int, DraftPayoff] = {}

    def for_k(self, k: int) -> DraftPayoff:
        return self._by_k.setdefault(k, DraftPayoff())


def _smoothed(previous: float | None, value: float, weight: float = PAYOFF_SMOOTHING) -> float:
    """An exponentially weighted average: `value` weighs `weight`, what came before the rest."""
    return value if previous is None else weight * value + (1 - weight) * previous


# --- how much of each draft a greedy round verifies ---------------------------------------------
# The drafted tokens that, by their measured odds of acceptance and what a round of so many rows was
# measured to cost here, give the most tokens per millisecond.
#
# A round of k live rows yields k tokens plus the accepted drafts; its cost grows with its rows, but
# not evenly: on a 2-core CPU each extra row costs 5-8 % of a one-row round, and steps where a kernel
# changes loops (Intel AMX takes groups of 16 rows) make some row counts cheaper than fewer.
# A lookup draft's tokens are accepted far more often after a long n-gram match than after a
# one-token one (measured at 0.5B: the first token after a 6-token match 92 %, after 1 token 46 %),
# so the same γ for every branch verifies rows that will not pay. Here each drafted token's chance
# of being accepted (given the ones before it were) is learned per what found its draft
# (`Draft.evidence`) and its place in it, from the engine's own rounds; a round's drafted tokens are
# taken likeliest first (a token's cumulative chance falls along its draft, so every branch keeps a
# prefix) for as long as the expected tokens per estimated millisecond rises.
#
# Greedy output does not depend on which drafts are verified (acceptance keeps exactly the target's
# argmax), only the time does; sampled runs keep their drafts (a seed gives the same text anywhere).


def _place(index: int) -> int:
    return min(index, PLACES - 1)


@dataclass
class DraftChances:
    """Per (evidence, place): how often a drafted token there was accepted once offered (all the
    draft's tokens before it accepted)."""

    counts: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # [accepted, offered]

    def chance(self, evidence: str, index: int) -> float:
        accepted, offered = self.counts.get((evidence, _place(index)), CHANCE_PRIOR)
        return accepted / offered

    def record(self, evidence: str, drafted: int, accepted: int) -> None:
        """A row verified `drafted` tokens and accepted the first `accepted`: tokens 0 .. accepted were
        offered (the one after the last accepted was rejected, if any), 0 .. accepted - 1 accepted."""
        for index in range(min(drafted, accepted + 1)):
            counts = self.counts.setdefault((evidence, _place(index)), list(CHANCE_PRIOR))
            counts[0] += index < accepted
            counts[1] += 1
            if counts[1] > CHANCE_MEMORY:
                counts[0], counts[1] = counts[0] / 2, counts[1] / 2


@dataclass
class RoundCosts:
    """A round's measured milliseconds per (threads, rows), smoothed; other row counts interpolated
    between the nearest measured ones (beyond the largest: its slope from the one before). A row count
    not measured for COST_MEMORY rounds is forgotten: one slow round there (another process woke) would
    otherwise keep the budget from ever choosing it, and so from measuring it again."""

    ms: dict[tuple[int, int], float] = field(default_factory=dict)
    measured_at: dict[tuple[int, int], int] = field(default_factory=dict)  # the round that last measured it
    rounds: int = 0

    def record(self, threads: int, rows: int, ms: float) -> None:
        self.rounds += 1
        key = (threads, rows)
        self.ms[key] = _smoothed(self.ms.get(key), ms, COST_SMOOTHING)
        self.measured_at[key] = self.rounds
        for stale in [key for key, at in self.measured_at.items() if self.rounds - at > COST_MEMORY]:
            del self.ms[stale], self.measured_at[stale]

    def curve(self, threads: int) -> list[tuple[int, float]]:
        """(rows, ms) measured at this thread count, by rows."""
        return sorted((r, ms) for (t, r), ms in self.ms.items() if t == threads)

    def estimate(self, threads: int, rows: int) -> float | None:
        """None until two row counts were measured at this thread count."""
        return _interpolated(self.curve(threads), rows)


def _interpolated(known: list[tuple[int, float]], rows: int) -> float | None:
    """ms at `rows` on a measured curve (RoundCosts.curve); None with fewer than two points."""
    if len(known) < 2:
        return None
    if rows <= known[0][0]:
        return known[0][1]
    for (low, low_ms), (high, high_ms) in zip(known, known[1:]):
        if rows <= high:
            return low_ms + (high_ms - low_ms) * (rows - low) / (high - low)
    (low, low_ms), (high, high_ms) = known[-2], known[-1]
    return high_ms + max(0.0, (high_ms - low_ms) / (high - low)) * (rows - high)


@dataclass
class DraftBudget:
    """An engine's draft chances and round costs, learned across its requests."""

    chances: DraftChances = field(default_factory=DraftChances)
    costs: RoundCosts = field(default_factory=RoundCosts)

    def lengths(self, threads: int, drafted: Sequence[tuple[str, int]], fixed_rows: int) -> list[int]:
        """drafted: per free row, (evidence, tokens drafted); fixed_rows: the round's other rows (forced
        starts, their tokens included). -> per free row, how many of its drafted tokens to verify: all
        of them until the round costs are known."""
        wanted = [n for _, n in drafted]
        base, curve = len(drafted) + fixed_rows, self.costs.curve(threads)  # the curve once a round, not once a token
        if sum(wanted) == 0 or _interpolated(curve, base) is None:
            return wanted
        offers = []  # (cumulative chance, row): each row's tokens in order, their chances multiplied
        for row, (evidence, n) in enumerate(drafted):
            chance = 1.0
            for index in range(n):
                chance *= self.chances.chance(evidence, index)
                offers.append((chance, row))
        offers.sort(key=lambda offer: -offer[0])  # stable: a row's own tokens stay in order
        expected, best_rate, best_taken = float(len(drafted)), 0.0, 0
        for taken in range(len(offers) + 1):
            expected += offers[taken - 1][0] if taken else 0.0
            ms = _interpolated(curve, base + taken)
            rate = expected / ms if ms else 0.0
            if rate > best_rate:
                best_rate, best_taken = rate, taken
        lengths = [0] * len(drafted)
        for _, row in offers[:best_taken]:
            lengths[row] += 1
        return lengths

    def record(self, threads: int, rows: int, ms: float, drafts: Sequence[Draft], accepted: Sequence[int]) -> None:
        """A round of `rows` rows took `ms`; its free rows verified `drafts` and accepted `accepted` of each."""
        self.costs.record(threads, rows, ms)
        for draft, taken in zip(drafts, accepted):
            if draft.tokens:
                self.chances.record(draft.evidence, len(draft.tokens), taken)


def trim_drafts(budget: DraftBudget, threads: int, drafts: list[Draft], fixed: set[int]) -> set[int]:
    """Cut the drafts of the rows not in `fixed` to the lengths `budget` chooses (in place); -> the
    rows whose whole draft was cut (they say nothing about γ this round)."""
    free = [row for row in range(len(drafts)) if row not in fixed]
    fixed_rows = sum(1 + len(drafts[row].tokens) for row in fixed)
    lengths = budget.lengths(threads, [(drafts[row].evidence, len(drafts[row].tokens)) for row in free], fixed_rows)
    cut: set[int] = set()
    for row, length in zip(free, lengths):
        if length < len(drafts[row].tokens):
            drafts[row].cut(length)
            if length == 0:
                cut.add(row)
    return cut


@dataclass
class SpeculationStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    branch_rounds: int = 0  # sum over rounds of live branches
    drafting_branch_rounds: int = 0  # ... over the rounds that asked for drafts (not paused by DraftPayoff)
    gammas: list[int] = field(default_factory=list)
    draft_ms: float = 0.0  # where a round's time goes: drafting,
    verify_ms: float = 0.0  # the target's forward pass, its head and the acceptance that head decides,
    accept_ms: float = 0.0  # detokenization, stop checks and cache bookkeeping

    def record_round(
        self, live: int, drafting: bool, drafted: int, accepted: int, gamma: int, draft_ms: float, verify_ms: float, accept_ms: float
    ) -> None:
        """One round of `live` branches: `drafted` / `accepted` draft tokens (forced starts aside)
        under `gamma`, whether it asked for drafts, and where its time went."""
        self.rounds += 1
        self.branch_rounds += live
        self.drafting_branch_rounds += live if drafting else 0
        self.drafted += drafted
        self.accepted += accepted
        self.gammas.append(gamma)
        self.draft_ms += draft_ms
        self.verify_ms += verify_ms
        self.accept_ms += accept_ms

    @property
    def mean_accepted_per_round(self) -> float:
        """Drafted tokens accepted per branch per round that drafted (plus 1 target token each round)."""
        return self.accepted / self.drafting_branch_rounds if self.drafting_branch_rounds else 0.0


@dataclass
class SpeculativeOutput(DecodeOutput):
    stats: SpeculationStats = field(default_factory=SpeculationStats)


class SpeculativeRun:
    """One request's k branches being decoded, one round at a time.

    A round is `propose()` (the rows to verify: each live branch's last token and its
    draft), one target forward pass over those rows on `cache` — alone, or together with
    other requests' rows (engine/batching.py) — and `accept(logits)`. `finished()` drops
    branches that ended (they stop costing work) and says when none is left, or the
    deadline passed, or the request was cancelled."""

    def __init__(
        self,
        model: Transformer,
        tracker: BranchTracker,
        k: int,
        params: SamplingParams,
        drafter: Drafter,
        config: SpeculationConfig = SpeculationConfig(),
        cancel: CancelToken | None = None,
        diverse: bool = False,
        prefill: Prefill | None = None,
        unit_done: UnitDone | None = None,
        healing: HealingBias | None = None,
        payoff: DraftPayoff | None = None,
        forced: Sequence[list[int]] = (),
        steering: SteeringConfig = SteeringConfig(),
        names: MemberConstraint | None = None,
        fork_ratio: float = 0.0,
        budget: DraftBudget | None = None,
    ):
        """payoff: what drafting was measured to be worth so far (DraftPayoffs.for_k); None: a
        fresh one for this run. Used only by greedy runs with config.cost_aware.
        forced: token starts for some branches, most wanted first (engine/decode/steering.py:
        `forced_tokens`, the healed text included); `steering` says how many and how low the
        target may score them. names: keeps a branch inside `module.name` to the module's names
        (engine/decode/member_constraint.py). fork_ratio (diverse runs): a first token starts a
        branch of its own only where it is at least this likely relative to the best one; the
        other branches split later, where the greedy path hesitates (engine/decode/forks.py; 0:
        the k likeliest first tokens). budget: the engine's DraftBudget (None: a fresh one), used where `payoff` is."""
        self.model, self.tracker, self.params, self.drafter, self.config = model, tracker, params, drafter, config
        self.cancel, self.unit_done, self.names = cancel, unit_done, names
        self._name_rows: set[int] = set()  # this round's rows inside a member name (`propose`)
        self.generator = torch.Generator().manual_seed(params.seed)
        self.stats = SpeculationStats()
        started = time.perf_counter()
        limits = tracker.limits
        with torch.inference_mode():
            prefill = prefill or prefill_uncached(model, tracker.prompt_ids)
            self.reused_tokens = prefill.reused_tokens
            self.cache = BranchKVCache.from_prompt(prefill.cache, k, limits.max_new_tokens + GAMMA_LIMIT + 2)
            self.prefill_ms = (time.perf_counter() - started) * 1000
            self.healing = healing or HealingBias(tracker.tokenizer, prefill.last_logits.shape[-1], prefill.last_logits.device)
            self.branches = [Branch(heal_remaining=tracker.healed_text) for _ in range(k)]
            self.detoks = [tracker.new_detokenizer() for _ in range(k)]
            first_logits = tracker.constrain(prefill.last_logits[None].expand(k, -1), self.branches, self.healing)  # [k, V]
            if names is not None:
                first_logits = names.constrain(first_logits, self.branches)
            tokens, logprobs, plausible = _first_tokens(first_logits, params, self.generator, diverse, fork_ratio, tracker.tokenizer)
            starts = [start for start in forced if len(start) < limits.max_new_tokens]
            self.forced = ForcedStarts(steering)
            if starts and steering.branches:
                first_log_probs = torch.log_softmax(first_logits.float(), dim=-1)  # [k, V]
                self.forced = ForcedStarts.assign(steering, starts, first_log_probs, tokens, logprobs)
        self._fork_candidates = set(range(plausible, k))  # branches that start as the best one and split later
        self.forks = LaterForks.starting(fork_ratio, tracker.tokenizer, self._fork_candidates, self.forced.by_branch)
        if self.forks.waiting:
            texts, healed = tracker.tokenizer.token_texts(), tracker.healed_text
            self.forks.offer_first(first_logits[0], tokens[:plausible], lambda token: begins_a_word(texts[token], healed))
        for branch, detok, token, logprob in zip(self.branches, self.detoks, tokens, logprobs):
            _commit(tracker, branch, detok, token, logprob, unit_done)
        drafter.begin(tracker.prompt_ids, k, limits.max_new_tokens)
        self.live = list(range(k))  # branch index of each cache row
        with torch.inference_mode():  # the waiting branches explore the first tokens left meanwhile
            for index, split in self.forks.plan(self.branches[self.forks.lead]).items() if self.forks.waiting else ():
                self._move(index, self.forks.lead, split)
        self.gamma = config.gamma
        self.payoff = (payoff or DraftPayoff()) if config.cost_aware and params.greedy else None
        self.budget = (budget or DraftBudget()) if self.payoff is not None else None
        self._cut: set[int] = set()  # this round's rows whose whole draft the budget cut
        self._drafting = True
        self._name_end = NameEndBias(tracker.tokenizer, self.healing.vocab_size, self.healing.device)
        self._drafts: list[Draft] = []
        self.head_plan = HeadPlan(model.head_cost)  # how far each round's first call of the head reaches
        self._round_started = 0.0
        self._drafted_at = 0.0

    @torch.inference_mode()
    def finished(self) -> bool:
        """True when no branch is left to decode, or the run was interrupted (a question: it changes nothing)."""
        return all(self.branches[index].done for index in self.live) or interrupted(self.branches, self.tracker.limits, self.cancel)

    def _drop_finished_rows(self) -> None:
        """Finished branches stop costing work: their cache and drafter rows go (but for a branch still
        waiting to split, which the lead may move elsewhere: engine/decode/forks.py)."""
        still = [row for row, index in enumerate(self.live) if not self.branches[index].done or index in self.forks.waiting]
        if len(still) < len(self.live):
            self.cache.keep(still)
            self.drafter.keep(still)
            self.live = [self.live[row] for row in still]

    @property
    def live_branches(self) -> list[Branch]:
        return [self.branches[index] for index in self.live]

    def propose(self) -> list[list[int]]:
        """This round's rows, one per live branch: [last token, drafts...] (ragged)."""
        self._drop_finished_rows()
        self._round_started = time.perf_counter()
        limits = self.tracker.limits
        live_branches = self.live_branches
        self._drafting = self.payoff is None or self.payoff.draft_now()
        if self._drafting:
            drafts = self.drafter.propose([b.token_ids for b in live_branches], self.gamma)
        else:  # paused: no drafting cost either (a drafter catches up on the histories when asked next)
            drafts = [Draft([]) for _ in live_branches]
        for draft, branch in zip(drafts, live_branches):  # healing: the target picks, one token at a time
            draft.cut(0 if branch.heal_remaining else max(0, limits.max_new_tokens - len(branch.token_ids)))
        for row, rest in self.forced.drafts(self.live).items():
            drafts[row] = Draft(rest)  # verified in this pass, accepted whatever the target's argmax (see `_verify_forced`)
        for row, index in enumerate(self.live):  # waiting to split with no split to explore: a copy of the lead
            if self.branches[index].done or index in self.forks.waiting and index not in self.forks.tentative:
                drafts[row] = Draft([])  # done (`_drop_finished_rows`): its row keeps nothing (`accept`)
        self._name_rows = set()
        if self.names is not None:  # inside `module.name`: one token at a time, each kept to the module's names
            self._name_rows = {row for row, b in enumerate(live_branches) if row not in self.forced.verifying and self.names.bias(b) is not None}
            for row in self._name_rows:
                drafts[row] = Draft([])
        self._cut = trim_drafts(self.budget, torch.get_num_threads(), drafts, set(self.forced.verifying)) if self.budget is not None and self._drafting else set()
        self._drafts = drafts
        self._drafted_at = time.perf_counter()
        return [[b.token_ids[-1], *d.tokens] for b, d in zip(live_branches, drafts)]

    @torch.inference_mode()
    def accept(self, hidden: Tensor, verify_ms: float, round_rows: int | None = None) -> None:
        """hidden [k', T, dim]: the target's final hidden states of this request's rows (T >= each
        row's length; padding ignored); the run computes the logits its acceptance needs.
        round_rows: the tokens the verification fed, other requests' rows included (default: this one's)."""
        verified_at = time.perf_counter()
        live_branches, drafts = self.live_branches, self._drafts

        lead_row = self.live.index(self.forks.lead) if self.forks.waiting and self.forks.lead in self.live else None
        lead = self.branches[self.forks.lead]
        watch = lead_row is not None and not lead.heal_remaining  # the lead's positions show where the waiting branches split

        def observe(step: int, logits: Tensor) -> None:  # the lead's logits [V] at position `step` of its row
            drafted = drafts[lead_row].tokens[:step]
            self.forks.observe(logits, (*lead.token_ids, *drafted), self.forks.text_at(lead, drafted))

        def constrain(first: Tensor) -> Tensor:  # [k', V] -> [k', V]
            first = self.tracker.constrain(first, live_branches, self.healing)
            if self._name_rows and self.names is not None:
                first = self.names.constrain(first, live_branches, self._name_rows)
            if watch:
                observe(0, first[lead_row])
            return first

        def later(step: int, rows: list[int], logits: Tensor) -> Tensor:  # position `step` of `rows`: [n, V]
            if lead_row in rows:
                observe(step, logits[rows.index(lead_row)])
            return logits

        if self.params.greedy and hidden.device.type == "cpu":  # the head only where it decides
            lengths = [len(d.tokens) for d in drafts]
            taken = accept_greedy_by_position(
                [d.tokens for d in drafts], hidden, self.model.logits, constrain, later if watch else None, self.head_plan.positions(lengths)
            )  # fmt: skip
            self.head_plan.record(lengths, taken.accepted)
        else:
            logits = self.model.logits(hidden)  # [k', T, V]
            logits[:, 0] = constrain(logits[:, 0])
            log_probs = torch.log_softmax(logits, dim=-1)  # [k', T, V]
            # every row on the device, one transfer
            greedy_rows = [self.params.greedy_branch(index) for index in self.live]  # a sampling run's greedy branches
            taken = accept_drafts([d.tokens for d in drafts], [d.q for d in drafts], logits, log_probs, self.params, self.generator, greedy_rows)
            if watch:
                for step in range(1, 1 + taken.accepted[lead_row]):
                    observe(step, logits[lead_row, step])
        forced_rows = self.forced.verifying
        restarted: set[int] = set()
        if forced_rows:
            taken, restarted = self._verify_forced(taken, hidden, live_branches)
        head_ms = (time.perf_counter() - verified_at) * 1000  # the head and the acceptance
        row_done = [branch.done for branch in live_branches]  # before this round: their rows keep nothing
        for row, branch in enumerate(live_branches):
            if row in restarted:
                branch = self._restart(row)
            detok = self.detoks[self.live[row]]
            for token, logprob in zip(taken.tokens[row], taken.logprobs[row]):
                if branch.done:
                    break
                _commit(self.tracker, branch, detok, token, logprob, self.unit_done)
        # the previous last token and the accepted drafts (a restarted branch, or one already done, keeps nothing)
        kept = [0 if row in restarted or row_done[row] else 1 + n for row, n in enumerate(taken.accepted)]
        self.cache.advance(kept)
        if lead_row is not None:
            for index, split in self.forks.plan(lead).items():
                self._move(index, lead_row, split)
        free = [row for row in range(len(drafts)) if row not in forced_rows]  # a forced start is no draft
        drafted, accepted = [len(drafts[row].tokens) for row in free], [taken.accepted[row] for row in free]
        draft_ms = (self._drafted_at - self._round_started) * 1000
        accept_ms = (time.perf_counter() - verified_at) * 1000 - head_ms
        self.stats.record_round(len(self.live), self._drafting, sum(drafted), sum(accepted), self.gamma, draft_ms, verify_ms + head_ms, accept_ms)
        if self.payoff is not None:
            self.payoff.record(any(d.tokens for d in drafts), sum(len(t) for t in taken.tokens), draft_ms + verify_ms + head_ms)
        if self.budget is not None:
            self.budget.record(torch.get_num_threads(), round_rows or sum(1 + len(d.tokens) for d in drafts), verify_ms + head_ms, [drafts[row] for row in free], accepted)
        said = [i for i, row in enumerate(free) if row not in self._cut]  # a row whose whole draft the budget cut says nothing about γ
        if self._drafting and said:
            self.gamma = adapt_gamma(self.gamma, [drafted[i] for i in said], [accepted[i] for i in said], self.config)

    def _verify_forced(
        self, taken: RoundAcceptance, hidden: Tensor, live_branches: list[Branch]
    ) -> tuple[RoundAcceptance, set[int]]:
        """The rows whose draft is a forced start take it as the target scored it (steering.py),
        whatever the target's argmax; -> the round's acceptance, and the rows whose start was
        undone (they decode again from their own first token)."""
        accepted, tokens, logprobs = list(taken.accepted), list(taken.tokens), list(taken.logprobs)
        restarted: set[int] = set()
        for row in sorted(self.forced.verifying):
            branch = live_branches[row]
            verified = self.forced.score(
                self.live[row], hidden[row], self.model.logits,
                lambda first, branch=branch: self.tracker.constrain(first, [branch], self.healing),
                self.params.of_branch(self.live[row]), self.generator, self._name_end,
            )  # fmt: skip
            tokens[row], logprobs[row] = verified.tokens, verified.logprobs
            accepted[row] = 0 if verified.undone else len(verified.tokens) - 1
            if verified.undone:
                restarted.add(row)
        self.forced.verifying = set()
        return RoundAcceptance(accepted, tokens, logprobs), restarted

    def _move(self, index: int, lead_row: int, split: Split | None) -> None:
        """Branch `index` made the lead's path up to `split`, then the split's token (None: the lead's
        whole path, a copy), its KV copied from the lead's row; it decodes on from there."""
        row = self.live.index(index)
        self.branches[index], self.detoks[index] = _on_lead_path(self.tracker, self.branches[self.forks.lead], split, self.unit_done)
        self.cache.fork(lead_row, row)
        self.cache.truncate(row, min(self.cache.lengths[row], len(self.branches[index].token_ids) - 1))

    def _restart(self, row: int) -> Branch:
        """Row `row`'s branch from scratch (its forced start undone): the tokens it takes next start it."""
        index = self.live[row]
        if index in self._fork_candidates:  # it started as the best branch: it waits to split again
            self.forks.waiting.add(index)
        self.branches[index], self.detoks[index] = self.tracker.fresh()
        return self.branches[index]

    def output(self) -> SpeculativeOutput:
        decode_ms = self.stats.draft_ms + self.stats.verify_ms + self.stats.accept_ms  # this request's rounds (shared ones whole)
        return SpeculativeOutput(self.branches, self.prefill_ms, decode_ms, self.stats.rounds, self.stats)


def _first_tokens(
    first_logits: Tensor, params: SamplingParams, generator: torch.Generator, diverse: bool, fork_ratio: float, tokenizer: Tokenizer
) -> tuple[list[int], list[float], int]:
    """first_logits [k, V] -> the k branches' first tokens, their log-probabilities, and how many
    of them are distinct plausible starts (diverse runs with a fork_ratio: the others start as the
    best one and split later, engine/decode/forks.py; otherwise all k)."""
    k = first_logits.shape[0]
    if diverse and fork_ratio > 0:
        tokens, logprobs, plausible = plausible_first_tokens(first_logits[0], k, tokenizer.stop_ids, fork_ratio, tokenizer.token_texts())  # [k], [k]
    else:
        tokens, logprobs = first_tokens(first_logits, params, generator, diverse, tokenizer.stop_ids)  # [k], [k]
        plausible = k
    return tokens.tolist(), logprobs.tolist(), plausible


def _on_lead_path(tracker: BranchTracker, lead: Branch, split: Split | None, unit_done: UnitDone | None) -> tuple[Branch, IncrementalDetokenizer]:
    """A fresh branch (and its detokenizer) holding the lead's tokens up to `split`, then the split's
    token (engine/decode/forks.py); None: all the lead's tokens, and its end if it ended."""
    upto = split.position if split is not None else len(lead.token_ids)
    fresh, detok = tracker.fresh()
    for token, logprob in zip(lead.token_ids[:upto], lead.logprobs[:upto]):
        tracker.push(fresh, detok, token, logprob)
    if split is not None:
        _commit(tracker, fresh, detok, split.token, split.logprob, unit_done)
    elif lead.done:
        fresh.finish_reason = fresh.finish_reason or lead.finish_reason
    return fresh, detok


def pad_rows(rows: list[list[int]], device: torch.device) -> Tensor:
    """Ragged token rows -> [B, T] right-padded with token 0 (padding positions are never kept)."""
    width = max(len(row) for row in rows)
    return to_device([row + [0] * (width - len(row)) for row in rows], torch.int64, device)  # [B, T]


def _commit(
    tracker: BranchTracker, branch: Branch, detok, token: int, logprob: float, unit_done: UnitDone | None
) -> None:
    tracker.push(branch, detok, token, logprob)
    if not branch.done and unit_done is not None and branch.text and unit_done(branch.text):
        branch.finish_reason = "stop"
