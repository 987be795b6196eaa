"""Watch a live engine's speculative-decoding acceptance against the verdict that let it roll out.

Every --interval seconds `watch` scrapes the engine's Prometheus /metrics (llama.cpp's
`llamacpp:spec_decode_num_*_total`, vLLM's `vllm:spec_decode_num_*_total`), differences the
counters (a restart of the engine starts a new epoch: nothing drafted since is lost), and feeds
accepted/drafted tokens to a one-sided CUSUM (analysis.lr_cusum: the likelihood ratio of each
step's own count, beta-binomial with the reference's overdispersion) that tests for acceptance
falling below the reference: the run's accepted/drafted lower bound, less --tolerance.
--arl-hours sets the average time between false alarms while acceptance stays at that boundary;
the threshold is solved so that the detector's exact in-control ARL (a Markov chain) reaches it.
Acceptance above the boundary alarms less often still.

Two kinds of alarm: `acceptance_below_reference` (the CUSUM) and `speculation_stopped` (the
engine generated --stopped-tokens tokens while its drafted counter stood still, or with its
spec-decode series gone: a relaunch without speculation). On an alarm it prints one line with
the evidence, runs --on-alarm-command and posts to --webhook (the evidence as JSON), and latches:
decodegate_alarm stays 1 on its /metrics until --max-duration, SIGTERM/SIGINT (exit 4 while an
alarm stands) or SIGUSR1 (acknowledged: cleared, watched afresh). --exit-on-alarm exits 4 at once.
It never changes the engine: a team's kill switch acts on the hook or on the alarm series.

A scrape that fails (no answer, an error status, a body that is not Prometheus text, an empty
one) is counted in decodegate_scrape_failures_total and watch goes on; more than
--max-scrape-failures in a row end it (exit 2) with the last response's first line.

Meanwhile it serves its own /metrics at --listen: the reference and its bounds, the window's
acceptance and interval, the detector's statistic and threshold, the alarm state and evidence,
with the run's labels (team, cost centre, ...) and `engine`, `optimization` on every series.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections import deque
from urllib.parse import urlparse

ALARM_EXIT = 4
EPILOG = ("exit codes: 0 stopped (--max-duration or a signal) with no alarm standing, 4 an alarm stands (acceptance "
          "fell below the reference, or speculation stopped) or --exit-on-alarm saw one, 2 a usage or input error "
          "(one line naming it: an engine without spec-decode counters at the start, a reference without acceptance "
          "or with too few drafting requests, counters that go backwards without a restart, more failed scrapes in a "
          "row than --max-scrape-failures), 3 an internal error")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.add_argument("--engine", required=True, help="the engine's base URL (its /metrics is scraped)")
    p.add_argument("--reference", required=True, help="a run folder of `decodegate regress`, or mlflow:RUN_ID")
    p.add_argument("--candidate", help="the reference run's candidate (default: the only one that drafted)")
    p.add_argument("--temperature", type=float, default=None,
                   help="the temperature the watched traffic runs at: the reference is the run's requests at it "
                        "(needed when the run drafted at several)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI for an mlflow:RUN_ID reference")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes (default 15)")
    p.add_argument("--window", type=float, default=300.0,
                   help="seconds of the sliding window whose acceptance and interval are exported (default 300)")
    p.add_argument("--arl-hours", type=float, default=720.0,
                   help="average hours between false alarms at the in-control boundary (default 720: 30 days)")
    p.add_argument("--drop", type=float, default=0.10,
                   help="the relative drop below the boundary the CUSUM is tuned to (default 0.10); a collapse to a "
                        "third of the boundary is carried too (and a one-step collapse limit)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="relative slack under the reference's lower bound still in control (default 0.05, as the gate)")
    p.add_argument("--min-drafted", type=int, default=64,
                   help="drafted tokens per detector step; quieter scrapes are carried over (default 64)")
    p.add_argument("--dispersion", type=float, default=None,
                   help="overdispersion φ of acceptance counts (default: the 95%% upper bound of the one measured on the "
                        "reference run's requests)")
    p.add_argument("--listen", default="127.0.0.1:9848", help="HOST:PORT of watch's own /metrics (default 127.0.0.1:9848)")
    p.add_argument("--engine-label", help="the `engine` label on watch's series (default: the URL's host:port)")
    p.add_argument("--on-alarm-command", help="a command run once on an alarm, the evidence as JSON on its stdin "
                                             "and in $DECODEGATE_ALARM (not through a shell)")
    p.add_argument("--webhook", help="a URL the evidence is POSTed to as JSON on an alarm")
    p.add_argument("--log", help="append one JSON line per scrape (counters, differences, statistic) to this file")
    p.add_argument("--max-duration", type=float, default=None,
                   help="stop after this many seconds (exit 0 if no alarm stands, 4 if one does)")
    p.add_argument("--exit-on-alarm", action="store_true",
                   help="exit 4 as soon as an alarm is raised (after the hooks), for scripts; by default watch keeps "
                        "serving decodegate_alarm 1 until --max-duration, SIGTERM/SIGINT, or SIGUSR1 (acknowledge)")
    p.add_argument("--max-scrape-failures", type=int, default=40,
                   help="scrapes in a row that may fail (no answer, an error, not Prometheus text, empty) before watch "
                        "gives up with exit 2; each is counted in decodegate_scrape_failures_total (default 40)")
    p.add_argument("--stopped-tokens", type=int, default=512,
                   help="generated tokens with nothing drafted (or with the spec-decode series gone) that raise the "
                        "`speculation_stopped` alarm (default 512)")


def _check(args) -> None:
    from analysis.drift_detector import CounterError
    if not 0 < args.drop < 1:
        raise CounterError(f"--drop must lie in (0, 1), got {args.drop!r}")
    for name in ("interval", "window", "arl_hours"):
        value = getattr(args, name)
        if not value > 0 or value == float("inf"):
            raise CounterError(f"--{name.replace('_', '-')} must be a positive number, got {value!r}")
    if args.arl_hours * 3600 / args.interval <= 1:
        raise CounterError(f"--arl-hours {args.arl_hours:g} is shorter than one --interval ({args.interval:g} s)")
    for name in ("min_drafted", "stopped_tokens"):
        if getattr(args, name) < 1:
            raise CounterError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_scrape_failures < 0:
        raise CounterError(f"--max-scrape-failures must be at least 0, got {args.max_scrape_failures}")
    if args.dispersion is not None and not args.dispersion >= 1:
        raise CounterError(f"--dispersion must be at least 1 (1: binomial), got {args.dispersion!r}")
    if args.tolerance is not None and not 0 <= args.tolerance < 1:
        raise CounterError(f"--tolerance must lie in [0, 1), got {args.tolerance!r}")


def run(args) -> int:
    from analysis.lr_cusum import AcceptanceCusum, design
    from harness.verdict import live_reference
    from harness.verdict.acceptance_ref import DEFAULT_TOLERANCE
    from harness.run.live_metrics import Scraper, WatchMetrics
    _check(args)
    ref = live_reference.load(args.reference, args.candidate, tracking_uri=args.tracking_uri,
                              temperature=args.temperature)
    scraper = Scraper(args.engine)
    first = scraper.first()  # refuses an engine that is down or exports no spec-decode counters
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    p0 = ref.monitored_boundary(tolerance)
    phi = args.dispersion or ref.dispersion_upper
    phi_from = (" as given" if args.dispersion else
                f": the upper bound of {ref.dispersion:.2f} measured over {ref.requests} requests")
    arl_steps = args.arl_hours * 3600 / args.interval
    detector = AcceptanceCusum(design(p0, args.drop, args.min_drafted, phi, arl_steps))
    engine_label = args.engine_label or urlparse(args.engine).netloc or args.engine
    labels = {**ref.labels, "engine": engine_label, "optimization": ref.candidate}
    metrics = WatchMetrics(labels)
    metrics.reference(ref, p0, detector.h)
    address = metrics.serve(args.listen)
    print(f"decodegate: watching {args.engine} against {ref.source} ({ref.candidate}: accepted/drafted "
          f"{ref.ratio:.3f} [{ref.low:.3f}, {ref.high:.3f}], boundary {p0:.3f}, φ {phi:.2f}{phi_from}); "
          f"{_design_line(detector.design, args)}; metrics at http://{address}/metrics", flush=True)
    return _loop(args, scraper, first, detector, metrics, ref, labels)


def _design_line(d, args) -> str:
    limit = f", collapse limit: {d.shewhart} or fewer accepted of {d.n}" if d.shewhart >= 0 else ""
    return (f"LR CUSUM against acceptance {d.p1:.3f} (and {d.p0 / 3:.3f} at weight {d.weight:g}), h {d.h:.2f} nats"
            f"{limit}: exact in-control ARL {d.arl:.0f} steps of {d.n} drafted tokens for the {args.arl_hours:g} h asked "
            f"({d.target:.0f} steps of {args.interval:g} s)")


class _Watch:
    """The loop's state: the last reading, the window, the latched alarm, the stop and acknowledge flags."""

    def __init__(self, args, scraper, first, detector, metrics, ref, labels):
        self.args, self.scraper, self.previous, self.detector = args, scraper, first, detector
        self.metrics, self.ref, self.labels = metrics, ref, labels
        self.window: deque = deque()  # (time, accepted, drafted)
        self.failed_between, self.failures, self.last_failure = False, 0, ""
        self.generated_since_drafting = 0.0
        self.latched: dict | None = None   # the evidence of the alarm that holds
        self.stop = self.ack = False
        self.ended = ""
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wait(self) -> None:
        """Sleep one --interval in short slices, so a signal or --max-duration ends it promptly."""
        end = time.monotonic() + self.args.interval
        if self.args.max_duration is not None:
            end = min(end, self.started + self.args.max_duration)
        while not (self.stop or self.ack) and time.monotonic() < end:
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def running(self) -> bool:
        return not self.stop and (self.args.max_duration is None or self.elapsed() < self.args.max_duration)

    def acknowledge(self) -> None:
        """SIGUSR1: the team has seen the alarm; clear it and watch afresh (statistic from 0)."""
        self.ack = False
        if self.latched is not None:
            print(f"decodegate: alarm ({self.latched['kind']}) acknowledged; watching again from 0", flush=True)
        self.latched, self.generated_since_drafting = None, 0.0
        self.detector.reset()
        self.metrics.acknowledged()

    def failed(self, failure) -> None:
        """A scrape that gave no counters: counted, and only a run past --max-scrape-failures ends watch."""
        self.failed_between, self.failures, self.last_failure = True, self.failures + 1, failure.why
        self.metrics.scrape_failed()
        if self.failures > self.args.max_scrape_failures:
            raise ScrapeFailures(f"{self.failures} scrapes of {self.scraper.url} in a row failed (--max-scrape-failures "
                                 f"{self.args.max_scrape_failures}); the last: {failure.why}")

    def step(self, reading, log) -> dict | None:
        """Feed one reading; the evidence of a new alarm, or None."""
        from analysis.drift_detector import wilson_interval
        now = self.elapsed()
        delta = self._delta(reading)
        self.failed_between, self.failures = False, 0
        if delta.restarted:
            self.metrics.restarted()
            print(f"decodegate: {self.args.engine} restarted ({delta.why}): a new epoch, counted from zero", flush=True)
        stepped = self.detector.update(delta.accepted, delta.drafted)
        self.window.append((now, delta.accepted, delta.drafted))
        while self.window and self.window[0][0] < now - self.args.window:
            self.window.popleft()
        w_acc, w_drafted = sum(x[1] for x in self.window), sum(x[2] for x in self.window)
        interval = wilson_interval(w_acc, w_drafted, dispersion=self.detector.phi)
        self.metrics.update(delta, self.detector, w_acc, w_drafted, interval)
        if log:
            log.write(json.dumps({"t": round(now, 3), "drafted": reading.drafted, "accepted": reading.accepted,
                                  "generated": reading.generated, "spec": reading.spec, "d_drafted": delta.drafted,
                                  "d_accepted": delta.accepted, "d_generated": delta_generated(self.previous, reading),
                                  "restarted": delta.restarted, "step": stepped, "statistic": self.detector.statistic,
                                  "steps": self.detector.steps}) + "\n")
            log.flush()
        self._stopped_drafting(reading, delta)
        self.previous = reading
        if self.latched is not None:
            return None
        window = (w_acc, w_drafted, *interval)
        if self.detector.alarm:
            return _evidence(self.args, self.ref, self.detector, self.labels, window, now, "acceptance_below_reference")
        if self.generated_since_drafting >= self.args.stopped_tokens:
            e = _evidence(self.args, self.ref, self.detector, self.labels, window, now, "speculation_stopped")
            return {**e, "generated_since_drafting": self.generated_since_drafting, "spec_series": reading.spec}
        return None

    def _delta(self, reading):
        from analysis.drift_detector import Delta, counter_delta
        if reading.spec:
            if not self.previous.spec:  # the series came back (a relaunch with speculation): a new epoch
                return Delta(reading.drafted, reading.accepted, reading.drafts, True, "spec-decode series reappeared")
            return counter_delta(self.previous, reading, failed_scrape_between=self.failed_between)
        # No spec-decode series: nothing drafted; the epoch is the generated counter's.
        went_down = (self.previous.generated or 0) > (reading.generated or 0)
        return Delta(0.0, 0.0, None, self.previous.spec or went_down,
                     "spec-decode series vanished" if self.previous.spec else "generated tokens counter reset")

    def _stopped_drafting(self, reading, delta) -> None:
        if delta.drafted > 0:
            self.generated_since_drafting = 0.0
        elif reading.generated is None:
            # An engine without a generated-token counter: series that vanished are all there is to go by.
            self.generated_since_drafting = float("inf") if not reading.spec else 0.0
        else:
            self.generated_since_drafting += delta_generated(self.previous, reading)


class ScrapeFailures(ValueError):
    """A run of failed scrapes past --max-scrape-failures (exit 2, one line)."""


def delta_generated(before, after) -> float:
    """Generated tokens between two readings, a reset (a new process) counted from zero."""
    if after.generated is None:
        return 0.0
    if before.generated is None or after.generated < before.generated:
        return after.generated
    return after.generated - before.generated


def _loop(args, scraper, first, detector, metrics, ref, labels) -> int:
    import signal

    from analysis.drift_detector import CounterError
    from harness.run.live_metrics import Failure
    w = _Watch(args, scraper, first, detector, metrics, ref, labels)
    log = open(args.log, "a") if args.log else None
    saved = _signals(w)
    try:
        while w.running():
            w.wait()
            if w.ack:
                w.acknowledge()
            if not w.running():
                break
            reading = scraper.read()
            if isinstance(reading, Failure):
                w.failed(reading)
                continue
            evidence = w.step(reading, log)
            if evidence is not None:
                w.latched = evidence
                print(_alarm_line(evidence), flush=True)
                metrics.alarmed(evidence)
                _hooks(args, evidence)
                if args.exit_on_alarm:
                    return ALARM_EXIT
    except ValueError as e:  # ScrapeFailures, CounterError: our input errors end watch, an alarm raised still stands
        if w.latched is None or not isinstance(e, (ScrapeFailures, CounterError)):
            raise
        print(f"decodegate: {e}", file=sys.stderr)
        w.ended = "the engine stopped answering" if isinstance(e, ScrapeFailures) else "its counters became unreadable"
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if log:
            log.close()
        metrics.stop()
    why = w.ended or ("stopped by a signal" if w.stop else f"--max-duration {args.max_duration:g} s reached")
    if w.latched is not None:
        print(f"decodegate: {why} with the alarm ({w.latched['kind']}) still raised", flush=True)
        return ALARM_EXIT
    print(f"decodegate: no alarm standing, {why} ({detector.steps} detector steps, "
          f"statistic {detector.statistic:.3f} < h {detector.h:.3f})", flush=True)
    return 0


def _signals(w: _Watch) -> dict:
    """SIGTERM / SIGINT stop watch (exit 4 if an alarm stands), SIGUSR1 acknowledges the alarm."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return {}
    saved = {}

    def stop(*_):
        w.stop = True

    def ack(*_):
        w.ack = True
    for sig, handler in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGUSR1, ack)):
        saved[sig] = signal.signal(sig, handler)
    return saved


def _evidence(args, ref, det, labels, window, elapsed, kind: str) -> dict:
    w_acc, w_drafted, w_low, w_high = window
    return {"kind": kind, "engine": args.engine, "labels": labels, "reference": ref.source, "candidate": ref.candidate,
            "reference_ratio": ref.ratio, "reference_interval": [ref.low, ref.high], "boundary": det.p0,
            "statistic": det.statistic, "threshold": det.h, "tuned_to": det.design.p1,
            "collapse_limit": det.shewhart_fired, "in_control_arl_steps": det.design.arl, "dispersion": det.phi,
            "arl_hours": args.arl_hours, "steps": det.steps, "drafted_since_statistic_rose": det.drafted_since_reset,
            "window_seconds": args.window, "window_accepted": w_acc, "window_drafted": w_drafted,
            "window_ratio": (w_acc / w_drafted) if w_drafted else None, "window_interval": [w_low, w_high],
            "stopped_tokens": args.stopped_tokens, "watched_seconds": round(elapsed, 3)}


def _alarm_line(e: dict) -> str:
    if e["kind"] == "speculation_stopped":
        gone = "its spec-decode series are gone" if not e["spec_series"] else "it drafts nothing"
        return (f"decodegate: ALARM {e['engine']} {e['candidate']}: speculation stopped: {gone} while it generated "
                f"{e['generated_since_drafting']:.0f} tokens (--stopped-tokens {e['stopped_tokens']}); the speedup "
                f"the verdict measured is gone; nothing was switched off")
    window = (f"window {e['window_ratio']:.3f} [{e['window_interval'][0]:.3f}, {e['window_interval'][1]:.3f}] over "
              f"{e['window_drafted']:.0f} drafted tokens in {e['window_seconds']:g} s" if e["window_drafted"] else "window empty")
    return (f"decodegate: ALARM {e['engine']} {e['candidate']}: acceptance below the reference "
            f"{e['reference_ratio']:.3f} [{e['reference_interval'][0]:.3f}, {e['reference_interval'][1]:.3f}] "
            f"(boundary {e['boundary']:.3f}): "
            f"{'one step under the collapse limit, ' if e['collapse_limit'] else ''}CUSUM {e['statistic']:.2f} "
            f"{'>=' if e['statistic'] >= e['threshold'] else '<'} h {e['threshold']:.2f} (ARL "
            f"{e['arl_hours']:g} h), {e['drafted_since_statistic_rose']:.0f} drafted tokens since it left 0; {window}; "
            f"nothing was switched off")


def _hooks(args, evidence: dict) -> None:
    """The team's kill switch lives behind these; a hook that fails is said, the alarm stands."""
    body = json.dumps(evidence)
    if args.on_alarm_command:
        import os
        try:
            proc = subprocess.run(shlex.split(args.on_alarm_command), input=body, text=True, timeout=60,
                                  env={**os.environ, "DECODEGATE_ALARM": body})
            if proc.returncode != 0:
                print(f"decodegate: --on-alarm-command exited {proc.returncode}", file=sys.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"decodegate: --on-alarm-command failed: {e}", file=sys.stderr)
    if args.webhook:
        import httpx
        try:
            r = httpx.post(args.webhook, content=body, headers={"Content-Type": "application/json"}, timeout=10)
            if r.status_code >= 300:
                print(f"decodegate: --webhook answered HTTP {r.status_code}", file=sys.stderr)
        except httpx.HTTPError as e:
            print(f"decodegate: --webhook failed: {type(e).__name__}: {e}", file=sys.stderr)
