"""The text normalisation of the `exact_match` grader, apart from `suites.graders` so that suite
validation (`suites.grader_options`) can refuse a reference that normalises to nothing without
importing the graders and their sandbox.

`normalize(text)`: lower case, accents removed, punctuation removed, articles dropped, whitespace
collapsed; what carries meaning in a short answer is kept:
- numbers keep their decimal point ("3.14"), lose thousands separators ("1,000" -> "1000"), and
  keep a leading sign ("-4", "+4"; the Unicode minus is "-"), so "-4" is not "4" and "-6" does
  not contain "6";
- the math symbols + - < > ^ = % * / (and != ; Unicode's − ≤ ≥ ≠ × ÷ are written with them) stay,
  each a token of its own, so "x+1" is not "x-1", "a < b" is not "a > b" and "C++" is not "C";
  but a hyphen inside a word ("Jean-Paul" is "jean paul"), a list bullet at the start of a line
  ("- Paris", "* Paris") and Markdown emphasis ("**Paris**") are punctuation;
- articles (a, an, the) are dropped, except where that would leave nothing ("A", a
  multiple-choice letter, stays "a") and in a formula, a text with a math symbol ("a < b"; the
  exact_match grader then compares the answer with its articles too, so "x < b" does not contain
  "a < b", while "I have a dog" still does not contain the reference "A").
A text of punctuation and spaces only ("?", "  ") normalises to "": the graders never pass on it,
and suite validation refuses such a reference.
"""
from __future__ import annotations

import re
import unicodedata

ARTICLES = frozenset({"a", "an", "the"})
OPERATORS = frozenset("+-<>^=%*/")
_CANONICAL = str.maketrans({"\u2212": "-", "\u2264": "<=", "\u2265": ">=", "\u2260": "!=", "\u00d7": "*",
                            "\u00f7": "/"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
# A sign that belongs to the number after it: not after a word or a closing bracket ("x-1" and
# "f(x)-1" are subtractions).
_SIGN = re.compile(r"(?<![\w)\]}])([+-])(?=\d)")
_BULLET = re.compile(r"(?m)^([ \t]*)[-*](?=\s)")
_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")
_STARS = re.compile(r"\*+")
# Placeholders, set before the punctuation pass and restored after it.
_POINT, _MINUS, _PLUS, _NOT_EQUAL = "\x00", "\x01", "\x02", "\x03"
_RESTORE = str.maketrans({_POINT: ".", _MINUS: "-", _PLUS: "+", _NOT_EQUAL: "!="})
_OPERAND = frozenset("()[]{}" + _POINT + _MINUS + _PLUS)


def _stars(match: re.Match) -> str:
    """A run of '*' is multiplication (or a power) between two operands ("x*2", "(a)**2") or
    between two spaces ("2 * 3"); anything else ("**Paris**", "*Paris*.") is Markdown emphasis."""
    text, start, end = match.string, match.start(), match.end()
    before, after = text[start - 1] if start else "", text[end] if end < len(text) else ""

    def operand(c):
        return c.isalnum() or c in _OPERAND

    if (operand(before) and operand(after)) or (before.isspace() and after.isspace()):
        return match.group(0)
    return " "


def normalize(text: str) -> str:
    """`text` as the exact_match grader compares it (see the module docstring)."""
    found = tokens(text)
    return " ".join(found if is_formula(found) else drop_articles(found))


def is_formula(found: list[str]) -> bool:
    """Whether these tokens have a math symbol: then "a" is a variable, not an article."""
    return any(t in OPERATORS or t == "!=" for t in found)


def drop_articles(found: list[str]) -> list[str]:
    """The tokens without articles, unless that would leave nothing ("A" stays "a")."""
    return [t for t in found if t not in ARTICLES] or found


def tokens(text: str) -> list[str]:
    """`text` normalised, as a list of tokens, articles kept."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower().translate(_CANONICAL)
    # Control characters are nothing to compare (and the placeholders below are four of them).
    text = "".join(" " if unicodedata.category(c) == "Cc" and not c.isspace() else c for c in text)
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL.sub(_POINT, text)  # protect decimal points from the punctuation pass
    text = _SIGN.sub(lambda m: _MINUS if m.group(1) == "-" else _PLUS, text)
    text = _BULLET.sub(r"\1 ", text)
    text = _HYPHEN.sub(" ", text)
    text = _STARS.sub(_stars, text)
    text = text.replace("!=", _NOT_EQUAL)
    out = []
    for c in text:
        if c in OPERATORS or c == _NOT_EQUAL:
            out.append(f" {c} ")
        elif unicodedata.category(c).startswith(("P", "S")):
            out.append(" ")
        else:
            out.append(c)
    return "".join(out).translate(_RESTORE).split()
