"""MLflow views of a regress run: what a reviewer opens instead of downloading records.jsonl.

One of the two tracking modules that import mlflow (with harness.run.tracking). MLflow 3's own
objects, each for what it was made for (harness.run.review builds the rows, without mlflow):
- the experiment kind tag (`mlflow.experimentKind` = "custom_model_development", "Machine
  learning") and a description (`mlflow.note.content`, rendered as Markdown) saying where
  everything is. MLflow 3.17's UI lands on the workflow its sidebar switch holds (GenAI, a traces
  overview, by default) whatever the kind; `review_url` adds `workflowType=machine_learning`, the
  UI's own parameter, so the link opens the runs view;
- a table per run (`MlflowClient.log_table`, `prompts.json`): the parent holds the baseline's
  generations, each candidate run one row per prompt pair; the artifact view renders it;
- a trace per generation (`MlflowClient.start_trace` / `start_span`), linked to its run: a span
  for the prompt, one per draft/verify round (proposed, accepted) or per exit check (the layer
  that answered), the request's labels as attributes. Baseline and candidate traces share their
  inputs, so the run's Traces tab (MLflow's evaluation view, "compare to") lines them up;
- assessments on them (`mlflow.log_feedback`): identity, divergence class, first divergent token, grade.
At most `trace_limit` traces per decoder, divergent prompts first; with `log_text = false` no
prompt or generated text goes anywhere (rows, traces and descriptions keep the numbers only).
"""
from __future__ import annotations

import contextlib
import time

from harness.run import review

KIND_TAG = "mlflow.experimentKind"
# "custom_model_development": the experiment is about runs (the regress parents and their
# candidates), not a GenAI app's traces.
KIND = "custom_model_development"
NOTE = "mlflow.note.content"
TABLE = "prompts.json"
MAX_SPANS = 64          # round / exit-check spans per trace; the rest are counted on the decode span
NOTE_LIMIT = 7900       # MLflow caps a run tag at 8000 characters
SOURCE_ID = "decodegate"

EXPERIMENT_NOTE = """\
**decodegate regress runs** (in the sidebar, choose **Model training** to land on the runs).
Each row of the runs table is one `decodegate regress`: the parent
run (the baseline) carries the verdict, the gate table and the report in its description; its
candidates are folded under it, one run each.

- A candidate run's **description** lists the prompts where it diverged from the baseline, with
  both texts and the first divergence (token, the baseline's top-2 margin, near-tie / within-floor / real).
- **Artifacts → prompts.json**: every prompt pair (suite, item, category, both texts, identity,
  first divergence, both grades, latencies, α/τ or exit layers), rendered as a table.
- A candidate run's **Traces** tab is MLflow's evaluation view: pick the parent run in
  *compare to* and each prompt shows the baseline's and the candidate's output side by side,
  with assessments (identical, divergence, first_divergence_token, grade). Each trace has spans
  for the prompt and the draft/verify rounds or exit checks, the request's labels as attributes.
- `decodegate history` draws α, τ, speedup and identity per candidate and category over runs.
"""


def label_experiment(client, exp_id: str) -> None:
    """The experiment kind and its description, once (a reviewer may edit the description)."""
    exp = client.get_experiment(exp_id)
    if exp.tags.get(KIND_TAG) != KIND:
        client.set_experiment_tag(exp_id, KIND_TAG, KIND)
    if NOTE not in exp.tags:
        client.set_experiment_tag(exp_id, NOTE, EXPERIMENT_NOTE)


def note(text: str) -> str:
    return text if len(text) <= NOTE_LIMIT else text[:NOTE_LIMIT] + "\n\n…(cut: the whole report is report.md)"


@contextlib.contextmanager
def tracing_to(uri: str):
    """Traces and assessments go through MLflow's global tracking URI: point it at `uri` for the
    duration, and put back what was there (it also sets $MLFLOW_TRACKING_URI)."""
    import os
    import mlflow
    before_env = os.environ.get("MLFLOW_TRACKING_URI")
    before = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.flush_trace_async_logging()
        mlflow.set_tracking_uri(before)
        if before_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before_env


# What a reviewer reads first leads the table; the rest follow in row order.
FIRST = ("suite", "item_id", "category", "temperature", "seed", "divergence", "divergence_position",
         "divergence_margin", "divergence_context", "prompt", "baseline_text", "candidate_text", "text",
         "baseline_score", "candidate_score", "score")


def log_table(client, run_id: str, rows: list[dict]) -> None:
    """`prompts.json`, once per run (log_table appends to an existing file: a re-sync must not)."""
    if not rows or any(f.path == TABLE for f in client.list_artifacts(run_id)):
        return
    import pandas as pd
    columns = list(dict.fromkeys(k for r in rows for k in r))
    columns = [c for c in FIRST if c in columns] + [c for c in columns if c not in FIRST]
    client.log_table(run_id, data=pd.DataFrame(rows, columns=columns), artifact_file=TABLE)


def review_url(uri: str, exp_id: str, run_id: str | None = None, compare_to: str | None = None) -> str:
    """The UI page of the experiment's runs, or of a run's traces beside another run's. MLflow 3.17's
    UI opens an experiment in the workflow its sidebar switch last held (GenAI by default: a traces
    overview); the `workflowType` parameter makes it the runs view ("Model training")."""
    page = f"#/experiments/{exp_id}" + (f"/runs/{run_id}/traces" if run_id else "/runs")
    query = "workflowType=machine_learning" + (f"&compareToRunUuid={compare_to}" if compare_to else "")
    if not uri:
        return f"{page}?{query}"  # a link inside the UI (a run description)
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}?{query}"
    # A local store: the UI is `mlflow ui` on it, at that command's default address.
    return f"http://127.0.0.1:5000/{page}?{query} (after `mlflow ui --backend-store-uri {uri}`)"


def has_traces(client, exp_id: str, run_id: str) -> bool:
    return bool(client.search_traces(locations=[exp_id], run_id=run_id, max_results=1))


def _times(rec: dict, start_ns: int) -> list[int]:
    """Absolute end time of each new token (ns), from the record's per-token intervals."""
    t, out = start_ns, []
    for dt in (rec.get("timing") or {}).get("token_times_s") or []:
        t += int(dt * 1e9)
        out.append(t)
    return out


def _steps(rec: dict) -> list[tuple[str, str, dict, int, int]]:
    """(name, span type, attributes, first token, last token) of each draft/verify round or exit check."""
    st = rec.get("stats") or {}
    n = len(rec.get("tokens") or [])
    proposed, accepted = st.get("proposed_per_round") or [], st.get("accepted_per_round") or []
    if proposed and len(accepted) == len(proposed):
        offsets = st.get("round_offsets") or []
        if len(offsets) != len(proposed):  # no offsets: a round emits its accepted tokens and one more
            offsets, pos = [], 0
            for a in accepted:
                offsets.append(pos)
                pos += a + 1
        out = []
        for i, (p, a) in enumerate(zip(proposed, accepted)):
            lo = min(offsets[i], max(n - 1, 0))
            hi = min((offsets[i + 1] if i + 1 < len(offsets) else n) - 1, max(n - 1, 0))
            out.append((f"round {i + 1}", "DRAFT_VERIFY", {"proposed": p, "accepted": a, "emitted_from_token": lo},
                        lo, max(lo, hi)))
        return out
    layers = st.get("exit_layers") or []
    return [(f"token {i}", "EXIT_CHECK", {"exit_layer": int(layer), "num_layers": st.get("num_layers")}, i, i)
            for i, layer in enumerate(layers)]


class Pace:
    """Flushes MLflow's asynchronous trace queue before it can fill. Every ended span and trace is
    one task on that queue (1000 by default, `MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE`); a full
    queue drops them with only a warning, and the assessments logged afterwards then fail with
    "Trace ... not found" (`make decide`: ~300 traces of up to 67 spans each)."""

    def __init__(self):
        from mlflow.environment_variables import MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE
        self.budget = max(1, (MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE.get() or 1000) // 2)
        self.pending = 0

    def __call__(self) -> None:
        self.pending += 1
        if self.pending >= self.budget:
            import mlflow
            mlflow.flush_trace_async_logging()
            self.pending = 0


def log_trace(client, exp_id: str, run_id: str, rec: dict, row: dict, attributes: dict, log_text: bool,
              start_ns: int, pace=lambda: None) -> str:
    """One generation as a trace: root span (inputs, output, labels), prompt span, step spans;
    `pace` is called after each span and the trace end."""
    # The same inputs on the baseline's and the candidate's trace: the run comparison pairs on them.
    inputs = {"prompt": row["prompt"]} if log_text and row.get("prompt") is not None else {}
    inputs.update(suite=rec["suite"], item_id=rec["item_id"], temperature=rec["temperature"], seed=rec["seed"])
    timing = rec.get("timing") or {}
    wall_ns = int((timing.get("wall_s") or 0.0) * 1e9)
    ttft_ns = int((timing.get("ttft_s") or 0.0) * 1e9)
    end_ns = start_ns + max(wall_ns, 1)
    attrs = {**attributes, "decodegate.candidate": rec["candidate"], "decodegate.decoder": rec.get("decoder"),
             "decodegate.suite": rec["suite"], "decodegate.item_id": rec["item_id"],
             "decodegate.category": row.get("category"), "decodegate.temperature": rec["temperature"],
             "decodegate.seed": rec["seed"], "decodegate.tokens": len(rec.get("tokens") or []),
             "decodegate.finish_reason": rec.get("finish_reason"), "decodegate.wall_s": timing.get("wall_s"),
             "decodegate.ttft_s": timing.get("ttft_s")}
    for k in ("identical", "divergence", "divergence_position", "divergence_margin", "alpha", "tau",
              "mean_exit_layers"):
        if row.get(k) is not None:
            attrs[f"decodegate.{k}"] = row[k]
    attrs = {k: v for k, v in attrs.items() if v is not None}
    tags = {"decodegate.candidate": rec["candidate"], "decodegate.suite": rec["suite"],
            "decodegate.divergence": str(row.get("divergence", "baseline"))}
    root = client.start_trace(name=f"{rec['candidate']}: {rec['suite']}/{rec['item_id']}", span_type="LLM",
                              inputs=inputs, attributes=attrs, tags=tags, experiment_id=exp_id,
                              start_time_ns=start_ns, run_id=run_id)
    tid = root.trace_id
    prompt = client.start_span("prompt", tid, root.span_id, span_type="PARSER",
                               inputs={"prompt": row["prompt"]} if log_text and row.get("prompt") else None,
                               attributes={"suite": rec["suite"], "item_id": rec["item_id"],
                                           "category": row.get("category") or ""}, start_time_ns=start_ns)
    client.end_span(tid, prompt.span_id, end_time_ns=start_ns + ttft_ns)
    pace()
    steps = _steps(rec)
    decode = client.start_span("decode", tid, root.span_id, span_type="DECODE",
                               attributes={"tokens": len(rec.get("tokens") or []), "steps": len(steps),
                                           "steps_not_shown": max(0, len(steps) - MAX_SPANS),
                                           **{k: v for k, v in (rec.get("stats") or {}).items()
                                              if k in ("target_forwards", "draft_forwards", "proposed", "accepted",
                                                       "fallbacks", "drafter", "verifier", "k", "avg_layers")}},
                               start_time_ns=start_ns + ttft_ns)
    token_end = _times(rec, start_ns)
    for name, kind, a, lo, hi in steps[:MAX_SPANS]:
        t0 = token_end[lo - 1] if 0 < lo <= len(token_end) else start_ns + ttft_ns
        t1 = token_end[hi] if hi < len(token_end) else end_ns
        span = client.start_span(name, tid, decode.span_id, span_type=kind, attributes=a, start_time_ns=t0)
        client.end_span(tid, span.span_id, end_time_ns=max(t0, t1))
        pace()
    client.end_span(tid, decode.span_id, end_time_ns=end_ns)
    pace()
    outputs = {"text": rec.get("text", "")} if log_text else {"tokens": len(rec.get("tokens") or [])}
    client.end_trace(tid, outputs=outputs, end_time_ns=end_ns, status="ERROR" if rec.get("error") else "OK")
    pace()
    return tid


def assess(trace_id: str, row: dict, log_text: bool, candidate: bool) -> None:
    """Identity, divergence class and grade on a candidate's trace; the grade on a baseline's."""
    import mlflow
    from mlflow.entities import AssessmentSource
    source = AssessmentSource(source_type="CODE", source_id=SOURCE_ID)
    side = "candidate" if candidate else None
    score = row.get(f"{side}_score") if side else row.get("score")
    passed = row.get(f"{side}_passed") if side else row.get("passed")
    detail = row.get(f"{side}_grade_detail") if side else None
    if score is not None:
        mlflow.log_feedback(trace_id=trace_id, name="grade", value=float(score), source=source,
                            rationale=("passed" if passed else "failed") + (f": {detail}" if log_text and detail else ""))
    if not candidate:
        return
    if row.get("identical") is not None:
        mlflow.log_feedback(trace_id=trace_id, name="identical", value=bool(row["identical"]), source=source,
                            rationale="token-identical to the baseline" if row["identical"] else
                            f"first differs at token {row.get('divergence_position')}")
    margin = row.get("divergence_margin")
    if row.get("divergence_position") is not None:
        mlflow.log_feedback(trace_id=trace_id, name="first_divergence_token", value=int(row["divergence_position"]),
                            source=source, rationale=f"baseline top-2 margin there: "
                                                     f"{'unknown' if margin is None else format(margin, '.4g')}")
    why = {"identical": "same tokens as the baseline",
           "near-tie": "the baseline's top-2 margin there is below the near-tie epsilon",
           "within-floor": "the baseline's margin there is within the engine's own noise (its A/A run)",
           "real": "a divergence neither a near-tie nor the engine's own noise (A/A) explains",
           "differs": "outputs differ; no identity was required here (exact in distribution only)",
           "error": "a side errored"}.get(row.get("divergence"), "")
    where = "" if row.get("identical") else (f"token {row.get('divergence_position')}, baseline margin "
                                            f"{'unknown' if margin is None else format(margin, '.4g')}: ")
    mlflow.log_feedback(trace_id=trace_id, name="divergence", value=str(row.get("divergence")), source=source,
                        rationale=where + why)


def log_traces(client, exp_id: str, run_id: str, records_by_key: dict, rows: list[dict], attributes: dict,
               log_text: bool, candidate: bool, t0_ns: int) -> int:
    """A trace (and its assessments) per row. A run whose traces were all logged (its
    TRACES_DONE tag) is left alone; one whose upload stopped part way (traces without their
    assessments) has them deleted and logged again, so a later `sync` repairs it."""
    if not rows:
        return 0
    if has_traces(client, exp_id, run_id):
        if client.get_run(run_id).data.tags.get(TRACES_DONE) == "true":
            return 0
        _delete_traces(client, exp_id, run_id)
    import mlflow
    made = []
    t = t0_ns
    pace = Pace()
    for row in rows:
        rec = records_by_key.get(review.row_key(row))
        if rec is None:
            continue
        made.append((log_trace(client, exp_id, run_id, rec, row, attributes, log_text, t, pace), row))
        t += int(((rec.get("timing") or {}).get("wall_s") or 0.0) * 1e9) + 1_000_000
    mlflow.flush_trace_async_logging()  # the traces must be stored before assessments refer to them
    for tid, row in made:
        assess(tid, row, log_text, candidate)
    client.set_tag(run_id, TRACES_DONE, "true")
    return len(made)


TRACES_DONE = "decodegate.traces_complete"


def _delete_traces(client, exp_id: str, run_id: str) -> None:
    while True:
        found = client.search_traces(locations=[exp_id], run_id=run_id, max_results=100, include_spans=False)
        if not found:
            return
        client.delete_traces(exp_id, trace_ids=[t.info.trace_id for t in found])


def candidate_note(name: str, cand: dict, rows: list[dict], compare: str = "") -> str:
    """A candidate run's description: verdict, gates, and the prompts where it diverged."""
    lines = [f"### {name}: {cand['verdict'].upper()}", ""]
    if compare:
        lines += [f"Every prompt beside the baseline's, with assessments: [Traces, compared with the baseline run]"
                  f"({compare}).", ""]
    if cand.get("gates"):
        lines += ["| gate | status | detail |", "|---|---|---|"]
        lines += [f"| {review._cell(g['name'])} | {g['status'].upper()} | {review._cell(g['detail'])} |"
                  for g in cand["gates"]]
        lines.append("")
    lines += ["#### Prompts where the output diverged from the baseline", "", review.divergence_markdown(rows)]
    return note("\n".join(lines))


def start_ns(summary: dict) -> int:
    """Traces are placed at the run's creation time (records keep durations, not clock times)."""
    import calendar
    created = summary.get("created")
    t = calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")) if created else time.time()
    return int(t * 1e9)


def log_candidate(client, exp_id: str, run_id: str, parent_id: str, name: str, cand: dict, rows: list[dict],
                  records: list[dict], attributes: dict, trace_limit: int, log_text: bool, t0: int) -> int:
    """A candidate run's table, description, traces and assessments; the number of traces."""
    log_table(client, run_id, rows)
    compare = review_url("", exp_id, run_id, parent_id) if trace_limit else ""
    client.set_tag(run_id, NOTE, candidate_note(name, cand, rows, compare))
    by_key = {review.row_key(r): r for r in records if r["candidate"] == name}
    return log_traces(client, exp_id, run_id, by_key, review.for_traces(rows, trace_limit), attributes,
                      log_text, True, t0)


def baseline_keys(rows_by_cand: dict, trace_limit: int) -> list:
    """The baseline generations to trace: those of the candidates' traced pairs, up to the limit."""
    keys = [review.row_key(r) for rows in rows_by_cand.values() for r in review.for_traces(rows, trace_limit)]
    return list(dict.fromkeys(keys))[:max(0, trace_limit)]


def log_baseline(client, exp_id: str, parent_id: str, name: str, rows: list[dict], records: list[dict], keys: list,
                 attributes: dict, log_text: bool, t0: int) -> int:
    """The parent run's table of baseline generations, and traces of those the candidates' traces pair with."""
    log_table(client, parent_id, rows)
    index = {review.row_key(r): r for r in rows}
    by_key = {review.row_key(r): r for r in records if r["candidate"] == name}
    return log_traces(client, exp_id, parent_id, by_key, [index[k] for k in keys if k in index], attributes,
                      log_text, False, t0)


def category_metrics(rows: list[dict]) -> dict:
    """`category.<name>.<quantity>` metrics of one candidate run (for `decodegate history`)."""
    out = {}
    for cat, m in review.category_metrics(rows).items():
        for k, v in m.items():
            out[f"category.{cat}.{k}"] = v
    return out

