"""Grading that measures nothing must not pass (red-team round 12).

1. A broken sandbox (here: a timeout_s of Infinity that suite validation let through) failed every
   item on both sides alike, and two sides failing alike passed the non-inferiority test: now the
   limits are validated, a machinery failure is a grade with `error` set (not a wrong answer),
   and the quality gate of its suite is inconclusive.
2. An exact_match reference that normalised to "" ("A", "?") passed the empty completion; a blank
   `contains` reference passed anything.
3. normalize dropped signs and operators: "-4" matched "4", "x+1" matched "x-1".
4. `hf:` suites skipped the duplicate-id check; a config joined `hf:` onto its folder.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.calibration.synthetic import make_record
from harness.config import ConfigError, load_config
from harness.verdict.gate import decide
from harness.verdict.summary import summarize
from helpers import regress, write_regress_config
from suites import SuiteError
from suites.format import item_from_row, load_file, make_suite
from suites.graders import grade, normalize

SQUARE = {"entry_point": "square", "tests": "assert square(3) == 9\n"}
RIGHT = "def square(x):\n    return x * x\n"


def code_item(**options):
    return item_from_row({"id": "sq", "prompt": "q", "grader": "code", "grader_options": {**SQUARE, **options}})


def write_code_suite(path: Path, timeout: str) -> Path:
    header = {"suite": "t", "version": "1", "description": "d", "smoke": ["add"], "defaults": {"grader": "code"}}
    item = ('{"id": "add", "prompt": "p", "grader_options": {"entry_point": "add", '
            '"tests": "assert add(2, 3) == 5\\n", "timeout_s": %s}}' % timeout)
    path.write_text(json.dumps(header) + "\n" + item + "\n")
    return path


# --- 1a. the sandbox's limits are validated when the suite loads -------------------------------

@pytest.mark.parametrize("timeout", ["Infinity", "-Infinity", "NaN", "0", "-1", "601", "1e308", "1" + "0" * 400])
def test_a_code_timeout_that_is_not_a_finite_sane_number_is_refused_at_load(tmp_path, timeout):
    # before: Infinity and NaN (and 1e308) loaded, and every grade was "sandbox error: ..."
    with pytest.raises(SuiteError, match=r"timeout_s.*item 'add'.*finite number of seconds in \(0, 600\]"):
        load_file(write_code_suite(tmp_path / "t.jsonl", timeout))


@pytest.mark.parametrize("timeout", ["0.5", "10", "600"])
def test_a_sane_code_timeout_loads(tmp_path, timeout):
    suite = load_file(write_code_suite(tmp_path / "t.jsonl", timeout))
    assert suite.items[0].grader_options["timeout_s"] == float(timeout)


@pytest.mark.parametrize("field, value", [("timeout_s", float("inf")), ("timeout_s", float("nan")),
                                          ("timeout_s", 0), ("cpu_s", float("inf")), ("memory_mb", 0),
                                          ("threads", 1.5)])
def test_sandbox_limits_refuse_values_that_would_break_every_run(field, value):
    from suites.sandbox import SandboxLimits
    with pytest.raises(ValueError, match=f"SandboxLimits.{field}"):
        SandboxLimits(**{field: value})


# --- 1b. a machinery failure is a grade error, not a wrong answer -----------------------------

def test_a_sandbox_that_cannot_start_is_a_grade_error(monkeypatch):
    import suites.sandbox.parent as parent

    def no_pipes(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(parent, "_run", no_pipes)
    g = grade(code_item(), RIGHT)
    assert (g.passed, g.score) == (False, 0.0)
    assert g.error and g.error.startswith("sandbox error") and "Too many open files" in g.error
    assert g.detail.startswith("sandbox error")


def test_a_graders_own_exception_is_a_grade_error(monkeypatch):
    import suites.graders as graders

    def broken(*args, **kwargs):
        raise RuntimeError("the grader broke")

    monkeypatch.setitem(graders.GRADERS, "exact_match", graders.GraderSpec(broken, graders.OPTIONS["exact_match"]))
    g = grade(item_from_row({"id": "q", "prompt": "p", "references": ["Paris"], "grader": "exact_match"}), "Paris")
    assert g.passed is False and g.error == "grader error: RuntimeError: the grader broke"


@pytest.mark.parametrize("completion, reason", [
    ("def square(x):\n    return x + x\n", "failed"),
    ("def square(x)\n    return x\n", "error"),
    ("raise RuntimeError('sandbox error: the sandbox did not start')\n", "error"),
    ("import sys\nsys.stderr.write('sandbox error: x\\n')\nraise SystemExit('sandbox error: x')\n", "error"),
    ("import os\nos._exit(0)\n", "error"),
    ("def square(x):\n    while True:\n        pass\n", "timeout"),
])
def test_a_completion_cannot_make_its_own_failure_a_grade_error(completion, reason):
    """What the code does (fail, crash, exit, hang, print or raise "sandbox error") is a wrong
    answer: a grade error would only make the suite inconclusive (a fail by default), but it must
    not be the completion's to claim."""
    g = grade(code_item(timeout_s=2.0), completion)
    assert g.passed is False and g.error is None, g
    assert g.detail.startswith(reason) and not g.detail.startswith("sandbox error"), g


# --- 1c. the quality gate of a suite with grade errors is inconclusive ------------------------

LOSSY = """
target = "tiny-llama"
[baseline]
name = "baseline"
decoder = "standard"
[[candidates]]
name = "ee"
decoder = "early-exit"
kind = "lossy"
options = { threshold = 0.5 }
[suites.code]
margin = 0.1
[profiles.smoke]
subset = "full"
suites = ["code"]
temperatures = [0.0]
seeds = [0]
"""


EXITS = {"exit_layers": [1, 2, 2, 2], "num_layers": 2, "lm_head_evals": 6}


def _summary(tmp_path, rows, inconclusive="fail"):
    cfg = tmp_path / "regress.toml"
    cfg.write_text(LOSSY + f'[gates]\ninconclusive = "{inconclusive}"\n')
    config = load_config(cfg, "smoke")
    items = [item_from_row({"id": f"c{i}", "prompt": "p", "grader": "code", "grader_options": SQUARE})
             for i in range(len(rows) // 2)]
    suite = make_suite(name="code", version="1", description="d", items=items, smoke_ids=["c0"], source="<t>")
    records = []
    for (cand, dec), row in zip([("baseline", "standard"), ("ee", "early-exit")] * (len(rows) // 2), rows):
        extra = {k: row[k] for k in ("grade_detail", "grade_error") if k in row}
        records.append({**make_record(candidate=cand, decoder=dec, suite="code", suite_hash=suite.hash,
                                      item_id=row["item_id"], passed=row["passed"], score=row["score"],
                                      stats=EXITS if dec == "early-exit" else None), **extra})
    summary = summarize(config, records, [suite])
    d = decide(summary["candidates"]["ee"], config.gates)
    return summary, {r.name: r for r in d.results}, d.passed


def _rows(n, baseline, candidate):
    out = []
    for i in range(n):
        out += [dict(item_id=f"c{i}", **baseline), dict(item_id=f"c{i}", **candidate)]
    return out


BROKEN = {"passed": False, "score": 0.0, "grade_detail": "sandbox error: OSError: no pipes",
          "grade_error": "sandbox error: OSError: no pipes"}


def test_every_grade_a_machinery_failure_is_inconclusive_not_non_inferior(tmp_path):
    summary, gates, passed = _summary(tmp_path, _rows(40, BROKEN, BROKEN))
    s = summary["candidates"]["ee"]["suites"]["code"]
    assert s["grade_errors"]["n"] == 80 and s["grade_errors"]["baseline"] == 40
    assert s["quality"]["non_inferiority"]["passed"]  # the test alone: two sides failing alike
    q = gates["quality code"]
    assert not passed and q.status == "fail"  # before: pass, "non-inferior"
    assert q.detail.startswith("inconclusive: 80 grade(s) measured nothing")
    assert "first: baseline c0: sandbox error: OSError: no pipes" in q.detail


def test_grade_errors_are_inconclusive_even_where_inconclusive_only_warns(tmp_path):
    _, gates, _ = _summary(tmp_path, _rows(40, BROKEN, BROKEN), inconclusive="warn")
    assert gates["quality code"].status == "warn"  # never "pass"


def test_one_baseline_grade_error_makes_the_suite_inconclusive(tmp_path):
    ok = {"passed": True, "score": 1.0, "grade_detail": "passed"}
    rows = _rows(40, ok, ok)
    rows[0] = dict(item_id="c0", **BROKEN)
    _, gates, passed = _summary(tmp_path, rows)
    assert not passed and gates["quality code"].status == "fail"
    assert "1 grade(s) measured nothing" in gates["quality code"].detail
    assert "(1 baseline, 0 candidate row(s))" in gates["quality code"].detail


def test_records_from_before_the_grade_error_field_are_recognised(tmp_path):
    legacy = {"passed": False, "score": 0.0, "grade_detail": "sandbox error: ValueError: cannot convert float NaN"}
    _, gates, passed = _summary(tmp_path, _rows(40, legacy, legacy))
    assert not passed and gates["quality code"].detail.startswith("inconclusive: 80 grade(s)")


def test_a_real_loss_with_grade_errors_stays_a_fail(tmp_path):
    ok = {"passed": True, "score": 1.0, "grade_detail": "passed"}
    wrong = {"passed": False, "score": 0.0, "grade_detail": "failed: AssertionError"}
    rows = _rows(40, ok, wrong)
    rows[1] = dict(item_id="c0", **BROKEN)
    _, gates, passed = _summary(tmp_path, rows)
    assert not passed and gates["quality code"].status == "fail"
    assert gates["quality code"].detail.startswith("worse") and "measured nothing" in gates["quality code"].detail


def test_regress_with_a_broken_sandbox_does_not_pass_a_wrecked_lossy_candidate(tmp_path, monkeypatch):
    """End to end (the red team's f3, small): the sandbox cannot start, so every code grade on
    both sides is a fail; the early-exit candidate at threshold 0 (which wrecks its outputs)
    passed the quality gate, and the run passed."""
    import suites.sandbox.parent as parent

    def no_pipes(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(parent, "_run", no_pipes)
    rows = [{"suite": "code6", "version": "1", "description": "d", "smoke": [f"c{i}" for i in range(6)],
             "defaults": {"grader": "code", "max_new_tokens": 4, "stop": []}}]
    rows += [{"id": f"c{i}", "prompt": f"Write add{i}(a, b)",
              "grader_options": {"entry_point": "add", "tests": "assert add(2, 3) == 5\n"}} for i in range(6)]
    suite = tmp_path / "code6.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_regress_config(tmp_path / "regress.toml", candidates="""
[[candidates]]
name = "ee-0"
decoder = "early-exit"
kind = "lossy"
options = { threshold = 0.0 }
""", suites={"code6": {"margin": 0.5, "path": str(suite)}},
                               profile={"subset": "smoke", "suites": ["code6"], "temperatures": [0.0], "seeds": [0]})
    code = regress(cfg, tmp_path / "run")
    assert code == 1  # before: 0, verdict PASS
    cand = json.loads((tmp_path / "run" / "summary.json").read_text())["candidates"]["ee-0"]
    quality = next(g for g in cand["gates"] if g["name"] == "quality code6")
    assert quality["status"] == "fail" and quality["detail"].startswith("inconclusive: 12 grade(s) measured nothing")
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 12 and all(r["grade_error"].startswith("sandbox error") for r in records)


# --- 2. a reference that normalises to nothing ------------------------------------------------

@pytest.mark.parametrize("ref", ["?", "  ", "...", "!?", "\u00a0"])
def test_an_exact_match_reference_that_normalises_to_nothing_is_refused(ref):
    with pytest.raises(SuiteError, match=r"references\[0\].*item 'q'.*normalises to nothing"):
        item_from_row({"id": "q", "prompt": "p", "references": [ref], "grader": "exact_match"})


def test_a_blank_contains_reference_is_refused():
    with pytest.raises(SuiteError, match=r"references\[1\].*item 'q'.*blank"):
        item_from_row({"id": "q", "prompt": "p", "references": ["red", " \t "], "grader": "contains"})


@pytest.mark.parametrize("ref", ["A", "a", "The", "An"])
def test_an_article_reference_keeps_its_letter(ref):
    item = item_from_row({"id": "q", "prompt": "Which option? A, B, C or D", "references": [ref],
                          "grader": "exact_match"})
    assert normalize(ref) == ref.lower()
    assert grade(item, "").passed is False  # before: True
    assert grade(item, "I do not know").passed is False
    # "a" inside a sentence is an article, even beside a formula: no pass for a wrong choice.
    assert grade(item, "I have a dog.").passed is False
    assert grade(item, "Since x + 1 = 3, x is 2: a simple problem. The answer is B.").passed is False
    for answer in (ref, f"({ref})", f"{ref}.", f" {ref.upper()} "):
        assert grade(item, answer).passed, answer


def test_a_formula_reference_keeps_its_variables():
    item = item_from_row({"id": "q", "prompt": "p", "references": ["a < b"], "grader": "exact_match"})
    assert normalize("a < b") == "a < b"
    assert grade(item, "So a < b.").passed
    assert not grade(item, "So x < b.").passed and not grade(item, "a > b").passed


def test_graders_never_pass_on_an_empty_reference_built_past_validation():
    exact = item_from_row({"id": "q", "prompt": "p", "references": ["x"], "grader": "exact_match"})
    exact = dataclasses.replace(exact, references=("?",))
    assert grade(exact, "").passed is False and grade(exact, "?").passed is False
    contains = item_from_row({"id": "q", "prompt": "p", "references": ["x"], "grader": "contains"})
    contains = dataclasses.replace(contains, references=("  ",))
    assert grade(contains, "anything").passed is False  # before: True
    both = dataclasses.replace(contains, references=("red", "  "), grader_options={"all": True})
    assert grade(both, "red").passed is False


# --- 3. signs and operators are part of the answer --------------------------------------------

@pytest.mark.parametrize("ref, answer", [
    ("-4", "4"), ("4", "-4"), ("\u22124", "4"), ("6", "The answer is -6."), ("0.5", "-0.5"),
    ("-1,000", "1000"), ("x+1", "x-1"), ("a < b", "a > b"), ("C++", "C"), ("x^2", "x*2"),
    ("a != b", "a = b"), ("x <= 1", "x = 1"), ("50%", "50"), ("1/2", "12"),
])
@pytest.mark.parametrize("contains", [False, True])
def test_a_sign_or_operator_changes_the_answer(ref, answer, contains):
    item = item_from_row({"id": "q", "prompt": "p", "references": [ref], "grader": "exact_match",
                          "grader_options": {"contains": contains}})
    assert grade(item, answer).passed is False, (normalize(ref), normalize(answer))


@pytest.mark.parametrize("ref, answer", [
    ("-4", "\u22124"), ("-4", "**-4**"), ("x+1", "x + 1"),
    ("x \u2264 1", "x <= 1"), ("2 \u00d7 3", "2*3"), ("-1,000", "-1000"), ("Paris", "**Paris**"),
    ("Paris", "- Paris"), ("Jean-Paul Sartre", "Jean Paul Sartre"), ("3.14", "3.14."), ("C++", "c++"),
])
def test_the_same_answer_written_differently_still_matches(ref, answer):
    item = item_from_row({"id": "q", "prompt": "p", "references": [ref], "grader": "exact_match",
                          "grader_options": {"contains": False}})
    assert grade(item, answer).passed, (normalize(ref), normalize(answer))


def test_a_signed_number_is_found_in_a_sentence():
    item = item_from_row({"id": "q", "prompt": "p", "references": ["-4"], "grader": "exact_match"})
    assert grade(item, "The answer is -4.").passed and grade(item, "So x = -4").passed
    assert not grade(item, "The answer is 4.").passed and not grade(item, "x = 3-4").passed


# --- 4. hf: suites ------------------------------------------------------------------------------

def test_an_hf_suite_with_a_repeated_id_is_refused(tmp_path):
    from suites.registry import load_suite
    folder = tmp_path / "dup"
    folder.mkdir()
    rows = [{"id": f"q{i}", "prompt": f"Q{i}?", "references": ["x"]} for i in range(3)]
    rows.append({"id": "q1", "prompt": "another question", "references": ["y"]})
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SuiteError, match=r"line 4|:4:") as info:  # before: loaded, two items 'q1'
        load_suite(f"hf:{folder}@train")
    assert "duplicate id 'q1' (first on row 2)" in str(info.value)


def test_make_suite_refuses_a_repeated_id():
    items = [item_from_row({"id": i, "prompt": "p", "references": ["x"], "grader": "contains"}) for i in "aba"]
    with pytest.raises(SuiteError, match="duplicate id 'a'"):
        make_suite(name="s", version="1", description="d", items=items, smoke_ids=["a"], source="<t>")


def test_an_hf_suite_path_in_a_config_is_not_joined_onto_its_folder(tmp_path):
    cfg = tmp_path / "cfg" / "regress.toml"
    cfg.parent.mkdir()
    body = LOSSY.replace("[suites.code]\nmargin = 0.1\n", '[suites.code]\nmargin = 0.1\npath = "hf:/x/data@train"\n'
                         '[suites.mine]\npath = "mine.jsonl"\n')
    cfg.write_text(body)
    config = load_config(cfg, "smoke")
    assert config.suites["code"].path == "hf:/x/data@train"  # before: "<cfg folder>/hf:/x/data@train"
    assert config.suites["mine"].path == str(cfg.parent / "mine.jsonl")


@pytest.mark.parametrize("value", ["5", "''", "[\"a.jsonl\"]"])
def test_a_suite_path_that_is_not_a_string_is_refused(tmp_path, value):
    cfg = tmp_path / "regress.toml"
    cfg.write_text(LOSSY.replace("[suites.code]\nmargin = 0.1\n", f"[suites.code]\nmargin = 0.1\npath = {value}\n"))
    with pytest.raises(ConfigError, match=r"\[suites.code\]: path must be a non-empty string"):
        load_config(cfg, "smoke")
