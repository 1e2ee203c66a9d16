"""The daemon's Prometheus metrics (GET /metrics, and METRICS for `genie-ctl metrics`): per-request figures
observed as each request ends, whichever front it came through, and gauges read from the daemon's state
when scraped."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from genie_protocol.kv_messages import KvSaveCounts
from genie_protocol.messages import Timings, Usage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DaemonMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "genie_time_to_first_token_seconds",
            "Time from a request reaching the worker to its first token",
            buckets=(0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30),
            registry=r,
        )
        self.decode = Histogram(
            "genie_decode_tokens_per_second",
            "Decode speed of each finished request",
            buckets=(5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 500, 800),
            registry=r,
        )
        self.prompt_tokens = Counter("genie_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter(
            "genie_cached_tokens", "Prompt tokens served from KV (resident or hydrated), not prefilled", registry=r
        )
        self.generated_tokens = Counter("genie_generated_tokens", "Tokens generated", registry=r)
        self.requests = Counter("genie_requests", "Finished requests by how they ended", ["finish"], registry=r)
        self.requests_running = Gauge("genie_requests_running", "Requests in flight on the worker", registry=r)
        self.slots_total = Gauge("genie_slots_total", "Requests the worker runs at once (its KV slots)", registry=r)
        self.requests_waiting = Gauge("genie_requests_waiting", "Requests queued", registry=r)
        self._state = _StateCollector()
        r.register(self._state)

    def observe_done(self, finish_reason: str, usage: Usage, timings: Timings) -> None:
        self.requests.labels(finish_reason).inc()
        self.prompt_tokens.inc(max(0, int(usage.get("prompt_tokens", 0))))
        self.cached_tokens.inc(max(0, int(usage.get("cached_tokens", 0))))
        self.generated_tokens.inc(max(0, int(usage.get("completion_tokens", 0))))
        if timings.get("ttft_ms"):
            self.ttft.observe(float(timings["ttft_ms"]) / 1000)
        if timings.get("decode_tok_s"):
            self.decode.observe(float(timings["decode_tok_s"]))

    def observe_error(self, code: str) -> None:
        self.requests.labels(f"error:{code}").inc()

    def render(self, state: dict[str, Any]) -> bytes:
        """The text exposition, with gauges from `state`: the daemon's status with its `kv` section."""
        self._read_state(state)
        return generate_latest(self.registry)

    def counters(self, state: dict[str, Any]) -> dict[str, float]:
        """The same figures as one flat map for `genie-ctl metrics` (METRICS): each sample by its name and
        labels as the text has them; histograms by their _count and _sum (buckets are for Prometheus)."""
        self._read_state(state)
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
                key = f"{sample.name}{{{labels}}}" if labels else sample.name
                value = float(sample.value)
                out[key] = int(value) if value.is_integer() else value  # a count reads as one
        return out

    def _read_state(self, state: dict[str, Any]) -> None:
        self.requests_running.set(int(state.get("running", 0)))
        self.slots_total.set(int((state.get("slots") or {}).get("total", 0)))
        self.requests_waiting.set(int(state.get("queue", 0)))
        self._state.snapshot = state


class _StateCollector(Collector):
    """Gauges from the daemon's status at scrape time: readiness, restarts, the KV store's figures and the
    worker's count of its KV saves."""

    snapshot: dict[str, Any] = {}

    def collect(self) -> Any:
        s = self.snapshot
        kv = s.get("kv") or {}
        yield _gauge("genie_ready", "1 when the model is loaded and serving", 1.0 if s.get("ready") else 0.0)
        yield _gauge("genie_worker_restarts", "Worker restarts since the daemon started", s.get("worker_restarts", 0))
        thermal = s.get("thermal") or {}
        if isinstance(thermal.get("temp_c"), (int, float)):
            yield _gauge("genie_temperature_celsius", "The worker's device temperature", thermal["temp_c"])
        if "throttled" in thermal:
            throttled = 1.0 if thermal["throttled"] else 0.0
            yield _gauge("genie_thermal_throttled", "1 while the worker slows down for heat", throttled)
        figures = {
            "entries": "Saved conversations in the KV store",
            "bytes": "Bytes of saved KV",
            "max_bytes": "Size cap of the saved KV (0: none)",
            "hits": "KV lookups that found a saved prefix",
            "misses": "KV lookups that found nothing",
            "saves": "KV saves written",
            "save_failures": "KV saves that failed: the disk refused them (after making room), or no name was free",
            "evictions": "Saved KV entries evicted by the size cap or for room on a full disk",
            "rejected": "Saved KV entries rejected on read (corrupt or foreign)",
        }
        for key, help_text in figures.items():
            value = kv.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield _gauge(f"genie_kv_store_{key}", help_text, value)
        saves = kv.get("worker_saves")
        if isinstance(saves, dict):
            counts = KvSaveCounts.from_body(saves)
            for f in fields(KvSaveCounts):
                yield _gauge(f"genie_kv_worker_saves_{f.name}", f.metadata["help"], getattr(counts, f.name))


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, help_text)
    g.add_metric([], float(value))
    return g
