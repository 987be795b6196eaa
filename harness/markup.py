"""Text from a run (engine error bodies, generated text, names from a config or a request log)
made safe for the Markdown and XML that CI and MLflow render.

A detail can hold anything an engine or a proxy sent back: a CR, HTML, ANSI escapes. In a
Markdown cell a CR ends the line and HTML opens a block that swallows the rest of the table (the
failed gates after it vanish from the rendered job summary); in XML a control character makes
the whole JUnit file unreadable, and CI then shows no failure at all.
"""
from __future__ import annotations

import html
import re

# Characters XML 1.0 does not allow (its Char production), and Unicode's line and paragraph breaks.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_BREAKS = re.compile("[\r\n\x0b\x0c\x85\u2028\u2029]+")
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f]")


def xml_text(s) -> str:
    """`s` with every character XML 1.0 forbids replaced by U+FFFD (ElementTree writes them raw)."""
    return _NOT_XML.sub("\ufffd", str(s))


def md_cell(s) -> str:
    """One Markdown table cell: one line, no markup (HTML escaped, backslashes and pipes escaped,
    control characters dropped)."""
    s = _CONTROL.sub("", _BREAKS.sub(" ", str(s)))
    return html.escape(s, quote=False).replace("\\", "\\\\").replace("|", "\\|")


def md_code(s) -> str:
    """A value for an inline code span: one line, no backticks (a code span shows HTML as text)."""
    return _CONTROL.sub("", _BREAKS.sub(" ", str(s))).replace("`", "'")


def md_fence(text: str) -> list[str]:
    """`text` as a fenced code block whose fence is longer than any run of backticks inside it, so
    that no line of the text can close it."""
    longest = max((len(m) for m in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n")), fence]
