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
