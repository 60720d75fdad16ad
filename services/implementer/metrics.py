"""Prometheus metrics of one app instance (own registry, so tests can build several apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from shared.contracts import ImplementResponse


class ImplementerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "implementer_requests",
            "Implement requests answered, by status.",
            ["backend", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "implementer_latency_seconds",
            "Time to answer one implement request.",
            ["backend"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.upstream_calls = Counter(
            "implementer_upstream_calls",
            "Backend calls made, retries and repairs included.",
            ["backend"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "implementer_upstream_errors", "Requests that ended in upstream_error.", ["backend"], registry=self.registry
        )
        self.tokens = Counter(
            "implementer_tokens", "Tokens reported by the upstream server.", ["backend", "kind"], registry=self.registry
        )

    def observe(self, response: ImplementResponse) -> None:
        backend = response.backend
        self.requests.labels(backend, response.status).inc()
        self.latency.labels(backend).observe(response.latency_ms / 1000)
        self.upstream_calls.labels(backend).inc(response.attempts)
        if response.status == "upstream_error":
            self.upstream_errors.labels(backend).inc()
        self.tokens.labels(backend, "prompt").inc(response.usage.prompt_tokens)
        self.tokens.labels(backend, "completion").inc(response.usage.completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
