"""`watch`'s two ends on the network: scraping an engine's /metrics into counter readings, and
serving watch's own series with prometheus_client.

Series (every one with the run's labels, `engine` and `optimization`), following Prometheus's
conventions (snake_case, `_ratio` for a share, `_total` for counters):
- decodegate_reference_acceptance_ratio, ..._lower_ratio, ..._upper_ratio: the verdict's
  accepted/drafted and its interval; decodegate_acceptance_boundary_ratio: the detector's p0;
- decodegate_window_acceptance_ratio, ..._lower_ratio, ..._upper_ratio: the sliding window;
- decodegate_cusum_statistic, decodegate_cusum_threshold, decodegate_alarm (1 while alarmed);
- decodegate_watched_draft_tokens_total, decodegate_watched_accepted_tokens_total,
  decodegate_engine_restarts_total, decodegate_scrape_failures_total.
"""
from __future__ import annotations

import httpx

from analysis.drift_detector import CounterError, Reading
from decoders.engines.telemetry import flatten, spec_counters

SPEC = "spec_decode_num_"


class Scraper:
    def __init__(self, base_url: str):
        self.url = base_url.rstrip("/") + "/metrics"
        self.http = httpx.Client(timeout=10.0)

    def _get(self) -> dict[str, float]:
        r = self.http.get(self.url)
        if r.status_code != 200:
            raise CounterError(f"{self.url} answered HTTP {r.status_code} (llama.cpp's server needs --metrics)")
        return flatten(r.text)

    def first(self) -> Reading:
        """The first reading; an engine that is down or exports no spec-decode counters is refused."""
        try:
            metrics = self._get()
        except httpx.HTTPError as e:
            raise CounterError(f"engine at {self.url} cannot be scraped ({type(e).__name__}: {e})") from e
        reading = reading_from(metrics)
        if reading is None:
            raise CounterError(f"engine at {self.url} exports no spec-decode counters (*:spec_decode_num_draft_tokens_total "
                               f"and *:spec_decode_num_accepted_tokens_total): is speculative decoding on?")
        return reading

    def read(self) -> Reading | None:
        """A reading, or None while the engine does not answer (a restart, a network blip)."""
        try:
            metrics = self._get()
        except (httpx.HTTPError, CounterError):
            return None
        reading = reading_from(metrics)
        if reading is None:
            raise CounterError(f"engine at {self.url} stopped exporting spec-decode counters")
        return reading


def reading_from(metrics: dict[str, float]) -> Reading | None:
    spec = spec_counters(metrics)
    if spec is None or not any(SPEC + "draft_tokens" in k for k in metrics) or not any(SPEC + "accepted_tokens" in k
                                                                                        for k in metrics):
        return None
    others = {k: v for k, v in metrics.items() if k.split("{", 1)[0].endswith("_total") and SPEC not in k}
    return Reading(drafted=spec["draft_tokens"], accepted=spec["accepted"],
                   drafts=spec["drafts"] if any(SPEC + "drafts" in k for k in metrics) else None,
                   others=others, start_time=metrics.get("process_start_time_seconds"))


class WatchMetrics:
    def __init__(self, labels: dict):
        from prometheus_client import CollectorRegistry, Counter, Gauge
        self.registry = CollectorRegistry()
        self.labels = labels
        names = list(labels)

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=self.registry).labels(**labels)

        def counter(name, doc):
            return Counter(name, doc, names, registry=self.registry).labels(**labels)

        self.ref = gauge("decodegate_reference_acceptance_ratio", "accepted/drafted tokens of the reference run")
        self.ref_low = gauge("decodegate_reference_acceptance_lower_ratio", "lower bound of the reference's interval")
        self.ref_high = gauge("decodegate_reference_acceptance_upper_ratio", "upper bound of the reference's interval")
        self.boundary = gauge("decodegate_acceptance_boundary_ratio", "lowest acceptance in control (lower bound less tolerance)")
        self.window = gauge("decodegate_window_acceptance_ratio", "accepted/drafted tokens over the sliding window")
        self.window_low = gauge("decodegate_window_acceptance_lower_ratio", "lower bound of the window's interval")
        self.window_high = gauge("decodegate_window_acceptance_upper_ratio", "upper bound of the window's interval")
        self.statistic = gauge("decodegate_cusum_statistic", "the one-sided CUSUM of acceptance below the boundary")
        self.threshold = gauge("decodegate_cusum_threshold", "the CUSUM's alarm threshold h (from --arl-hours)")
        self.alarm = gauge("decodegate_alarm", "1 when acceptance fell below the reference, else 0")
        self.drafted = counter("decodegate_watched_draft_tokens", "drafted tokens seen by watch")
        self.accepted = counter("decodegate_watched_accepted_tokens", "accepted draft tokens seen by watch")
        self.restarts = counter("decodegate_engine_restarts", "engine restarts seen (counter resets)")
        self.failures = counter("decodegate_scrape_failures", "scrapes of the engine that failed")
        self.server = None

    def reference(self, ref, p0: float, h: float) -> None:
        self.ref.set(ref.ratio)
        self.ref_low.set(ref.low)
        self.ref_high.set(ref.high)
        self.boundary.set(p0)
        self.threshold.set(h)
        self.alarm.set(0)
        self.statistic.set(0)

    def serve(self, listen: str) -> str:
        from prometheus_client import start_http_server
        host, _, port = listen.rpartition(":")
        if not port.isdigit():
            raise CounterError(f"--listen wants HOST:PORT, got {listen!r}")
        try:
            self.server, _ = start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
        except OSError as e:
            raise CounterError(f"--listen {listen}: cannot serve metrics there ({e})") from e
        return f"{host or '127.0.0.1'}:{self.server.server_port}"

    def update(self, delta, detector, w_acc: float, w_drafted: float, interval) -> None:
        self.drafted.inc(max(delta.drafted, 0))
        self.accepted.inc(max(delta.accepted, 0))
        # An empty window is not measured: NaN, never a stale value or 0.
        self.window.set(w_acc / w_drafted if w_drafted > 0 else float("nan"))
        self.window_low.set(interval[0])
        self.window_high.set(interval[1])
        self.statistic.set(detector.statistic)
        self.alarm.set(1 if detector.alarm else 0)

    def restarted(self) -> None:
        self.restarts.inc()

    def scrape_failed(self) -> None:
        self.failures.inc()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
