"""How far a verification's first call of the head reaches: the head's cost fitted from its timed
calls, and the plan that weighs one more call against the rows it would take."""

from __future__ import annotations

import pytest
import torch

from kspec.engine.decode.acceptance import REACH_PRIOR, HeadPlan
from kspec.engine.models.head_cost import TIMED_ROWS, HeadCost, measure_head


def test_the_cost_is_the_line_through_the_timed_calls() -> None:
    cost = HeadCost.fitted({1: 5.3, 16: 9.05})
    assert cost.row_ms == pytest.approx(0.25) and cost.call_ms == pytest.approx(5.05) and cost.max_rows is None
    assert HeadCost.fitted({1: 5.0, 16: 9.0}, max_rows=12).max_rows == 12
    assert HeadCost.fitted({1: 5.0, 16: 4.0}).row_ms > 0  # noise that makes more rows faster: still a positive row cost
    with pytest.raises(ValueError, match="two row counts"):
        HeadCost.fitted({4: 6.0})
    with pytest.raises(ValueError):
        HeadCost(5.0, 0.0)


def test_the_first_call_takes_a_position_while_a_call_saved_is_worth_its_rows() -> None:
    cheap_rows = HeadPlan(HeadCost(call_ms=5.0, row_ms=0.25))  # prior reach 0.5: a position of up to 10 rows pays
    assert cheap_rows.positions([4, 4, 4, 4]) == 4
    assert cheap_rows.positions([4, 2, 0, 0]) == 4  # fewer rows deeper down
    assert cheap_rows.positions([]) == 0 and cheap_rows.positions([0, 0]) == 0
    wide = [4] * 12  # 12 rows a position: 0.5 x 5 ms < 12 x 0.25 ms
    assert cheap_rows.positions(wide) == 0
    assert HeadPlan(HeadCost(call_ms=5.0, row_ms=1.0)).positions([4, 4, 4, 4]) == 0
    assert HeadPlan(None).positions([4, 4, 4, 4]) == 0  # a head whose rows may round by their call
    capped = HeadPlan(HeadCost(call_ms=5.0, row_ms=0.25, max_rows=10))
    assert capped.positions([4, 4, 4, 4]) == 1  # 4 + 4 rows fit, a third position's 4 would not


def test_the_reach_follows_the_rounds() -> None:
    plan = HeadPlan(HeadCost(call_ms=5.0, row_ms=0.25))
    assert plan.reach(1) == REACH_PRIOR
    for _ in range(6):  # drafts of 4 rejected at once, round after round
        plan.record([4, 4, 4, 4], [0, 0, 0, 0])
    assert plan.reach(1) < 0.1 and plan.positions([4, 4, 4, 4]) == 0
    for _ in range(6):  # then one row accepts two drafts every round
        plan.record([4, 4, 4, 4], [2, 0, 1, 0])
    assert plan.reach(1) > 0.8 and plan.reach(2) > 0.8 and plan.reach(3) < 0.1
    assert plan.positions([4, 4, 4, 4]) == 2
    assert plan.reach(6) == plan.reach(3)  # never measured: no more than a shallower position


def test_the_head_is_timed_at_each_row_count() -> None:
    head = torch.nn.Linear(64, 1000, bias=False)
    times = measure_head(head, 64)
    assert sorted(times) == sorted(TIMED_ROWS) and all(ms > 0 for ms in times.values())
    HeadCost.fitted(times)  # a cost can be fitted from what was timed
