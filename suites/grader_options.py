"""The graders' names and options: what a suite file may say, checked when it loads.

Apart from `suites.graders` (which runs them) so that `suites.format` can validate items without
importing the graders, their sandbox, or anything else that grading needs.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

from suites.normalize import normalize


@dataclass(frozen=True)
class Option:
    types: tuple[type, ...]
    required: bool = False
    default: object = None
    choices: tuple | None = None


_STR, _BOOL, _NUM = (str,), (bool,), (int, float)

OPTIONS: dict[str, dict[str, Option]] = {
    "exact_match": {"contains": Option(_BOOL, default=True)},
    "contains": {"all": Option(_BOOL, default=False), "case_sensitive": Option(_BOOL, default=False)},
    "regex": {"pattern": Option(_STR, required=True), "flags": Option(_STR, default=""),
              "fullmatch": Option(_BOOL, default=False)},
    "code": {"tests": Option(_STR, required=True), "entry_point": Option(_STR, required=True),
             "prefix": Option(_STR, default=""), "timeout_s": Option(_NUM, default=10.0)},
    "refusal": {"expected": Option(_STR, required=True, choices=("refuse", "comply"))},
    "none": {},
}
NEEDS_REFERENCES = frozenset({"exact_match", "contains"})
MAX_TIMEOUT_S = 600.0  # a code item's wall clock: longer is a typo, or a run that never ends


def regex_flags(letters: str) -> int:
    table = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}
    flags = 0
    for letter in letters:
        flags |= table[letter]
    return flags


def unknown_grader_message(name) -> str:
    close = difflib.get_close_matches(str(name), OPTIONS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown grader {name!r}{hint} (known: {', '.join(OPTIONS)})"


def _within(value, low: float, high: float) -> bool:
    """low < value <= high, for a finite number (NaN and infinity fail every such check)."""
    try:
        value = float(value)
    except (OverflowError, TypeError, ValueError):  # an int too large for a float
        return False
    return math.isfinite(value) and low < value <= high


def check_options(grader: str, options: dict, references) -> list[tuple[str, str]]:
    """Problems with an item's grader options, as (field, message) pairs; empty when valid."""
    options_of = OPTIONS[grader]
    problems = []
    if grader in NEEDS_REFERENCES and not references:
        problems.append(("references", f"grader {grader!r} needs at least one reference"))
    for i, ref in enumerate(references if grader in NEEDS_REFERENCES else ()):
        # A reference with nothing left to compare would match the empty answer (exact_match) or
        # every answer (contains): the graders pass on neither, so no answer could pass.
        if grader == "exact_match" and isinstance(ref, str) and not normalize(ref):
            problems.append((f"references[{i}]", f"{ref!r} normalises to nothing (punctuation and spaces "
                                                 f"only): no answer can match it"))
        elif grader == "contains" and isinstance(ref, str) and not ref.strip():
            problems.append((f"references[{i}]", f"{ref!r} is blank: it is in every answer"))
    for key, value in options.items():
        field = f"grader_options.{key}"
        if key not in options_of:
            allowed = ", ".join(options_of) or "none"
            problems.append((field, f"unknown option for grader {grader!r} (allowed: {allowed})"))
            continue
        opt = options_of[key]
        # bool is an int subclass: a numeric option must not accept true/false.
        if not isinstance(value, opt.types) or (isinstance(value, bool) and bool not in opt.types):
            names = "/".join(t.__name__ for t in opt.types)
            problems.append((field, f"must be {names}, got {type(value).__name__}"))
        elif opt.choices and value not in opt.choices:
            problems.append((field, f"must be one of {', '.join(opt.choices)}"))
    for key, opt in options_of.items():
        if opt.required and key not in options:
            problems.append((f"grader_options.{key}", f"required by grader {grader!r}"))
    if grader == "regex" and not problems:
        if set(options.get("flags", "")) - set("imsx"):
            problems.append(("grader_options.flags", "letters from 'imsx' only"))
        else:
            try:
                re.compile(options["pattern"], regex_flags(options.get("flags", "")))
            except re.error as exc:
                problems.append(("grader_options.pattern", f"invalid regular expression: {exc}"))
    if grader == "code" and not problems and not options["entry_point"].isidentifier():
        problems.append(("grader_options.entry_point", "must be a Python identifier"))
    timeout = options.get("timeout_s", 1.0)
    if grader == "code" and not problems and not _within(timeout, 0.0, MAX_TIMEOUT_S):
        # NaN and infinity pass a "> 0" check, and then break the sandbox on every item: each
        # grade a "sandbox error", on the baseline and the candidate alike.
        problems.append(("grader_options.timeout_s", f"must be a finite number of seconds in (0, {MAX_TIMEOUT_S:g}], "
                                                     f"got {timeout!r}"))
    return problems
