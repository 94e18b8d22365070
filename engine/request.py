"""One request's life, in order: validated -> prompt -> prefill (a chunk per batch round,
reusing the prefix cache) -> token-healing walk -> speculative rounds over k branches
(driven by the batcher, engine/batching.py) -> post-processing into ranked alternatives.

The request's state is explicit (`RequestState`); the batcher schedules by it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import replace
from typing import Callable, Generator, Protocol

import torch
from torch import Tensor

from kspec.engine.api import (
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MODES,
    CancelToken,
    Completion,
    CompletionRequest,
    CompletionResult,
)
from kspec.engine.cache.prefix_cache import PrefixCache
from kspec.engine.config import EngineConfig, SteeringConfig
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.decode.drafters import Drafter, ModelDrafter, NoDrafter, PromptLookupDrafter
from kspec.engine.decode.healing import HealingBias, walk_healing
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.speculative import DraftBudget, DraftPayoffs, SpeculationConfig, SpeculativeRun
from kspec.engine.decode.member_constraint import MemberConstraint
from kspec.engine.decode.steering import forced_tokens, past_indentation_starts, ranked_by_model
from kspec.engine.decode.stopping import StopRule, rule_for_cursor
from kspec.engine.errors import CancelledError, InputError
from kspec.engine.models.loading import LoadedModel
from kspec.engine.models.transformer import EarlyExit
from kspec.engine.prompt import PromptBudget, PromptStarts, build_prompt
from kspec.engine.syntax.rank import dedupe_key
from kspec.engine.syntax import UnitPredicate, binding_starts, by_context_affinity, detect_language, hole_needs, member_names, postprocess


class RequestState(enum.Enum):
    PREPARING = "preparing"  # prompt prefill, a chunk per round
    DECODING = "decoding"  # in the batch's verification passes
    OVER = "over"  # ready for `result()`: decoded, nothing to complete, cancelled or late


class EngineParts(Protocol):
    """What a request uses of the engine that runs it (CompletionEngine)."""

    target: LoadedModel
    draft: LoadedModel | None
    config: EngineConfig
    prefix_cache: PrefixCache
    draft_prefix_cache: PrefixCache
    draft_payoffs: DraftPayoffs  # what drafting was measured to be worth, per k, across requests
    draft_budget: DraftBudget  # drafted tokens' measured chances and round costs, across requests
    prompt_starts: PromptStarts  # where recent prompts began: the next keystroke's begins there too

    @property
    def model_name(self) -> str: ...

    @property
    def prompt_tokens(self) -> int:
        """The prompt's token budget (the configured one, or less where the machine is slow)."""
        ...

    @property
    def suffix_tokens(self) -> int | None:
        """Of that budget, the text after the cursor's at most (None: the budget's share)."""
        ...


def validate_request(request: CompletionRequest) -> None:
    for name in ("prefix", "suffix", "language", "path"):
        _check_text(name, getattr(request, name))
    if not 1 <= request.k <= MAX_K:
        raise InputError(f"k must be between 1 and {MAX_K}, got {request.k}")
    if not 1 <= request.max_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"max_tokens must be between 1 and {MAX_NEW_TOKENS}, got {request.max_tokens}")
    if request.deadline_ms <= 0:
        raise InputError(f"deadline_ms must be > 0, got {request.deadline_ms}")
    if request.first_answer_ms < 0:
        raise InputError(f"first_answer_ms must be >= 0 (0: no early answer), got {request.first_answer_ms}")
    if len(request.stop) > MAX_STOPS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in request.stop):
        raise InputError(f"stop must be at most {MAX_STOPS} non-empty strings of up to {MAX_STOP_CHARS} characters")
    for stop in request.stop:
        _check_text("stop", stop)
    if request.mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {request.mode!r}")
    if not 0.0 <= request.others_temperature <= 10.0:
        raise InputError(f"others_temperature must be in [0, 10], got {request.others_temperature}")
    try:
        sampling_params(request)
    except ValueError as exc:
        raise InputError(str(exc)) from exc


def _check_text(name: str, text: str) -> None:
    """Text that UTF-8 can carry: JSON's "\\ud800" escapes give Python strings with lone
    surrogates, which the tokenizer cannot take (a TypeError deep inside it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{name} is not valid Unicode text: a lone surrogate at character {exc.start}") from None


def others_sampled(request: CompletionRequest) -> bool:
    """Mode "diverse" with `others_temperature`: branch 0 greedy, the other k - 1 sampled."""
    return request.mode == "diverse" and request.others_temperature > 0 and request.k > 1


def sampling_params(request: CompletionRequest) -> SamplingParams:
    if others_sampled(request):
        return SamplingParams(request.others_temperature, request.top_p, request.seed, greedy_branches=1)
    top_p = 1.0 if request.mode == "diverse" else request.top_p  # diverse: greedy after the distinct first tokens
    return SamplingParams(request.sampling_temperature, top_p, request.seed)


def choose_drafter(parts: EngineParts, params: SamplingParams) -> Drafter:
    choice = parts.config.drafter
    if choice == "auto":
        choice = "model" if parts.draft is not None else "lookup"
    if choice == "model" and parts.draft is not None:
        return ModelDrafter(parts.draft.model, params, parts.draft_prefix_cache)
    if choice == "layerskip":
        layers = min(parts.config.draft_layers, parts.target.model.args.n_layers)
        return ModelDrafter(EarlyExit(parts.target.model, layers), params, parts.draft_prefix_cache)
    return PromptLookupDrafter() if choice == "lookup" else NoDrafter()


def steering_starts(
    parts: EngineParts, request: CompletionRequest, language: str | None, healed_text: str,
    next_log_probs: Callable[[list[int]], Tensor], healing: HealingBias | None = None, stops: StopRule | None = None,
) -> tuple[list[list[int]], SteeringConfig]:  # fmt: skip
    """The forced starts for some of the request's branches (engine/decode/steering.py), as
    tokens after the healed text, most wanted first, with the rule they follow: after `module.`
    the module's member names (engine/syntax/members.py), ranked by the model
    (`next_log_probs(ids)` -> [V]: its log-probabilities after the prompt and `ids`); else starts
    that bind what the code after the cursor needs (engine/syntax/needs.py); else, at a line
    start, the likeliest indentation followed by distinct content (`past_indentation_starts`,
    with `healing`: the first token's constraint; not past a line break the cursor's rule,
    `stops`, ends the text at). None when steering is off, k is 1, or the cursor rules are off."""
    config = parts.config
    binding = SteeringConfig(config.steer_branches, config.steer_min_logprob)
    if request.k < 2 or not request.cursor_rules:
        return [], binding
    members = member_names(request.prefix, request.members) if config.steer_member_branches else None
    if members is not None:
        starts, steering = list(members.rests), SteeringConfig(config.steer_member_branches, config.steer_min_logprob)
    elif config.steer_branches and language is not None:
        needs = hole_needs(request.prefix, request.suffix, language, frozenset(request.outside_names))
        starts, steering = binding_starts(needs, headers=config.steer_block_headers), binding
        if starts and needs.header and config.steer_block_headers:  # only a header fills the hole: all branches but the first start with one
            steering = SteeringConfig(max(config.steer_branches, request.k - 1), config.steer_min_logprob)
    else:
        starts, steering = [], binding
    tokens = [forced_tokens(parts.target.tokenizer, healed_text, start) for start in starts]
    kept = [ids for ids in tokens if ids is not None]
    if members is None and config.steer_past_indent and request.mode == "diverse" and not others_sampled(request) and healing is not None:
        tokenizer = parts.target.tokenizer
        first = next_log_probs([])  # [V]
        if healed_text:
            first = torch.log_softmax(first + healing(healed_text), dim=-1)
        one_line = stops is not None and stops.single_line
        indented = past_indentation_starts(first, tokenizer.token_texts(), tokenizer.stop_ids, healed_text, next_log_probs, request.k, one_line)
        if indented:  # the binding starts first (steering.branches of them), the other branches split after the indentation
            kept = kept[: steering.branches]
            indented = [ids for ids in indented if not any(ids == start[: len(ids)] for start in kept)]
            return kept + indented, SteeringConfig(request.k - 1, config.steer_min_logprob)
    if members is None:
        return kept, steering
    ranked = ranked_by_model(kept, next_log_probs)
    if config.constrain_member_names:
        ranked = ranked[1:]  # branch 0, kept to the module's names too (member_constraint), writes the likeliest itself
    # Names that share a word with the code around the cursor come first, all but one steered
    # branch: the model's own preference keeps the last.
    tokens_of = {members.typed + rest: ids for rest, ids in zip(starts, tokens) if ids is not None}
    affine = [tokens_of[name] for name in by_context_affinity(tuple(tokens_of), members.words)]
    picks = [ids for ids in affine if ids in ranked][: max(0, config.steer_member_branches - 1)]
    return picks + [ids for ids in ranked if ids not in picks], steering


def member_constraint(parts: EngineParts, request: CompletionRequest, vocab_size: int, device: torch.device) -> MemberConstraint | None:
    """What keeps a branch inside `module.name` to the module's names: where the request carries
    member names, the cursor rules are on and the engine's setting allows it."""
    if not request.members or not request.cursor_rules or not parts.config.constrain_member_names:
        return None
    return MemberConstraint(parts.target.tokenizer, vocab_size, device, request.prefix, request.members)


def prepare(
    parts: EngineParts, request: CompletionRequest, cancel: CancelToken, deadline: float, language: str,
    noted: dict[str, float] | None = None,
) -> Generator[None, None, SpeculativeRun | None]:
    """Prompt, prefill (yielding between chunks) and the healing walk -> the request's
    decoding state, or None when there is nothing to complete (empty prompt).
    `deadline` (time.monotonic()) was set when the request arrived: prefill counts. `noted`
    receives the other files' context that went into the prompt (tokens, pieces)."""
    tokenizer, model = parts.target.tokenizer, parts.target.model
    prompt = build_prompt(
        tokenizer, request.prefix, request.suffix, PromptBudget(parts.prompt_tokens, suffix_tokens=parts.suffix_tokens), parts.prompt_starts,
        request.context, request.path, request.language,
    )  # fmt: skip
    if noted is not None and request.context:
        noted.update(context_tokens=float(prompt.context_tokens), context_files=float(len(prompt.context_files)))
    if not prompt.ids:
        return None
    first = yield from parts.prefix_cache.prefill_steps(model, prompt.ids)
    bias = HealingBias(tokenizer, model.args.vocab_size, model.device)
    ids, healed_text, prefill = walk_healing(
        lambda ids: parts.prefix_cache.prefill(model, ids, cancel), tokenizer, prompt.ids, prompt.healed_text, bias, first
    )
    # what the cache held when the request came: the walk's own prefills reuse what the first one just stored
    prefill = replace(prefill, reused_tokens=min(prefill.reused_tokens, first.reused_tokens))
    stops = rule_for_cursor(request.prefix, request.suffix, request.stop) if request.cursor_rules else StopRule(request.stop)
    echo_suffix = request.suffix if request.cursor_rules else ""  # what the editor closed after the cursor: no branch repeats it
    tracker = BranchTracker(tokenizer, stops, DecodeLimits(request.max_tokens, deadline), ids, healed_text, echo_suffix)
    params = sampling_params(request)
    forced, steering = steering_starts(
        parts, request, language, healed_text,
        lambda more: torch.log_softmax((parts.prefix_cache.prefill(model, ids + more, cancel) if more else prefill).last_logits.float(), -1),
        bias, stops,
    )  # fmt: skip
    unit_done = None
    if parts.config.early_stop and not request.raw:
        unit_done = UnitPredicate(request.prefix, request.suffix, language)
    return SpeculativeRun(
        model,
        tracker,
        request.k,
        params,
        choose_drafter(parts, params),
        SpeculationConfig(gamma=parts.config.gamma, gamma_max=max(8, parts.config.gamma), cost_aware=parts.config.draft_only_when_paying),
        cancel,
        diverse=request.mode == "diverse" and not others_sampled(request),
        prefill=prefill,
        unit_done=unit_done,
        healing=bias,
        payoff=parts.draft_payoffs.for_k(request.k),
        budget=parts.draft_budget,
        forced=forced,
        steering=steering,
        names=member_constraint(parts, request, bias.vocab_size, bias.device),
        fork_ratio=parts.config.fork_ratio,
    )


class ActiveCompletion:
    """One request inside a batch: PREPARING (a prefill chunk per round), then DECODING
    (its rows join each round's verification pass), then OVER (`result()`)."""

    def __init__(self, parts: EngineParts, request: CompletionRequest, cancel: CancelToken):
        validate_request(request)
        self.parts, self.request, self.cancel = parts, request, cancel
        self.started = time.perf_counter()
        self.deadline = time.monotonic() + request.deadline_ms / 1000
        self.language = detect_language(request.language, request.path)
        self.state = RequestState.PREPARING
        self.run: SpeculativeRun | None = None
        self.prompt_noted: dict[str, float] = {}  # context tokens and pieces, for timing_ms
        self._preparing: Generator[None, None, SpeculativeRun | None] | None = prepare(
            parts, request, cancel, self.deadline, self.language, self.prompt_noted
        )
        self._decode_started = 0.0
        self.batch_peak = 0  # most requests verified together in one of this request's rounds

    @property
    def expired(self) -> bool:
        """Cancelled, or past its deadline."""
        return self.cancel.cancelled or time.monotonic() > self.deadline

    def prepare_step(self) -> None:
        """One chunk of preparation; the state moves on to DECODING when the prompt is
        ready, or to OVER (nothing to complete, cancelled, or late while prefilling)."""
        assert self.state is RequestState.PREPARING and self._preparing is not None
        if self.expired:
            self._preparing.close()  # the prefix cache keeps the prompt's KV computed so far
            self._end_preparing(None)
            return
        try:
            next(self._preparing)
        except StopIteration as prepared:
            self._end_preparing(prepared.value)
        except CancelledError:  # the healing walk's prefill saw the cancel
            self._end_preparing(None)

    def _end_preparing(self, run: SpeculativeRun | None) -> None:
        self._preparing = None
        self.run = run
        self._decode_started = time.perf_counter()
        self.state = RequestState.OVER if run is None or run.finished() else RequestState.DECODING

    def after_round(self, batch_requests: int = 0) -> None:
        """A verification round (shared by `batch_requests` requests) was accepted, or the
        request was interrupted between rounds: OVER once every branch has ended."""
        self.batch_peak = max(self.batch_peak, batch_requests)
        if self.run is not None and self.run.finished():
            self.state = RequestState.OVER

    @property
    def early_answer_due(self) -> bool:
        """Decoding, asked for an early answer, and that moment has come."""
        return (
            self.state is RequestState.DECODING
            and self.request.first_answer_ms > 0
            and (time.perf_counter() - self.started) * 1000 >= self.request.first_answer_ms
        )

    def result(self, interim: bool = False) -> CompletionResult:
        """The ranked alternatives. `interim`: while decoding goes on — each branch as if the
        deadline were now, and beside those, the text so far of each branch still on its first
        line (`with_first_lines_so_far`): a typist sees the words the model is surest of, and
        the final answer continues or replaces them (`interim_partial` in the timing)."""
        parts, request, run = self.parts, self.request, self.run
        now = time.perf_counter()
        if run is None:
            return CompletionResult([], parts.model_name, {"total": (now - self.started) * 1000})
        output = run.output()
        candidates = [
            Completion(b.text, logprob=b.logprob, n_tokens=len(b.token_ids), finish_reason=b.finish_reason or ("deadline" if interim else ""))
            for b in output.branches
            if b.text
        ]
        members = member_names(request.prefix, request.members)
        completions = postprocess(
            request.prefix, request.suffix, self.language, candidates, raw=request.raw, members=members, outside=frozenset(request.outside_names)
        )
        partial = False
        if interim and not request.raw:
            completions, partial = with_first_lines_so_far(request.prefix, request.suffix, self.language, completions, candidates)
        finished = time.perf_counter()
        timing = {
            "prefill": (self._decode_started - self.started) * 1000,
            "prompt_tokens": float(len(run.tracker.prompt_ids)),
            "reused_prompt_tokens": float(run.reused_tokens),
            **self.prompt_noted,
            "decode": (now - self._decode_started) * 1000,
            "postprocess": (finished - now) * 1000,
            "total": (finished - self.started) * 1000,
            "rounds": float(output.stats.rounds),
            "accepted_per_round": output.stats.mean_accepted_per_round,
            "steered": float(run.forced.assigned - run.forced.undone),  # branches that kept a forced start
            "steer_undone": float(run.forced.undone),  # ... that started forced, the model scoring it below the floor
            "forked": float(run.forks.forked),  # branches that split from the greedy line after their first token
            "batch_requests_max": float(self.batch_peak),
            "interim": float(interim),
            "interim_partial": float(partial),
        }
        return CompletionResult(completions, parts.model_name, timing)


def with_first_lines_so_far(
    prefix: str, suffix: str, language: str | None, whole: list[Completion], candidates: list[Completion],
) -> tuple[list[Completion], bool]:
    """An interim answer: the alternatives whole so far (`whole`, ranked) and, beside them, what
    each branch still on its first line (`candidates` not finished: "deadline") has written, raw,
    all by score, each text once; when neither gives anything, every branch's text so far.
    -> (the texts to show, whether one of them is a text so far). Without the first lines so far,
    a short alternative that ended first ("0", "[]") became the ghost while a likelier one was
    still being written, and the editor, which keeps what it showed, kept it (docs/measurements/
    zen4-early-ghost.md: on held-out holes the ghost continued into the ranked best in 62 % of
    answers, 77 % with them)."""
    written = [replace(c, text=c.text.rstrip()) for c in candidates if c.text.strip()]
    writing = [c for c in written if c.finish_reason == "deadline" and "\n" not in c.text.lstrip()]
    if not whole and not writing:
        writing = written
    if not writing:
        return whole, False
    so_far = postprocess(prefix, suffix, language, writing, raw=True)
    merged: dict[str, Completion] = {}
    for completion in sorted([*whole, *so_far], key=lambda c: -c.score):  # stable: a whole one first on a tie
        merged.setdefault(dedupe_key(completion.text), completion)
    shown = list(merged.values())
    return shown, any(any(c is text for text in so_far) for c in shown)
