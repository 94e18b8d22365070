"""The whole request path on a CUDA device: load, prefill, k branches decoded over the shared
prefix with the device's attention kernel, trimmed and ranked. Skipped without a GPU (run by the
device check's second step, docs/measurements/h200.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kspec.engine.api import CompletionRequest
from kspec.engine.completion import CompletionEngine
from kspec.engine.config import EngineConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REQUEST = CompletionRequest(prefix="def add(a, b):\n    ", suffix="\n", language="python", k=4, max_tokens=16, raw=True)


def _engine(model_dir: Path, device: str) -> CompletionEngine:
    return CompletionEngine.load(EngineConfig(model=str(model_dir), device=device, dtype="float32", progress=False, fit_to_machine=False))


def test_a_request_on_cuda_answers_as_on_the_cpu(random_llama_dir: Path) -> None:
    on_cuda = _engine(random_llama_dir, "cuda")
    on_cpu = _engine(random_llama_dir, "cpu")
    assert on_cuda.attention["decode"] in ("triton", "flash-attn")  # a device kernel, not the PyTorch reference
    answer = on_cuda.complete(REQUEST)
    expected = on_cpu.complete(REQUEST)
    assert len(answer.completions) == REQUEST.k
    # float32 both sides (no TF32 in matmuls by default): the same greedy tokens on random weights
    assert [c.text for c in answer.completions] == [c.text for c in expected.completions]
