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
