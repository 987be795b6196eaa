"""`regress`'s exit code, decided in one place from the run folder alone.

0 only from a complete verdict: summary.json is there and says pass for the run and for every
candidate on trial, and every row the run's plan asked for (plan.json: decoder, suite, item,
seed, temperature) is in records.jsonl and is not an error. A row may be missing only where the
design chose not to run it: a candidate stopped on that suite (a sequential look, --fail-fast;
a broken candidate is stopped too, and its verdict already fails), or a baseline row no running
candidate needed. Anything else that is not a pass is 1 (a gate failed, a decoder died, a row is
missing or failed). Reading the folder fails closed: what cannot be read is not a pass.
"""
from __future__ import annotations

import json
from pathlib import Path

from harness.run.records import PLAN


def exit_code(run_dir: Path) -> tuple[int, str]:
    """(code, why): (0, "") for a complete passing verdict, else (1, the first reason it is not)."""
    from harness.run.records import RecordsError, read_records
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        plan = json.loads((run_dir / PLAN).read_text())
        rows = read_records(run_dir)
        stops = read_records(run_dir, "stops.jsonl")
    except (OSError, ValueError, RecordsError) as e:
        return 1, f"the run folder cannot be read as a finished run ({e}): no verdict"
    if summary.get("verdict") != "pass":
        return 1, ""  # the report names the gates that failed
    on_trial = {n: c for n, c in (summary.get("candidates") or {}).items() if c.get("verdict") != "floor"}
    failed = sorted(n for n, c in on_trial.items() if c.get("verdict") != "pass")
    if failed or not on_trial:
        return 1, f"no pass for {', '.join(failed) or 'any candidate (none was judged)'}"
    why = incomplete(plan, rows, stops)
    return (1, why) if why else (0, "")


def incomplete(plan: dict, rows: list[dict], stops: list[dict]) -> str | None:
    """Why the records do not cover the plan (a planned row missing or an error), or None."""
    have = {(r["candidate"], r["suite"], r["item_id"], r["seed"], r["temperature"]): r for r in rows}
    stopped = {(s.get("candidate"), s.get("suite")) for s in stops}
    halted = lambda c, suite: (c, "*") in stopped or (c, suite) in stopped  # noqa: E731
    base = set(plan.get("baselines") or ())
    runs = {}
    for c, suite, *_ in plan.get("rows") or ():
        runs.setdefault(suite, set()).add(c)
    bad = []
    for key in map(tuple, plan.get("rows") or ()):
        c, suite = key[0], key[1]
        row = have.get(key)
        if row is not None and not row.get("error"):
            continue
        cands = runs[suite] - base
        by_design = all(halted(o, suite) for o in cands) and bool(cands) if c in base else halted(c, suite)
        if row is None and by_design:
            continue  # not run by design: a stopped candidate, or a baseline row no candidate needed
        bad.append(f"{c} {suite}/{key[2]} seed {key[3]} T={key[4]:g}: " + ("an error" if row else "missing"))
    if not bad:
        return None
    return f"{len(bad)} planned generation(s) missing or failed (first: {bad[0]})"
