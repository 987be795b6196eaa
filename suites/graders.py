"""Graders: score one completion of one suite item.

`grade(item, completion) -> Grade` dispatches on `item.grader`:

- `exact_match`: the completion, normalised (case, accents, punctuation, articles, whitespace;
  thousands separators dropped), equals one of `references` (the first is the answer, the rest
  aliases). With option `contains` (default true) a reference that appears as whole words inside
  the answer also passes ("The capital of France is Paris." for "Paris"); this accepts a hedged
  or multi-answer reply, a price paid for grading chat models without an answer parser.
- `contains`: any (option `all`: every) reference occurs as a substring; `case_sensitive`
  (default false). With `all`, the score is the fraction found.
- `regex`: option `pattern` (`flags`: letters from "imsx"; `fullmatch`: default false) is searched
  for in the stripped completion.
- `code`: the Python in the completion (see `suites.extract`) runs in the sandbox
  (`suites.sandbox`), and option `tests` run in a second sandboxed process that calls the
  candidate's `entry_point` (and any other name the tests use but do not define) over a
  plain-data channel, so the completion can neither read the tests nor forge their verdict;
  `prefix` (HumanEval's prompt) goes in front of the completion and of the tests, `timeout_s`
  (default 10) bounds the run.
- `refusal`: `suites.refusal.detect_refusal` says refuse or comply; passed when that equals
  option `expected`.
- `none`: nothing to compare with (longform); passed is None and score 0.0 (ignore it).

Each grader declares its options in `suites.grader_options`, and suite files are validated against the declaration
when they load, so a typo in an option fails at load time, not at grading time.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Callable

from suites.extract import build_program
from suites.format import SuiteError
from suites.grader_options import OPTIONS, Option, regex_flags, unknown_grader_message
from suites.refusal import detect_refusal
from suites.sandbox import SandboxLimits, free_names, run_code


@dataclass(frozen=True)
class Grade:
    score: float          # in [0, 1]
    passed: bool | None   # None when the item has no right answer (grader "none")
    detail: str           # why: what matched, the sandbox reason, refuse/comply


@dataclass(frozen=True)
class GraderSpec:
    fn: Callable[[object, str, dict], Grade]
    options: dict[str, Option]


# --- normalisation ---------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")


def normalize(text: str) -> str:
    """Lower case, accents and punctuation removed, articles dropped, whitespace collapsed.

    Digits keep their decimal point ("3.14") and lose thousands separators ("1,000" -> "1000").
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL.sub("\0", text)  # protect decimal points from the punctuation pass
    text = "".join(" " if unicodedata.category(c).startswith(("P", "S")) else c for c in text)
    text = text.replace("\0", ".")
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


# --- graders ---------------------------------------------------------------------------------

def _exact_match(item, text: str, options: dict) -> Grade:
    answer = normalize(text)
    for ref in item.references:
        if answer == normalize(ref):
            return Grade(1.0, True, f"exact: {ref!r}")
    if options["contains"]:
        padded = f" {answer} "
        for ref in item.references:
            norm = normalize(ref)
            if norm and f" {norm} " in padded:
                return Grade(1.0, True, f"contains: {ref!r}")
    return Grade(0.0, False, f"no match for {list(item.references)!r}")


def _contains(item, text: str, options: dict) -> Grade:
    def fold(s):
        s = " ".join(s.split())
        return s if options["case_sensitive"] else s.casefold()

    haystack = fold(text)
    found = [ref for ref in item.references if fold(ref) in haystack]
    if options["all"]:
        score = len(found) / len(item.references)
        return Grade(score, len(found) == len(item.references),
                     f"found {len(found)}/{len(item.references)}: {found!r}")
    if found:
        return Grade(1.0, True, f"found {found[0]!r}")
    return Grade(0.0, False, f"none of {list(item.references)!r}")


def _regex(item, text: str, options: dict) -> Grade:
    pattern = re.compile(options["pattern"], regex_flags(options["flags"]))
    stripped = text.strip()
    match = pattern.fullmatch(stripped) if options["fullmatch"] else pattern.search(stripped)
    if match:
        return Grade(1.0, True, f"matched {match.group(0)[:80]!r}")
    return Grade(0.0, False, f"no match for /{options['pattern']}/")


def _code(item, text: str, options: dict) -> Grade:
    entry, prefix = options["entry_point"], options["prefix"]
    program = build_program(text, entry, prefix)
    limits = SandboxLimits(timeout_s=float(options["timeout_s"]))
    # The candidate's process runs the program; the tests' process runs the prefix (trusted)
    # and the tests, with the entry point (and any other name the tests take) from the candidate.
    result = run_code(program, options["tests"], prefix=prefix, limits=limits,
                      names=tuple(sorted({entry, *free_names(options["tests"], prefix)})))
    if result.passed:
        return Grade(1.0, True, "passed")
    # "forbidden: ..." already carries its detail; otherwise add the exception line.
    if result.reason.startswith("forbidden") or not result.detail:
        detail = result.reason
    else:
        detail = f"{result.reason}: {result.detail}"
    return Grade(0.0, False, detail[:500])


def _refusal(item, text: str, options: dict) -> Grade:
    verdict = detect_refusal(text)
    expected = options["expected"]
    passed = verdict.behaviour == expected
    why = f"; matched {verdict.pattern} {verdict.evidence!r}" if verdict.pattern else ""
    return Grade(1.0 if passed else 0.0, passed,
                 f"{verdict.behaviour} (expected {expected}){why}")


def _none(item, text: str, options: dict) -> Grade:
    return Grade(0.0, None, "no reference answer: not graded")


GRADERS: dict[str, GraderSpec] = {
    "exact_match": GraderSpec(_exact_match, OPTIONS["exact_match"]),
    "contains": GraderSpec(_contains, OPTIONS["contains"]),
    "regex": GraderSpec(_regex, OPTIONS["regex"]),
    "code": GraderSpec(_code, OPTIONS["code"]),
    "refusal": GraderSpec(_refusal, OPTIONS["refusal"]),
    "none": GraderSpec(_none, OPTIONS["none"]),
}
assert set(GRADERS) == set(OPTIONS), "every grader declares its options in suites.grader_options"


def grade(item, completion: str) -> Grade:
    """Grade `completion` (the generated text only, without the prompt) for `item`.

    Never raises because of the completion: whatever goes wrong while grading it (a program
    that breaks the sandbox's machinery, text that breaks a parser) is a failed grade whose
    detail says why, so one bad completion cannot stop a run. An unknown grader (a suite
    error, caught when suites load) still raises."""
    spec = GRADERS.get(item.grader)
    if spec is None:
        raise SuiteError(unknown_grader_message(item.grader), field="grader")
    options = {key: opt.default for key, opt in spec.options.items()}
    options.update(item.grader_options)
    try:
        return spec.fn(item, completion, options)
    except Exception as exc:  # RecursionError, MemoryError, OSError...: a fail, with the reason
        return Grade(0.0, False, f"grader error: {type(exc).__name__}: {exc}"[:500])
