"""MLflow logging: with harness.run.tracking_views (the review views: tables, traces,
assessments, descriptions), the only modules that import mlflow.

The run folder is the source of truth; MLflow holds a copy. One parent run per regress, one child
run per candidate. Every MLflow run carries the tag `decodegate.run_uid` (the run folder's id plus
the candidate), so `decodegate sync` can upload a folder again and never duplicate a run.

A tracking server that is down must not cost the results: its health is checked first with a short
timeout (MLflow's own client retries for minutes per call), and on failure the caller keeps the
folder and warns. The embedded default is MLflow 3's own: `sqlite:///mlflow.db` in the working dir.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from harness.run.records import acceptance_rows, read_records
from harness.run.tracking_uri import DEFAULT_URI, TrackingUnavailable, check_health, resolve_uri  # noqa: F401

EXPERIMENT = "decodegate-regress"
STATE = "tracking.json"


def _client(uri: str):
    # Fail fast instead of MLflow's default minutes of retries once health has passed.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    import warnings
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="sqlalchemy")
    from mlflow import MlflowClient
    return MlflowClient(tracking_uri=uri)


class ExperimentDeleted(TrackingUnavailable):
    """The experiment is in MLflow's trash: no run can be created in it, and a new one of the same
    name cannot be made until it is restored or purged. The user's call, not ours."""


def active_experiment(client, name: str, uri: str):
    """The experiment called `name`, None if there is none; ExperimentDeleted if it is deleted."""
    exp = client.get_experiment_by_name(name)
    if exp is not None and exp.lifecycle_stage == "deleted":
        raise ExperimentDeleted(
            f"experiment {name!r} (id {exp.experiment_id}) at {uri} is deleted: restore it "
            f"(`mlflow experiments restore -x {exp.experiment_id}`) or remove it for good (`mlflow gc "
            f"--experiment-ids {exp.experiment_id}`)")
    return exp


def _experiment_id(client, uri: str) -> str:
    exp = active_experiment(client, EXPERIMENT, uri)
    return exp.experiment_id if exp else client.create_experiment(EXPERIMENT)


def _existing(client, exp_id: str, uid: str):
    runs = client.search_runs([exp_id], filter_string=f"tags.`decodegate.run_uid` = '{uid}'", max_results=1)
    return runs[0] if runs else None


def _flat(prefix: str, value, out: dict) -> None:
    if isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)


def _metric_name(name: str) -> str:
    # MLflow allows alphanumerics, _ - . space / only.
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)[:250]


def _log(client, run_id: str, params: dict, metrics: dict, tags: dict, logged: dict | None = None) -> None:
    """`logged`: the metrics the run already holds (an upload cut part way, now synced again): those
    with the same value are not logged twice (each would add a second point to the metric's history)."""
    from mlflow.entities import Metric, Param, RunTag
    import time
    now = int(time.time() * 1000)
    logged = logged or {}
    ms = [Metric(_metric_name(k), float(v), now, 0) for k, v in metrics.items()
          if logged.get(_metric_name(k)) != float(v)]
    ps = [Param(_metric_name(k), str(v)[:6000]) for k, v in params.items()]
    ts = [RunTag(_metric_name(k), str(v)[:5000]) for k, v in tags.items()]
    # MLflow caps one batch at 1000 metrics, 100 params and 100 tags.
    for i in range(0, len(ps), 100):
        client.log_batch(run_id, params=ps[i:i + 100])
    for i in range(0, len(ts), 100):
        client.log_batch(run_id, tags=ts[i:i + 100])
    for i in range(0, len(ms), 1000):
        client.log_batch(run_id, metrics=ms[i:i + 1000])


DEFAULT_TRACE_LIMIT = 100  # traces per decoder and run, when summary.json predates trace_limit


@dataclass(frozen=True)
class _Upload:
    """What every part of one folder's upload reads."""
    client: object
    exp_id: str
    run_dir: Path
    summary: dict
    records: list
    rows: dict          # candidate -> its review rows (harness.run.review.pair_rows)
    prompt_text: dict
    log_text: bool
    trace_limit: int
    t0: int             # the regress run's start, ns
    started: int        # the same, ms: MLflow runs start when the regress run did


def log_run(run_dir: Path, uri: str | None = None) -> dict:
    """Upload a finished run folder (summary.json, records, figures, the review views of
    harness.run.tracking_views). Idempotent. Returns the MLflow run ids, also written to the
    folder's tracking.json."""
    from harness.run import review, tracking_views as views
    run_dir = Path(run_dir)
    uri = resolve_uri(uri)
    check_health(uri)
    from harness.run.records import read_summary
    summary = read_summary(run_dir)
    client = _client(uri)
    exp_id = _experiment_id(client, uri)
    views.label_experiment(client, exp_id)
    uid = summary["run_uid"]
    log_text = summary.get("log_text", True)
    records = read_records(run_dir)
    prompt_text = review.prompts(run_dir, summary) if log_text else {}
    rows = {name: review.pair_rows(records, summary, name, prompt_text, log_text) for name in summary["candidates"]}
    t0 = views.start_ns(summary)
    # Runs start when the regress run did, not when they were uploaded: a folder synced days later
    # must not become the newest run (`history`'s order and the fingerprint it compares with).
    up = _Upload(client, exp_id, run_dir, summary, records, rows, prompt_text, log_text,
                 summary.get("trace_limit", DEFAULT_TRACE_LIMIT), t0, t0 // 1_000_000)
    parent = _existing(client, exp_id, uid)
    ids = {}
    with views.tracing_to(uri):
        if parent is None or parent.info.status != "FINISHED":
            parent_id = ids["parent"] = _log_parent(up, parent)
        else:
            parent_id = ids["parent"] = parent.info.run_id
        for name, cand in summary["candidates"].items():
            ids[name] = _log_candidate(up, parent_id, name, cand)
    client.set_terminated(parent_id, "FINISHED")
    (run_dir / STATE).write_text(json.dumps({"uri": uri, "runs": ids,
                                             "review_url": views.review_url(uri, exp_id)}, indent=2))
    return ids


def _log_parent(up: _Upload, parent) -> str:
    """The regress run's parent run (created, or the unfinished one completed): its params,
    verdict, note, files, figures and the baseline's review views. Returns its id."""
    from harness.run import review, tracking_views as views
    client, summary, run_dir = up.client, up.summary, up.run_dir
    parent_id = parent.info.run_id if parent else client.create_run(
        up.exp_id, run_name=f"regress {summary['profile']} {summary['target']}", start_time=up.started,
        tags={"decodegate.run_uid": summary["run_uid"]}).info.run_id
    _log(client, parent_id, params=summary_params(summary),
         metrics={"verdict_pass": summary["verdict"] == "pass"},
         tags={"decodegate.verdict": summary["verdict"], "optimization": "baseline",
               **{f"label.{k}": v for k, v in summary.get("labels", {}).items()}},
         logged=parent.data.metrics if parent else None)
    report_md = run_dir / "report.md"
    client.set_tag(parent_id, views.NOTE, views.note(
        report_md.read_text() if report_md.exists() else f"verdict: **{summary['verdict'].upper()}**"))
    # log_text = false: records.jsonl (the only file holding generated text) stays in the folder.
    text = ("records.jsonl",) if up.log_text else ()
    for name in ("summary.json", *text, "per_prompt.csv", "report.txt", "report.md"):
        if (run_dir / name).exists():
            client.log_artifact(parent_id, str(run_dir / name))
    store = run_dir / "baseline_store"
    if store.is_dir() and up.log_text:  # `--baseline-store mlflow:<run id>` reads it back
        client.log_artifacts(parent_id, str(store), artifact_path="baseline_store")
    for fig in ("sweep.png", "load.png"):  # speedup against concurrency; speedup and goodput against rate
        if (run_dir / "figures" / fig).exists():
            client.log_artifact(parent_id, str(run_dir / "figures" / fig), artifact_path="figures")
    base_attrs = {"optimization": "baseline",
                  **{f"label.{k}": v for k, v in (summary.get("labels") or {}).items()}}
    views.log_baseline(client, up.exp_id, parent_id, summary["baseline"],
                       review.baseline_rows(up.records, summary["baseline"], up.prompt_text, up.log_text),
                       up.records, views.baseline_keys(up.rows, up.trace_limit), base_attrs, up.log_text, up.t0)
    return parent_id


def _log_candidate(up: _Upload, parent_id: str, name: str, cand: dict) -> str:
    """One candidate's child run (skipped if already finished): params, metrics, tags, figures,
    acceptance rows and its review views. Returns its id."""
    from harness.run import tracking_views as views
    client = up.client
    cuid = f"{up.summary['run_uid']}/{name}"
    child = _existing(client, up.exp_id, cuid)
    if child is not None and child.info.status == "FINISHED":
        return child.info.run_id
    run_id = child.info.run_id if child else client.create_run(
        up.exp_id, run_name=name, start_time=up.started,
        tags={"decodegate.run_uid": cuid, "mlflow.parentRunId": parent_id}).info.run_id
    metrics: dict = {}
    _flat("", cand.get("metrics", {}), metrics)
    metrics["verdict_pass"] = float(cand["verdict"] == "pass")
    metrics.update(views.category_metrics(up.rows[name]))
    tags = {**candidate_tags(cand, up.summary), "decodegate.candidate": name}
    _log(client, run_id, params={"decoder": cand["decoder"], "kind": cand["kind"], "target": cand["target"],
                                 **{f"option.{k}": v for k, v in cand.get("options", {}).items()}},
         metrics=metrics, tags={**tags, **fingerprint_tags(up.summary, name)},
         logged=child.data.metrics if child else None)
    figures = up.run_dir / "figures" / name
    if figures.is_dir():
        client.log_artifacts(run_id, str(figures), artifact_path="figures")
    _log_acceptance_rows(client, run_id, up.run_dir, name, cand, up.summary)
    views.log_candidate(client, up.exp_id, run_id, parent_id, name, cand, up.rows[name], up.records, tags,
                        up.trace_limit, up.log_text, up.t0)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def fingerprint_tags(summary: dict, name: str) -> dict:
    """What the candidate and its baseline ran on, by content: `decodegate history` marks runs
    whose target changed (a new tokenizer or fine-tune under the same name)."""
    fps = summary.get("fingerprints") or {}
    out = {}
    cand = (fps.get(name) or {}).get("target_fingerprint")
    base = (fps.get(summary["baseline"]) or {}).get("target_fingerprint")
    if cand:
        out["decodegate.target_fingerprint"] = cand
    if base:
        out["decodegate.baseline_fingerprint"] = base
    return out


def summary_params(summary: dict) -> dict:
    params = {"target": summary["target"], "profile": summary["profile"], "baseline": summary["baseline"],
              "seeds": summary.get("seeds"), "temperatures": summary.get("temperatures"),
              "code_version": summary.get("code_version")}
    st = summary.get("baseline_store")
    if st:
        params["baseline.reused_rows"] = st["reused_rows"]
        params["baseline.rows"] = st["baseline_rows"]
        params["baseline.store"] = st["store"]
    for name, fp in (summary.get("fingerprints") or {}).items():
        for k, v in fp.items():
            params[f"fingerprint.{name}.{k.replace('_fingerprint', '')}"] = v
    for s, info in summary.get("suites", {}).items():
        params[f"suite.{s}.version"] = info.get("version")
        params[f"suite.{s}.hash"] = info.get("hash")
    return params


def candidate_tags(cand: dict, summary: dict) -> dict:
    opts = cand.get("options", {})
    tags = {"optimization": cand["decoder"], "decodegate.kind": cand["kind"], "decodegate.verdict": cand["verdict"],
            "decodegate.target": cand["target"]}
    if cand.get("acceptance_suites_key"):
        tags["decodegate.suites_key"] = cand["acceptance_suites_key"]
    if "draft" in opts:
        tags["drafter"] = opts["draft"]
    if "verify" in opts:
        tags["verifier"] = opts["verify"]
    if "threshold" in opts:
        tags["exit_threshold"] = opts["threshold"]
    engine = cand.get("engine")
    if engine:  # exactly what was compared: the engine, its version and its launch flags
        tags["engine"] = engine.get("engine") or cand["decoder"]
        tags["engine.name"] = engine.get("name", "")
        tags["engine.version"] = engine.get("version", "unknown")
        tags["engine.launch"] = " ".join(engine["launch"]) if engine.get("launch") else engine.get("base_url", "")
        tags["engine.models"] = ",".join(map(str, engine.get("models") or []))
    if cand.get("compare_on") == "text":
        tags["decodegate.compare_on"] = "text"
    for k, v in {**summary.get("labels", {}), **cand.get("labels", {})}.items():
        tags[f"label.{k}"] = v
    return tags


def _new_run(uri: str | None, experiment: str, name: str):
    """(client, run id) of a fresh run in `experiment` (created on first use), after a health check."""
    uri = resolve_uri(uri)
    check_health(uri)
    client = _client(uri)
    exp = active_experiment(client, experiment, uri)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    return client, client.create_run(exp_id, run_name=name).info.run_id


def log_bench(result: dict, uri: str | None = None) -> str:
    """One MLflow run per bench invocation, with a metric per decoder and temperature."""
    client, run_id = _new_run(uri, "decodegate-bench", f"bench {result['target']}")
    metrics: dict = {}
    _flat("", {label: {k: v for k, v in e.items() if k not in ("options", "decoder")}
               for label, e in result["decoders"].items()}, metrics)
    _flat("roofline", result["roofline"], metrics)
    _log(client, run_id, params={"target": result["target"], "k": result["k"],
                                 "max_new_tokens": result["max_new_tokens"]}, metrics=metrics, tags={"decodegate.kind": "bench"})
    client.set_terminated(run_id, "FINISHED")
    return run_id


def log_frontier(result: dict, run_dir: Path, figures=(), uri: str | None = None) -> str:
    """One MLflow run per early-exit frontier sweep (`decodegate exit-frontier`): a metric per
    point, frontier.json / frontier.txt and the Pareto figure as artifacts."""
    client, run_id = _new_run(uri, "decodegate-exit-frontier", f"exit frontier {result['target']}")
    metrics: dict = {}
    _flat("", {p["name"]: {k: v for k, v in p.items() if k not in ("options", "name", "series")}
               for p in result["points"]}, metrics)
    _log(client, run_id, params={"target": result["target"], "subset": result["subset"],
                                 "suites": ",".join(result["suites"])},
         metrics=metrics, tags={"decodegate.kind": "exit-frontier"})
    for path in [Path(run_dir) / "frontier.json", Path(run_dir) / "frontier.txt", *map(Path, figures)]:
        if path.exists():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, "FINISHED")
    return run_id


# ------------------------------------------------------------------ acceptance references

ACCEPTANCE_ARTIFACT = "acceptance/acceptance_rows.json"


def _log_acceptance_rows(client, run_id: str, run_dir: Path, name: str, cand: dict, summary: dict) -> None:
    """A speculative candidate's per-record acceptance counters (no text), so that a later run can
    use this one as `acceptance_reference = "mlflow:last"`."""
    if not cand.get("acceptance_suites_key"):
        return
    rows = acceptance_rows(read_records(run_dir), name)
    if not any((r.get("stats") or {}).get("proposed_per_round") for r in rows):
        return
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(ACCEPTANCE_ARTIFACT).name
        path.write_text(json.dumps({"target": cand["target"], "rows": rows,
                                    "suite_hashes": {k: v.get("hash") for k, v in summary.get("suites", {}).items()}}))
        client.log_artifact(run_id, str(path), artifact_path=str(Path(ACCEPTANCE_ARTIFACT).parent))


def last_passing_reference(uri: str | None, candidate: str, target: str, suites_key: str) -> dict | None:
    """The newest passing MLflow run of `candidate` on `target` with the suite versions
    `suites_key` (harness.verdict.acceptance_ref.suites_key), as a Reference's fields; None if none."""
    import tempfile
    uri = resolve_uri(uri)
    check_health(uri)
    client = _client(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return None
    filt = (f"tags.`decodegate.candidate` = '{candidate}' and tags.`decodegate.verdict` = 'pass' and "
            f"tags.`decodegate.target` = '{target}' and tags.`decodegate.suites_key` = '{suites_key}'")
    for run in client.search_runs([exp.experiment_id], filter_string=filt, order_by=["attributes.start_time DESC"],
                                  max_results=20):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                local = client.download_artifacts(run.info.run_id, ACCEPTANCE_ARTIFACT, tmp)
            except Exception:  # noqa: BLE001 - a run without the artifact (older, or not speculative)
                continue
            data = json.loads(Path(local).read_text())
        return {"source": f"mlflow:{run.info.run_id}", "target": data["target"],
                "suite_hashes": data["suite_hashes"], "rows": data["rows"]}
    return None
