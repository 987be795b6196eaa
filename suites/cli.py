"""`decodegate suites list|show NAME|import FILE`: what the suites hold; request logs as a suite.

`register(subparsers)` adds the `suites` command to the harness's argparse tree; the chosen
handler is `args.func(args) -> int` (0 ok, 2 unknown suite or bad file). `python -m suites.cli`
runs it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from suites.format import Suite, SuiteError
from suites.registry import list_suites, load_suite


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("suites", help="list the prompt suites or show one; import request logs",
                                   description="List the prompt suites or show one.")
    commands = parser.add_subparsers(dest="suites_command", required=True, metavar="COMMAND")
    p_list = commands.add_parser("list", help="every suite: version, items, smoke size, hash")
    p_list.add_argument("--json", action="store_true", help="print JSON")
    p_show = commands.add_parser("show", help="one suite: graders, categories, smoke items")
    p_show.add_argument("name", help="a suite name (see `suites list`) or a .jsonl path")
    p_show.add_argument("--json", action="store_true", help="print JSON")
    p_show.add_argument("--items", action="store_true", help="also list every item")
    from suites import importer
    p_import = commands.add_parser("import", help="turn request logs (chat JSONL or prompts) into a suite file",
                                   description=importer.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    importer.add_arguments(p_import)
    parser.set_defaults(func=run)
    return parser


def summary(suite: Suite) -> dict:
    """The facts `list` and `show` print, as a JSON-able dict."""
    return {
        "name": suite.name, "version": suite.version, "hash": suite.hash,
        "description": suite.description, "items": len(suite.items),
        "graders": dict(Counter(item.grader for item in suite.items)),
        "categories": dict(sorted(Counter(c for item in suite.items
                                          for c in item.categories).items())),
        "smoke_size": len(suite.smoke_ids), "smoke_ids": list(suite.smoke_ids),
        "max_new_tokens": sorted({item.max_new_tokens for item in suite.items}),
        "source": suite.source,
    }


def run(args) -> int:
    try:
        if args.suites_command == "list":
            return _list(args.json)
        if args.suites_command == "import":
            from suites import importer
            return importer.run(args)
        return _show(args.name, args.json, args.items)
    except SuiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _list(as_json: bool) -> int:
    rows = []
    for name in list_suites():
        try:
            rows.append(summary(load_suite(name)))
        except SuiteError as exc:  # e.g. humaneval without its package: say so, list the rest
            rows.append({"name": name, "error": str(exc)})
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'suite':<11} {'version':<8} {'items':>5} {'smoke':>5}  {'grader':<12} hash")
    for row in rows:
        if "error" in row:
            print(f"{row['name']:<11} unavailable: {row['error']}")
            continue
        graders = ",".join(row["graders"])
        print(f"{row['name']:<11} {row['version']:<8} {row['items']:>5} {row['smoke_size']:>5}"
              f"  {graders:<12} {row['hash'][:12]}")
    return 0


def _show(name: str, as_json: bool, with_items: bool) -> int:
    suite = load_suite(name)
    info = summary(suite)
    if with_items:
        info["item_list"] = [item.to_row() for item in suite.items]
    if as_json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
        return 0
    print(f"{suite.name} v{suite.version}: {suite.description}")
    print(f"  source:      {suite.source}")
    print(f"  hash:        sha256:{suite.hash}")
    print(f"  items:       {len(suite.items)}")
    print("  graders:     " + ", ".join(f"{g} ({n})" for g, n in info["graders"].items()))
    print("  max tokens:  " + ", ".join(str(n) for n in info["max_new_tokens"]))
    print("  categories:  " + (", ".join(f"{c} ({n})" for c, n in info["categories"].items())
                               or "-"))
    print(f"  smoke:       {len(suite.smoke_ids)} items: {', '.join(suite.smoke_ids)}")
    if with_items:
        print()
        for item in suite.items:
            text = item.prompt if item.prompt is not None else item.messages[-1]["content"]
            text = " ".join(text.split())
            print(f"  {item.id:<16} [{item.grader}] {text[:90]}")
    return 0


def main(argv=None) -> int:
    """`python -m suites.cli list|show NAME`: the same commands without the harness."""
    parser = argparse.ArgumentParser(prog="python -m suites.cli")
    register(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["suites", *argv])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
