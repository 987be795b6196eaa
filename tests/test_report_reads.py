"""The report read cold (issue 61, `make regress-vllm` tried as a new user would): each suite row
said "pass" while the ALL row said "FAIL" (the failing gate was a run-level one, which no row
named), and a speedup's lower bound that means "none" printed as "(>= 0.00)"."""
from __future__ import annotations

from harness.verdict import report


def _gate(name: str, status: str) -> dict:
    return {"name": name, "status": status, "detail": f"{name} detail"}


def _summary(gates: list[dict], verdict: str, speedup: dict | None = None) -> dict:
    suite = {"identity": {"T=0": {"identical": 6, "n": 6, "near_ties": 0}}}
    return {"verdict": verdict, "candidates": {"spec": {
        "suites": {"factual": suite, "code": suite}, "gates": gates, "verdict": verdict,
        "speedup": speedup or {"statistic": 1.4, "lower_bound": 1.1, "lower_bound_level": 0.95, "n_prompts": 12}}}}


def test_a_run_level_failure_is_named_on_the_all_row_the_suite_rows_pass():
    gates = [_gate("identity factual", "pass"), _gate("identity code", "pass"), _gate("speed", "fail"),
             _gate("aa floor", "warn")]
    rows = report.verdict_rows(_summary(gates, "fail"))
    assert [r[-1] for r in rows if r[1] != "ALL"] == ["pass", "pass"]
    assert rows[-1][-1] == "FAIL (run-level fail: speed; warn: aa floor)"  # before: "FAIL", beside rows of "pass"
    md = report.markdown(_summary(gates, "fail"))
    assert "FAIL (run-level fail: speed; warn: aa floor)" in md
    passed = report.verdict_rows(_summary([_gate("identity factual", "pass"), _gate("aa floor", "warn")], "pass"))
    assert passed[-1][-1] == "PASS (warn: aa floor)"


def test_a_failing_suite_row_is_not_repeated_as_run_level():
    gates = [_gate("identity factual", "fail"), _gate("identity code", "pass")]
    rows = report.verdict_rows(_summary(gates, "fail"))
    assert rows[0][-1] == "fail" and rows[-1][-1] == "FAIL"


def test_a_speedup_bound_that_is_none_says_why_never_a_bare_zero():
    cases = [({"lower_bound": None, "n_prompts": 6}, "no bound: 6 prompts, 8 needed"),
             ({"lower_bound": 0.0, "n_prompts": 12}, "no bound: the interval over 12 prompts reaches 0; more prompts narrow it"),
             ({"lower_bound": None, "n_prompts": 40, "length_log_sd": 1.2, "length_log_sd_limit": 0.9},
              "no bound: output lengths too spread (log-sd 1.20 > 0.90 at 40 prompts)"),
             ({"lower_bound": 1.07, "n_prompts": 12}, ">= 1.07x")]
    for sp, words in cases:
        sp = {"statistic": 1.3, "lower_bound_level": 0.95, **sp}
        cell = report.verdict_rows(_summary([], "pass", sp))[-1][4]
        assert cell == f"1.30x ({words})", cell
        assert "(>= 0.00)" not in cell


def test_a_floor_plan_says_what_would_decide(tmp_path):
    """The plan printed "P(pass | correct) 0.368" before anything ran, with no word of what to do.
    With the exact rate test a correct candidate passes at any size; what a size lacks is power,
    and the plan names the size that would catch a doubled rate."""
    from harness.verdict import floor
    from tests.test_floor_margins import setup
    text = floor.plan_table(*setup(tmp_path))
    assert "P(pass | correct) 0.99" in text, text
    assert "about 373 would catch it with 0.8" in text, text


def test_the_aa_run_reads_as_the_floor_it_is_not_a_verdict():
    """`make regress-vllm`'s A/A row said "FLOOR" in the verdict column, a word a reader cannot
    tell from a failure."""
    s = _summary([], "floor")
    s["candidates"]["spec"]["role"] = "aa-floor"
    assert report.verdict_rows(s)[-1][-1] == "A/A floor, not judged"


def test_an_aa_run_that_broke_fails_the_run_and_says_so():
    """A hung A/A run left the report at "verdict: PASS" beside an exit code of 1 (its rows
    missing): the floor was never measured, and nothing may pass on a broken measurement."""
    from types import SimpleNamespace
    from harness.commands.regress import judge
    from harness.config import Gates
    hung = {"candidate": "base~aa", "suite": "*", "reason": "hung", "detail": "base~aa: hung on s/a (T=0, seed 0)"}
    summary = {"candidates": {"base~aa": {"role": "aa-floor", "suites": {}, "stopped": [hung]}}}
    judge(summary, SimpleNamespace(gates=Gates(), profile=SimpleNamespace(load=None)), None)
    assert summary["verdict"] == "fail"
    assert report.verdict_rows(summary)[-1][-1] == "A/A floor: BROKE"
    assert "FAIL  base~aa: hung on s/a" in report.table(summary)
    fine = {"candidates": {"base~aa": {"role": "aa-floor", "suites": {}, "stopped": []}}}
    judge(fine, SimpleNamespace(gates=Gates(), profile=SimpleNamespace(load=None)), None)
    assert fine["verdict"] == "pass" and report.verdict_rows(fine)[-1][-1] == "A/A floor, not judged"


def test_a_suite_speedup_without_a_bound_says_its_own_reason():
    """The suite's speedup from a timed subset (analysis.latency.suite_bounds) names why it has no
    bound; the report printed "no spread between the 10 prompts' speedups" over it."""
    why = "43% of the suite's baseline tokens are in prompts over 1.5x longer than any timed one"
    sp = {"statistic": 1.3, "lower_bound": None, "lower_bound_level": 0.95, "n_prompts": 10, "suite_prompts": 200,
          "no_bound": why}
    cell = report.verdict_rows(_summary([], "fail", sp))[-1][4]
    assert cell == f"1.30x (no bound: {why} (10 of the suite's 200 prompts timed))", cell
    assert "no spread" not in cell
