"""Our shipped suites as lm-eval task configs: one YAML and one local JSONL per suite, offline.

    from suites.lmeval_export import export_suites
    export_suites("lmeval_tasks")                 # every suite; or names=["factual"], profile="smoke"
    # then: decodegate lm-eval --include_path lmeval_tasks --tasks decodegate_factual ...
    # or:   python -m suites.lmeval_export lmeval_tasks [factual refusal ...] [--smoke]

Each task is `generate_until`, zero-shot, named `decodegate_<suite>` (`_smoke` appended for the
smoke profile), versioned with the suite's version. Documents are the suite's items (nested
fields JSON-encoded so that Arrow's schema inference cannot change them); prompts are the item's
text (chat turns joined by newlines, as `LoadedModel.encode(chat=False)` does: pass lm-eval's
`--apply_chat_template` for chat models). Each completion is graded by the item's own grader
(`suites.graders.grade`), reported as two metrics: `score` (mean) and `passed` (nanmean; NaN for
ungraded items). Suites graded by running code are marked `unsafe_code` (lm-eval then asks for
`--confirm_run_unsafe_code`; our sandbox runs the code).

lm-eval sets generation per task, not per document: a suite whose items differ in
`max_new_tokens` or `stop` becomes one task per setting, under a group named as above.

The YAML names the data file by absolute path (lm-eval resolves relative paths against the
working directory), so export again after moving the folder. Loading the task imports this
module (`!function suites.lmeval_export...`): decodegate must be installed where lm-eval runs.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import yaml

from suites.format import Item, Suite, item_from_row
from suites.registry import list_suites, load_suite

TASK_PREFIX = "decodegate_"
_JSON_FIELDS = ("messages", "grader_options")


def task_name(suite: Suite, profile: str = "full") -> str:
    return TASK_PREFIX + suite.name.replace("-", "_") + ("_smoke" if profile == "smoke" else "")


# --- functions the exported YAMLs call ----------------------------------------------------------

def doc_to_item(doc: dict) -> Item:
    """The suite item a document was exported from (validated again)."""
    row = dict(doc)
    for key in _JSON_FIELDS:
        if isinstance(row.get(key), str):
            row[key] = json.loads(row[key])
    row = {k: v for k, v in row.items() if v is not None}
    return item_from_row(row, file="<lm-eval doc>")


def doc_to_text(doc: dict) -> str:
    if doc.get("prompt") is not None:
        return doc["prompt"]
    return "\n".join(m["content"] for m in json.loads(doc["messages"]))


def doc_to_target(doc: dict) -> str:
    refs = doc.get("references") or []
    return refs[0] if refs else ""


def process_results(doc: dict, results: list) -> dict:
    """lm-eval's per-document hook: grade the completion with the item's own grader."""
    from suites.graders import grade

    g = grade(doc_to_item(doc), results[0])
    return {"score": float(g.score), "passed": math.nan if g.passed is None else float(g.passed)}


# --- writing ------------------------------------------------------------------------------------

def _doc(item: Item) -> dict:
    row = item.to_row()
    for key in _JSON_FIELDS:
        row[key] = json.dumps(row[key], sort_keys=True, ensure_ascii=False)
    return row


def _settings(items) -> list[tuple[int, tuple[str, ...]]]:
    seen = []
    for item in items:
        key = (item.max_new_tokens, tuple(item.stop))
        if key not in seen:
            seen.append(key)
    return seen


_FUNCTIONS = ("doc_to_text", "doc_to_target", "process_results")


def _task_yaml(name: str, data_file: Path, suite: Suite, profile: str, max_new: int, stop,
               unsafe: bool) -> str:
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file.resolve())}},
        "output_type": "generate_until",
        "test_split": "test",
        "num_fewshot": 0,
        "generation_kwargs": {"until": list(stop), "max_gen_toks": max_new, "do_sample": False,
                              "temperature": 0.0},
        "metric_list": [
            {"metric": "score", "aggregation": "mean", "higher_is_better": True},
            {"metric": "passed", "aggregation": "nanmean", "higher_is_better": True},
        ],
        "metadata": {"version": suite.version, "decodegate_suite": suite.name,
                     "decodegate_suite_hash": suite.hash, "decodegate_profile": profile},
    }
    if unsafe:
        config["unsafe_code"] = True
    head = (f"# decodegate suite {suite.name!r} v{suite.version} ({profile}), exported for lm-eval.\n"
            + "".join(f"# {line}\n" for line in _wrap(suite.description)))
    body = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    funcs = "".join(f"{f}: !function suites.lmeval_export.{f}\n" for f in _FUNCTIONS)
    return head + body + funcs


def _wrap(text: str, width: int = 96) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])


def export_suite(suite: Suite | str, out_dir: str | Path, *, profile: str = "full") -> list[str]:
    """Write `suite` (a Suite or a name) as lm-eval task(s) into `out_dir`; returns the name to
    pass to `--tasks` first, then any subtask names."""
    suite = load_suite(suite) if isinstance(suite, str) else suite
    items = suite.select(profile)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = task_name(suite, profile)
    settings = _settings(items)
    names = []
    for i, (max_new, stop) in enumerate(settings):
        sub = name if len(settings) == 1 else f"{name}_{i}"
        chosen = [item for item in items if (item.max_new_tokens, tuple(item.stop)) == (max_new, stop)]
        data = out / f"{sub}.jsonl"
        data.write_text("".join(json.dumps(_doc(item), ensure_ascii=False) + "\n" for item in chosen),
                        encoding="utf-8")
        chosen_unsafe = any(item.grader == "code" for item in chosen)
        (out / f"{sub}.yaml").write_text(
            _task_yaml(sub, data, suite, profile, max_new, stop, chosen_unsafe), encoding="utf-8")
        names.append(sub)
    if len(settings) > 1:
        group = {"group": name, "task": names,
                 # lm-eval groups aggregate by a (weighted) mean only; `passed` stays per subtask.
                 "aggregate_metric_list": [{"metric": "score", "aggregation": "mean",
                                            "weight_by_size": True}],
                 "metadata": {"version": suite.version}}
        (out / f"{name}.yaml").write_text(yaml.safe_dump(group, sort_keys=False), encoding="utf-8")
        names.insert(0, name)
    return names


def export_suites(out_dir: str | Path, names=None, *, profile: str = "full") -> list[str]:
    """Export several suites (default: every shipped one); returns the task names to pass."""
    tasks = []
    for name in names or list_suites():
        tasks.append(export_suite(name, out_dir, profile=profile)[0])
    return tasks


def main(argv=None) -> int:
    """python -m suites.lmeval_export OUT_DIR [SUITE ...] [--smoke]"""
    args = list(sys.argv[1:] if argv is None else argv)
    profile = "smoke" if "--smoke" in args else "full"
    args = [a for a in args if a != "--smoke"]
    if not args or args[0].startswith("-"):
        print(main.__doc__, file=sys.stderr)
        return 2
    tasks = export_suites(args[0], args[1:] or None, profile=profile)
    print(",".join(tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
