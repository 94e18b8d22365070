"""`kspec bench generate | decode | step | keystroke`: the engine's speed, always as ratios
of runs interleaved in one process (A B A B), medians.

generate: our regular batched decoding vs transformers' generate(), same prompt and
sampling. decode: BASS per drafter vs regular decoding through the serving path. step:
one forward step, bifurcated vs replicated prefix KV. keystroke: a keystroke's latency
with the prefix cache cold vs warm."""

from __future__ import annotations

import inspect
import json.decoder
import statistics
import sys
import time
from dataclasses import replace
from typing import Any, Callable

import torch
from tqdm import tqdm

from kspec.engine.api import CompletionRequest, CompletionResult
from kspec.engine.completion import CompletionEngine
from kspec.engine.models.loading import Compute, LoadedModel
from kspec.engine.config import PROMPT_TOKENS_RANGE, EngineConfig
from kspec.bench.stats import time_interleaved
from kspec.bench.baselines import branch_cache, decode_regular
from kspec.engine.decode.branches import BranchTracker, DecodeLimits
from kspec.engine.models.resolve import resolve_model
from kspec.engine.decode.sampling import SamplingParams
from kspec.engine.decode.stopping import StopRule


def code_prompt_ids(target: LoadedModel, n_tokens: int) -> list[int]:
    """The first n_tokens of a real source file (the stdlib's json.decoder)."""
    ids = target.tokenizer.encode(inspect.getsource(json.decoder))
    return ids[:n_tokens]


def _ours(target: LoadedModel, prompt: list[int], k: int, new_tokens: int, params: SamplingParams) -> Callable[[], int]:
    def run() -> int:
        tracker = BranchTracker(target.tokenizer, StopRule(), DecodeLimits(new_tokens, ignore_eos=True), prompt)
        output = decode_regular(target.model, tracker, k, params)
        return sum(len(b.token_ids) for b in output.branches)

    return run


def _transformers(hf_model: Any, prompt: list[int], k: int, new_tokens: int, params: SamplingParams) -> Callable[[], int]:
    inputs = torch.tensor([prompt])

    def run() -> int:
        torch.manual_seed(params.seed)
        with torch.inference_mode():
            out = hf_model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=0,
                num_return_sequences=k,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )
        return (out.shape[1] - len(prompt)) * out.shape[0]

    return run


def bench_generate(config: EngineConfig, ks: list[int], new_tokens: int, repeats: int, prompt_tokens: int = 512) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM  # dev dependency: the comparison baseline

    engine = CompletionEngine.load(config)
    target = engine.target
    folder = resolve_model(config.model, progress=False).folder
    hf_model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=target.model.dtype).eval()  # auto: what the engine chose
    prompt = code_prompt_ids(target, prompt_tokens)
    params = SamplingParams(temperature=1.0, top_p=1.0, seed=0)
    _ours(target, prompt, 1, 4, params)()  # warm-up both
    _transformers(hf_model, prompt, 1, 4, params)()
    cases = []
    for k in ks:
        rates = time_interleaved(
            {"kspec": _ours(target, prompt, k, new_tokens, params), "transformers": _transformers(hf_model, prompt, k, new_tokens, params)},
            repeats,
        )
        ours, theirs = statistics.median(rates["kspec"]), statistics.median(rates["transformers"])
        cases.append({"k": k, "kspec_tok_s": round(ours, 1), "transformers_tok_s": round(theirs, 1), "ratio": round(ours / theirs, 2)})
    return {
        "model": target.name,
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "cases": cases,
    }


def bench_decode_step(config: EngineConfig, k: int, contexts: list[int], repeats: int) -> dict[str, Any]:
    """One decode step of the whole model at k branches: shared prefix (bifurcated) vs
    the prompt KV replicated into k rows, interleaved; plus the KV bytes of each."""
    from kspec.engine.cache.prefix_cache import prefill_uncached

    engine = CompletionEngine.load(config)
    model = engine.target.model
    source = inspect.getsource(json.decoder) * 8
    cases = []
    for context in contexts:
        ids = engine.target.tokenizer.encode(source)[:context]
        prefill = prefill_uncached(model, ids)
        caches = {name: branch_cache(prefill.cache, k, 64, shared) for name, shared in (("bifurcated", True), ("replicated", False))}
        tokens = torch.full((k, 1), 5, dtype=torch.long)
        for cache in caches.values():  # 16 generated tokens in each branch, like mid-completion
            with torch.inference_mode():
                model(torch.full((k, 16), 7, dtype=torch.long), cache)
            cache.advance(16)
        times: dict[str, list[float]] = {name: [] for name in caches}
        for _ in range(repeats):
            for name, cache in caches.items():
                with torch.inference_mode():
                    started = time.perf_counter()
                    model(tokens, cache)
                    times[name].append((time.perf_counter() - started) * 1000)
        bifurcated, replicated = statistics.median(times["bifurcated"]), statistics.median(times["replicated"])
        cases.append(
            {
                "k": k,
                "context": len(ids),
                "replicated_ms": round(replicated, 2),
                "bifurcated_ms": round(bifurcated, 2),
                "ratio": round(replicated / bifurcated, 2),
                "replicated_kv_bytes": caches["replicated"].nbytes,
                "bifurcated_kv_bytes": caches["bifurcated"].nbytes,
            }
        )
    return {"model": engine.model_name, "threads": torch.get_num_threads(), "cases": cases}


def bench_keystroke(config: EngineConfig, prompt_tokens: int, points: int, repeats: int) -> dict[str, Any]:
    """Time to the first new token after typing one character into a ~prompt_tokens
    prompt: with the previous keystroke's KV in the prefix cache vs a cold prefill."""

    # not fitted to the machine: the fit caps the prompt budget (384 tokens on a slow CPU),
    # and this bench is about a prompt of prompt_tokens
    engine = CompletionEngine.load(replace(config, fit_to_machine=False, prompt_tokens=max(config.prompt_tokens or PROMPT_TOKENS_RANGE[1], prompt_tokens + 64)))
    source = inspect.getsource(json.decoder)
    tokenizer = engine.target.tokenizer
    # typing points: line ends late enough in the file that the prompt holds ~prompt_tokens
    offsets = [i for i, ch in enumerate(source) if ch == "\n" and len(tokenizer.encode(source[:i])) >= prompt_tokens]
    offsets = offsets[:: max(1, len(offsets) // points)][:points]
    cold: list[float] = []
    warm: list[float] = []
    measured_tokens: list[float] = []
    for _ in range(repeats):
        for offset in offsets:
            before = source[max(0, offset - 6 * prompt_tokens) : offset - 1]
            typed = source[max(0, offset - 6 * prompt_tokens) : offset]  # one more character
            request = CompletionRequest(prefix=typed, k=1, max_tokens=1, deadline_ms=60000)
            engine.clear_caches()
            result = engine.complete(request)
            cold.append(result.timing_ms["total"])
            measured_tokens.append(result.timing_ms.get("prompt_tokens", 0.0))
            engine.clear_caches()
            engine.complete(CompletionRequest(prefix=before, k=1, max_tokens=1, deadline_ms=60000))
            warm.append(engine.complete(request).timing_ms["total"])
    cold_ms, warm_ms = statistics.median(cold), statistics.median(warm)
    return {
        "model": engine.model_name,
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_measured": statistics.median(measured_tokens),  # what the engine prefilled
        "samples": len(cold),
        "cold_ms": round(cold_ms, 1),
        "warm_ms": round(warm_ms, 1),
        "ratio": round(cold_ms / warm_ms, 2),
    }


BENCH_SOURCES = ("json.decoder", "textwrap", "shlex")  # real code, shipped with every Python


def _source_prompts(target: LoadedModel, n_tokens: int) -> list[list[int]]:
    import importlib

    return [target.tokenizer.encode(inspect.getsource(importlib.import_module(name)))[:n_tokens] for name in BENCH_SOURCES]


def bench_decode(
    config: EngineConfig, ks: list[int], new_tokens: int, repeats: int, plot_path: str | None, progress: bool = False
) -> dict[str, Any]:
    """BASS with each drafter vs regular decoding (no drafter: one token per branch per
    round), prompt lookup also drafting every round ("lookup-always": DraftPayoff off, as
    before it existed), and k sequential single-branch requests, all through the path that serves
    requests (`CompletionEngine.complete`: the batcher, prefix cache warm as when typing),
    interleaved, greedy (diverse first tokens), same prompts. In float32 every method's texts
    are checked to be identical to regular decoding's (on the fast path: the share that is)."""
    loaded = CompletionEngine.load(config)
    model = loaded.target.model
    engines, drafters = _decode_engines(loaded, config)
    prompts = [loaded.target.tokenizer.decode(ids) for ids in _source_prompts(loaded.target, 384)]
    # float32: BASS must reproduce regular decoding token for token. The CPU fast path verifies
    # many rows with dense bfloat16 weights and decodes one row with the 4-bit kernel, so the two
    # agree up to bfloat16 noise: there the share of identical outputs is reported instead.
    exact = model.dtype == torch.float32 and not Compute.choose(config).fast_cpu  # the fast path's float32 model runs 4-bit matmuls

    def request(prompt: str, k: int) -> CompletionRequest:
        return CompletionRequest(prefix=prompt, k=k, max_tokens=new_tokens, raw=True, cursor_rules=False, deadline_ms=600_000)

    def run(name: str, prompt: str, k: int) -> tuple[list[str], int, CompletionResult]:
        if name == "sequential-lookup":
            results = [engines[name].complete(request(prompt, 1)) for _ in range(k)]
        else:
            results = [engines[name].complete(request(prompt, k))]
        texts = [c.text for r in results for c in r.completions]
        return texts, sum(c.n_tokens for r in results for c in r.completions), results[-1]

    for engine in engines.values():  # each engine's prefix cache holds the prompts, as when typing
        for prompt in prompts:
            engine.complete(CompletionRequest(prefix=prompt, k=1, max_tokens=1, deadline_ms=600_000))
    cases = []
    bar = tqdm(total=len(ks) * repeats * len(prompts), desc="kspec bench decode", unit="prompt", disable=not progress, file=sys.stderr)
    for k in ks:
        rates: dict[str, list[float]] = {name: [] for name in engines}
        accepted: dict[str, list[float]] = {name: [] for name in drafters}
        identical: dict[str, list[bool]] = {name: [] for name in drafters}
        for _ in range(repeats):
            for prompt in prompts:
                reference: list[str] | None = None
                for name in ["regular", *drafters, "sequential-lookup"]:  # interleaved: A B C A B C
                    started = time.perf_counter()
                    texts, tokens, result = run(name, prompt, k)
                    rates[name].append(tokens / (time.perf_counter() - started))
                    if name == "regular":
                        reference = texts
                    elif name in drafters:
                        accepted[name].append(result.timing_ms.get("accepted_per_round", 0.0))
                        identical[name].append(texts == reference)
                        if texts != reference and exact:
                            raise AssertionError(f"BASS with {name} diverged from regular decoding (k={k})")
                bar.update(1)
        cases += _decode_cases(k, [*drafters, "sequential-lookup"], rates, accepted, identical)
    bar.close()
    report = {
        "model": loaded.model_name,
        "path": "CompletionEngine.complete (batcher, warm prefix cache, raw texts)",
        "prompts": list(BENCH_SOURCES),
        "prompt_tokens": 384,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "cases": cases,
    }
    if plot_path:
        report["plot"] = plot_decode(report, plot_path)
    return report


def _decode_engines(loaded: CompletionEngine, config: EngineConfig) -> tuple[dict[str, CompletionEngine], dict[str, str]]:
    """The engines `bench_decode` compares over one loaded model (by name), and the drafting ones' drafters."""
    draft_layers = min(config.draft_layers, loaded.target.model.args.n_layers)
    drafters = {"lookup": "lookup", f"layerskip{draft_layers}": "layerskip"}
    if loaded.draft is not None:
        drafters["model"] = "model"
    engines = {name: CompletionEngine(loaded.target, replace(config, drafter=choice), loaded.draft) for name, choice in drafters.items()}
    drafters["lookup-always"] = "lookup"  # drafting every round, even where it does not pay (DraftPayoff off)
    engines["lookup-always"] = CompletionEngine(loaded.target, replace(config, drafter="lookup", draft_only_when_paying=False), loaded.draft)
    engines["regular"] = CompletionEngine(loaded.target, replace(config, drafter="none"), loaded.draft)
    engines["sequential-lookup"] = CompletionEngine(loaded.target, replace(config, drafter="lookup"), loaded.draft)
    return engines, drafters


def _decode_cases(
    k: int, names: list[str], rates: dict[str, list[float]], accepted: dict[str, list[float]], identical: dict[str, list[bool]]
) -> list[dict[str, Any]]:
    """One report row per method at this k: medians against regular decoding's."""
    regular_rate = statistics.median(rates["regular"])
    cases = []
    for name in names:
        rate = statistics.median(rates[name])
        cases.append(
            {
                "k": k,
                "drafter": name,
                "regular_tok_s": round(regular_rate, 1),
                "bass_tok_s": round(rate, 1),
                "ratio": round(rate / regular_rate, 2),
                "mean_accepted_per_round": round(statistics.mean(accepted[name]), 2) if name in accepted else None,
                "identical_to_regular": round(statistics.mean(identical[name]), 2) if name in identical else None,
            }
        )
    return cases


def plot_decode(report: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    cases = report["cases"]
    ks = sorted({c["k"] for c in cases})
    regular = {c["k"]: c["regular_tok_s"] for c in cases}
    axes.plot(ks, [regular[k] for k in ks], marker="o", label="regular batched")
    for name in sorted({c["drafter"] for c in cases}):
        rates = {c["k"]: c["bass_tok_s"] for c in cases if c["drafter"] == name}
        label = name if name.startswith("sequential") else f"BASS {name}"
        axes.plot(ks, [rates[k] for k in ks], marker="o", label=label)
    axes.set_xlabel("k (branches)")
    axes.set_ylabel("tokens / s (all branches)")
    axes.set_title(f"{report['model'].split(' (')[0]}, {report['new_tokens']} new tokens")
    axes.set_xticks(ks)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
