"""Loader for the local lm-eval test tasks in this folder (offline, cwd-independent).

lm-eval calls a task's `custom_dataset` as `fn(**metadata, **dataset_kwargs)`; the YAMLs here
name JSONL files relative to this folder in `dataset_kwargs.data_files`, one per split.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(data_files, **_ignored):
    import datasets

    splits = {}
    for split, name in data_files.items():
        with open(HERE / name, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        splits[split] = datasets.Dataset.from_list(rows)
    return datasets.DatasetDict(splits)
