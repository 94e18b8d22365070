"""The completion engine: cursor context in, k ranked alternatives out."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from engine.api import CancelToken, Completion, CompletionRequest, CompletionResult
from engine.config import MODES, EngineConfig
from engine.errors import InputError, ModelLoadError
from engine.generate import Branch, BranchTracker, DecodeLimits, decode_regular
from engine.models.hf_folder import load_transformer
from engine.models.resolve import resolve_model
from engine.models.transformer import Transformer
from engine.prefix_cache import PrefixCache, PrefixCacheConfig
from engine.prompt import PromptBudget, build_prompt
from engine.sampling import SamplingParams
from engine.stopping import rule_for_cursor
from engine.tokenizer import Tokenizer

MAX_K = 32
DEFAULT_SAMPLE_TEMPERATURE = 0.8
MAX_NEW_TOKENS = 512


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer
    name: str


def load_model(spec: str | None, config: EngineConfig) -> LoadedModel:
    resolved = resolve_model(spec, progress=config.progress)
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
        self._busy = threading.Lock()  # one request at a time: the model and caches are not re-entrant

    @classmethod
    def load(cls, config: EngineConfig) -> "CompletionEngine":
        if config.threads:
            torch.set_num_threads(config.threads)
        target = load_model(config.model, config)
        draft = load_model(config.draft, config) if config.draft else None
        if draft is not None:
            check_draft_compatible(target, draft)
        return cls(target, config, draft)

    @property
    def model_name(self) -> str:
        return self.target.name

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        validate_request(request)
        with self._busy:
            return self._complete(request, cancel)

    def _complete(self, request: CompletionRequest, cancel: CancelToken | None) -> CompletionResult:
        started = time.perf_counter()
        deadline = time.monotonic() + request.deadline_ms / 1000
        tokenizer = self.target.tokenizer
        prompt = build_prompt(tokenizer, request.prefix, request.suffix, PromptBudget(self.config.prompt_tokens))
        if not prompt.ids:
            return CompletionResult([], self.model_name, {"total": 0.0})
        tracker = BranchTracker(
            tokenizer,
            rule_for_cursor(request.prefix, request.suffix),
            DecodeLimits(request.max_tokens, deadline),
            prompt.ids,
            prompt.healed_text,
        )
        prefill = self.prefix_cache.prefill(self.target.model, prompt.ids)
        output = decode_regular(
            self.target.model, tracker, request.k, sampling_params(request), cancel, request.mode == "diverse", prefill
        )
        post_started = time.perf_counter()
        completions = rank_plain(output.branches)
        timing = {
            "prefill": (post_started - started) * 1000 - output.decode_ms,
            "reused_prompt_tokens": float(prefill.reused_tokens),
            "decode": output.decode_ms,
            "postprocess": (time.perf_counter() - post_started) * 1000,
            "total": (time.perf_counter() - started) * 1000,
        }
        return CompletionResult(completions, self.model_name, timing)


def rank_plain(branches: list[Branch]) -> list[Completion]:
    """Distinct non-blank texts, best mean token log-probability first (stable)."""
    seen: set[str] = set()
    completions: list[Completion] = []
    for branch in branches:
        text = branch.text.rstrip()
        if not text.strip() or text in seen:
            continue
        seen.add(text)
        score = branch.logprob / max(1, len(branch.token_ids))
        completions.append(Completion(text, score, branch.logprob, len(branch.token_ids), branch.finish_reason))
    return sorted(completions, key=lambda c: -c.score)
