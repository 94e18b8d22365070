"""`kspec bench generate`: our regular batched decoding vs transformers' generate(), same
prompt, same sampling, interleaved in one run (A B A B), medians and ratios."""

from __future__ import annotations

import inspect
import json.decoder
import statistics
import time
from typing import Any, Callable

import torch

from engine.completion import CompletionEngine, LoadedModel
from engine.config import EngineConfig
from engine.generate import BranchTracker, DecodeLimits, decode_regular
from engine.models.resolve import resolve_model
from engine.sampling import SamplingParams
from engine.stopping import StopRule


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


def time_interleaved(runs: dict[str, Callable[[], int]], repeats: int) -> dict[str, list[float]]:
    """Each callable once per repeat, in turn (A B A B ...): tokens/s per run."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            tokens = run()
            rates[name].append(tokens / (time.perf_counter() - started))
    return rates


def bench_generate(config: EngineConfig, ks: list[int], new_tokens: int, repeats: int, prompt_tokens: int = 512) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM  # dev dependency: the comparison baseline

    engine = CompletionEngine.load(config)
    target = engine.target
    folder = resolve_model(config.model, progress=False).folder
    hf_model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=config.torch_dtype).eval()
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
