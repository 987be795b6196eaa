"""Watch a live engine's speculative-decoding acceptance against the verdict that let it roll out.

Every --interval seconds `watch` scrapes the engine's Prometheus /metrics (llama.cpp's
`llamacpp:spec_decode_num_*_total`, vLLM's `vllm:spec_decode_num_*_total`), differences the
counters (a restart of the engine starts a new epoch: nothing drafted since is lost), and feeds
accepted/drafted tokens to a one-sided CUSUM that tests for acceptance falling below the
reference: the run's accepted/drafted lower bound, less --tolerance. --arl-hours sets the average
time between false alarms while acceptance stays at that boundary (threshold from Siegmund's
approximation; docs/monitoring.md says how it was checked). Acceptance above the boundary alarms
less often still.

On an alarm it prints one line with the evidence, runs --on-alarm-command and posts to --webhook
(the evidence as JSON), and exits 4. It never changes the engine: a team's kill switch acts on the
hook. Meanwhile it serves its own /metrics at --listen: the reference and its bounds, the window's
acceptance and interval, the detector's statistic and threshold, the alarm state, with the run's
labels (team, cost centre, ...) and `engine`, `optimization` on every series.
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
EPILOG = ("exit codes: 0 --max-duration reached without an alarm, 4 an alarm (acceptance fell below the "
          "reference), 2 a usage or input error (one line naming it: an engine without spec-decode counters, a "
          "reference without acceptance, counters that go backwards without a restart), 3 an internal error")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.add_argument("--engine", required=True, help="the engine's base URL (its /metrics is scraped)")
    p.add_argument("--reference", required=True, help="a run folder of `decodegate regress`, or mlflow:RUN_ID")
    p.add_argument("--candidate", help="the reference run's candidate (default: the only one that drafted)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI for an mlflow:RUN_ID reference")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between scrapes (default 15)")
    p.add_argument("--window", type=float, default=300.0,
                   help="seconds of the sliding window whose acceptance and interval are exported (default 300)")
    p.add_argument("--arl-hours", type=float, default=720.0,
                   help="average hours between false alarms at the in-control boundary (default 720: 30 days)")
    p.add_argument("--drop", type=float, default=0.10,
                   help="the relative drop below the boundary the detector is tuned to catch fastest (default 0.10)")
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
    p.add_argument("--max-duration", type=float, default=None, help="stop after this many seconds (exit 0 if no alarm)")


def _check(args) -> None:
    from analysis.drift_detector import CounterError
    for name in ("interval", "window", "arl_hours", "drop"):
        value = getattr(args, name)
        if not value > 0 or value == float("inf"):
            raise CounterError(f"--{name.replace('_', '-')} must be a positive number, got {value!r}")
    if args.arl_hours * 3600 / args.interval <= 1:
        raise CounterError(f"--arl-hours {args.arl_hours:g} is shorter than one --interval ({args.interval:g} s)")
    if args.min_drafted < 1:
        raise CounterError(f"--min-drafted must be at least 1, got {args.min_drafted}")
    if args.dispersion is not None and not args.dispersion >= 1:
        raise CounterError(f"--dispersion must be at least 1 (1: binomial), got {args.dispersion!r}")
    if args.tolerance is not None and not 0 <= args.tolerance < 1:
        raise CounterError(f"--tolerance must lie in [0, 1), got {args.tolerance!r}")


def run(args) -> int:
    from analysis.drift_detector import Cusum, cusum_threshold, reference_value
    from harness.verdict import live_reference
    from harness.verdict.acceptance_ref import DEFAULT_TOLERANCE
    from harness.run.live_metrics import Scraper, WatchMetrics
    _check(args)
    ref = live_reference.load(args.reference, args.candidate, tracking_uri=args.tracking_uri)
    scraper = Scraper(args.engine)
    first = scraper.first()  # refuses an engine that is down or exports no spec-decode counters
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    p0 = ref.boundary(tolerance)
    if not 0 < p0 < 1:
        raise live_reference.LiveReferenceError(
            f"reference {ref.source}: candidate {ref.candidate!r} accepted {ref.accepted} of {ref.drafted} drafted "
            f"tokens (lower bound {ref.low:.3f}): there is no acceptance to fall from")
    phi = args.dispersion or ref.dispersion_upper
    phi_from = (" as given" if args.dispersion else
                f": the upper bound of {ref.dispersion:.2f} measured over {ref.requests} requests")
    k = reference_value(p0, args.drop, phi, args.min_drafted)
    arl_steps = args.arl_hours * 3600 / args.interval
    detector = Cusum(p0=p0, k=k, h=cusum_threshold(arl_steps, k), phi=phi, min_drafted=args.min_drafted)
    engine_label = args.engine_label or urlparse(args.engine).netloc or args.engine
    labels = {**ref.labels, "engine": engine_label, "optimization": ref.candidate}
    metrics = WatchMetrics(labels)
    metrics.reference(ref, p0, detector.h)
    address = metrics.serve(args.listen)
    print(f"decodegate: watching {args.engine} against {ref.source} ({ref.candidate}: accepted/drafted "
          f"{ref.ratio:.3f} [{ref.low:.3f}, {ref.high:.3f}], boundary {p0:.3f}, φ {phi:.2f}{phi_from}); CUSUM k {k:.3f}, "
          f"h {detector.h:.3f} for an ARL of {args.arl_hours:g} h ({arl_steps:.0f} steps of {args.interval:g} s); "
          f"metrics at http://{address}/metrics", flush=True)
    return _loop(args, scraper, first, detector, metrics, ref, labels)


def _loop(args, scraper, previous, detector, metrics, ref, labels) -> int:
    from analysis.drift_detector import counter_delta, wilson_interval
    started = time.monotonic()
    window: deque = deque()  # (time, accepted, drafted)
    failed_between = False
    log = open(args.log, "a") if args.log else None
    try:
        while args.max_duration is None or time.monotonic() - started < args.max_duration:
            time.sleep(args.interval if args.max_duration is None
                       else max(0.0, min(args.interval, args.max_duration - (time.monotonic() - started))))
            now = time.monotonic()
            reading = scraper.read()
            if reading is None:
                failed_between = True
                metrics.scrape_failed()
                continue
            delta = counter_delta(previous, reading, failed_scrape_between=failed_between)
            failed_between, previous = False, reading
            if delta.restarted:
                metrics.restarted()
                print(f"decodegate: {args.engine} restarted ({delta.why}): a new epoch, counted from zero", flush=True)
            stepped = detector.update(delta.accepted, delta.drafted)
            window.append((now, delta.accepted, delta.drafted))
            while window and window[0][0] < now - args.window:
                window.popleft()
            w_acc, w_drafted = sum(x[1] for x in window), sum(x[2] for x in window)
            w_low, w_high = wilson_interval(w_acc, w_drafted, dispersion=detector.phi)
            metrics.update(delta, detector, w_acc, w_drafted, (w_low, w_high))
            if log:
                log.write(json.dumps({"t": round(now - started, 3), "drafted": reading.drafted, "accepted": reading.accepted,
                                      "d_drafted": delta.drafted, "d_accepted": delta.accepted,
                                      "restarted": delta.restarted, "step": stepped, "statistic": detector.statistic,
                                      "steps": detector.steps}) + "\n")
                log.flush()
            if detector.alarm:
                evidence = _evidence(args, ref, detector, labels, (w_acc, w_drafted, w_low, w_high), now - started)
                print(_alarm_line(evidence), flush=True)
                _hooks(args, evidence)
                return ALARM_EXIT
    finally:
        if log:
            log.close()
        metrics.stop()
    print(f"decodegate: no alarm in {args.max_duration:g} s ({detector.steps} detector steps, "
          f"statistic {detector.statistic:.3f} < h {detector.h:.3f})", flush=True)
    return 0


def _evidence(args, ref, det, labels, window, elapsed) -> dict:
    w_acc, w_drafted, w_low, w_high = window
    return {"engine": args.engine, "labels": labels, "reference": ref.source, "candidate": ref.candidate,
            "reference_ratio": ref.ratio, "reference_interval": [ref.low, ref.high], "boundary": det.p0,
            "statistic": det.statistic, "threshold": det.h, "k": det.k, "dispersion": det.phi,
            "arl_hours": args.arl_hours, "steps": det.steps, "drafted_since_statistic_rose": det.drafted_since_reset,
            "window_seconds": args.window, "window_accepted": w_acc, "window_drafted": w_drafted,
            "window_ratio": (w_acc / w_drafted) if w_drafted else None, "window_interval": [w_low, w_high],
            "watched_seconds": round(elapsed, 3)}


def _alarm_line(e: dict) -> str:
    window = (f"window {e['window_ratio']:.3f} [{e['window_interval'][0]:.3f}, {e['window_interval'][1]:.3f}] over "
              f"{e['window_drafted']:.0f} drafted tokens in {e['window_seconds']:g} s" if e["window_drafted"] else "window empty")
    return (f"decodegate: ALARM {e['engine']} {e['candidate']}: acceptance below the reference "
            f"{e['reference_ratio']:.3f} [{e['reference_interval'][0]:.3f}, {e['reference_interval'][1]:.3f}] "
            f"(boundary {e['boundary']:.3f}): CUSUM {e['statistic']:.2f} >= h {e['threshold']:.2f} (ARL "
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
