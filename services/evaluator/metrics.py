"""Prometheus metrics of one app instance (own registry, so several apps can live in one test process)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.contracts import EvaluationResult


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "evaluator_requests", "HTTP requests by route and status code", ["route", "code"], registry=self.registry
        )
        self.verdicts = Counter(
            "evaluator_verdicts", "Evaluation results by status", ["status"], registry=self.registry
        )
        self.cache_hits = Counter(
            "evaluator_build_cache_hits", "Evaluations that reused a cached build", registry=self.registry
        )
        self.latency = Histogram(
            "evaluator_evaluation_seconds",
            "Wall-clock time of one evaluation",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "evaluator_queue_depth", "Evaluations waiting for a worker slot", registry=self.registry
        )
        self.running = Gauge("evaluator_running", "Evaluations running now", registry=self.registry)
        self.build_paths = Counter(
            "evaluator_build_paths",
            "Evaluations that built extensions, by build path (see build_path)",
            ["path"],
            registry=self.registry,
        )
        self.reference_runs = Counter(
            "evaluator_reference_runs",
            "Reference workers run (the reference's outputs for that seed neither cached nor being computed)",
            registry=self.registry,
        )
        self.phase_seconds = Counter(
            "evaluator_phase_seconds",
            "Seconds spent per evaluation phase (see phases_s)",
            ["phase"],
            registry=self.registry,
        )

    def record(self, result: EvaluationResult) -> None:
        self.verdicts.labels(status=result.status.value).inc()
        self.latency.observe(result.duration_s)
        if result.cache_hit:
            self.cache_hits.inc()
        if result.build_path is not None:
            self.build_paths.labels(path=result.build_path).inc()
        for phase, seconds in result.phases_s.items():
            self.phase_seconds.labels(phase=phase).inc(seconds)  # the judge's clock: never negative
