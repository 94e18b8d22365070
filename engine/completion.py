"""The completion engine: cursor context in, k ranked alternatives out."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generator

import torch

from engine.api import DEFAULT_SAMPLE_TEMPERATURE, CancelToken, CompletionRequest, CompletionResult
from engine.config import MODES, EngineConfig
from engine.errors import CancelledError, InputError, ModelLoadError
from engine.drafters import Drafter, ModelDrafter, NoDrafter, PromptLookupDrafter
from engine.generate import BranchTracker, DecodeLimits
from engine.healing import HealingBias, walk_healing
from engine.models.gguf_convert import ProgressCallback
from engine.models.hf_folder import load_transformer
from engine.models.resolve import resolve_model
from engine.models.transformer import EarlyExit, Transformer
from engine.prefix_cache import PrefixCache, PrefixCacheConfig
from engine.prompt import PromptBudget, build_prompt
from engine.sampling import SamplingParams
from engine.speculative import SpeculationConfig, SpeculativeRun
from engine.stopping import StopRule, rule_for_cursor
from engine.syntax import Candidate, UnitPredicate, detect_language, postprocess
from engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.batching import ContinuousBatcher

MAX_K = 32
MAX_NEW_TOKENS = 512
MAX_STOPS = 8


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    name: str


def load_model(spec: str | None, config: EngineConfig, on_progress: ProgressCallback | None = None) -> LoadedModel:
    """on_progress(fraction, message): conversion (if a GGUF file is new) up to 0.8, then weights."""
    report = on_progress or (lambda fraction, message: None)
    resolved = resolve_model(spec, progress=config.progress, on_progress=lambda f, m: report(0.8 * f, m))
    report(0.8, f"loading {resolved.name}")
    model = load_transformer(resolved.folder, config.torch_dtype, config.device)
    tokenizer = Tokenizer.from_folder(resolved.folder, model.args.eos_token_ids)
    if tokenizer.vocab_size > model.args.vocab_size:
        raise ModelLoadError(
            f"{resolved.name}: tokenizer has {tokenizer.vocab_size} tokens but the model only {model.args.vocab_size}"
        )
    return LoadedModel(model, tokenizer, resolved.name)


def check_draft_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    if target.tokenizer.vocabulary() != draft.tokenizer.vocabulary():
        raise ModelLoadError(
            f"draft model {draft.name!r} has a different vocabulary from {target.name!r}; "
            "a draft must share the target's tokenizer"
        )


def validate_request(request: CompletionRequest) -> None:
    if not 1 <= request.k <= MAX_K:
        raise InputError(f"k must be between 1 and {MAX_K}, got {request.k}")
    if not 1 <= request.max_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"max_tokens must be between 1 and {MAX_NEW_TOKENS}, got {request.max_tokens}")
    if request.deadline_ms <= 0:
        raise InputError(f"deadline_ms must be > 0, got {request.deadline_ms}")
    if len(request.stop) > MAX_STOPS or not all(isinstance(s, str) and 0 < len(s) <= 256 for s in request.stop):
        raise InputError(f"stop must be at most {MAX_STOPS} non-empty strings of up to 256 characters")
    if request.mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {request.mode!r}")
    try:
        sampling_params(request)
    except ValueError as exc:
        raise InputError(str(exc)) from exc


def sampling_params(request: CompletionRequest) -> SamplingParams:
    if request.mode == "diverse":
        return SamplingParams(0.0, 1.0, request.seed)  # greedy after the distinct first tokens
    return SamplingParams(request.temperature or DEFAULT_SAMPLE_TEMPERATURE, request.top_p, request.seed)


class CompletionEngine:
    def __init__(self, target: LoadedModel, config: EngineConfig, draft: LoadedModel | None = None):
        self.target, self.draft, self.config = target, draft, config
        self.prefix_cache = PrefixCache(PrefixCacheConfig(max_bytes=config.prefix_cache_mb * 1024 * 1024))
        self.draft_prefix_cache = PrefixCache(PrefixCacheConfig(max_bytes=config.prefix_cache_mb * 1024 * 1024 // 4))
        self.lock = threading.Lock()  # one round at a time: the model and caches are not re-entrant

    @classmethod
    def load(cls, config: EngineConfig, on_progress: ProgressCallback | None = None) -> "CompletionEngine":
        """on_progress(fraction in [0, 1], message) is called as loading advances."""
        report = on_progress or (lambda fraction, message: None)
        if config.threads:
            torch.set_num_threads(config.threads)
        share = 0.9 if config.draft else 1.0
        target = load_model(config.model, config, lambda f, m: report(share * f, m))
        draft = load_model(config.draft, config, lambda f, m: report(share + (1 - share) * f, m)) if config.draft else None
        if draft is not None:
            check_draft_compatible(target, draft)
        report(1.0, "ready")
        return cls(target, config, draft)

    def _drafter(self, params: SamplingParams) -> Drafter:
        choice = self.config.drafter
        if choice == "auto":
            choice = "model" if self.draft is not None else "lookup"
        if choice == "model" and self.draft is not None:
            return ModelDrafter(self.draft.model, params, self.draft_prefix_cache)
        if choice == "layerskip":
            layers = min(self.config.draft_layers, self.target.model.args.n_layers)
            return ModelDrafter(EarlyExit(self.target.model, layers), params, self.draft_prefix_cache)
        return PromptLookupDrafter() if choice == "lookup" else NoDrafter()

    @property
    def model_name(self) -> str:
        return self.target.name

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        """One request on its own (the CLI, `kspec eval`): a batch of one, run to the end."""
        outcome: list[tuple[CompletionResult | None, BaseException | None]] = []
        batcher = self.batcher(max_requests=1)
        batcher.add(request, cancel or CancelToken(), lambda result, error: outcome.append((result, error)))
        while not batcher.idle:
            batcher.run_round()
        result, error = outcome[0]
        if error is not None:
            raise error
        assert result is not None
        return result

    def batcher(self, max_requests: int) -> "ContinuousBatcher":
        """Requests of several clients decoded together (continuous batching)."""
        from engine.batching import BatchConfig, ContinuousBatcher

        return ContinuousBatcher(self, BatchConfig(max_requests=max_requests))

    def begin(self, request: CompletionRequest, cancel: CancelToken) -> "ActiveCompletion":
        """A request ready to be prepared (prefill, a chunk per call) and then decoded in a batch.
        Raises InputError for an invalid request."""
        validate_request(request)
        return ActiveCompletion(self, request, cancel)

    def prepare(
        self, request: CompletionRequest, cancel: CancelToken, deadline: float, language: str
    ) -> Generator[None, None, SpeculativeRun | None]:
        """Prompt, prefill (yielding between chunks) and the healing walk -> the request's
        decoding state, or None when there is nothing to complete (empty prompt).
        `deadline` (time.monotonic()) was set when the request arrived: prefill counts."""
        tokenizer, model = self.target.tokenizer, self.target.model
        prompt = build_prompt(tokenizer, request.prefix, request.suffix, PromptBudget(self.config.prompt_tokens))
        if not prompt.ids:
            return None
        first = yield from self.prefix_cache.prefill_steps(model, prompt.ids)
        bias = HealingBias(tokenizer, model.args.vocab_size, model.device)
        ids, healed_text, prefill = walk_healing(
            lambda ids: self.prefix_cache.prefill(model, ids, cancel), tokenizer, prompt.ids, prompt.healed_text, bias, first
        )
        stops = rule_for_cursor(request.prefix, request.suffix, request.stop) if request.cursor_rules else StopRule(request.stop)
        tracker = BranchTracker(tokenizer, stops, DecodeLimits(request.max_tokens, deadline), ids, healed_text)
        params = sampling_params(request)
        unit_done = None
        if self.config.early_stop and not request.raw:
            unit_done = UnitPredicate(request.prefix, request.suffix, language)
        return SpeculativeRun(
            model,
            tracker,
            request.k,
            params,
            self._drafter(params),
            SpeculationConfig(gamma=self.config.gamma, gamma_max=max(8, self.config.gamma)),
            cancel,
            diverse=request.mode == "diverse",
            prefill=prefill,
            unit_done=unit_done,
            healing=bias,
        )


class ActiveCompletion:
    """One request inside a batch: first prepared (a prefill chunk per round), then
    decoded (`run`, one round per batch round), then finished into a result."""

    def __init__(self, engine: CompletionEngine, request: CompletionRequest, cancel: CancelToken):
        self.engine, self.request, self.cancel = engine, request, cancel
        self.started = time.perf_counter()
        self.deadline = time.monotonic() + request.deadline_ms / 1000
        self.language = detect_language(request.language, request.path)
        self.run: SpeculativeRun | None = None
        self._preparing: Generator[None, None, SpeculativeRun | None] | None = engine.prepare(request, cancel, self.deadline, self.language)
        self._decode_started = 0.0

    @property
    def preparing(self) -> bool:
        return self._preparing is not None

    @property
    def expired(self) -> bool:
        """Cancelled, or past its deadline."""
        return self.cancel.cancelled or time.monotonic() > self.deadline

    def prepare_step(self) -> bool:
        """One chunk of preparation. -> True when the request is over already (nothing
        to complete, cancelled, or its deadline passed while its prompt was prefilled)."""
        assert self._preparing is not None
        if self.expired:
            self._preparing.close()  # the prefix cache keeps the prompt's KV computed so far
            self._preparing = None
            return True
        try:
            next(self._preparing)
            return False
        except StopIteration as prepared:
            self._preparing = None
            self.run = prepared.value
            self._decode_started = time.perf_counter()
            return self.run is None
        except CancelledError:  # the healing walk's prefill saw the cancel
            self._preparing = None
            return True

    def result(self) -> CompletionResult:
        engine, request, run = self.engine, self.request, self.run
        now = time.perf_counter()
        if run is None:
            return CompletionResult([], engine.model_name, {"total": (now - self.started) * 1000})
        output = run.output()
        candidates = [Candidate(b.text, b.logprob, len(b.token_ids), b.finish_reason) for b in output.branches if b.text]
        completions = postprocess(request.prefix, request.suffix, self.language, candidates, raw=request.raw)
        finished = time.perf_counter()
        timing = {
            "prefill": (self._decode_started - self.started) * 1000,
            "prompt_tokens": float(len(run.tracker.prompt_ids)),
            "reused_prompt_tokens": float(run.reused_tokens),
            "decode": (now - self._decode_started) * 1000,
            "postprocess": (finished - now) * 1000,
            "total": (finished - self.started) * 1000,
            "rounds": float(output.stats.rounds),
            "accepted_per_round": output.stats.mean_accepted_per_round,
        }
        return CompletionResult(completions, engine.model_name, timing)
