"""records.jsonl: one JSON row per generation, appended and fsynced as it finishes.

A killed run loses at most the row in flight; a torn last line is cut before appending. The
same writer serves the side files of a run folder (engine batches, lm-eval markers, stops).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

RECORDS = "records.jsonl"
PLAN = "plan.json"  # every row a run's design asks for (harness.run.runner.write_plan, harness.verdict.exit_code)
LMEVAL_DONE = "lmeval_done.jsonl"  # (decoder, suite, seed, temperature) lm-eval runs finished (harness.run.runner.run_lmeval)
LOAD, LOAD_LEVELS = "load.jsonl", "load_levels.jsonl"  # open-loop requests and levels (harness.run.load)
# Only these fields of a record are kept in an acceptance reference (harness.verdict.acceptance_ref) (no text, no tokens' content).
KEEP = ("candidate", "suite", "suite_hash", "item_id", "categories", "seed", "temperature", "error")
CANDIDATE_KEYS = ("verdict", "decoder", "kind", "target")  # every candidate of a finished summary.json
STATS = ("accepted_per_round", "proposed_per_round", "target_forwards", "proposed", "accepted", "drafter")




def record_key(row: dict) -> tuple:
    return (row["candidate"], row["suite"], row["item_id"], row["seed"], row["temperature"])


class RecordsError(ValueError):
    """A run folder's file that cannot be read as the harness wrote it (an input error: exit 2)."""


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
            row = json.loads(line)
        except json.JSONDecodeError:
            if i < len(lines) - 2:  # only the last line may be torn
                raise RecordsError(f"{path}: line {i + 1} is not valid JSON (the file was edited?)")
            continue
        if isinstance(row, dict) and isinstance(row.get("temperature"), float):
            row["temperature"] += 0.0  # -0.0 (a folder from before the config made it 0.0) is greedy: keyed T=0
        rows.append(row)
    return rows


def read_summary(run_dir: Path) -> dict:
    """A finished run folder's summary.json, or a RecordsError naming what is wrong with it."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise RecordsError(f"{run_dir} has no summary.json: not a finished decodegate run folder")
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordsError(f"{path} is not valid JSON ({e}): not a summary decodegate wrote") from None
    missing = [k for k in ("run_uid", "baseline", "candidates", "target", "profile", "verdict")
               if not isinstance(summary, dict) or k not in summary]
    if missing:
        raise RecordsError(f"{path} is not a decodegate run summary (no {', '.join(missing)})")
    # What `sync` reads of every candidate: checked here, so that an edited or cut summary is named
    # before any upload starts, not a KeyError halfway through one.
    if not isinstance(summary["candidates"], dict):
        raise RecordsError(f"{path}: 'candidates' is not an object: not a summary decodegate wrote")
    for name, cand in summary["candidates"].items():
        lacks = [k for k in CANDIDATE_KEYS if not isinstance(cand, dict) or k not in cand]
        if lacks:
            raise RecordsError(f"{path}: candidate {name!r} has no {', '.join(lacks)}: not a summary of a "
                               f"finished run (was it edited?)")
    return summary


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


def acceptance_rows(records: list[dict], candidate: str) -> list[dict]:
    """The candidate's records reduced to what a later drift check needs (no generated text)."""
    out = []
    for r in records:
        if r.get("candidate") != candidate:
            continue
        row = {k: r[k] for k in KEEP if k in r}
        row["stats"] = {k: v for k, v in (r.get("stats") or {}).items() if k in STATS}
        row["tokens"] = [0] * len(r.get("tokens") or [])  # only the count matters (τ)
        out.append(row)
    return out
