"""Suites from a Hugging Face dataset, loaded through `datasets`: `load_suite("hf:ID_OR_PATH")`.

`ID_OR_PATH[@split]` is anything `datasets.load_dataset` accepts (a hub id where the hub is
reachable, or a local folder of JSON/JSONL/Parquet files), or a folder written by
`Dataset.save_to_disk`. Each row is one item in the suite item format (`id`, `prompt` or
`messages`, `references`, `grader`, ...). The suite's version is the dataset's fingerprint, so a
changed dataset is a new version; the smoke subset is the first 10 items.
"""
from __future__ import annotations

import re
from pathlib import Path

from suites.format import SuiteError, item_from_row, make_suite

SMOKE = 10


def load(spec: str):
    import datasets

    source, _, split = spec.partition("@")
    split = split or "test"
    try:
        if (Path(source) / "dataset_info.json").exists() or (Path(source) / "state.json").exists():
            ds = datasets.load_from_disk(source)
            ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(source, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds; name the source
        raise SuiteError(f"cannot load dataset {source!r} (split {split!r}): {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    items, first_row = [], {}
    for i, row in enumerate(ds):
        row = {k: v for k, v in row.items() if v is not None}  # Arrow fills absent fields with None
        item = item_from_row(row, {"grader": "exact_match", "max_new_tokens": 64, "stop": []},
                             file=f"hf:{source}", line=i + 1)
        if item.id in first_row:  # as suite files: records pair on the id, so one id is one item
            raise SuiteError(f"duplicate id {item.id!r} (first on row {first_row[item.id]})", file=f"hf:{source}",
                             line=i + 1, field="id")
        first_row[item.id] = i + 1
        items.append(item)
    if not items:
        raise SuiteError(f"dataset {source!r} split {split!r} has no rows")
    name = re.sub(r"[^a-z0-9_-]+", "-", Path(source).name.lower()).strip("-") or "dataset"
    return make_suite(name=name, version=ds._fingerprint, description=f"Hugging Face dataset {source} ({split})",
                      items=items, smoke_ids=[it.id for it in items[:SMOKE]], source=f"hf:{spec}")
