"""CI outputs and review rows without a server or a model: JUnit XML that the standard library
parses, the Markdown verdict table, the `trace_limit` key, and the rows MLflow's views get."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from harness.cli import main
from harness.run import review
from harness.verdict import report


def summary() -> dict:
    gate = lambda n, s, d: {"name": n, "status": s, "detail": d}  # noqa: E731
    return {"verdict": "fail", "target": "t", "profile": "smoke", "baseline": "baseline", "run_uid": "u" * 32,
            "created": "2026-01-01T00:00:00Z", "code_version": "dev",
            "candidates": {
                "spec": {"decoder": "speculative", "kind": "exact", "target": "t", "verdict": "pass",
                         "suites": {"s": {"identity": {"T=0": {"identical": 3, "n": 3, "near_ties": 0}}}},
                         "gates": [gate("identity s T=0", "pass", "3/3 identical"),
                                   gate("speed", "warn", "inconclusive | too few")]},
                "ee": {"decoder": "early-exit", "kind": "lossy", "target": "t", "verdict": "fail", "suites": {},
                       "gates": [gate("quality s", "fail", "worse: bound -0.3 < -0.2\nsecond line")]},
                "ee-empty": {"decoder": "early-exit", "kind": "lossy", "target": "t", "verdict": "fail",
                             "suites": {}, "gates": []},
                "base~aa": {"decoder": "standard", "kind": "exact", "target": "t", "verdict": "floor",
                            "role": "aa-floor", "suites": {}, "gates": []}}}


def test_junit_one_testcase_per_gate_failures_carry_the_detail(tmp_path):
    path = tmp_path / "j.xml"
    report.write_ci(summary(), "report", junit_path=str(path), environ={})
    root = ET.parse(path).getroot()
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"spec", "ee", "ee-empty"}  # the A/A floor is not on trial
    assert [c.get("name") for c in suites["spec"].findall("testcase")] == ["identity s T=0", "speed"]
    assert suites["spec"].find("testcase/failure") is None  # a warning does not fail
    assert "WARN: inconclusive | too few" in suites["spec"].findall("testcase")[1].find("system-out").text
    fail = suites["ee"].find("testcase/failure")
    assert fail.text == "worse: bound -0.3 < -0.2\nsecond line" and fail.get("message") == "worse: bound -0.3 < -0.2"
    # Fail closed: a failing candidate with no gate result still shows as a failure.
    assert suites["ee-empty"].find("testcase/failure") is not None
    assert root.get("tests") == "4" and root.get("failures") == "2"


def test_markdown_summary_holds_the_verdict_table_and_appends_to_the_step_summary(tmp_path):
    step = tmp_path / "step.md"
    step.write_text("before\n")
    out = tmp_path / "s.md"
    report.write_ci(summary(), "the report", summary_md=str(out), environ={"GITHUB_STEP_SUMMARY": str(step)})
    md = out.read_text()
    assert md.startswith("## decodegate regress: FAIL")
    assert "| " + " | ".join(report.HEADER) + " |" in md
    assert "| spec | s | 3/3 |" in md and "| ee | ALL |" in md
    assert "| spec | speed | **WARN** | inconclusive \\| too few |" in md  # a pipe in a detail is escaped
    assert step.read_text() == "before\n" + md
    # --summary-md "$GITHUB_STEP_SUMMARY": appended once, what earlier steps wrote is kept.
    report.write_ci(summary(), "r", summary_md=str(step), environ={"GITHUB_STEP_SUMMARY": str(step)})
    assert step.read_text().startswith("before\n") and step.read_text().count("## decodegate regress") == 2


ATTACK = "e2: HTTP 413\r\n<html>\r\n<head><title>413 Too Large</title></head>\x1b[0m\x00\x0c end"


def _attacked() -> dict:
    """An engine's error body (CR/LF, HTML, an ANSI escape, NUL, form feed) in a failed gate's
    detail, before the gates a reviewer must still see."""
    s = summary()
    s["candidates"]["spec"]["gates"].insert(0, {"name": "errors", "status": "fail", "detail": ATTACK})
    s["candidates"]["spec"]["verdict"] = "fail"
    return s


def test_junit_stays_readable_whatever_an_engine_sent_back(tmp_path):
    """A control character written raw makes the whole file unreadable (XML 1.0 forbids it), and
    CI then shows no failure at all (red-team finding: ElementTree writes them as they are)."""
    path = tmp_path / "j.xml"
    report.write_ci(_attacked(), "report", junit_path=str(path), environ={})
    root = ET.parse(path).getroot()
    assert root.get("failures") == "3"
    fail = root.find("testsuite[@name='spec']/testcase[@name='errors']/failure")
    assert "413 Too Large" in fail.text and "\x00" not in fail.text


def _rendered(md: str):
    from markdown_it import MarkdownIt
    return MarkdownIt("commonmark").enable("table").parse(md)


def test_markdown_keeps_every_gate_row_whatever_a_detail_or_report_holds():
    """A CR ends a Markdown line and HTML then opens a block that swallows the rest of the table;
    a report holding a fence closes the code block and can add a PASS heading to a failing run."""
    text = "report\n```\n## decodegate regress: PASS\n<h1>PASS</h1>\n````\nafter"
    tokens = _rendered(report.markdown(_attacked(), text))
    assert not [t for t in tokens if t.type in ("html_block", "html_inline")]
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["decodegate regress: FAIL", "Gates", "Report"]
    rows = [t for t in tokens if t.type == "tr_open"]
    n_gates = sum(len(c["gates"]) for c in _attacked()["candidates"].values())
    n_verdict_rows = len(report.verdict_rows(_attacked()))
    assert len(rows) == 2 + n_verdict_rows + n_gates    # two header rows, and not one row lost
    fence = next(t for t in tokens if t.type == "fence")
    assert "## decodegate regress: PASS" in fence.content and fence.content.rstrip().endswith("after")


def test_review_cells_keep_generated_text_on_its_row():
    tokens = _rendered("| a | b |\n|---|---|\n| " + review._cell("def f():\r\n  <b>x</b>\r\n") + " | z |\n")
    assert [t.type for t in tokens if t.type == "tr_open"] == ["tr_open", "tr_open"]
    assert not [t for t in tokens if t.type in ("html_block", "html_inline")]


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../up", "bob's k=3", "a\x1bb", "x|y", "<b>", "spec@c4", "",
                                  "a" * 81])
def test_a_name_that_would_be_a_path_a_quote_or_markup_is_refused(tmp_path, name):
    """Names become folders (figures/NAME: a path wrote outside the run and uploaded that folder to
    MLflow), MLflow search filters (a quote broke every upload and `sync`), JUnit and Markdown."""
    from harness.config import ConfigError, load_config
    cfg = tmp_path / "c.toml"
    import json
    cfg.write_text(f'target = "tiny-llama"\n[[candidates]]\ndecoder = "standard"\nname = {json.dumps(name)}\n'
                   f'[profiles.smoke]\nsuites = ["factual"]\n')
    with pytest.raises(ConfigError, match="may hold only letters"):
        load_config(cfg)
    cfg.write_text(f'target = "tiny-llama"\n[[candidates]]\ndecoder = "standard"\nname = "ok-1.2_x+y=z"\n'
                   f'[profiles.smoke]\nsuites = ["factual"]\n')
    assert load_config(cfg).candidates[0].name == "ok-1.2_x+y=z"


def test_a_suite_row_shows_its_own_gates_not_those_of_a_suite_whose_name_starts_alike():
    s = summary()
    s["candidates"]["spec"]["suites"] = {"code": {}, "code_long": {}}
    s["candidates"]["spec"]["gates"] = [{"name": "identity code T=0", "status": "pass", "detail": ""},
                                        {"name": "identity code_long T=0", "status": "fail", "detail": ""}]
    rows = {r[1]: r[-1] for r in report.verdict_rows(s) if r[0] == "spec"}
    assert rows["code"] == "pass" and rows["code_long"] == "fail"


def test_ci_paths_in_a_missing_folder_fail_before_the_run(tmp_path, capsys):
    rc = main(["regress", "--config", "regress.toml", "--no-tracking", "--plan-only",
               "--junit-xml", str(tmp_path / "nowhere" / "j.xml")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "1.5", "true", '"10"'])
def test_trace_limit_must_be_a_count(tmp_path, value):
    from harness.config import ConfigError, load_config
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'target = "tiny-llama"\ntrace_limit = {value}\n[[candidates]]\ndecoder = "standard"\nname = "x"\n'
                   f'[profiles.smoke]\nsuites = ["factual"]\n')
    with pytest.raises(ConfigError, match="trace_limit must be an integer >= 0"):
        load_config(cfg)


def _records():
    def rec(cand, item, tokens, text, score):
        return {"candidate": cand, "decoder": "standard", "suite": "s", "item_id": item, "categories": ["c1"],
                "seed": 0, "temperature": 0.0, "tokens": tokens, "text": text, "score": score,
                "passed": bool(score), "margins": [0.5, 0.0001, 2.0], "stats": {}, "grade_detail": f"saw {text}",
                "timing": {"wall_s": 1.0, "ttft_s": 0.1, "token_times_s": [0.1, 0.4, 0.5]}}
    return [rec("baseline", "a", [1, 2, 3], "one two three", 1.0), rec("baseline", "b", [4, 5, 6], "four", 1.0),
            rec("cand", "a", [1, 2, 3], "one two three", 1.0), rec("cand", "b", [4, 9, 6], "four nine", 0.0)]


def test_pair_rows_carry_the_first_divergence_and_no_text_without_log_text():
    s = {"baseline": "baseline", "candidates": {"cand": {"suites": {"s": {"identity": {"T=0": {"divergences": [
        {"item_id": "b", "seed": 0, "temperature": 0.0, "position": 1, "margin": 0.0001, "kind": "near-tie"}]}}}}}}}
    rows = review.pair_rows(_records(), s, "cand", {("s", "a"): "prompt a", ("s", "b"): "prompt b"})
    assert [r["divergence"] for r in rows] == ["identical", "near-tie"]
    assert rows[1]["divergence_position"] == 1 and rows[1]["divergence_margin"] == 0.0001
    assert rows[1]["baseline_text"] == "four" and rows[1]["candidate_text"] == "four nine"
    assert "baseline: ''" in rows[1]["divergence_context"] and "' nine'" in rows[1]["divergence_context"]
    assert review.for_traces(rows, 1) == [rows[1]]  # divergent prompts are traced first
    bare = review.pair_rows(_records(), s, "cand", {("s", "a"): "prompt a"}, log_text=False)
    assert not any(k in r for r in bare for k in review.TEXT_FIELDS)
    assert bare[1]["divergence_position"] == 1  # the numbers stay
    m = review.category_metrics(rows)
    assert m["ALL"]["identity"] == 0.5 and m["c1"]["speedup"] == 1.0


GREEN = ('<?xml version="1.0" encoding="utf-8"?>\n<testsuites name="decodegate regress" tests="1" failures="0" '
         'errors="0">\n  <testsuite name="decodegate" tests="1" failures="0" errors="0" skipped="0">\n'
         '    <testcase classname="decodegate" name="identity s T=0" time="0" />\n  </testsuite>\n</testsuites>\n')


@pytest.mark.parametrize("case", ["plan-only", "bad name"])
def test_a_run_that_stops_before_its_verdict_leaves_no_green_ci_files(tmp_path, case):
    """The placeholder was written only after the config, suite and plan checks: a refused config
    or --plan-only left the previous run's green JUnit and summary for CI to show (red-team finding)."""
    junit, md = tmp_path / "j.xml", tmp_path / "s.md"
    junit.write_text(GREEN)
    md.write_text("## decodegate regress: PASS\n")
    argv = ["regress", "--no-tracking", "--junit-xml", str(junit), "--summary-md", str(md)]
    if case == "plan-only":
        argv += ["--config", "regress.toml", "--plan-only"]
    else:
        cfg = tmp_path / "c.toml"
        cfg.write_text('target = "tiny-llama"\n[[candidates]]\ndecoder = "standard"\nname = "x|y"\n'
                       '[profiles.smoke]\nsuites = ["factual"]\n')
        argv += ["--config", str(cfg)]
    rc = main(argv)
    assert rc == (0 if case == "plan-only" else 2)
    root = ET.fromstring(junit.read_text())
    assert root.get("errors") == "1" and root.find(".//error").get("type") == "no-verdict"
    assert md.read_text().startswith("## decodegate regress: NO VERDICT")


# ------------------------------------------------------------------ regress's last step on constructed records

SPEC_CANDIDATE = ('[[candidates]]\nname = "spec"\ndecoder = "speculative"\n'
                  'options = { draft = "prompt-lookup", verify = "coupled" }\n')


def finished_run(tmp_path, records_of, candidates: str = SPEC_CANDIDATE, baseline: str = 'decoder = "standard"',
                 head: str = "", n: int = 4, **meta):
    """A run folder as `regress` leaves it, from records as the runner writes them, without a model:
    harness.commands.regress.finish (summary, report, figures, CI files; no tracking). `records_of(suite)`
    gives the records; `meta`, run.json's fields to set (created, fingerprints, ...). Returns (exit code,
    run folder)."""
    import argparse
    import json
    from harness.commands.regress import finish
    from harness.config import load_config
    from suites.format import item_from_row, make_suite
    ids = [f"i{k}" for k in range(n)]
    suite = make_suite(name="f", version="1", description="test", source="<test>", smoke_ids=ids,
                       items=[item_from_row({"id": i, "prompt": f"q {i}", "references": ["x"]}, {"grader": "contains"})
                              for i in ids])
    cfg = tmp_path / "regress.toml"
    cfg.write_text(f'target = "tiny-llama"\n{head}\n[baseline]\nname = "base"\n{baseline}\n{candidates}\n'
                   f'[suites.f]\nmargin = 0.2\n[profiles.smoke]\nsubset = "smoke"\nsuites = ["f"]\n'
                   f'temperatures = [0.0]\nseeds = [0]\n')
    records = records_of(suite)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = {"run_uid": "r" * 32, "fingerprint": "x", "config": str(cfg), "profile": "smoke",
            "created": "2026-01-01T00:00:00Z", "code_version": "dev", **meta}
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = argparse.Namespace(junit_xml=str(tmp_path / "j.xml"), summary_md=str(tmp_path / "s.md"), no_tracking=True,
                              tracking_uri=None)
    return finish(load_config(cfg, "smoke"), run_dir, meta, records, [suite], {}, args), run_dir


def _row(candidate: str, suite, item_id: str, decoder: str = "standard", **kw) -> dict:
    from harness.calibration.synthetic import make_record
    return make_record(candidate=candidate, decoder=decoder, suite=suite.name, suite_hash=suite.hash, item_id=item_id,
                       passed=True, **kw)


def test_a_row_without_a_wall_time_still_gets_its_report_and_ci_files(tmp_path, capsys):
    """A candidate row whose wall time is null (a record writer turns a NaN into null): the analysis
    fails its latency and speedup gates by name, but the figures then divided None by a token
    count and ended the run with a TypeError: no report.txt, no JUnit, no MLflow (red-team finding)."""
    def records(suite):
        rows = [_row("base", suite, i.id) for i in suite.items]
        for i in suite.items:
            row = _row("spec", suite, i.id, "speculative")
            row["timing"] = {**row["timing"], "wall_s": None}
            rows.append(row)
        return rows
    code, run_dir = finished_run(tmp_path, records)
    assert code == 1
    assert (run_dir / "report.txt").read_text().rstrip().endswith("verdict: FAIL")
    root = ET.parse(tmp_path / "j.xml").getroot()
    failed = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    assert {"analysis latency", "analysis speedup"} <= failed
    assert (tmp_path / "s.md").read_text().startswith("## decodegate regress: FAIL")


def test_summary_json_is_strict_json_when_an_a_a_comparison_had_no_pairs(tmp_path):
    """An engine candidate whose every generation errored: its identity block has no pairs, and the
    A/A comparison's difference bound over them was NaN, written into summary.json as a bare `NaN`
    that JSON.parse (MLflow's artifact viewer, any JavaScript or strict reader) rejects."""
    import json
    engine = '[engines.plain]\nlaunch = ["llama-server", "--port", "{port}"]\nmodel = "tiny-llama"\n'
    cand = '[[candidates]]\nname = "eng"\ndecoder = "llama.cpp"\nkind = "exact"\noptions = { engine = "plain" }\n'

    def records(suite):
        rows = [_row(name, suite, i.id, "llama.cpp") for i in suite.items for name in ("base", "base~aa")]
        for i in suite.items:
            rows.append({**_row("eng", suite, i.id, "llama.cpp"), "error": "HTTP 500", "tokens": [], "text": "",
                         "margins": [], "stats": {}, "timing": {}, "passed": False, "score": 0.0})
        return rows
    code, run_dir = finished_run(tmp_path, records, cand, 'decoder = "llama.cpp"\noptions = { engine = "plain" }',
                                 head=engine)
    assert code == 1

    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    summary = json.loads((run_dir / "summary.json").read_text(), parse_constant=refuse)
    floor = summary["candidates"]["eng"]["suites"]["f"]["identity"]["T=0"]["floor"]
    assert floor["n"] == 0 and floor["difference_lower_bound"] is None
    assert summary["candidates"]["eng"]["verdict"] == "fail"


def test_history_alpha_and_tau_are_the_reports(tmp_path):
    """`history` (the `category.ALL.alpha` / `.tau` metrics) showed accepted / proposed averaged over
    records as "α" (0.42 here), while report.txt and the run's `alpha` metric gave the summary's α,
    accepted over the drafts the verifier tested (0.72): two numbers for one run under one name
    (red-team finding)."""
    import json
    from harness.calibration.synthetic import speculative_stats
    rounds = {"i0": [4, 0, 2], "i1": [1, 1], "i2": [4, 4, 3, 0], "i3": [0, 2]}

    def records(suite):
        rows = [_row("base", suite, i.id, tokens=tuple(range(12))) for i in suite.items]
        for i in suite.items:
            st = speculative_stats(rounds[i.id], k=4)
            n = sum(rounds[i.id]) + len(rounds[i.id])  # each round emits its accepted drafts and one more
            rows.append(_row("spec", suite, i.id, "speculative", stats=st, tokens=tuple(range(n))))
        return rows
    code, run_dir = finished_run(tmp_path, records)
    summary = json.loads((run_dir / "summary.json").read_text())
    acc = summary["candidates"]["spec"]["acceptance"]
    recs = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    rows = review.pair_rows(recs, summary, "spec", log_text=False)
    m = review.category_metrics(rows)["ALL"]
    assert acc["alpha"] != pytest.approx(acc["acceptance_rate"], abs=0.05)  # the two quantities differ here
    assert m["alpha"] == pytest.approx(acc["alpha"]) and m["tau"] == pytest.approx(acc["tau"])
    assert summary["candidates"]["spec"]["metrics"]["alpha"] == pytest.approx(m["alpha"])
    assert rows[0]["acceptance_rate"] == pytest.approx(6 / 12) and rows[0]["alpha"] == pytest.approx(6 / 8)


def test_a_run_synced_from_another_folder_still_has_its_prompts(tmp_path, monkeypatch):
    """run.json kept `--config` as typed (`my.toml`): `sync` run from another folder could not find
    it, fell back to the copy in the run folder, whose relative suite path then pointed inside the
    run folder, and every prompt went to MLflow as null (red-team finding)."""
    import argparse
    import json
    from harness.commands.regress import open_run_dir
    from harness.config import load_config
    from harness.run import runner
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "mine.jsonl").write_text(
        json.dumps({"suite": "mine", "version": "1", "description": "t", "smoke": ["a"],
                    "defaults": {"grader": "contains", "max_new_tokens": 4, "stop": []}}) + "\n"
        + json.dumps({"id": "a", "prompt": "Tell me about cats", "references": ["cat"]}) + "\n")
    (project / "my.toml").write_text(f'target = "tiny-llama"\n{SPEC_CANDIDATE}[suites.mine]\npath = "data/mine.jsonl"\n'
                                     '[profiles.smoke]\nsubset = "smoke"\nsuites = ["mine"]\n'
                                     'temperatures = [0.0]\nseeds = [0]\n')
    monkeypatch.chdir(project)
    config = load_config("my.toml", "smoke")
    suites = runner.load_suites(config)
    args = argparse.Namespace(config="my.toml", profile="smoke", run_dir="runs/r1")
    run_dir, meta = open_run_dir(args, config, suites)
    summary = {"profile": "smoke", "suites": {s.name: {"hash": s.hash} for s in suites}}
    monkeypatch.chdir(tmp_path)   # `decodegate sync project/runs/r1` from elsewhere
    assert review.prompts(project / run_dir, summary) == {("mine", "a"): "Tell me about cats"}


def test_history_alpha_without_round_counts_is_the_reports_fallback(tmp_path):
    """An engine that reports only drafted and accepted totals: the report's α falls back to
    accepted / proposed (its method says so), and history's must be that same number, not none."""
    import json

    def records(suite):
        rows = [_row("base", suite, i.id) for i in suite.items]
        rows += [_row("spec", suite, i.id, "speculative", stats={"proposed": 8, "accepted": a, "k": 4,
                                                                  "target_forwards": 3})
                 for i, a in zip(suite.items, (2, 5, 8, 1))]
        return rows
    code, run_dir = finished_run(tmp_path, records)
    summary = json.loads((run_dir / "summary.json").read_text())
    acc = summary["candidates"]["spec"]["acceptance"]
    assert acc["alpha_method"] == "accepted/proposed" and acc["alpha"] == pytest.approx(16 / 32)
    recs = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines()]
    rows = review.pair_rows(recs, summary, "spec", log_text=False)
    assert review.category_metrics(rows)["ALL"]["alpha"] == pytest.approx(acc["alpha"])
    assert "alpha" not in rows[0] and rows[0]["acceptance_rate"] == pytest.approx(2 / 8)


def test_history_identity_is_the_greedy_pairs_as_in_the_report():
    """A sampled pair of an exact-in-distribution decoder may differ by design; history's identity
    rate pooled it with the greedy pairs and read 0.5 where the report said 1 of 1 identical."""
    recs = _records()
    sampled = [dict(r, item_id="a", temperature=0.7, seed=1) for r in recs if r["item_id"] == "a"]
    sampled[1] = dict(sampled[1], tokens=[1, 7, 3], text="one seven three")
    rows = review.pair_rows([r for r in recs if r["item_id"] == "a"] + sampled, {"baseline": "baseline",
                            "candidates": {"cand": {}}}, "cand", {})
    assert sorted(r["identical"] for r in rows) == [False, True]
    assert review.category_metrics(rows)["ALL"]["identity"] == 1.0
