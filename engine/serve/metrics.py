"""The network engine's Prometheus metrics (`GET /metrics`, text format 0.0.4), one
registry per daemon (no process-wide state), fed from each request's outcome.

Exposed (all prefixed `kspec_`):
- `request_latency_seconds{surface}` histogram: arrival to answer ("http" or "protocol")
- `time_to_first_token_seconds{surface}` histogram: arrival to the end of prefill
- `requests_in_flight` gauge, `queue_length` gauge (waiting for the engine's thread)
- `requests_per_batch` histogram: requests decoded together (the peak during a request)
- `branches_per_request` histogram: the k alternatives decoded together over one prefix
- `decode_rounds` histogram and `accepted_draft_tokens_per_round` histogram (BASS)
- `prompt_tokens_total` / `prompt_tokens_reused_total` counters: prefix-cache hit rate =
  reused / prompt
- `requests_total{surface}`, `errors_total{kind}` counters (kind as in engine/errors.py)
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kspec.engine.errors import describe

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ACCEPTED_BUCKETS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the classic text format generate_latest writes; every Prometheus reads it


class EngineMetrics:
    def __init__(self, queue_length: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram("kspec_request_latency_seconds", "arrival to answer", ["surface"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("kspec_time_to_first_token_seconds", "arrival to the end of prefill", ["surface"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("kspec_requests_in_flight", "requests accepted and not yet answered", registry=r)
        self.queue = Gauge("kspec_queue_length", "requests waiting for the engine's thread", registry=r)
        if queue_length is not None:
            self.queue.set_function(lambda: float(queue_length()))
        self.batch = Histogram("kspec_requests_per_batch", "requests decoded together (peak during a request)", buckets=COUNT_BUCKETS, registry=r)
        self.branches = Histogram("kspec_branches_per_request", "alternatives decoded together over one prefix", buckets=COUNT_BUCKETS, registry=r)
        self.rounds = Histogram("kspec_decode_rounds", "decode rounds per request", buckets=COUNT_BUCKETS, registry=r)
        self.accepted = Histogram("kspec_accepted_draft_tokens_per_round", "draft tokens accepted per branch per round", buckets=ACCEPTED_BUCKETS, registry=r)
        self.prompt_tokens = Counter("kspec_prompt_tokens", "prompt tokens of answered requests", registry=r)
        self.reused_tokens = Counter("kspec_prompt_tokens_reused", "prompt tokens found in the prefix cache", registry=r)
        self.requests = Counter("kspec_requests", "requests answered", ["surface"], registry=r)
        self.errors = Counter("kspec_errors", "requests that failed, by kind", ["kind"], registry=r)

    def answered(self, surface: str, k: int, timing: dict[str, float], seconds: float) -> None:
        """A request of `k` branches answered in `seconds`, with its answer's `timing` (timing_ms)."""
        self.requests.labels(surface).inc()
        self.latency.labels(surface).observe(seconds)
        queued_s = max(0.0, seconds - timing.get("total", seconds * 1000) / 1000)
        if "prefill" in timing:
            self.first_token.labels(surface).observe(queued_s + timing["prefill"] / 1000)
        if "batch_requests_max" in timing:
            self.batch.observe(timing["batch_requests_max"])
        self.branches.observe(k)
        if timing.get("rounds"):
            self.rounds.observe(timing["rounds"])
            self.accepted.observe(timing.get("accepted_per_round", 0.0))
        self.prompt_tokens.inc(timing.get("prompt_tokens", 0.0))
        self.reused_tokens.inc(timing.get("reused_prompt_tokens", 0.0))

    def failed(self, error: BaseException) -> None:
        self.errors.labels(describe(error).kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
