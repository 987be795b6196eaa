"""No evidence, no pass (issue 21): a summary step without data is a failed gate, never an
exception; a gated suite with no pairs fails with "no items"; a lossy candidate needs a quality
test. Summaries of records as the runner writes them (`harness.run.runner.make_row`), and one
`regress` end to end on the tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.calibration.synthetic import make_record
from harness.config import ConfigError, load_config
from harness.verdict.gate import decide
from harness.verdict.summary import summarize
from helpers import errored_record, regress, write_regress_config
from suites.format import item_from_row, make_suite


def _config(tmp_path: Path, candidates: str, suites: str, profile_suites: str, extra: str = "",
            temperatures: str = "[0.0]"):
    cfg = write_regress_config(tmp_path / "regress.toml", candidates=candidates, suites=suites, tail=extra,
                               profile={"subset": "smoke", "suites": json.loads(profile_suites),
                                        "temperatures": json.loads(temperatures), "seeds": [0]})
    return load_config(cfg, "smoke")


def _suite(name: str, ids, smoke=None):
    items = [item_from_row({"id": i, "prompt": f"question {i}", "references": ["x"]}, {"grader": "contains"})
             for i in ids]
    return make_suite(name=name, version="1", description="test", items=items,
                      smoke_ids=list(ids) if smoke is None else smoke, source="<test>")


def _errored(candidate: str, decoder: str, suite, item_id: str) -> dict:
    return errored_record(suite, candidate, item_id, "prompt is 300 tokens but the model's context is 256",
                          decoder=decoder, categories=[], kind="lossy")


def _gates(summary: dict, name: str, config) -> dict:
    d = decide(summary["candidates"][name], config.gates)
    return {r.name: r for r in d.results}, d.passed


EARLY_EXIT = """
[[candidates]]
name = "ee"
decoder = "early-exit"
kind = "lossy"
options = { threshold = 0.5 }
"""


def test_early_exit_whose_every_generation_errored_fails_a_gate(tmp_path):
    config = _config(tmp_path, EARLY_EXIT, "[suites.f]\nmargin = 0.2", '["f"]')
    suite = _suite("f", ["a", "b", "c"])
    records = [_errored(c, d, suite, i) for i in ("a", "b", "c") for c, d in (("baseline", "standard"),
                                                                              ("ee", "early-exit"))]
    summary = summarize(config, records, [suite])  # before: ValueError from analysis.exit_summary
    gates, passed = _gates(summary, "ee", config)
    assert not passed
    assert gates["analysis exits"].status == "fail"
    assert "no tokens" in gates["analysis exits"].detail and "3 of 3" in gates["analysis exits"].detail
    assert gates["errors"].status == "fail"


def test_one_errored_item_leaves_the_exit_statistics_of_the_others(tmp_path):
    config = _config(tmp_path, EARLY_EXIT, "[suites.f]\nmargin = 0.2", '["f"]')
    suite = _suite("f", ["a", "b", "c"])
    stats = {"exit_layers": [1, 2, 2, 2], "num_layers": 2, "lm_head_evals": 6}
    records = [_errored("ee", "early-exit", suite, "a")]
    records += [make_record(suite="f", suite_hash=suite.hash, item_id=i, passed=True) for i in ("a", "b", "c")]
    records += [make_record(candidate="ee", decoder="early-exit", suite="f", suite_hash=suite.hash, item_id=i,
                            passed=True, stats=stats) for i in ("b", "c")]
    summary = summarize(config, records, [suite])  # before: ValueError (record 'a' has no stats.exit_layers)
    cand = summary["candidates"]["ee"]
    assert cand["suites"]["f"]["exits"]["tokens"] == 8 and cand["exits"]["tokens"] == 8
    gates, passed = _gates(summary, "ee", config)
    assert not passed and gates["errors"].status == "fail" and "analysis exits" not in gates


SPEC = """
[[candidates]]
name = "spec"
decoder = "speculative"
options = { draft = "prompt-lookup", verify = "coupled" }
"""


def test_gated_suite_with_an_empty_subset_fails_with_no_items(tmp_path):
    config = _config(tmp_path, SPEC, "[suites.f]\nmargin = 0.2\n[suites.g]\nmargin = 0.2", '["f", "g"]')
    full, empty = _suite("f", ["a", "b"]), _suite("g", ["x", "y"], smoke=[])
    records = [make_record(candidate=c, suite="f", suite_hash=full.hash, item_id=i, passed=True)
               for i in ("a", "b") for c in ("baseline", "spec")]
    summary = summarize(config, records, [full, empty])
    assert summary["suites"]["g"]["n_items"] == 0
    gates, passed = _gates(summary, "spec", config)
    assert gates["quality f"].status == "pass"  # identical outputs on f
    assert not passed and gates["quality g"].status == "fail" and "no items" in gates["quality g"].detail


def test_suite_without_a_margin_may_be_empty(tmp_path):
    """Only gated suites must have items: an identity-only suite without any adds nothing."""
    config = _config(tmp_path, SPEC, "[suites.f]\nmargin = 0.2", '["f", "g"]')
    full, empty = _suite("f", ["a", "b"]), _suite("g", ["x"], smoke=[])
    records = [make_record(candidate=c, suite="f", suite_hash=full.hash, item_id=i, passed=True)
               for i in ("a", "b") for c in ("baseline", "spec")]
    gates, passed = _gates(summarize(config, records, [full, empty]), "spec", config)
    assert passed and "quality g" not in gates


def test_rows_without_timing_fail_the_latency_step_not_the_run(tmp_path):
    config = _config(tmp_path, SPEC, "[suites.f]\nmargin = 0.2", '["f"]')
    suite = _suite("f", ["a", "b"])
    records = [make_record(suite="f", suite_hash=suite.hash, item_id=i, passed=True) for i in ("a", "b")]
    for i in ("a", "b"):
        row = make_record(candidate="spec", decoder="speculative", suite="f", suite_hash=suite.hash, item_id=i,
                          passed=True)
        row["timing"] = {}  # a backend that reported no wall time
        records.append(row)
    summary = summarize(config, records, [suite])  # before: ValueError (record has no timing.wall_s)
    gates, passed = _gates(summary, "spec", config)
    assert not passed and gates["analysis latency"].status == "fail"
    assert "wall_s" in gates["analysis latency"].detail


def test_drafts_without_a_draft_length_fail_the_acceptance_step(tmp_path):
    config = _config(tmp_path, SPEC, "[suites.f]\nmargin = 0.2", '["f"]')
    suite = _suite("f", ["a", "b"])
    records = [make_record(suite="f", suite_hash=suite.hash, item_id=i, passed=True) for i in ("a", "b")]
    records += [make_record(candidate="spec", decoder="speculative", suite="f", suite_hash=suite.hash, item_id=i,
                            passed=True, stats={"proposed": 4, "accepted": 2}) for i in ("a", "b")]
    gates, passed = _gates(summarize(config, records, [suite]), "spec", config)
    assert not passed and gates["analysis acceptance"].status == "fail"
    assert "draft length" in gates["analysis acceptance"].detail


def test_min_speedup_without_timed_pairs_fails(tmp_path):
    config = _config(tmp_path, SPEC.replace('name = "spec"', 'name = "spec"\nmin_speedup = 1.1'),
                     "[suites.f]\nmargin = 0.2", '["f"]')
    suite = _suite("f", ["a", "b"])
    records = [dict(make_record(suite="f", suite_hash=suite.hash, item_id=i, passed=True), reused={"run_uid": "r"})
               for i in ("a", "b")]  # the baseline came from the store: nothing timed beside the candidate
    records += [make_record(candidate="spec", decoder="speculative", suite="f", suite_hash=suite.hash, item_id=i,
                            passed=True) for i in ("a", "b")]
    gates, passed = _gates(summarize(config, records, [suite]), "spec", config)
    assert not passed and gates["speed"].status == "fail" and "no timed pairs" in gates["speed"].detail


def test_regress_with_a_prompt_too_long_for_the_early_exit_candidate(tmp_path):
    """End to end: one item errors (its prompt exceeds the tiny model's 256 positions); the run
    ends with a failed gate and the other items' exit statistics, not an exception."""
    rows = [{"suite": "mixed", "version": "1", "description": "one prompt too long", "smoke": ["ok-0", "ok-1", "long"],
             "defaults": {"grader": "contains", "max_new_tokens": 6, "stop": []}},
            {"id": "ok-0", "prompt": "Tell me about cats", "references": ["\u0000never"]},
            {"id": "ok-1", "prompt": "Tell me about rivers", "references": ["\u0000never"]},
            {"id": "long", "prompt": "word " * 2000, "references": ["\u0000never"]}]
    suite = tmp_path / "mixed.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_regress_config(tmp_path / "regress.toml", candidates=EARLY_EXIT,
                               suites={"mixed": {"margin": 0.5, "path": str(suite)}},
                               profile={"subset": "smoke", "suites": ["mixed"], "temperatures": [0.0], "seeds": [0]})
    code = regress(cfg, tmp_path / "run")
    assert code == 1  # before: exit 3, internal error "record 'long' has no stats.exit_layers ..."
    cand = json.loads((tmp_path / "run" / "summary.json").read_text())["candidates"]["ee"]
    assert cand["suites"]["mixed"]["exits"]["n"] == 2 and cand["exits"]["n"] == 2
    failed = {g["name"] for g in cand["gates"] if g["status"] == "fail"}
    assert {"errors", "baseline errors"} <= failed


def test_a_profile_that_selects_no_candidate_is_refused(tmp_path):
    """`candidates = []` in a profile ran the baseline alone, gated nothing and exited 0."""
    with pytest.raises(ConfigError, match=r"candidates = \[\] selects no candidate.*spec"):
        _config(tmp_path, SPEC, "[suites.f]\nmargin = 0.2", '["f"]', extra="candidates = []")


ASSISTED = """
[[candidates]]
name = "assisted"
decoder = "hf-assisted"
options = { draft = "tiny-llama" }
"""


def test_an_exact_candidate_with_only_speed_to_show_fails_coverage(tmp_path):
    """Sampled only (no identity at T=0, no tested distribution) and no quality margin: a faster
    candidate whose outputs nobody compared passed on its speed gate alone."""
    config = _config(tmp_path, ASSISTED.replace('name = "assisted"', 'name = "assisted"\nmin_speedup = 1.1'),
                     "[suites.f]", '["f"]', temperatures="[0.7]")
    suite = _suite("f", [f"q{i}" for i in range(8)])
    records = []
    for i in range(8):
        records.append(make_record(suite="f", suite_hash=suite.hash, item_id=f"q{i}", temperature=0.7,
                                   tokens=(1, 2, 3, 4), step_s=0.05))
        records.append(make_record(candidate="assisted", decoder="hf-assisted", suite="f", suite_hash=suite.hash,
                                   item_id=f"q{i}", temperature=0.7, tokens=(9, 8, 7, i), step_s=0.02 + 0.001 * i))  # speedups that vary, so a bound exists
    gates, passed = _gates(summarize(config, records, [suite]), "assisted", config)
    assert gates["speed"].status == "pass"  # the only gate that applied
    assert not passed and gates["coverage"].status == "fail"
    assert "no identity, exactness or quality gate" in gates["coverage"].detail


def test_identity_not_measured_is_no_metric_not_zero_divergences(tmp_path):
    """Every pair errored: the identity rate was left out of the MLflow metrics, but
    `<suite>.real_divergences.T=0` went in as 0, a clean number for a candidate that produced
    nothing (red-team finding)."""
    config = _config(tmp_path, SPEC, "[suites.f]\nmargin = 0.2", '["f"]')
    suite = _suite("f", ["a", "b"])
    records = [make_record(suite="f", suite_hash=suite.hash, item_id=i, passed=True) for i in ("a", "b")]
    records += [dict(_errored("spec", "speculative", suite, i), kind="exact") for i in ("a", "b")]
    cand = summarize(config, records, [suite])["candidates"]["spec"]
    assert cand["suites"]["f"]["identity"]["T=0"]["n"] == 0
    assert not [k for k in cand["metrics"] if ".identity." in k or ".real_divergences." in k]
    gates, passed = _gates({"candidates": {"spec": cand}}, "spec", config)
    assert not passed and gates["identity f T=0"].status == "fail"
