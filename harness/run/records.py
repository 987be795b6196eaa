"""records.jsonl: one JSON row per generation, appended and fsynced as it finishes.

A killed run loses at most the row in flight; a torn last line is cut before appending. The
same writer serves the side files of a run folder (engine batches, lm-eval markers, stops).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

RECORDS = "records.jsonl"


def record_key(row: dict) -> tuple:
    return (row["candidate"], row["suite"], row["item_id"], row["seed"], row["temperature"])


def read_records(run_dir: Path, name: str = RECORDS) -> list[dict]:
    """All complete rows; a torn last line (the run was killed mid-write) is dropped."""
    path = Path(run_dir) / name
    if not path.exists():
        return []
    rows = []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 2:  # only the last line may be torn
                raise ValueError(f"{path}: line {i + 1} is not valid JSON (the file was edited?)")
    return rows


def _finite(obj):
    """NaN/inf become null: records stay valid JSON for every reader, not just Python's."""
    if isinstance(obj, float) and obj != obj or obj in (float("inf"), float("-inf")):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class RecordWriter:
    def __init__(self, run_dir: Path, name: str = RECORDS):
        path = Path(run_dir) / name
        # Cut a torn last line before appending, so new rows start on a fresh line.
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                os.truncate(path, data.rfind(b"\n") + 1)  # in place: never rewrite finished rows
        self.f = open(path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self.f.write(json.dumps(_finite(row), allow_nan=False) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()
