"""Print the regress config's JSON Schema (harness.config_schema), the one the loader validates
against. Editors check a TOML file against it as it is typed: taplo / Even Better TOML read the
`#:schema ./regress.schema.json` line at the top of the shipped configs.
`--output FILE` writes it to FILE instead; `--docs FILE` rewrites the key tables of a Markdown
file between its `<!-- config-schema: TABLE -->` markers (`make docs` does both)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", type=Path, help="write the schema to this file (default: print it)")
    p.add_argument("--docs", type=Path, help="rewrite the generated key tables of this Markdown file "
                                             "(docs/configuration.md)")


def text() -> str:
    from harness.config_schema import json_schema
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def run(args) -> int:
    if args.docs is not None:
        from harness.config_docs import render
        if not args.docs.is_file():
            raise FileNotFoundError(f"--docs {args.docs}: no such file")
        args.docs.write_text(render(args.docs.read_text(encoding="utf-8")), encoding="utf-8")
    if args.output is not None:
        args.output.write_text(text(), encoding="utf-8")
    elif args.docs is None:
        print(text(), end="")
    return 0
