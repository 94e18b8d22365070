"""Defaults that fit the machine: the rule that turns measured round and prefill times into
k, max tokens and the first-answer moment, and the engine's own measurement."""

from __future__ import annotations

import pytest

from kspec.engine.machine_fit import (
    FIRST_ANSWER_RANGE_MS,
    MAX_TOKENS_RANGE,
    MIN_K,
    TARGET_FIRST_ANSWER_MS,
    MachineTiming,
    choose_defaults,
    line_ms,
)


def test_a_fast_machine_gets_four_alternatives_and_an_early_first_answer():
    fast = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=1.0))
    assert fast.k == 4 and fast.first_answer_ms <= TARGET_FIRST_ANSWER_MS
    assert fast.max_tokens == MAX_TOKENS_RANGE[1]


def test_a_slow_machine_trades_alternatives_and_length_for_time():
    slow = choose_defaults(MachineTiming({2: 60.0, 4: 90.0}, prefill_ms_per_token=4.0))
    assert slow.k == MIN_K and slow.max_tokens < MAX_TOKENS_RANGE[1]
    assert FIRST_ANSWER_RANGE_MS[0] <= slow.first_answer_ms <= FIRST_ANSWER_RANGE_MS[1]
    assert slow.first_answer_ms == pytest.approx(min(FIRST_ANSWER_RANGE_MS[1], line_ms(MachineTiming({2: 60.0, 4: 90.0}, 4.0), 2)), abs=1)


def test_choices_get_no_worse_as_the_machine_gets_faster():
    previous = None
    for round_ms in (120.0, 60.0, 30.0, 15.0, 8.0, 4.0):
        chosen = choose_defaults(MachineTiming({2: round_ms * 0.8, 4: round_ms}, prefill_ms_per_token=round_ms / 20))
        if previous is not None:
            assert chosen.k >= previous.k and chosen.max_tokens >= previous.max_tokens
            assert chosen.first_answer_ms <= previous.first_answer_ms
        previous = chosen


def test_timing_is_validated():
    with pytest.raises(ValueError):
        MachineTiming({}, 1.0)
    with pytest.raises(ValueError):
        MachineTiming({4: 0.0}, 1.0)


def test_the_engine_measures_itself(random_engine):
    timing = random_engine.measure_machine()
    assert set(timing.round_ms) == {2, 4} and all(ms > 0 for ms in timing.round_ms.values())
    assert timing.prefill_ms_per_token > 0
    assert random_engine.defaults is not None and random_engine.defaults.k >= MIN_K  # chosen at load
