"""A decode round without host round-trips (engine/decode/acceptance.py and its callers).

  * always (CPU): the batched acceptance equals the per-branch host acceptance (greedy) or
    follows the target's distribution (sampling), and so does the CPU's greedy acceptance
    position by position; a whole greedy round on the CPU (finished, propose, the target's pass,
    accept) reads values into Python once per position whose logits it takes (once more with a
    model drafter: its drafts), counted by patching every Tensor method that reads a tensor's
    values into Python;
  * CUDA: a whole round synchronises once, under torch's sync debug mode, which also sees
    synchronising copies.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import torch

from kspec.engine.decode.acceptance import accept_drafts, accept_greedy_by_position, accept_greedy_rows, accept_sampling_rows, pack_drafts, read_round
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.decode.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.speculative import SpeculationConfig, SpeculativeRun, pad_rows
from kspec.engine.decode.stopping import StopRule
from kspec.engine.models.hf_folder import load_transformer
from kspec.engine.models.tokenizer import Tokenizer

CODE = "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n\n\ndef total(values):\n    total = 0\n    for value in values:\n"
READS = ("tolist", "item", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")  # values into Python / to the host


@contextmanager
def host_reads() -> Iterator[list[str]]:
    """Every call of a Tensor method that reads values into Python, by name (on CUDA: a sync each)."""
    calls: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name: str):
        original = originals[name]

        def read(self, *args, **kwargs):
            calls.append(name)
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


# -- the batched acceptance --------------------------------------------------------------


@pytest.mark.parametrize("ahead", [0, 2, 100])
def test_greedy_rows_equal_the_per_branch_acceptance(ahead: int) -> None:
    """The same tokens whether the head runs position by position or takes the next positions of
    the rows that drafted there in its first call (`ahead`: that many positions after the first)."""
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        k, vocab = 5, 7
        lengths = torch.randint(0, 5, (k,), generator=g).tolist()
        width = max(lengths)
        logits = torch.randn(k, width + 2, vocab, generator=g)  # [k, T, V], T wider than needed (a batch's padding)
        logits[0, 1, 3] = logits[0, 1].max()  # a tie: the first maximum wins on both paths
        best = logits.argmax(-1)  # [k, T]
        drafts = []
        for row, n in enumerate(lengths):  # the target's own tokens, with a wrong one somewhere (or none)
            draft = best[row, :n].tolist()
            wrong = int(torch.randint(0, n + 1, (), generator=g)) if n else 0
            if wrong < n:
                draft[wrong] = (draft[wrong] + 1) % vocab
            drafts.append(draft)
        tokens, lens = pack_drafts(drafts, width, torch.device("cpu"))
        accepted, taken = accept_greedy_rows(tokens, lens, logits[:, : width + 1])
        log_probs = torch.log_softmax(logits, -1)
        result = read_round(accepted, taken, log_probs[:, : width + 1])
        scored: list[int] = []  # rows the head took per position
        by_position = accept_greedy_by_position(
            drafts, logits, lambda rows: scored.append(len(rows)) or rows, lambda first: first, ahead=ahead
        )  # fmt: skip  # hidden states that are the logits: the head is the identity
        for row, draft in enumerate(drafts):
            n_ok, own = accept_greedy(draft, logits[row, : len(draft) + 1])
            assert result.accepted[row] == n_ok, trial
            assert result.tokens[row] == draft[:n_ok] + [own]
            assert result.logprobs[row] == [float(log_probs[row, j, t]) for j, t in enumerate(result.tokens[row])]
        assert by_position.accepted == result.accepted and by_position.tokens == result.tokens, trial
        assert by_position.logprobs == result.logprobs
        first_call = k + sum(min(length, ahead) for length in lengths)  # position 0, then each draft's first `ahead`
        assert scored[0] == first_call, trial
        if ahead == 0:
            assert sum(scored) == sum(n + 1 for n in result.accepted)  # the head only where it decides
        reached = max(result.accepted)  # positions past the first call: one call each, the rows still accepting
        assert len(scored) == 1 + max(0, reached - ahead), trial


def _chi_square_limit(df: int) -> float:
    """~0.9999 quantile of chi-square(df) (Wilson–Hilferty)."""
    z = 3.719
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampling_rows_follow_the_target_distribution(deterministic: bool) -> None:
    """Many rows with the same p and q: each row's first token, accepted draft or correction,
    is distributed as p (what exact speculative sampling guarantees); after an accepted draft
    the bonus token follows p's next row."""
    rows, vocab = 40000, 5
    g = torch.Generator().manual_seed(3)
    p = torch.tensor([[0.05, 0.4, 0.1, 0.25, 0.2], [0.3, 0.1, 0.2, 0.1, 0.3]])  # [T=2, V]
    q_row = torch.tensor([0.5, 0.1, 0.2, 0.1, 0.1])  # the drafter's distribution at position 0
    drafts = torch.multinomial(q_row, rows, replacement=True, generator=g)[:, None]  # [k, 1], d ~ q
    if deterministic:  # a deterministic drafter: always the same token, q one-hot
        drafts = torch.full((rows, 1), 0)
    q = None if deterministic else q_row.expand(rows, 1, vocab)  # [k, 1, V]
    accepted, taken = accept_sampling_rows(drafts, torch.ones(rows, dtype=torch.int64), q, p.expand(rows, 2, vocab), g)
    first = torch.bincount(taken[:, 0], minlength=vocab).double()
    expected = p[0].double() * rows
    statistic = (((first - expected) ** 2) / expected).sum().item()
    assert statistic < _chi_square_limit(vocab - 1), statistic
    bonus = taken[accepted == 1, 1]  # accepted the draft: the second token is drawn from p[1]
    counts = torch.bincount(bonus, minlength=vocab).double()
    expected = p[1].double() * len(bonus)
    assert (((counts - expected) ** 2) / expected).sum().item() < _chi_square_limit(vocab - 1)
    assert 0 < int(accepted.sum()) < rows


def test_sampling_rows_accept_everything_when_the_draft_is_the_target() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, 4, 9, generator=g), -1)  # [k, T, V]
    drafts = torch.multinomial(p[:, :3].reshape(-1, 9), 1, generator=g).view(6, 3)  # [k, 3]
    lengths = torch.tensor([3, 2, 0, 1, 3, 3])
    accepted, taken = accept_sampling_rows(drafts, lengths, p[:, :3], p, g)
    assert accepted.tolist() == lengths.tolist()
    for row, n in enumerate(lengths.tolist()):
        assert taken[row, :n].tolist() == drafts[row, :n].tolist()


# -- a whole round ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(random_llama_dir: Path):
    return load_transformer(random_llama_dir, torch.float32), Tokenizer.from_folder(random_llama_dir)


def _run(model, tokenizer, drafter, k: int = 3) -> SpeculativeRun:
    tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(12, ignore_eos=True), tokenizer.encode(CODE))
    config = SpeculationConfig(gamma=3, rule="fixed", cost_aware=False)  # every round drafts: what a round costs is under test
    return SpeculativeRun(model, tracker, k, SamplingParams(), drafter, config, diverse=True)


def _round(run: SpeculativeRun, model) -> bool:
    """One round as decode_speculative runs it; False when the run is over."""
    with torch.inference_mode():
        if run.finished():
            return False
        inputs = pad_rows(run.propose(), model.device)  # [k', T]
        run.accept(model(inputs, run.cache), 0.0)  # hidden [k', T, dim]
    return True


@pytest.mark.parametrize("drafter, draft_reads", [("none", 0), ("lookup", 0), ("model", 1)])
def test_a_greedy_round_on_the_cpu_reads_the_host_once_per_position_it_scores(tiny, drafter: str, draft_reads: int) -> None:
    """The head's positions one at a time (1 + the round's longest accepted run), one read each,
    plus one of a model drafter's drafts; a round without drafts reads once."""
    model, tokenizer = tiny
    make = {"none": NoDrafter, "lookup": PromptLookupDrafter, "model": lambda: ModelDrafter(model, SamplingParams())}[drafter]
    run = _run(model, tokenizer, make())
    scored = []
    while True:
        with host_reads() as calls, torch.inference_mode():
            if run.finished():
                break
            before = list(run.cache.lengths)
            rows = run.propose()
            run.accept(model(pad_rows(rows, model.device), run.cache), 0.0)
            scored.append(max(after - length for after, length in zip(run.cache.lengths, before)))  # 1 + accepted
        assert len(calls) == scored[-1] + draft_reads, calls
        assert scored[-1] <= max(len(row) for row in rows)
    assert len(scored) >= 3
    assert all(len(branch.token_ids) == 12 for branch in run.branches)
    if drafter == "none":
        assert set(scored) == {1}
    if drafter == "model":  # the target drafting for itself: every draft accepted, every position scored
        assert max(scored) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch's sync debug mode)")
def test_a_round_on_cuda_synchronises_once(random_llama_dir: Path) -> None:
    model = load_transformer(random_llama_dir, torch.bfloat16, "cuda")
    run = _run(model, Tokenizer.from_folder(random_llama_dir), PromptLookupDrafter())
    _round(run, model)  # warm-up: first calls allocate and load kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _round(run, model)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]


@pytest.mark.parametrize("drafter", ["lookup", "model"])
def test_the_device_sampling_path_of_a_run(tiny, drafter: str) -> None:
    """What a CUDA run takes for sampling (the CPU keeps its per-branch version): the batched
    rows give drafts' prefixes and one token of the target's, with their log-probabilities."""
    model, tokenizer = tiny
    params = SamplingParams(temperature=0.8, seed=5)
    make = {"lookup": PromptLookupDrafter, "model": lambda: ModelDrafter(model, params)}[drafter]
    tracker = BranchTracker(tokenizer, StopRule(), DecodeLimits(12, ignore_eos=True), tokenizer.encode(CODE))
    run = SpeculativeRun(model, tracker, 3, params, make(), SpeculationConfig(gamma=3, rule="fixed"))
    with torch.inference_mode():
        assert not run.finished()
        rows = run.propose()
        logits = model.logits(model(pad_rows(rows, model.device), run.cache))  # [k, T, V]
        log_probs = torch.log_softmax(logits, -1)
        with host_reads() as calls:
            taken = accept_drafts([d.tokens for d in run._drafts], [d.q for d in run._drafts], logits, log_probs, params, run.generator)
    assert calls == ["tolist"]
    for row, draft in enumerate(rows):
        n = taken.accepted[row]
        assert 0 <= n <= len(draft) - 1 and taken.tokens[row][:n] == draft[1 : 1 + n]
        assert len(taken.tokens[row]) == len(taken.logprobs[row]) == n + 1
        assert taken.logprobs[row] == [float(log_probs[row, j, t]) for j, t in enumerate(taken.tokens[row])]


def test_bfloat16_is_the_default_on_cuda() -> None:
    from kspec.engine.config import EngineConfig
    from kspec.engine.models.loading import Compute

    assert Compute.choose(EngineConfig(device="cuda")) == Compute(torch.bfloat16, False)
    assert Compute.choose(EngineConfig(device="cuda:1")).dtype == torch.bfloat16
    assert Compute.choose(EngineConfig(device="cuda", dtype="float32")).dtype == torch.float32  # an explicit dtype stays
    assert Compute.choose(EngineConfig(device="cpu")).dtype == torch.float32  # the CPU keeps its own rule


def accept_greedy(draft: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """The greedy rule written plainly, the oracle the engine's acceptance is checked against:
    target_logits [n+1, V] for [last, d1..dn] -> (accepted count, the target's next token)."""
    choices = target_logits.argmax(dim=-1).tolist()  # [n+1]
    accepted = 0
    while accepted < len(draft) and draft[accepted] == choices[accepted]:
        accepted += 1
    return accepted, choices[accepted]
