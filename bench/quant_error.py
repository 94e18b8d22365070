"""How far quantized weights move a model's logits from its float weights, on the CPU fast path:
`python -m kspec.bench.quant_error FLOAT.gguf [CANDIDATE.gguf ...]`.

The float file is the reference (its weights dense, float32 path). Each candidate is loaded as a
user would run it (the fast path): the float file itself quantized at load by kspec (q8, q4:
`EngineConfig.quantize`), and any other file given (e.g. llama-quantize's Q8_0 / Q4_K of the same
float file). Reported per candidate: mean and max |delta logit| over the positions of a real
Python prompt, and the share of positions whose top token is the reference's. Both sides of a
comparison share the kernels' 8-bit activations, so the difference between candidates is the
weights' quantization.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from kspec.engine.cache.kv import RaggedKVCache
from kspec.engine.config import EngineConfig
from kspec.engine.models.loading import LoadedModel, load_model

PROMPT_TOKENS = 256


def _logits(loaded: LoadedModel, tokens: torch.Tensor) -> torch.Tensor:
    model = loaded.model
    with torch.inference_mode():
        cache = RaggedKVCache(model.cache_shape, 1, tokens.shape[1], model.dtype)
        return model.logits(model(tokens, cache)[0]).float()  # [T, V]


def compare(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, float]:
    delta = (candidate - reference).abs()
    return {
        "mean_abs_delta": round(float(delta.mean()), 5),
        "max_abs_delta": round(float(delta.max()), 4),
        "top1_same": round(float((candidate.argmax(-1) == reference.argmax(-1)).float().mean()), 3),
    }


def quant_error(float_gguf: Path, candidates: list[Path]) -> dict[str, Any]:
    base = dict(progress=False, fit_to_machine=False)
    reference = load_model(str(float_gguf), EngineConfig(dtype="float32", quantize="none", **base))  # type: ignore[arg-type]
    prompt = inspect.getsource(textwrap)
    tokens = torch.tensor([reference.tokenizer.encode(prompt)[:PROMPT_TOKENS]])
    want = _logits(reference, tokens)
    report: dict[str, Any] = {"reference": float_gguf.name, "logit_scale": round(float(want.abs().mean()), 4)}
    runs: list[tuple[str, str, str]] = [(f"kspec {q} at load", str(float_gguf), q) for q in ("q8", "q4")]
    runs += [(path.name, str(path), "q8") for path in candidates]
    for name, spec, quantize in runs:
        loaded = load_model(spec, EngineConfig(quantize=quantize, **base))  # type: ignore[arg-type]
        report[name] = {**compare(want, _logits(loaded, tokens)), "compute": loaded.compute}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kspec.bench.quant_error", description=__doc__.split("\n\n")[0])
    parser.add_argument("float_gguf", type=Path, help="an F32 / F16 / BF16 GGUF: the reference")
    parser.add_argument("candidates", type=Path, nargs="*", help="quantized GGUFs of the same weights")
    args = parser.parse_args(argv)
    print(json.dumps(quant_error(args.float_gguf, args.candidates), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
