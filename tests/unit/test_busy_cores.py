"""The thread count follows the free cores (engine/busy_cores.py), on a fake clock: rounds
slower than the fitted one try a thread fewer, kept only where faster; later the core is tried
again; prefill rounds are not judged."""

from __future__ import annotations

from kspec.engine.busy_cores import RETRY_S, ROUNDS_PER_VERDICT, CoreGovernor

FITTED_MS = 10.0


class Machine:
    """A fake clock and the round time each thread count gets."""

    def __init__(self, round_ms: dict[int, float]):
        self.now, self.round_ms, self.set_to = 0.0, round_ms, []
        self.governor = CoreGovernor(2, lambda: FITTED_MS, self.set_to.append, clock=lambda: self.now)

    def rounds(self, count: int, decode_only: bool = True) -> None:
        for _ in range(count):
            with self.governor.round(decode_only):
                self.now += self.round_ms[self.governor.threads] / 1000


def test_rounds_as_fast_as_fitted_keep_every_thread():
    machine = Machine({2: FITTED_MS * 1.2, 1: FITTED_MS * 1.8})
    machine.rounds(10 * ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 2 and machine.set_to == []


def test_a_taken_core_is_left_to_the_other_process_while_that_is_faster():
    machine = Machine({2: 60.0, 1: 18.0})  # one thread shares its core: every barrier waits for it
    machine.rounds(ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 1 and machine.set_to == [1]  # a trial
    machine.rounds(ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 1 and machine.governor.changes[-1][1].endswith("kept")
    machine.round_ms[2] = 11.0  # the other process ended
    machine.now += RETRY_S
    machine.rounds(2 * ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 2 and machine.set_to == [1, 2]  # tried again and kept


def test_a_slower_trial_goes_back_and_waits_before_trying_again():
    machine = Machine({2: 30.0, 1: 45.0})  # slow for another reason: fewer threads do not help
    machine.rounds(2 * ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 2 and machine.set_to == [1, 2]
    machine.rounds(5 * ROUNDS_PER_VERDICT)  # 30 ms x 30 rounds: well within RETRY_S
    assert machine.set_to == [1, 2]
    machine.now += RETRY_S
    machine.rounds(ROUNDS_PER_VERDICT)
    assert machine.set_to == [1, 2, 1]


def test_prefill_rounds_are_not_judged():
    machine = Machine({2: 60.0, 1: 18.0})
    machine.rounds(10 * ROUNDS_PER_VERDICT, decode_only=False)
    assert machine.set_to == []
