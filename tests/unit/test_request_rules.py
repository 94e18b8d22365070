"""One set of rules for a request, whichever surface it came through: the sampling
temperature a mode means, and the one parser of untrusted request maps."""

from __future__ import annotations

import pytest

from kspec.engine.api import DEFAULT_SAMPLE_TEMPERATURE, CompletionRequest
from kspec.engine.serve.openai_api import parse_completion


@pytest.mark.parametrize(
    ("mode", "temperature", "sampled_at"),
    [("diverse", 0.0, 0.0), ("diverse", 0.7, 0.0), ("sample", 0.0, DEFAULT_SAMPLE_TEMPERATURE), ("sample", 0.3, 0.3)],
)
def test_the_temperature_a_mode_means_survives_the_openai_api(mode: str, temperature: float, sampled_at: float) -> None:
    """What the remote backend sends for a request is parsed back into the same sampling."""
    request = CompletionRequest(prefix="x", mode=mode, temperature=temperature)
    assert request.sampling_temperature == sampled_at
    parsed = parse_completion({"prompt": "x", "temperature": request.sampling_temperature}).request
    assert parsed.mode == mode and parsed.sampling_temperature == sampled_at
