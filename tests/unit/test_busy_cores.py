"""The thread count follows the free cores (engine/busy_cores.py), on a fake clock: rounds
slower than the fitted one try a thread fewer, kept only where faster; later the core is tried
again; prefill rounds are not judged; rounds of another size are not compared with each other;
where the system says other processes took a core, the next round (a prefill's too) leaves it to
them, tries it again only once they no longer use it, and then takes it back. `OtherProcesses` on /proc texts of our own."""

from __future__ import annotations

import pytest

from kspec.engine.busy_cores import LOOK_S, RETRY_S, ROUNDS_PER_VERDICT, TRIAL_ROUNDS, CoreGovernor, OtherProcesses, size_class

FITTED_MS = 10.0


SMALL, LARGE = 4, 20  # tokens a round feeds: k = 4 rows of one token; the same with 4 drafts each


class Machine:
    """A fake clock and the round time each thread count gets, for rounds of SMALL tokens (and of
    LARGE ones, where given)."""

    def __init__(self, round_ms: dict[int, float], large_ms: dict[int, float] | None = None):
        self.now, self.round_ms, self.large_ms, self.set_to = 0.0, round_ms, large_ms or {}, []
        self.others: float | None = None  # what the system says other processes used (None: it says nothing)
        self.governor = CoreGovernor(2, lambda: (FITTED_MS, SMALL), self.set_to.append, clock=lambda: self.now, others=lambda: self.others)

    def rounds(self, count: int, decode_only: bool = True, tokens: int = SMALL) -> None:
        for _ in range(count):
            with self.governor.round(decode_only) as shape:
                times = self.large_ms if tokens == LARGE else self.round_ms
                self.now += times[self.governor.threads] / 1000
                shape.tokens = tokens


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


def test_a_slower_trial_goes_back_and_its_rounds_become_the_pace():
    machine = Machine({2: 30.0, 1: 45.0})  # slow for another reason: fewer threads do not help
    machine.rounds(2 * ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 2 and machine.set_to == [1, 2]
    machine.now += RETRY_S
    machine.rounds(5 * ROUNDS_PER_VERDICT)  # 30 ms is this machine's pace for such rounds: no trial
    assert machine.set_to == [1, 2]
    machine.round_ms[2] = 60.0  # now another process takes a core
    machine.rounds(ROUNDS_PER_VERDICT)
    assert machine.set_to == [1, 2, 1]


def test_prefill_rounds_are_not_judged():
    machine = Machine({2: 60.0, 1: 18.0})
    machine.rounds(10 * ROUNDS_PER_VERDICT, decode_only=False)
    assert machine.set_to == []


def test_rounds_of_another_size_are_not_taken_for_a_taken_core():
    """Rounds that verify drafts take longer on a quiet machine too: a class larger than the fitted
    round's is not compared with it, but with its own pace; a trial is compared with rounds of its
    own size only (not with the small rounds that happen to run meanwhile, which would make a mix
    look faster)."""
    machine = Machine({2: 9.0, 1: 16.0}, large_ms={2: 30.0, 1: 50.0})
    assert size_class(SMALL) < size_class(LARGE)
    for _ in range(5):
        machine.rounds(ROUNDS_PER_VERDICT, tokens=LARGE)  # 30 ms > 1.5 x 10, but no reference: its own pace
        machine.rounds(ROUNDS_PER_VERDICT)
    assert machine.set_to == []
    machine.large_ms[2] = 60.0  # another process takes a core: a trial of 1 thread
    machine.rounds(ROUNDS_PER_VERDICT, tokens=LARGE)
    assert machine.set_to == [1]
    machine.rounds(2 * ROUNDS_PER_VERDICT)  # small rounds at 16 ms (slower than 9): not what it is compared on
    assert machine.governor.threads == 1
    machine.rounds(ROUNDS_PER_VERDICT, tokens=LARGE)  # 50 ms vs 60: kept
    assert machine.governor.threads == 1 and machine.governor.changes[-1][1].endswith("kept")


def test_a_trial_that_meets_no_round_of_its_class_goes_back():
    machine = Machine({2: 9.0, 1: 16.0}, large_ms={2: 30.0, 1: 50.0})
    machine.rounds(ROUNDS_PER_VERDICT, tokens=LARGE)  # its pace: 30 ms
    machine.large_ms[2] = 60.0
    machine.rounds(ROUNDS_PER_VERDICT, tokens=LARGE)  # a trial
    machine.rounds(TRIAL_ROUNDS)
    assert machine.governor.threads == 2 and machine.set_to == [1, 2]


def test_an_engine_starts_on_the_processs_threads_not_on_what_an_earlier_engines_governor_left(random_engine):
    """PyTorch's thread count is the process's: an engine loaded after another one lowered it (a core
    was taken) starts again from the count kspec was imported with."""
    import torch

    from kspec.engine.completion import THREADS_AT_IMPORT, CompletionEngine

    if THREADS_AT_IMPORT < 2:
        pytest.skip("one thread: nothing to lower")
    try:
        torch.set_num_threads(THREADS_AT_IMPORT - 1)  # as a governor leaves it while a core is taken
        engine = CompletionEngine(random_engine.target, random_engine.config)
        assert engine.cores is not None and engine.cores.full == THREADS_AT_IMPORT
        assert torch.get_num_threads() == THREADS_AT_IMPORT
    finally:
        torch.set_num_threads(THREADS_AT_IMPORT)


def test_a_core_the_system_says_is_taken_is_left_from_the_next_round_a_prefill_s_too():
    machine = Machine({2: 60.0, 1: 18.0})
    machine.others = 0.98  # a process spinning on one of the two cores
    machine.now += LOOK_S
    machine.rounds(1, decode_only=False)  # no decode round timed yet: the system's count alone
    assert machine.governor.threads == 1 and machine.set_to == [1]
    assert "other processes used 0.98 cores" in machine.governor.changes[-1][1]
    machine.now += RETRY_S
    machine.rounds(2 * ROUNDS_PER_VERDICT)  # no trial of 2 threads: the system says the core is still taken
    assert machine.governor.threads == 1 and machine.set_to == [1]
    machine.others = 0.05  # it ended
    machine.now += LOOK_S
    machine.rounds(1, decode_only=False)
    assert machine.governor.threads == 2 and machine.set_to[-1] == 2


def test_a_little_use_by_other_processes_takes_no_core():
    machine = Machine({2: 10.0, 1: 18.0})
    for used in (0.3, 0.55, None):  # an editor typing, a language server parsing; or a system that does not say
        machine.others = used
        machine.now += LOOK_S
        machine.rounds(ROUNDS_PER_VERDICT)
    assert machine.governor.threads == 2 and machine.set_to == []


def test_other_processes_cpu_time_is_the_systems_busy_time_less_this_processs_own():
    """Two looks 0.5 s apart on a 2-CPU machine (100 ticks a second): the CPUs were busy 120 ticks
    (user, nice, system, irq, softirq and steal; idle and iowait are not), this process used 30 of them."""
    texts = {
        "/proc/stat": "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 100 0 20 500 5 0 0 0 0 0\ncpu1 50 0 10 600 0 0 0 0 0 0\nintr 1 2 3\n",
        "/proc/self/stat": "4242 (python (a name) x) S 1 2 3 4 5 6 7 8 9 10 40 10 0 0 20 0",
    }
    clock = [10.0]
    others = OtherProcesses(read=texts.__getitem__, clock=lambda: clock[0])
    others._cpus, others._ticks = {"cpu0", "cpu1"}, 100  # the machine of the texts above
    assert others.since_last() is None  # a first look: nothing to compare with
    texts["/proc/stat"] = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 170 0 30 520 9 0 5 0 0 0\ncpu1 80 2 10 660 0 0 0 3 0 0\n"
    texts["/proc/self/stat"] = "4242 (python (a name) x) S 1 2 3 4 5 6 7 8 9 10 60 20 0 0 20 0"
    clock[0] = 10.5
    assert others.since_last() == pytest.approx((120 - 30) / 100 / 0.5)  # 1.8 cores
    silent = OtherProcesses(read=lambda path: "")  # a system that says nothing: no count, ever
    assert silent.since_last() is None and silent.since_last() is None
