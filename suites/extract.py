"""Pull runnable Python out of a model's completion, and assemble the program to test.

Chat models wrap code in ```python fences, add prose before and after, or (completion style)
emit only the function body. `extract_code` handles these in order:
1. fenced blocks (```python, ```py, or a bare ```): the first block that defines the entry
   point, else the first block. An unclosed fence (generation hit its token limit) runs to the end.
2. no fence: the text itself if it compiles; else from the first line that starts code (`def`,
   `class`, `import`, `from`, `@`) with trailing prose lines (up to 100) dropped until it
   compiles; else the text unchanged (so a body-only continuation keeps its indentation).
`build_program` then puts the task's `prefix` (HumanEval: the prompt, with its imports and
helpers) in front: before a completion that defines the entry point (which overrides the
prompt's stub), or as the head of a body-only continuation (re-indented if that is what makes it
compile).
"""

from __future__ import annotations

import re
import textwrap

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_PY_LANGS = {"", "python", "py", "python3", "py3"}
MAX_PROSE_LINES = 100
_CODE_START = re.compile(r"^(?:async\s+def|def|class|import|from|@)\b", re.MULTILINE)


def compiles(source: str) -> bool:
    """Whether `source` compiles (stricter than ast.parse: catches a `return` outside def)."""
    try:
        compile(source, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False  # RecursionError: nesting deeper than the compiler's stack
    return True


def defines(source: str, name: str) -> bool:
    """Whether `source` has a top-level-looking `def name(` (works on code that does not parse)."""
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", source,
                     re.MULTILINE) is not None


def extract_code(text: str, entry_point: str | None = None) -> str:
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in _PY_LANGS]
    if blocks:
        if entry_point:
            for body in blocks:
                if defines(body, entry_point):
                    return body
        return blocks[0]
    if compiles(text):
        return text
    start = _CODE_START.search(text)
    if start is None:
        return text
    lines = text[start.start():].splitlines()
    # Drop trailing prose one line at a time; stop at the longest prefix that compiles. Each try
    # compiles the whole prefix, so only the last MAX_PROSE_LINES lines may go (else a long
    # text that never compiles would cost quadratic time).
    for end in range(len(lines), max(len(lines) - MAX_PROSE_LINES, 0), -1):
        candidate = "\n".join(lines[:end])
        if compiles(candidate):
            return candidate + "\n"
    return text


def build_program(completion: str, entry_point: str, prefix: str = "") -> str:
    """The source to run before the tests: extracted code, with `prefix` where it belongs."""
    code = extract_code(completion, entry_point)
    if not prefix:
        return code
    if defines(code, entry_point):
        return prefix.rstrip("\n") + "\n\n\n" + code
    # A continuation of the prompt: as written, or re-indented into the stub's body.
    candidates = [prefix + code, prefix + textwrap.indent(textwrap.dedent(code), "    ")]
    for candidate in candidates:
        if compiles(candidate):
            return candidate
    return candidates[0]
