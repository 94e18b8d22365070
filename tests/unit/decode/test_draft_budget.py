"""The draft budget: drafted tokens' learned chances, rounds' learned costs, and the cut that
follows from them (engine/decode/speculative.py)."""

from __future__ import annotations

import random

import pytest

from kspec.engine.decode.speculative import CHANCE_MEMORY, CHANCE_PRIOR, COST_MEMORY, DraftBudget, DraftChances, RoundCosts, trim_drafts
from kspec.engine.decode.drafters import Draft


def test_a_tokens_chance_is_counted_where_it_was_offered():
    chances = DraftChances()
    prior_accepted, prior_offered = CHANCE_PRIOR
    assert chances.chance("own6", 0) == prior_accepted / prior_offered > 0.5  # verified until measured
    chances.record("own6", drafted=4, accepted=2)  # places 0, 1 accepted, 2 offered and rejected, 3 never offered
    assert chances.chance("own6", 0) == chances.chance("own6", 1) == (prior_accepted + 1) / (prior_offered + 1)
    assert chances.chance("own6", 2) == prior_accepted / (prior_offered + 1)
    assert chances.chance("own6", 3) == chances.chance("own1", 0) == prior_accepted / prior_offered  # nothing said yet
    chances.record("own6", drafted=8, accepted=8)  # places from PLACES - 1 on share one count
    assert chances.chance("own6", 3) == chances.chance("own6", 7) == (prior_accepted + 5) / (prior_offered + 5)
    for _ in range(5 * CHANCE_MEMORY):
        chances.record("own1", drafted=1, accepted=1)
    for _ in range(CHANCE_MEMORY):  # then a text where it stopped paying: the newer offers outweigh the many older
        chances.record("own1", drafted=1, accepted=0)
    assert chances.chance("own1", 0) < 0.5


def test_round_costs_interpolate_between_measured_row_counts():
    costs = RoundCosts()
    costs.record(2, 4, 24.0)
    assert costs.estimate(2, 4) is None  # one row count says nothing about the others
    costs.record(2, 16, 36.0)
    costs.record(1, 4, 40.0)  # another thread count, its own curve
    assert costs.estimate(2, 1) == 24.0  # fewer rows than measured: no cheaper than the least
    assert costs.estimate(2, 10) == pytest.approx(30.0)
    assert costs.estimate(2, 20) == pytest.approx(40.0)  # beyond: the last slope
    assert costs.estimate(1, 8) is None
    costs.record(2, 16, 46.0)  # smoothed, not replaced
    assert 36.0 < costs.estimate(2, 16) < 46.0  # type: ignore[operator]
    costs.record(2, 13, 90.0)  # one slow round at 13 rows ...
    assert costs.estimate(2, 13) == 90.0
    for _ in range(COST_MEMORY // 2 + 1):
        costs.record(2, 4, 24.0)
        costs.record(2, 16, 36.0)
    assert costs.estimate(2, 13) == pytest.approx(33.0)  # ... forgotten: interpolated again
    assert (1, 4) not in costs.ms  # the other thread count too


def _budget(costs: dict[int, float], chances: dict[str, float], threads: int = 2) -> DraftBudget:
    budget = DraftBudget()
    for rows, ms in costs.items():
        budget.costs.record(threads, rows, ms)
    for evidence, chance in chances.items():
        for place in range(4):
            budget.chances.counts[(evidence, place)] = [chance * 1000, 1000.0]
    return budget


def test_unlikely_drafts_are_cut_where_rows_cost_and_likely_ones_kept():
    # a one-row round 20 ms, each further row 1.5 ms: a token pays at a chance above ~0.3
    budget = _budget({1: 20.0, 4: 24.5, 32: 66.5}, {"own6": 0.9, "own1": 0.2})
    assert budget.lengths(2, [("own6", 4), ("own1", 4), ("own6", 2), ("own1", 1)], 0) == [4, 0, 2, 0]
    # free rows (a flat cost): every drafted token is worth verifying
    flat = _budget({1: 20.0, 32: 20.0}, {"own1": 0.2})
    assert flat.lengths(2, [("own1", 4), ("own1", 3)], 0) == [4, 3]
    # costs not measured yet at this thread count: the drafts as they came
    assert budget.lengths(1, [("own1", 4)], 0) == [4]


def test_a_cheaper_larger_row_count_is_taken_where_the_kernel_steps():
    """AMX multiplies 16 rows at a time: 16 rows can cost less than 13 and far less than 17."""
    budget = _budget({4: 24.0, 12: 38.0, 13: 41.0, 15: 43.0, 16: 39.0, 17: 56.0, 20: 56.0}, {"own6": 0.8})
    lengths = budget.lengths(2, [("own6", 4)] * 4, 0)  # 4 + 16 rows offered
    assert 4 + sum(lengths) == 16


def test_the_cut_keeps_each_rows_first_tokens():
    generator = random.Random(3)
    for _ in range(200):
        chances = {f"e{i}": generator.uniform(0.05, 0.95) for i in range(3)}
        costs = {rows: 20.0 + generator.uniform(0.5, 3.0) * rows for rows in (1, 4, 8, 16, 24)}
        budget = _budget(costs, chances)
        drafts = [Draft(list(range(generator.randrange(0, 9))), evidence=generator.choice(list(chances))) for _ in range(generator.randrange(1, 6))]
        original = [list(d.tokens) for d in drafts]
        fixed = {0} if generator.random() < 0.3 else set()
        cut = trim_drafts(budget, 2, drafts, fixed)
        for row, (draft, tokens) in enumerate(zip(drafts, original)):
            assert draft.tokens == tokens[: len(draft.tokens)]  # a prefix of what was drafted
            assert (row in cut) == (len(draft.tokens) == 0 < len(tokens))
            if row in fixed:
                assert draft.tokens == tokens  # a forced start is verified whole


def test_a_round_teaches_the_budget_its_cost_and_its_drafts_chances():
    budget = DraftBudget()
    drafts = [Draft([1, 2, 3, 4], evidence="own2"), Draft([]), Draft([5, 6, 7, 8], evidence="sibling5")]
    budget.record(2, rows=12, ms=30.0, drafts=drafts, accepted=[1, 0, 4])
    assert budget.costs.ms == {(2, 12): 30.0}
    accepted, offered = CHANCE_PRIOR
    assert budget.chances.chance("own2", 0) == (accepted + 1) / (offered + 1) and budget.chances.chance("own2", 1) == accepted / (offered + 1)
    assert budget.chances.chance("sibling5", 3) == (accepted + 1) / (offered + 1) and ("", 0) not in budget.chances.counts
