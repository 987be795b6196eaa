"""Acceptance references: the earlier run a candidate's α and τ must not fall below.

A candidate declares `acceptance_reference = "<run folder>"` or `"mlflow:last"` (the last
passing MLflow run of the same candidate, target and suite hashes; found through
harness.run.tracking) and `acceptance_tolerance` (relative, default 0.05). A reference made on
another target or another version of a suite is refused, naming both: acceptance on other
prompts or another model says nothing about this one.

`check(config, suites, uri)` runs before any model is loaded (a bad reference fails in a second);
`attach(summary, config, records, uri)` adds `acceptance_drift` to each such candidate of the
summary, which `harness.verdict.gate` turns into gates. The statistic is analysis.acceptance_drift.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from harness.config import ConfigError, DecoderSpec, RegressConfig
from harness.run.records import acceptance_rows, read_records

DEFAULT_TOLERANCE = 0.05
MLFLOW_LAST = "mlflow:last"
@dataclass(frozen=True)
class Reference:
    source: str                  # the folder, or "mlflow:<run id>"
    target: str
    suite_hashes: dict           # suite name -> hash
    rows: list                   # the reference candidate's records (acceptance fields)


def suites_key(hashes: dict) -> str:
    """One short id for a set of suite versions: what `mlflow:last` matches on."""
    text = "\n".join(f"{name}:{h}" for name, h in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def candidate_suites(config: RegressConfig, spec: DecoderSpec, suites) -> dict:
    return {s.name: s.hash for s in suites if spec.suites is None or s.name in spec.suites}


def _from_folder(folder: Path, spec: DecoderSpec, where: str) -> Reference:
    summary_path, records_path = folder / "summary.json", folder / "records.jsonl"
    if not summary_path.is_file() or not records_path.is_file():
        raise ConfigError(f"{where}: acceptance_reference {str(folder)!r} is not a finished run folder "
                          f"(needs summary.json and records.jsonl)")
    summary = json.loads(summary_path.read_text())
    cand = summary.get("candidates", {}).get(spec.name)
    if cand is None:
        raise ConfigError(f"{where}: the reference run {folder} has no candidate {spec.name!r} "
                          f"(it has: {', '.join(summary.get('candidates', {})) or 'none'})")
    return Reference(source=str(folder), target=cand.get("target") or summary.get("target"),
                     suite_hashes={k: v.get("hash") for k, v in summary.get("suites", {}).items()},
                     rows=acceptance_rows(read_records(folder), spec.name))


def load_reference(config: RegressConfig, spec: DecoderSpec, suites, uri: str | None) -> Reference:
    """The candidate's reference, checked against this run's target and suite hashes."""
    where = f"{config.path}: candidate {spec.name!r}"
    target = spec.target or config.target
    mine = candidate_suites(config, spec, suites)
    if spec.acceptance_reference == MLFLOW_LAST:
        from harness.run import tracking
        found = tracking.last_passing_reference(uri, spec.name, target, suites_key(mine))
        if found is None:
            raise ConfigError(f"{where}: acceptance_reference = 'mlflow:last', but MLflow at "
                              f"{tracking.resolve_uri(uri)} has no passing run of {spec.name!r} on target {target!r} "
                              f"with these suite versions ({', '.join(f'{k}:{v[:12]}' for k, v in sorted(mine.items()))})")
        ref = Reference(**found)
    else:
        folder = Path(spec.acceptance_reference)
        if not folder.is_absolute():
            folder = Path(config.path).parent / folder if not folder.exists() else folder
        ref = _from_folder(folder, spec, where)
    if ref.target != target:
        raise ConfigError(f"{where}: the acceptance reference {ref.source} was run on target {ref.target!r}, "
                          f"this run's is {target!r}: acceptance on another model is no reference")
    for name, h in sorted(mine.items()):
        theirs = ref.suite_hashes.get(name)
        if theirs != h:
            what = f"suite hash {theirs[:12]}" if theirs else "no such suite"
            raise ConfigError(f"{where}: the acceptance reference {ref.source} has {what} for suite {name!r}, "
                              f"this run has {h[:12]}: compare acceptance only on the same prompts")
    if not any((r.get("stats") or {}).get("proposed_per_round") for r in ref.rows):
        raise ConfigError(f"{where}: the acceptance reference {ref.source} holds no drafting rounds for "
                          f"{spec.name!r} (was it speculative?)")
    return ref


def check(config: RegressConfig, suites, uri: str | None) -> dict:
    """Every declared reference, loaded and checked (raises ConfigError naming the mismatch)."""
    return {spec.name: load_reference(config, spec, suites, uri)
            for spec in config.candidates if getattr(spec, "acceptance_reference", None)}


def _plain_comparison(c) -> dict:
    from harness.verdict.plain import plain as _plain
    return _plain(c)


def attach(summary: dict, config: RegressConfig, records: list[dict], suites, uri: str | None,
           refs: dict | None = None) -> None:
    """Add `acceptance_drift` (the statistic, per category and draft position) and
    `acceptance_rows_key` to each candidate of `summary` that declares a reference. `refs`: the
    references `check` loaded before the run (loaded here where not given)."""
    from analysis.acceptance_drift import acceptance_drift
    refs = check(config, suites, uri) if refs is None else refs
    for spec in config.candidates:
        cand = summary["candidates"].get(spec.name)
        if cand is None:
            continue
        cand["acceptance_suites_key"] = suites_key(candidate_suites(config, spec, suites))
        if spec.name not in refs:
            continue
        ref = refs[spec.name]
        tolerance = spec.acceptance_tolerance if spec.acceptance_tolerance is not None else DEFAULT_TOLERANCE
        mine = [r for r in records if r.get("candidate") == spec.name]
        try:
            drift = acceptance_drift(ref.rows, mine, tolerance=tolerance, alpha=config.gates.alpha, rng=0)
        except ValueError as e:
            cand["acceptance_drift"] = {"reference": ref.source, "error": str(e), "tolerance": tolerance}
            continue
        cand["acceptance_drift"] = {"reference": ref.source, **_plain_comparison(drift)}
