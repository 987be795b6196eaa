"""Export a run's verdict as the team's own monitoring reads it: Prometheus alerting rules and a
Grafana dashboard whose thresholds come from the acceptance the run measured, not from a guess.

Writes into --out:
- decodegate-rules.yml: a recording rule for the engine's accepted/drafted ratio over 10 minutes;
  `SpecDecodeAcceptanceBelowReference` (warning) when that ratio stays 3 standard errors below the
  boundary (the run's lower bound less --tolerance, standard errors from the drafted tokens and
  the run's overdispersion) for 15 minutes; `SpecDecodeAcceptanceAlarm` (critical) while
  `decodegate watch` alarms (either kind); `SpecDecodeStoppedDrafting` (warning) when the engine
  generates without drafting, its spec-decode series flat or gone (`unless`, so a relaunch without
  speculation, which exports none, still fires it); `SpecDecodeEngineSeriesAbsent` and
  `DecodegateWatchAbsent` (warning) when the engine's generated-token series or watch's
  decodegate_alarm are gone for 10 minutes (the alerts above read them, and an empty series never
  fires). Check it with `promtool check rules decodegate-rules.yml`.
- decodegate-dashboard.json: a Grafana dashboard (templated $engine): acceptance per engine with
  the reference band, acceptance per label (watch's window), accepted tokens per draft, latency,
  and the detector's statistic against its threshold.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RULES, DASHBOARD = "decodegate-rules.yml", "decodegate-dashboard.json"
RATE_WINDOW = "10m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run folder of `decodegate regress` (or mlflow:RUN_ID)")
    p.add_argument("--out", required=True, help="folder for decodegate-rules.yml and decodegate-dashboard.json")
    p.add_argument("--candidate", help="the run's candidate (default: the only one that drafted)")
    p.add_argument("--tolerance", type=float, default=None, help="relative slack under the lower bound (default 0.05)")
    p.add_argument("--temperature", type=float, default=None,
                   help="the temperature the watched traffic runs at: the reference is the run's requests at it "
                        "(needed when the run drafted at several)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI for an mlflow:RUN_ID run")


def run(args) -> int:
    import yaml
    from harness.verdict import live_reference
    from harness.verdict.acceptance_ref import DEFAULT_TOLERANCE
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    if not 0 <= tolerance < 1:
        raise live_reference.LiveReferenceError(f"--tolerance must lie in [0, 1), got {tolerance!r}")
    ref = live_reference.load(args.run_dir, args.candidate, tracking_uri=args.tracking_uri,
                              temperature=args.temperature)
    ref.metric_prefix  # noqa: B018 - refuses an engine without verified metric names before anything is written
    p0 = ref.monitored_boundary(tolerance)  # a boundary of 0: an alert that can never fire, refused
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise live_reference.LiveReferenceError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / RULES).write_text(yaml.safe_dump(rules(ref, p0), sort_keys=False, width=120))
    (out / DASHBOARD).write_text(json.dumps(dashboard(ref, p0), indent=2))
    print(f"decodegate: wrote {out / RULES} and {out / DASHBOARD} ({ref.candidate}: accepted/drafted {ref.ratio:.3f} "
          f"[{ref.low:.3f}, {ref.high:.3f}], alert boundary {p0:.3f})")
    return 0


def engine_series(prefix: str) -> dict:
    """The engine's own metric names (llama.cpp's `llamacpp:`, vLLM's `vllm:`)."""
    names = {"drafted": f"{prefix}:spec_decode_num_draft_tokens_total",
             "accepted": f"{prefix}:spec_decode_num_accepted_tokens_total",
             "drafts": f"{prefix}:spec_decode_num_drafts_total"}
    if prefix == "llamacpp":
        names["generated"] = "llamacpp:tokens_predicted_total"
        names["generated_seconds"] = "llamacpp:tokens_predicted_seconds_total"
    else:
        names["generated"] = f"{prefix}:generation_tokens_total"
        names["latency_bucket"] = f"{prefix}:e2e_request_latency_seconds_bucket"
    return names


def _ratio(m: dict, window: str, selector: str = "") -> str:
    return (f"sum by (instance) (rate({m['accepted']}{selector}[{window}])) / "
            f"sum by (instance) (rate({m['drafted']}{selector}[{window}]))")


def rules(ref, p0: float) -> dict:
    m = engine_series(ref.metric_prefix)
    record = f"decodegate:spec_decode_acceptance:ratio_rate{RATE_WINDOW}"
    labels = {**ref.labels, "optimization": ref.candidate}
    where = (f"the reference run {ref.source} ({ref.candidate}) accepted {ref.accepted} of {ref.drafted} drafted tokens: "
             f"{ref.ratio:.3f}, {ref.level:.0%} interval [{ref.low:.3f}, {ref.high:.3f}]")
    act = ("Check what changed in the traffic (a new tenant, prompt template, target or draft). If acceptance stays "
           "low, switch this engine to standard decoding with your kill switch (decodegate never does), then rerun "
           "`decodegate regress` on the new traffic before turning speculation back on.")
    # 3 standard errors below p0 at the drafted tokens of the window (φ: the run's overdispersion).
    se = f"sqrt({ref.dispersion_upper:.4g} * {p0:.4g} * {1 - p0:.4g} / sum by (instance) (increase({m['drafted']}[{RATE_WINDOW}])))"
    return {"groups": [{"name": "decodegate-spec-decode-acceptance", "rules": [
        {"record": record, "expr": _ratio(m, RATE_WINDOW)},
        {"alert": "SpecDecodeAcceptanceBelowReference", "expr": f"{record} < {p0:.4g} - 3 * {se}", "for": "15m",
         "labels": {"severity": "warning", **labels},
         "annotations": {"summary": "Speculative decoding accepts fewer drafts on {{ $labels.instance }} than its verdict",
                         "description": f"Accepted/drafted over {RATE_WINDOW} is {{{{ $value | printf \"%.3f\" }}}}, "
                                        f"below the boundary {p0:.3f} for 15 minutes; {where}.",
                         "runbook": act}},
        {"alert": "SpecDecodeAcceptanceAlarm", "expr": f'max by (engine) (decodegate_alarm{{optimization="{ref.candidate}"}}) == 1',
         "labels": {"severity": "critical", **labels},
         "annotations": {"summary": "decodegate watch alarmed: acceptance dropped below the verdict on {{ $labels.engine }}",
                         "description": f"The CUSUM of `decodegate watch` crossed its threshold; {where}.",
                         "runbook": act}},
        {"alert": "SpecDecodeStoppedDrafting",
         # `unless`, not `and ... == 0`: an engine relaunched without speculation exports no
         # spec-decode series at all, and `and` with an empty right-hand side is empty.
         "expr": (f"(sum by (instance) (rate({m['generated']}[15m])) > 0) unless "
                  f"(sum by (instance) (rate({m['drafted']}[15m])) > 0)"), "for": "15m",
         "labels": {"severity": "warning", **labels},
         "annotations": {"summary": "{{ $labels.instance }} generates tokens but drafts none",
                         "description": "Speculation is off (its spec-decode series are gone) or finds nothing to draft: "
                                        "the speedup the verdict measured is gone (no acceptance to watch).",
                         "runbook": "Check the engine's launch flags (--spec-type, the draft model) against the verdict's."}},
        # The alerts above read series; with the series gone they are empty, and empty never fires.
        {"alert": "SpecDecodeEngineSeriesAbsent", "expr": f"absent({m['generated']})", "for": "10m",
         "labels": {"severity": "warning", **labels},
         "annotations": {"summary": f"No {m['generated']} series: the engine is down, not scraped, or renamed its metrics",
                         "description": "Every spec-decode alert of decodegate reads the engine's counters; without "
                                        "them none of them can fire.",
                         "runbook": "Check the engine is up and in Prometheus's targets, and its metric names "
                                    "against this file's."}},
        {"alert": "DecodegateWatchAbsent", "expr": f'absent(decodegate_alarm{{optimization="{ref.candidate}"}})',
         "for": "10m", "labels": {"severity": "warning", **labels},
         "annotations": {"summary": "decodegate watch is not running or not scraped",
                         "description": "SpecDecodeAcceptanceAlarm reads decodegate_alarm from `decodegate watch`; "
                                        "with watch gone (stopped, crashed, or its /metrics not scraped) it cannot fire.",
                         "runbook": "Restart `decodegate watch` (it exits 2 with one line saying why it stopped) "
                                    "and check Prometheus scrapes its --listen address."}},
    ]}]}


def _panel(pid: int, title: str, targets: list[tuple[str, str]], *, y: int, unit: str = "percentunit",
           description: str = "", thresholds: list | None = None, overrides: list | None = None) -> dict:
    field = {"unit": unit, "custom": {"fillOpacity": 0}}
    if thresholds:
        field["thresholds"] = {"mode": "absolute", "steps": thresholds}
        field["custom"]["thresholdsStyle"] = {"mode": "line+area"}
    return {"id": pid, "type": "timeseries", "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * ((pid - 1) % 2), "y": y},
            "fieldConfig": {"defaults": field, "overrides": overrides or []},
            "targets": [{"refId": chr(65 + i), "expr": expr, "legendFormat": legend}
                        for i, (expr, legend) in enumerate(targets)]}


def dashboard(ref, p0: float) -> dict:
    m = engine_series(ref.metric_prefix)
    sel = '{instance=~"$engine"}'
    mine = f'{{optimization="{ref.candidate}"}}'
    band = [{"matcher": {"id": "byName", "options": "reference lower"},
             "properties": [{"id": "custom.fillBelowTo", "value": "reference upper"}, {"id": "custom.fillOpacity", "value": 15}]}]
    if "latency_bucket" in m:
        latency = (f"histogram_quantile(0.95, sum by (le, instance) (rate({m['latency_bucket']}{sel}[5m])))",
                   "p95 request latency {{instance}}", "s", "p95 end-to-end request latency")
    else:
        latency = (f"sum by (instance) (rate({m['generated_seconds']}{sel}[5m])) / "
                   f"sum by (instance) (rate({m['generated']}{sel}[5m]))", "{{instance}}", "s",
                   "Mean seconds per generated token (llama.cpp exports no latency histogram, so no p95 here: "
                   "take p95 from your gateway or `decodegate regress --profile load`)")
    panels = [
        _panel(1, "Draft acceptance per engine (accepted/drafted) with the verdict's band",
               [(_ratio(m, "$__rate_interval", sel), "{{instance}}"),
                (f"max(decodegate_reference_acceptance_lower_ratio{mine})", "reference lower"),
                (f"max(decodegate_reference_acceptance_upper_ratio{mine})", "reference upper")], y=0,
               description=f"Reference {ref.ratio:.3f} [{ref.low:.3f}, {ref.high:.3f}] from {ref.source}; red below "
                           f"the boundary {p0:.3f}.",
               thresholds=[{"color": "red", "value": None}, {"color": "green", "value": round(p0, 4)}], overrides=band),
        _panel(2, "Acceptance per label (decodegate watch's window)",
               [("decodegate_window_acceptance_ratio", "{{optimization}} {{engine}} {{team}}"),
                ("decodegate_window_acceptance_lower_ratio", "lower {{optimization}} {{engine}}")], y=0),
        _panel(3, "Accepted tokens per draft (mean accepted length)",
               [(f"sum by (instance) (rate({m['accepted']}{sel}[$__rate_interval])) / "
                 f"sum by (instance) (rate({m['drafts']}{sel}[$__rate_interval]))", "{{instance}}")], y=8, unit="none"),
        _panel(4, latency[3], [(latency[0], latency[1])], y=8, unit=latency[2], description=latency[3]),
        _panel(5, "Drift detector: CUSUM statistic against its threshold",
               [(f"decodegate_cusum_statistic{mine}", "statistic {{engine}}"),
                (f"decodegate_cusum_threshold{mine}", "threshold {{engine}}"),
                (f"decodegate_alarm{mine}", "alarm {{engine}}")], y=16, unit="none"),
    ]
    return {"title": f"decodegate: speculative decoding, {ref.candidate}", "uid": f"decodegate-{ref.candidate}"[:40],
            "tags": ["decodegate", "speculative-decoding"], "schemaVersion": 39, "version": 1, "editable": True,
            "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
            "templating": {"list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {"name": "engine", "type": "query", "label": "engine", "includeAll": True, "multi": True,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"}, "refresh": 2,
                 "definition": f"label_values({m['drafted']}, instance)",
                 "query": {"query": f"label_values({m['drafted']}, instance)", "refId": "engine"},
                 "current": {"text": "All", "value": "$__all"}}]},
            "panels": panels}
