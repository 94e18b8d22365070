"""One set of rules for a request, whichever surface it came through: the sampling
temperature a mode means, and the one parser of untrusted request maps."""

from __future__ import annotations

import pytest
from request_maps import parsed, through_the_wire

from kspec.engine.api import DEFAULT_SAMPLE_TEMPERATURE, CompletionRequest
from kspec.engine.errors import InputError
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


def test_request_maps_are_type_checked() -> None:
    """msgpack frames and the Ray replica's calls decode requests through engine/serve/wire.py."""
    request = parsed({"prefix": "a", "k": 2, "deadline_ms": 100, "stop": ["\n"], "unknown": 1})
    assert request.k == 2 and request.deadline_ms == 100.0 and isinstance(request.deadline_ms, float) and request.stop == ("\n",)
    for bad in ({"prefix": 1}, {"prefix": "a", "k": "2"}, {"prefix": "a", "k": 2.0}, {"prefix": "a", "raw": 1},
                {"prefix": "a", "stop": ["\n", 3]}, {"prefix": "a", "stop": ("\n", None)}, {"k": 1}, ["prefix"], None):  # fmt: skip
        with pytest.raises(InputError):
            parsed(bad)


def test_a_request_survives_its_map() -> None:
    request = CompletionRequest(prefix="def f(", suffix=")", k=3, mode="sample", temperature=0.5, stop=("\n\n",), deadline_ms=250.0)
    assert through_the_wire(request) == request
