"""Defaults that fit the machine: the rule that turns measured round and prefill times into
k, max tokens and the first-answer moment, and the engine's own measurement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kspec.engine.machine_fit import (
    FIRST_ANSWER_RANGE_MS,
    MAX_TOKENS_RANGE,
    MIN_K,
    TARGET_FIRST_ANSWER_MS,
    MachineTiming,
    choose_defaults,
    tokens_ms,
    FIRST_WORD_TOKENS,
    COLD_PROMPT_MS,
    PROMPT_TOKENS_RANGE,
)


def test_a_fast_machine_gets_four_alternatives_and_an_early_first_answer():
    fast = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=1.0, keystroke_ms=20.0))
    assert fast.k == 4 and fast.first_answer_ms <= TARGET_FIRST_ANSWER_MS
    assert fast.max_tokens == MAX_TOKENS_RANGE[1]


def test_a_slow_machine_trades_alternatives_and_length_for_time():
    timing = MachineTiming({2: 120.0, 4: 180.0}, prefill_ms_per_token=4.0, keystroke_ms=100.0)
    slow = choose_defaults(timing)
    assert slow.k == MIN_K and slow.max_tokens < MAX_TOKENS_RANGE[1]
    assert FIRST_ANSWER_RANGE_MS[0] <= slow.first_answer_ms <= FIRST_ANSWER_RANGE_MS[1]
    # the first answer is due when the first words can be there (an interim answer shows them), not a whole line
    assert slow.first_answer_ms == pytest.approx(tokens_ms(timing, 2, FIRST_WORD_TOKENS), abs=1) == 100 + 2 * 120


def test_choices_get_no_worse_as_the_machine_gets_faster():
    previous = None
    for round_ms in (120.0, 60.0, 30.0, 15.0, 8.0, 4.0):
        chosen = choose_defaults(MachineTiming({2: round_ms * 0.8, 4: round_ms}, prefill_ms_per_token=round_ms / 20, keystroke_ms=round_ms))
        if previous is not None:
            assert chosen.k >= previous.k and chosen.max_tokens >= previous.max_tokens
            assert chosen.first_answer_ms <= previous.first_answer_ms
        previous = chosen


def test_timing_is_validated():
    with pytest.raises(ValueError):
        MachineTiming({}, 1.0, 1.0)
    with pytest.raises(ValueError):
        MachineTiming({4: 0.0}, 1.0, 1.0)
    with pytest.raises(ValueError):
        MachineTiming({4: 1.0}, 1.0, -1.0)


def test_the_engine_measures_itself(random_llama_dir):
    from kspec.engine.completion import CompletionEngine
    from kspec.engine.config import EngineConfig

    engine = CompletionEngine.load(EngineConfig(model=str(random_llama_dir), dtype="float32", progress=False))
    assert engine.defaults is not None and engine.defaults.k >= MIN_K  # chosen at load
    assert engine.prompt_tokens == min(engine.config.prompt_tokens, engine.defaults.prompt_tokens)
    timing = engine.measure_machine()
    assert set(timing.round_ms) == {2, 4} and all(ms > 0 for ms in timing.round_ms.values())
    assert timing.prefill_ms_per_token > 0 and timing.keystroke_ms > 0
    # per token of the cold prompt's own prefill: not the whole prefill over the one token the
    # healing walk computed after it (that read 470 ms "per token" for the default model)
    assert timing.prefill_ms_per_token < timing.keystroke_ms


def test_the_prompt_budget_is_what_a_cold_prefill_does_in_its_time():
    slow = choose_defaults(MachineTiming({2: 120.0, 4: 180.0}, prefill_ms_per_token=2.0, keystroke_ms=100.0))
    assert slow.prompt_tokens == int(COLD_PROMPT_MS / 2.0)
    fast = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=0.2, keystroke_ms=20.0))
    assert fast.prompt_tokens == PROMPT_TOKENS_RANGE[1]
    crawling = choose_defaults(MachineTiming({2: 900.0, 4: 1200.0}, prefill_ms_per_token=50.0, keystroke_ms=400.0))
    assert crawling.prompt_tokens == PROMPT_TOKENS_RANGE[0]


def test_the_engine_cuts_prompts_to_the_fitted_budget(random_engine):
    from kspec.engine.api import CompletionRequest

    assert random_engine.defaults is None  # the fixture's engine is not fitted
    assert random_engine.prompt_tokens == random_engine.config.prompt_tokens
    long_prefix = "".join(f"def function_{i}(argument):\n    return argument * {i}\n\n" for i in range(300))

    def prompt_tokens() -> float:
        result = random_engine.complete(CompletionRequest(prefix=long_prefix, k=1, max_tokens=1, raw=True, cursor_rules=False))
        return result.timing_ms["prompt_tokens"]

    fitted = choose_defaults(MachineTiming({2: 8.0, 4: 10.0}, prefill_ms_per_token=0.01, keystroke_ms=20.0))
    try:
        random_engine.defaults = fitted  # 1536: never above the configured budget
        assert random_engine.prompt_tokens == random_engine.config.prompt_tokens
        whole = prompt_tokens()
        random_engine.defaults = replace(fitted, prompt_tokens=100)
        assert random_engine.prompt_tokens == 100
        assert 0 < prompt_tokens() <= 100 < whole
    finally:
        random_engine.defaults = None
