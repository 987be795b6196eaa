"""Find suites by name: the JSONL files in `suites/data/`, plus `humaneval` from its package.

`load_suite` also takes a path to any suite file, or `hf:DATASET[@split]` (see `hf_dataset`). Loaded built-in suites are cached (they are
immutable); a path is read afresh each time, since the file may be being edited.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from suites.format import Suite, SuiteError, load_file

DATA_DIR = Path(__file__).with_name("data")
# Suites that are not files in DATA_DIR: name -> "module:function", imported only when used.
PACKAGE_SUITES = {"humaneval": "suites.humaneval:load"}


def list_suites() -> list[str]:
    names = {p.stem for p in DATA_DIR.glob("*.jsonl")} | set(PACKAGE_SUITES)
    return sorted(names)


def load_suite(name_or_path: str | Path) -> Suite:
    """A suite by registered name, or from a `.jsonl` file path."""
    text = str(name_or_path)
    if text.startswith("hf:"):
        from suites.hf_dataset import load
        return load(text[3:])
    if isinstance(name_or_path, Path) or text.endswith(".jsonl") or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise SuiteError(f"no suite file at {text}")
        return load_file(path)
    return _load_named(text)


@functools.lru_cache(maxsize=None)
def _load_named(name: str) -> Suite:
    if name in PACKAGE_SUITES:
        module, func = PACKAGE_SUITES[name].split(":")
        import importlib

        return getattr(importlib.import_module(module), func)()
    path = DATA_DIR / f"{name}.jsonl"
    if not path.is_file():
        close = difflib.get_close_matches(name, list_suites(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SuiteError(f"unknown suite {name!r}{hint} (known: {', '.join(list_suites())})")
    suite = load_file(path)
    if suite.name != name:
        raise SuiteError(f"header names the suite {suite.name!r} but the file is {path.name}",
                         file=str(path), field="suite")
    return suite
