"""House rules read from the source with `ast`: every function in harness/ and analysis/ fits on
a screen (at most 60 lines, counted from its `def` to the end of its body, docstring and nested
functions included; decorators not counted).

The test prints the longest ten so a reader sees how close the code runs to the limit, and fails
naming every function over it (methods and nested functions included, each under its dotted name).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "analysis")
MAX_FUNCTION_LINES = 60


def function_lengths(root: Path, packages) -> list[tuple[int, str, str]]:
    """(lines, dotted name, file relative to root) for every function and method in the packages,
    longest first."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            relative = path.relative_to(root).as_posix()
            found.extend((lines, name, relative) for name, lines in _functions(tree, ""))
    return sorted(found, key=lambda row: (-row[0], row[2], row[1]))


def _functions(node, prefix: str):
    """(dotted name, lines) of each function under `node`, nested ones under their parent's name."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, name + ".")
        else:
            yield from _functions(child, prefix)


def test_every_function_fits_on_a_screen():
    lengths = function_lengths(ROOT, PACKAGES)
    # The walk saw the project (a wrong root or package name would find nothing and pass).
    assert len(lengths) > 100
    assert any(file == "harness/run/load.py" and name == "play" for _, name, file in lengths)
    print(f"\nlongest ten functions in {', '.join(PACKAGES)}:")
    for lines, name, file in lengths[:10]:
        print(f"  {lines:4d}  {file}:{name}")
    too_long = [f"{file}:{name} ({lines} lines)" for lines, name, file in lengths
                if lines > MAX_FUNCTION_LINES]
    assert too_long == [], (f"{len(too_long)} functions over {MAX_FUNCTION_LINES} lines: "
                            + "; ".join(too_long))


def test_a_long_function_is_found(tmp_path):
    """The checker itself sees a long method and a long nested function, and counts from the `def`
    (not the decorator) to the last line of the body."""
    (tmp_path / "pkg").mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(60))
    (tmp_path / "pkg" / "mod.py").write_text(
        "class Box:\n    @staticmethod\n    def long():\n" + body
        + "def outer():\n    def inner():\n" + body
        + "    return inner\n"
        + "def short():\n    return 1\n")
    lengths = function_lengths(tmp_path, ("pkg",))
    assert lengths == [(63, "outer", "pkg/mod.py"), (61, "Box.long", "pkg/mod.py"),
                       (61, "outer.inner", "pkg/mod.py"), (2, "short", "pkg/mod.py")]
