"""`watch`'s two ends on the network: scraping an engine's /metrics into counter readings, and
serving watch's own series with prometheus_client.

Series (every one with the run's labels, `engine` and `optimization`), following Prometheus's
conventions (snake_case, `_ratio` for a share, `_total` for counters):
- decodegate_reference_acceptance_ratio, ..._lower_ratio, ..._upper_ratio: the verdict's
  accepted/drafted and its interval; decodegate_acceptance_boundary_ratio: the detector's p0;
- decodegate_window_acceptance_ratio, ..._lower_ratio, ..._upper_ratio: the sliding window;
- decodegate_cusum_statistic, decodegate_cusum_threshold; decodegate_alarm (1 from an alarm until
  watch stops or the alarm is acknowledged), decodegate_alarm_evidence_info (its kind,
  `acceptance_below_reference` or `speculation_stopped`, and evidence as labels), decodegate_alarms_total;
- decodegate_watched_draft_tokens_total, decodegate_watched_accepted_tokens_total,
  decodegate_engine_restarts_total, decodegate_scrape_failures_total.
"""
from __future__ import annotations

from dataclasses import dataclass

import httpx

from analysis.drift_detector import CounterError, Reading
from decoders.engines.telemetry import flatten, spec_counters

SPEC = "spec_decode_num_"
EVIDENCE_LABELS = ("kind", "boundary", "statistic", "threshold", "window_ratio", "window_drafted",
                   "generated_since_drafting", "watched_seconds")


# The engines' generated-token counters: "speculation stopped" is drafting that stands still (or
# whose series vanished) while these grow.
GENERATED = ("llamacpp:tokens_predicted_total", "vllm:generation_tokens_total")


@dataclass(frozen=True)
class Failure:
    """A scrape that gave no counters: the engine did not answer, answered an error, or answered
    something that is not Prometheus text. `why` names it with the response's first line."""
    why: str


class Scraper:
    def __init__(self, base_url: str, timeout: float = 10.0):
        self.url = base_url.rstrip("/") + "/metrics"
        self.http = httpx.Client(timeout=timeout)

    def scrape(self) -> dict[str, float] | Failure:
        """The engine's samples, or a Failure naming why there are none."""
        try:
            r = self.http.get(self.url)
        except httpx.HTTPError as e:
            return Failure(f"{type(e).__name__}: {e}"[:200])
        first = (r.text.strip().splitlines() or ["(empty body)"])[0][:120]
        if r.status_code != 200:
            return Failure(f"HTTP {r.status_code}: {first} (llama.cpp's server needs --metrics)")
        try:
            samples = flatten(r.text)
        except ValueError as e:
            return Failure(f"not Prometheus text ({e}): {first}"[:240])
        if not samples:
            return Failure(f"no samples in the answer: {first}")
        return samples

    def first(self) -> Reading:
        """The first reading; an engine that is down or exports no spec-decode counters is refused."""
        got = self.scrape()
        if isinstance(got, Failure):
            raise CounterError(f"engine at {self.url} cannot be scraped ({got.why})")
        reading = reading_from(got)
        if (bad := not_a_count(reading)) is not None:
            raise CounterError(f"engine at {self.url}: {bad.why}")
        if not reading.spec:
            raise CounterError(f"engine at {self.url} exports no spec-decode counters (*:spec_decode_num_draft_tokens_total "
                               f"and *:spec_decode_num_accepted_tokens_total): is speculative decoding on?")
        return reading

    def read(self) -> Reading | Failure:
        """A reading (its `spec` False when the spec-decode series are gone), or a Failure."""
        got = self.scrape()
        if isinstance(got, Failure):
            return got
        reading = reading_from(got)
        return not_a_count(reading) or reading


def not_a_count(reading: Reading) -> Failure | None:
    """A Failure where a spec-decode or generated counter is NaN, infinite or negative (an exporter
    or proxy bug): no count of tokens, so a failed scrape, never data fed to the detector."""
    import math
    values = {"drafted": reading.drafted, "accepted": reading.accepted, "drafts": reading.drafts,
              "generated": reading.generated}
    bad = [f"{k} {v!r}" for k, v in values.items() if v is not None and not (math.isfinite(v) and v >= 0)]
    return Failure(f"counters that are not counts ({', '.join(bad)})") if bad else None


def reading_from(metrics: dict[str, float]) -> Reading:
    spec = spec_counters(metrics)
    generated = [v for k, v in metrics.items() if k.split("{", 1)[0] in GENERATED]
    others = {k: v for k, v in metrics.items() if k.split("{", 1)[0].endswith("_total") and SPEC not in k}
    common = dict(others=others, start_time=metrics.get("process_start_time_seconds"),
                  generated=sum(generated) if generated else None)
    if spec is None or not any(SPEC + "draft_tokens" in k for k in metrics) or not any(SPEC + "accepted_tokens" in k
                                                                                        for k in metrics):
        return Reading(drafted=0.0, accepted=0.0, spec=False, **common)
    return Reading(drafted=spec["draft_tokens"], accepted=spec["accepted"],
                   drafts=spec["drafts"] if any(SPEC + "drafts" in k for k in metrics) else None, **common)


class WatchMetrics:
    def __init__(self, labels: dict):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Info
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
        self.alarm = gauge("decodegate_alarm", "1 from an alarm until watch stops or it is acknowledged (SIGUSR1), else 0")
        self.evidence = Info("decodegate_alarm_evidence", "the latched alarm's kind and evidence (kind none: no alarm)",
                             names, registry=self.registry).labels(**labels)
        self.alarms = counter("decodegate_alarms", "alarms raised (both kinds), acknowledged or not")
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
        self.evidence.info({"kind": "none"})
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
        self.threshold.set(detector.h)  # the threshold of the step's size (analysis.lr_cusum.Design.at)

    def alarmed(self, evidence: dict) -> None:
        """Latch the alarm: decodegate_alarm stays 1 (and the evidence readable) until cleared."""
        self.alarm.set(1)
        self.alarms.inc()
        self.evidence.info({k: (f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in evidence.items()
                            if k in EVIDENCE_LABELS and v is not None})

    def acknowledged(self) -> None:
        self.alarm.set(0)
        self.evidence.info({"kind": "none"})

    def restarted(self) -> None:
        self.restarts.inc()

    def scrape_failed(self) -> None:
        self.failures.inc()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
