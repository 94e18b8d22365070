"""GET /metrics on the HTTP API: Prometheus text with the engine's figures, behind the token
unless opened explicitly; counted from each request's outcome (errors by kind)."""

from __future__ import annotations

import re

from kspec.engine.api import CompletionResult
from kspec.engine.errors import DeadlineExceeded
from kspec.engine.serve.http_api import HttpApi
from kspec.engine.serve.metrics import EngineMetrics


def _api(metrics: EngineMetrics, opened: bool) -> HttpApi:
    async def complete(request, document):
        return CompletionResult([], "m", {}), {}

    async def model_name() -> str:
        return "m"

    async def ready() -> tuple[bool, str]:
        return True, "ready"

    return HttpApi(complete, model_name, ready, "secret", metrics.exposition, opened)


async def test_metrics_need_the_token_unless_opened() -> None:
    metrics = EngineMetrics(queue_length=lambda: 3)
    status, body, headers = await _api(metrics, False).respond("GET", "/metrics", {}, b"")
    assert status == 401
    status, body, headers = await _api(metrics, False).respond("GET", "/metrics", {"authorization": "Bearer secret"}, b"")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4") and b"kspec_queue_length 3.0" in body
    status, body, _ = await _api(metrics, True).respond("GET", "/metrics", {}, b"")
    assert status == 200
    status, _, _ = await _api(metrics, True).respond("POST", "/v1/completions", {}, b"{}")
    assert status == 401  # only /metrics is opened


def test_outcomes_are_counted() -> None:
    metrics = EngineMetrics()
    timing = {"prefill": 20.0, "total": 50.0, "prompt_tokens": 10.0, "reused_prompt_tokens": 8.0, "rounds": 3.0, "accepted_per_round": 1.5, "batch_requests_max": 2.0}
    metrics.answered("http", 4, timing, 0.08)
    metrics.failed(DeadlineExceeded("late"))
    text = metrics.exposition().decode()
    assert 'kspec_requests_total{surface="http"} 1.0' in text
    assert "kspec_prompt_tokens_total 10.0" in text and "kspec_prompt_tokens_reused_total 8.0" in text
    assert 'kspec_errors_total{kind="deadline"} 1.0' in text
    ttft = float(re.search(r'^kspec_time_to_first_token_seconds_sum\{surface="http"\} (\S+)$', text, re.M).group(1))
    assert abs(ttft - 0.05) < 1e-9  # 30 ms queued + 20 ms prefill
    assert 'kspec_branches_per_request_bucket{le="4.0"} 1.0' in text
