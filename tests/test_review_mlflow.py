"""A regress run as a reviewer and CI see it, against a real `mlflow server` started per test on a
free port: the experiment kind, parent and child runs with Markdown descriptions, the per-prompt
table, traces with spans and attributes, assessments; `log_text = false` keeps every text out;
`trace_limit` caps the traces; JUnit XML and the Markdown job summary; `decodegate history`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from decoders import GenerationRequest, make_decoder
from harness.cli import main
from harness.models import load_model
from helpers import free_port

PROMPTS = ["Item 0: tell me about cats", "Item 1: describe a river", "Item 2: count the stars",
           "Item 3: how to bake bread", "Item 4: a song about trains", "Item 5: where maps fail"]
CATEGORIES = ["facts", "chat"]


@pytest.fixture(scope="module")
def small_suite(tmp_path_factory):
    """Six prompts in two categories; each reference is the tiny baseline's own greedy output."""
    target = load_model("tiny-llama")
    dec = make_decoder("standard", target)
    rows = [{"suite": "mini", "version": "1", "description": "tiny-model suite for the review tests",
             "smoke": [f"m{i}" for i in range(len(PROMPTS))],
             "defaults": {"grader": "contains", "max_new_tokens": 10, "stop": []}}]
    for i, prompt in enumerate(PROMPTS):
        text = dec.generate(GenerationRequest(tuple(target.encode(prompt)), max_new_tokens=10,
                                              stop_token_ids=target.stop_token_ids())).text
        rows.append({"id": f"m{i}", "prompt": prompt, "references": [" ".join(text.split()) or "\u0000never"],
                     "grader_options": {"case_sensitive": True}, "categories": [CATEGORIES[i % 2]]})
    path = tmp_path_factory.mktemp("suite") / "mini.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


CANDIDATES = """
[[candidates]]
name = "spec"
decoder = "speculative"
options = { draft = "tiny-llama", k = 3, verify = "coupled" }
[[candidates]]
name = "ee-0"
decoder = "early-exit"
kind = "lossy"
options = { threshold = 0.0 }
"""


def write_config(tmp_path: Path, suite: Path, *, top: str = "", target: str = "tiny-llama",
                 candidates: str = CANDIDATES) -> Path:
    cfg = tmp_path / "regress.toml"
    cfg.write_text(f"""
target = "{target}"
{top}
[labels]
team = "review-tests"
[baseline]
name = "baseline"
decoder = "standard"
{candidates}
[suites.mini]
margin = 0.2
path = "{suite}"
[profiles.smoke]
subset = "smoke"
suites = ["mini"]
temperatures = [0.0]
seeds = [0]
""")
    return cfg


def regress(cfg: Path, run_dir: Path, uri: str, *extra) -> int:
    return main(["regress", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress",
                 "--tracking-uri", uri, *extra])


# ------------------------------------------------------------------ the REST API, raw

def get(uri: str, route: str, **params):
    with urllib.request.urlopen(f"{uri}{route}?{urllib.parse.urlencode(params)}", timeout=30) as r:
        return json.loads(r.read())


def post(uri: str, path: str, body: dict):
    req = urllib.request.Request(f"{uri}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def experiment(uri: str) -> dict:
    return get(uri, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="decodegate-regress")["experiment"]


def runs(uri: str, exp_id: str) -> list[dict]:
    return post(uri, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp_id], "max_results": 100})["runs"]


def tags(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def artifact(uri: str, run_id: str, path: str) -> bytes:
    q = urllib.parse.urlencode({"path": path, "run_uuid": run_id})
    with urllib.request.urlopen(f"{uri}/get-artifact?{q}", timeout=30) as r:
        return r.read()


def artifact_paths(uri: str, run_id: str, path: str = "") -> list[str]:
    listing = get(uri, "/api/2.0/mlflow/artifacts/list", run_id=run_id, **({"path": path} if path else {}))
    out = []
    for f in listing.get("files", []):
        out += artifact_paths(uri, run_id, f["path"]) if f["is_dir"] else [f["path"]]
    return out


def traces(uri: str, exp_id: str) -> list[dict]:
    body = {"locations": [{"type": "MLFLOW_EXPERIMENT", "mlflow_experiment": {"experiment_id": exp_id}}],
            "max_results": 500}
    return post(uri, "/api/3.0/mlflow/traces/search", body).get("traces", [])


def full_trace(uri: str, trace_id: str) -> dict:
    return get(uri, "/api/3.0/mlflow/traces/get", trace_id=trace_id)["trace"]


def span_attrs(span: dict) -> dict:
    """OTLP attributes (values JSON-encoded by MLflow) as a dict."""
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        raw = v.get("string_value", v.get("int_value", v.get("double_value", v.get("bool_value"))))
        try:
            out[a["key"]] = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            out[a["key"]] = raw
    return out


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]


def test_review_views_and_ci_outputs(tmp_path, small_suite, mlflow_server, monkeypatch):
    uri = mlflow_server
    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    cfg = write_config(tmp_path, small_suite)
    run_dir = tmp_path / "run"
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    rc = regress(cfg, run_dir, uri, "--junit-xml", str(junit), "--summary-md", str(md))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert rc == (0 if summary["verdict"] == "pass" else 1)
    assert (run_dir / "tracking.json").exists(), "the run was not logged"

    exp = experiment(uri)
    exp_tags = {t["key"]: t["value"] for t in exp["tags"]}
    assert exp_tags["mlflow.experimentKind"] == "custom_model_development"
    assert "prompts.json" in exp_tags["mlflow.note.content"]
    all_runs = runs(uri, exp["experiment_id"])
    parent = next(r for r in all_runs if "mlflow.parentRunId" not in tags(r))
    children = {r["info"]["run_name"]: r for r in all_runs if tags(r).get("mlflow.parentRunId")
                == parent["info"]["run_id"]}
    assert len(all_runs) == 3 and set(children) == {"spec", "ee-0"}
    note = tags(parent)["mlflow.note.content"]  # the run page renders it as Markdown
    assert note.startswith(f"## decodegate regress: {summary['verdict'].upper()}")
    assert "| candidate | suite | identity T=0 |" in note and "### Gates" in note

    recs = records(run_dir)
    by = {}
    for r in recs:
        by.setdefault(r["candidate"], {})[r["item_id"]] = r
    # The table artifact: one row per pair, both texts, the first divergence.
    for name, child in children.items():
        table = json.loads(artifact(uri, child["info"]["run_id"], "prompts.json"))
        rows = [dict(zip(table["columns"], row)) for row in table["data"]]
        assert len(rows) == len(PROMPTS)
        for row in rows:
            assert row["baseline_text"] == by["baseline"][row["item_id"]]["text"]
            assert row["candidate_text"] == by[name][row["item_id"]]["text"]
            assert row["prompt"] == PROMPTS[int(row["item_id"][1:])]
            assert row["category"] == CATEGORIES[int(row["item_id"][1:]) % 2]
            same = by["baseline"][row["item_id"]]["tokens"] == by[name][row["item_id"]]["tokens"]
            assert row["identical"] is same
            if not same:
                assert row["divergence"] in ("real", "near-tie", "unknown") and row["divergence_position"] is not None
        if name == "spec":
            assert all(r["identical"] for r in rows) and all(r["alpha"] is not None for r in rows)
    ee_rows = [dict(zip(t["columns"], row)) for t in [json.loads(artifact(uri, children["ee-0"]["info"]["run_id"],
                                                                          "prompts.json"))] for row in t["data"]]
    diverged = [r for r in ee_rows if not r["identical"]]
    assert diverged, "early exit at threshold 0 should change outputs on a random model"
    ee_note = tags(children["ee-0"])["mlflow.note.content"]
    assert "Prompts where the output diverged" in ee_note and "| real |" in ee_note
    assert f"compareToRunUuid={parent['info']['run_id']}" in ee_note  # the side-by-side view, one click
    assert "workflowType=machine_learning" in json.loads((run_dir / "tracking.json").read_text())["review_url"]
    parent_table = json.loads(artifact(uri, parent["info"]["run_id"], "prompts.json"))
    assert len(parent_table["data"]) == len(PROMPTS)
    child_metrics = {m["key"]: m["value"] for m in children["spec"]["data"]["metrics"]}
    assert child_metrics["category.ALL.identity"] == 1.0 and "category.facts.alpha" in child_metrics

    # Traces: one per generation (6 per decoder under the default limit), linked to their run.
    infos = traces(uri, exp["experiment_id"])
    assert len(infos) == 3 * len(PROMPTS)
    run_of = {i["trace_id"]: i["trace_metadata"]["mlflow.sourceRun"] for i in infos}
    for name, child in children.items():
        assert sum(v == child["info"]["run_id"] for v in run_of.values()) == len(PROMPTS)
    spec_id = next(t for t, rid in run_of.items() if rid == children["spec"]["info"]["run_id"])
    spec_trace = full_trace(uri, spec_id)
    spans = {s["name"]: s for s in spec_trace["spans"]}
    assert {"prompt", "decode", "round 1"} <= set(spans)
    root = next(s for s in spec_trace["spans"] if not s.get("parent_span_id"))
    attrs = span_attrs(root)
    assert attrs["optimization"] == "speculative" and attrs["label.team"] == "review-tests"
    assert attrs["decodegate.suite"] == "mini" and attrs["decodegate.identical"] is True
    assert set(span_attrs(spans["round 1"])) >= {"proposed", "accepted"}
    assessments = {a["assessment_name"]: a for a in spec_trace["trace_info"]["assessments"]}
    assert set(assessments) == {"identical", "divergence", "grade"}
    assert assessments["identical"]["feedback"]["value"] is True
    assert assessments["divergence"]["feedback"]["value"] == "identical"
    ee_ids = [t for t, rid in run_of.items() if rid == children["ee-0"]["info"]["run_id"]]
    ee_traces = [full_trace(uri, t) for t in ee_ids]
    checks = [s for t in ee_traces for s in t["spans"] if s["name"].startswith("token ")]
    assert checks and all("exit_layer" in span_attrs(s) for s in checks)
    div_values = {a["feedback"]["value"] for t in ee_traces for a in t["trace_info"]["assessments"]
                  if a["assessment_name"] == "divergence"}
    assert div_values & {"real", "near-tie", "unknown"}
    positions = {r["item_id"]: r["divergence_position"] for r in diverged}
    for t in ee_traces:
        item = json.loads(t["trace_info"]["request_preview"])["item_id"]
        token = [a["feedback"]["value"] for a in t["trace_info"]["assessments"]
                 if a["assessment_name"] == "first_divergence_token"]
        assert token == ([positions[item]] if item in positions else [])
    base_id = next(t for t, rid in run_of.items() if rid == parent["info"]["run_id"])
    base_trace = full_trace(uri, base_id)
    assert {a["assessment_name"] for a in base_trace["trace_info"]["assessments"]} == {"grade"}
    # Baseline and candidate traces of one prompt share their inputs: MLflow lines them up.
    assert base_trace["trace_info"]["request_preview"] in {i["request_preview"] for i in infos
                                                           if run_of[i["trace_id"]] != parent["info"]["run_id"]}

    # CI: JUnit with one testcase per gate, failures == failed gates, the detail in each failure.
    gates = [(n, g) for n, c in summary["candidates"].items() for g in c["gates"]]
    xml = ET.parse(junit).getroot()
    cases = xml.findall("./testsuite/testcase")
    assert len(cases) == len(gates) == int(xml.get("tests"))
    failed = [g for _, g in gates if g["status"] == "fail"]
    assert int(xml.get("failures")) == len(failed) == len(xml.findall("./testsuite/testcase/failure"))
    assert failed, "ee-0 should fail its quality gate"
    for case, (n, g) in zip(cases, gates):
        assert case.get("classname") == f"decodegate.{n}" and case.get("name") == g["name"]
        fail = case.find("failure")
        assert (fail is not None) == (g["status"] == "fail")
        if fail is not None:
            assert fail.text == g["detail"]
    # The Markdown summary: the verdict table, appended to $GITHUB_STEP_SUMMARY after what was there.
    text = md.read_text()
    assert "| candidate | suite | identity T=0 | quality delta (lower bound) | speedup |" in text
    assert "| spec | ALL |" in text and "| ee-0 | ALL |" in text
    assert step.read_text() == "earlier step\n" + text


def _texts(run_dir: Path) -> set[str]:
    """Every prompt and generated text long enough not to occur by chance."""
    out = {p for p in PROMPTS}
    # A random model's text can be mostly U+FFFD (bytes that decode to nothing): look for real letters.
    out |= {r["text"].strip() for r in records(run_dir) if sum(c.isalnum() for c in r.get("text", "")) >= 4}
    return out


def test_log_text_false_puts_no_text_anywhere_and_trace_limit_caps(tmp_path, small_suite, mlflow_server):
    uri = mlflow_server
    cfg = write_config(tmp_path, small_suite, top="log_text = false\ntrace_limit = 2")
    run_dir = tmp_path / "run"
    regress(cfg, run_dir, uri)
    assert (run_dir / "tracking.json").exists()
    texts = _texts(run_dir)
    assert len(texts) > len(PROMPTS), "the tiny model generated no text to look for"

    exp = experiment(uri)
    everything = [json.dumps(exp)]
    all_runs = runs(uri, exp["experiment_id"])
    assert len(all_runs) == 3
    for r in all_runs:
        everything.append(json.dumps(r))
        for path in artifact_paths(uri, r["info"]["run_id"]):
            if not path.endswith(".png"):  # figures are images: their bytes are no text
                everything.append(artifact(uri, r["info"]["run_id"], path).decode("utf-8"))
    infos = traces(uri, exp["experiment_id"])
    per_run: dict = {}
    for i in infos:
        per_run[i["trace_metadata"]["mlflow.sourceRun"]] = per_run.get(i["trace_metadata"]["mlflow.sourceRun"], 0) + 1
        everything.append(json.dumps(full_trace(uri, i["trace_id"])))
    assert sorted(per_run.values()) == [2, 2, 2]  # trace_limit: two per decoder
    blob = "\n".join(everything)
    assert "prompts.json" in blob and "divergence" in blob  # the numbers went; only the text stayed home
    leaked = [t for t in texts if t in blob or json.dumps(t)[1:-1] in blob]
    assert not leaked, f"text reached MLflow with log_text = false: {leaked[:3]}"


def test_history_marks_runs_of_another_target(tmp_path, small_suite, mlflow_server, capsys):
    uri = mlflow_server
    spec_only = CANDIDATES.split("[[candidates]]\nname = \"ee-0\"")[0]
    for i, target in enumerate(("tiny-qwen2", "tiny-llama")):
        (tmp_path / f"c{i}").mkdir()
        cfg = write_config(tmp_path / f"c{i}", small_suite, target=target, candidates=spec_only)
        regress(cfg, tmp_path / f"run{i}", uri)
        assert (tmp_path / f"run{i}" / "tracking.json").exists()
    capsys.readouterr()
    fig = tmp_path / "history.png"
    assert main(["history", "--tracking-uri", uri, "--last", "5", "--figure", str(fig), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    newest, older = rows[0]["run_id"], rows[-1]["run_id"]
    assert newest != older and {r["candidate"] for r in rows} == {"spec"}
    assert {r["category"] for r in rows} == {"ALL", "facts", "chat"}
    assert all(not r["other_target"] for r in rows if r["run_id"] == newest)
    assert all(r["other_target"] for r in rows if r["run_id"] == older)  # tiny-qwen2: another target
    for r in rows:
        assert r["verdict"] in ("pass", "fail") and r["identity"] is not None and r["alpha"] is not None
    assert fig.stat().st_size > 1000
    assert main(["history", "--tracking-uri", uri, "--figure", "none"]) == 0
    out = capsys.readouterr().out
    assert "spec" in out and " *" in out and "another target fingerprint" in out


def test_history_refuses_a_server_that_is_down(capsys):
    assert main(["history", "--tracking-uri", f"http://127.0.0.1:{free_port()}", "--figure", "none"]) == 2
    assert "not reachable" in capsys.readouterr().err


TRACE_BURST = r'''
import sys, time
from mlflow import MlflowClient
from harness.run import tracking_views as views
uri = sys.argv[1]
client = MlflowClient(uri)
with views.tracing_to(uri):
    exp = client.create_experiment("burst")
    run = client.create_run(exp).info.run_id
    recs, rows = {}, []
    for i in range(6):
        row = {"suite": "s", "item_id": f"i{i}", "seed": 0, "temperature": 0.0, "prompt": "p", "identical": False,
               "divergence": "real", "divergence_position": 2, "candidate_score": 1.0, "candidate_passed": True}
        recs[("s", f"i{i}", 0, 0.0)] = {
            "candidate": "c", "suite": "s", "item_id": f"i{i}", "seed": 0, "temperature": 0.0, "tokens": [1] * 40,
            "text": "x", "timing": {"wall_s": 0.1, "ttft_s": 0.01, "token_times_s": [0.001] * 40},
            "stats": {"exit_layers": [3] * 40}}
        rows.append(row)
    made = views.log_traces(client, exp, run, recs, rows, {}, True, True, time.time_ns())
traces = client.search_traces(locations=[exp], run_id=run, max_results=100)
print(made, len(traces), sum(1 for t in traces if t.info.assessments))
'''


def test_many_spans_never_overflow_mlflows_trace_queue(tmp_path):
    """`make decide` logged ~300 traces of up to 67 spans; MLflow's asynchronous queue (1000 tasks)
    filled, dropped traces with a warning, and the assessments that followed failed ("Trace ...
    not found"). A queue of 40 shows the same with 6 traces of 43 spans on a real sqlite store:
    every trace must be stored, with its assessments."""
    env = {**os.environ, "MLFLOW_ASYNC_TRACE_LOGGING_MAX_QUEUE_SIZE": "40", "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run([sys.executable, "-c", TRACE_BURST, f"sqlite:///{tmp_path}/mlflow.db"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["6", "6", "6"]


def test_an_upload_cut_during_assessments_is_repaired_by_the_next_sync(tmp_path, monkeypatch):
    """The server went away after 3 of 6 traces' assessments: the next sync found traces, logged
    none, and marked the run FINISHED, so the review view lacked its evidence for good."""
    import time
    from mlflow import MlflowClient
    from harness.run import tracking_views as views
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    recs, rows = {}, []
    for i in range(6):
        rows.append({"suite": "s", "item_id": f"i{i}", "seed": 0, "temperature": 0.0, "prompt": "p", "identical": True,
                     "divergence": "identical", "divergence_position": None, "candidate_score": 1.0,
                     "candidate_passed": True})
        recs[("s", f"i{i}", 0, 0.0)] = {"candidate": "c", "suite": "s", "item_id": f"i{i}", "seed": 0,
                                        "temperature": 0.0, "tokens": [1] * 4, "text": "x",
                                        "timing": {"wall_s": 0.1, "ttft_s": 0.01, "token_times_s": [0.01] * 4}}
    assess, calls = views.assess, []

    def dies_after_three(*a, **kw):
        calls.append(a)
        if len(calls) > 3:
            raise ConnectionError("tracking server went away")
        return assess(*a, **kw)

    with views.tracing_to(uri):
        exp = client.create_experiment("cut")
        run = client.create_run(exp).info.run_id
        monkeypatch.setattr(views, "assess", dies_after_three)
        with pytest.raises(ConnectionError):
            views.log_traces(client, exp, run, recs, rows, {}, True, True, time.time_ns())
        monkeypatch.setattr(views, "assess", assess)
        assert views.log_traces(client, exp, run, recs, rows, {}, True, True, time.time_ns()) == 6
        assert views.log_traces(client, exp, run, recs, rows, {}, True, True, time.time_ns()) == 0   # complete
    traces = client.search_traces(locations=[exp], run_id=run, max_results=100)
    assert len(traces) == 6 and all(t.info.assessments for t in traces)


def _folder(tmp_path):
    """A finished run folder with two candidates (an exact one that diverged once, a lossy one),
    from constructed records (test_ci_outputs.finished_run: regress's last step, no model)."""
    from harness.calibration.synthetic import speculative_stats
    from test_ci_outputs import SPEC_CANDIDATE, _row, finished_run
    lossy = ('[[candidates]]\nname = "ee"\ndecoder = "early-exit"\nkind = "lossy"\n'
             'options = { threshold = 0.5 }\n')

    def rows(suite):
        out = [_row("base", suite, i.id) for i in suite.items]
        out += [_row("spec", suite, i.id, "speculative", stats=speculative_stats([2, 1, 3], k=4),
                     tokens=(1, 2, 9, 9) if i.id == "i0" else (1, 2, 3, 4)) for i in suite.items]
        out += [_row("ee", suite, i.id, "early-exit", tokens=(1, 2, 5, 6),
                     stats={"exit_layers": [1, 2, 2, 2], "num_layers": 2, "lm_head_evals": 6}) for i in suite.items]
        return out
    return finished_run(tmp_path, rows, SPEC_CANDIDATE + lossy)[1]


def test_sync_into_an_experiment_in_mlflows_trash_is_one_clear_line(tmp_path, capsys):
    """Someone deleted the experiment in the UI: `sync` died with exit 3 and MLflow's traceback ("must
    be in the 'active' state"), and `history` said there were no runs (red-team finding)."""
    from mlflow import MlflowClient
    run_dir, uri = _folder(tmp_path), f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["sync", str(run_dir), "--tracking-uri", uri]) == 0
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("decodegate-regress")
    client.delete_experiment(exp.experiment_id)
    capsys.readouterr()
    assert main(["sync", str(run_dir), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "is deleted" in err and f"mlflow experiments restore -x {exp.experiment_id}" in err
    assert "Traceback" not in err
    assert main(["history", "--tracking-uri", uri, "--figure", "none"]) == 2
    assert "is deleted" in capsys.readouterr().err
    client.restore_experiment(exp.experiment_id)
    assert main(["sync", str(run_dir), "--tracking-uri", uri]) == 0
    assert len(client.search_runs([exp.experiment_id])) == 3  # restored: the same runs, none added


def test_an_upload_cut_part_way_then_synced_twice_logs_each_metric_once(tmp_path, monkeypatch):
    """The server went away during the second candidate's views: the parent stayed RUNNING, and each
    sync after it logged the parent's and that candidate's metrics again, a second point in every
    metric's history (a chart of two runs where there was one)."""
    from mlflow import MlflowClient
    from harness.run import tracking, tracking_views as views
    run_dir, uri = _folder(tmp_path), f"sqlite:///{tmp_path}/mlflow.db"
    log_candidate, calls = views.log_candidate, []

    def dies_on_the_second(*a, **kw):
        calls.append(a)
        if len(calls) == 2:
            raise ConnectionError("tracking server went away")
        return log_candidate(*a, **kw)
    monkeypatch.setattr(views, "log_candidate", dies_on_the_second)
    with pytest.raises(ConnectionError):
        tracking.log_run(run_dir, uri)
    monkeypatch.setattr(views, "log_candidate", log_candidate)
    for _ in range(2):
        assert main(["sync", str(run_dir), "--tracking-uri", uri]) == 0
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("decodegate-regress").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["ee", "regress smoke tiny-llama", "spec"]
    assert all(r.info.status == "FINISHED" for r in runs)
    twice = {(r.info.run_name, k) for r in runs for k in r.data.metrics
             if len(client.get_metric_history(r.info.run_id, k)) != 1}
    assert not twice
    assert {r.info.run_name: r.data.tags["decodegate.verdict"] for r in runs} == {
        "ee": "fail", "spec": "fail", "regress smoke tiny-llama": "fail"}


def test_a_run_synced_days_later_keeps_its_place_in_history(tmp_path, capsys):
    """Monday's run was made while the server was down and synced on Wednesday, after Tuesday's run
    was logged. Its MLflow runs started at the upload: `history` listed Monday's run as the newest,
    dated Wednesday, and marked Tuesday's (the real newest, on the new target) as "another target"
    (red-team finding)."""
    import calendar
    from harness.calibration.synthetic import speculative_stats
    from test_ci_outputs import _row, finished_run

    def rows(suite):
        return [_row("base", suite, i.id) for i in suite.items] + [
            _row("spec", suite, i.id, "speculative", stats=speculative_stats([2, 1, 3], k=4)) for i in suite.items]
    folders = {}
    for day, created in (("monday", "2026-11-30T09:00:00Z"), ("tuesday", "2026-12-01T09:00:00Z")):
        (tmp_path / day).mkdir()
        fp = {"target_fingerprint": f"{day}-target"}
        folders[day] = finished_run(tmp_path / day, rows, run_uid=day.ljust(32, "0"), created=created,
                                    fingerprints={"spec": fp, "base": fp})[1]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["sync", str(folders["tuesday"]), "--tracking-uri", uri]) == 0
    assert main(["sync", str(folders["monday"]), "--tracking-uri", uri]) == 0   # the late upload
    capsys.readouterr()
    assert main(["history", "--tracking-uri", uri, "--figure", "none", "--category", "ALL", "--json"]) == 0
    rows_ = json.loads(capsys.readouterr().out)
    assert [r["target_fingerprint"] for r in rows_] == ["tuesday-target", "monday-target"]
    assert [r["other_target"] for r in rows_] == [False, True]
    assert rows_[1]["start_time"] == calendar.timegm((2026, 11, 30, 9, 0, 0)) * 1000


def test_history_whose_filters_match_nothing_says_so_not_that_nothing_was_logged(tmp_path, capsys):
    """`--category all` (the pseudo-category is ALL) or a misspelt candidate printed "no regress runs
    in experiment ...", though the runs were there (red-team finding)."""
    run_dir, uri = _folder(tmp_path), f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["sync", str(run_dir), "--tracking-uri", uri]) == 0
    capsys.readouterr()
    assert main(["history", "--tracking-uri", uri, "--figure", "none", "--category", "all"]) == 0
    out = capsys.readouterr().out
    assert "no regress runs" not in out
    assert "nothing matches --category all" in out and "candidates there: ee, spec" in out and "ALL" in out
    assert main(["history", "--tracking-uri", uri, "--figure", "none", "--candidate", "spce"]) == 0
    assert "nothing matches --candidate spce" in capsys.readouterr().out
    assert main(["history", "--tracking-uri", uri, "--figure", "none", "--candidate", "spec", "--json"]) == 0
    assert {r["candidate"] for r in json.loads(capsys.readouterr().out)} == {"spec"}
