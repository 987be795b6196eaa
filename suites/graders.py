"""Graders: score one completion of one suite item.

`grade(item, completion) -> Grade` dispatches on `item.grader`:

- `exact_match`: the completion, normalised (`suites.normalize`: case, accents, punctuation,
  articles, whitespace; thousands separators dropped; a number's sign and decimal point and the
  math symbols + - < > ^ = % * / kept), equals one of `references` (the first is the answer, the
  rest aliases). With option `contains` (default true) a reference that appears as whole words
  inside the answer also passes ("The capital of France is Paris." for "Paris"); this accepts a
  hedged or multi-answer reply, a price paid for grading chat models without an answer parser.
  A reference that is an article ("A", a multiple-choice letter) keeps it, so it matches "A",
  "(A)" or "A." but not "The answer is A." (where "a" is an article): use `regex` for those.
  A reference that normalises to nothing ("?") is refused when the suite loads, and an empty
  answer never passes.
- `contains`: any (option `all`: every) reference occurs as a substring; `case_sensitive`
  (default false). With `all`, the score is the fraction found. A blank reference is refused.
- `regex`: option `pattern` (`flags`: letters from "imsx"; `fullmatch`: default false) is searched
  for in the stripped completion.
- `code`: the Python in the completion (see `suites.extract`) runs in the sandbox
  (`suites.sandbox`), and option `tests` run in a second sandboxed process that calls the
  candidate's `entry_point` (and any other name the tests use but do not define) over a
  plain-data channel, so the completion can neither read the tests nor forge their verdict;
  `prefix` (HumanEval's prompt) goes in front of the completion and of the tests, `timeout_s`
  (default 10; a finite number of seconds in (0, 600]) bounds the run. A failure of the
  sandbox's own machinery ("sandbox error: ...") is a grade with `error` set, not a wrong answer.
- `refusal`: `suites.refusal.detect_refusal` says refuse or comply; passed when that equals
  option `expected`.
- `none`: nothing to compare with (longform); passed is None and score 0.0 (ignore it).

Each grader declares its options in `suites.grader_options`, and suite files are validated against the declaration
when they load, so a typo in an option fails at load time, not at grading time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from suites.extract import build_program
from suites.format import SuiteError
from suites.grader_options import OPTIONS, Option, regex_flags, unknown_grader_message
from suites.normalize import drop_articles, is_formula, normalize, tokens
from suites.refusal import detect_refusal
from suites.sandbox import SandboxLimits, free_names, run_code


@dataclass(frozen=True)
class Grade:
    score: float          # in [0, 1]
    passed: bool | None   # None when the item has no right answer (grader "none")
    detail: str           # why: what matched, the sandbox reason, refuse/comply
    # Set when the grading machinery failed (the sandbox could not be set up or started, a
    # grader raised): the grade (a fail) then measures nothing about the completion, and the
    # quality gate of its suite is inconclusive. A completion that fails, errs, times out or
    # breaks a limit is an ordinary wrong answer, with no error.
    error: str | None = None


@dataclass(frozen=True)
class GraderSpec:
    fn: Callable[[object, str, dict], Grade]
    options: dict[str, Option]


# --- graders ---------------------------------------------------------------------------------

def _exact_match(item, text: str, options: dict) -> Grade:
    found = tokens(text)
    # The answer as each reference is compared with it: without articles, or, for a formula
    # reference ("a < b", where "a" is a variable), with them.
    answers = {False: " ".join(drop_articles(found)), True: " ".join(found)}
    # A reference that normalises to nothing ("?") matches nothing, not the empty answer (suite
    # validation refuses it; this holds for items built any other way).
    refs = [(ref, norm, is_formula(norm.split())) for ref in item.references if (norm := normalize(ref))]
    if found:
        for ref, norm, formula in refs:
            if answers[formula] == norm:
                return Grade(1.0, True, f"exact: {ref!r}")
        if options["contains"]:
            for ref, norm, formula in refs:
                if f" {norm} " in f" {answers[formula]} ":
                    return Grade(1.0, True, f"contains: {ref!r}")
    return Grade(0.0, False, f"no match for {list(item.references)!r}")


def _contains(item, text: str, options: dict) -> Grade:
    def fold(s):
        s = " ".join(s.split())
        return s if options["case_sensitive"] else s.casefold()

    haystack = fold(text)
    # A blank reference is found in every text: it finds nothing (suite validation refuses it).
    found = [ref for ref in item.references if fold(ref) and fold(ref) in haystack]
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
    # "sandbox error": the machinery failed (the sandbox could not be set up or did not start,
    # or its host side raised), not the code: the fail says nothing about the answer.
    error = detail[:500] if result.reason.startswith("sandbox error") else None
    return Grade(0.0, False, detail[:500], error=error)


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
    detail says why, so one bad completion cannot stop a run. Where the grading machinery
    itself failed (the sandbox, a grader's own exception), the grade's `error` says so: that
    fail is no evidence about the completion, and the quality gate treats it as missing
    evidence (harness.verdict.gate). An unknown grader (a suite error, caught when suites load)
    still raises."""
    spec = GRADERS.get(item.grader)
    if spec is None:
        raise SuiteError(unknown_grader_message(item.grader), field="grader")
    options = {key: opt.default for key, opt in spec.options.items()}
    options.update(item.grader_options)
    try:
        return spec.fn(item, completion, options)
    except Exception as exc:  # RecursionError, MemoryError, OSError...: a fail, with the reason
        detail = f"grader error: {type(exc).__name__}: {exc}"[:500]
        return Grade(0.0, False, detail, error=detail)
