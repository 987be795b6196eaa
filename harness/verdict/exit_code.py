"""`regress`'s exit code, decided in one place from the run folder alone.

0 only from a complete verdict: summary.json is there and says pass for the run and for every
candidate on trial, every row the run's plan asked for (plan.json: decoder, suite, item,
seed, temperature) is in records.jsonl and is not an error, and every lm-eval run it asked for
(decoder, task, seed, temperature: lm-eval picks the items) has its completion marker, the
rows that marker counts, and no error row. A row may be missing only where the
design chose not to run it: a candidate stopped on that suite (a sequential look, --fail-fast;
a broken candidate is stopped too, and its verdict already fails), or a baseline row no running
candidate needed. Anything else that is not a pass is 1 (a gate failed, a decoder died, a row is
missing or failed). Reading the folder fails closed: what cannot be read is not a pass.
"""
from __future__ import annotations

import json
from pathlib import Path

from harness.run.records import LMEVAL_DONE, PLAN


def exit_code(run_dir: Path) -> tuple[int, str]:
    """(code, why): (0, "") for a complete passing verdict, else (1, the first reason it is not)."""
    from harness.run.records import RecordsError, read_records
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        plan = json.loads((run_dir / PLAN).read_text())
        rows = read_records(run_dir)
        stops = read_records(run_dir, "stops.jsonl")
        done = read_records(run_dir, LMEVAL_DONE)
    except (OSError, ValueError, RecordsError) as e:
        return 1, f"the run folder cannot be read as a finished run ({e}): no verdict"
    why = wrong_shape(summary, plan, rows, stops)
    if why:
        return 1, f"the run folder is not a finished run ({why}): no verdict"
    if summary.get("verdict") != "pass":
        return 1, ""  # the report names the gates that failed
    on_trial = {n: c for n, c in (summary.get("candidates") or {}).items() if c.get("verdict") != "floor"}
    failed = sorted(n for n, c in on_trial.items() if c.get("verdict") != "pass")
    if failed or not on_trial:
        return 1, f"no pass for {', '.join(failed) or 'any candidate (none was judged)'}"
    why = incomplete(plan, rows, stops) or lmeval_incomplete(plan, rows, done, stops)
    return (1, why) if why else (0, "")


def wrong_shape(summary, plan, rows: list, stops: list) -> str | None:
    """Why the folder's files are not what a run writes (read fail closed: 1, never an exception
    that would be exit 3), or None. A plan that asks for no row proves nothing complete."""
    if not isinstance(summary, dict) or not isinstance(summary.get("candidates", {}), dict) or not all(
            isinstance(c, dict) for c in (summary.get("candidates") or {}).values()):
        return "summary.json is not a summary"
    if not isinstance(plan, dict) or not isinstance(plan.get("baselines", []), list):
        return f"{PLAN} is not a plan"
    keys, units = plan.get("rows"), plan.get("lmeval", [])
    if not isinstance(keys, list) or not isinstance(units, list) or not (keys or units):
        return f"{PLAN} plans no generation"
    if not all(isinstance(k, list) and len(k) == 5 and isinstance(k[4], (int, float)) for k in keys):
        return f"{PLAN} holds a row that is not (decoder, suite, item, seed, temperature)"
    if not all(isinstance(u, list) and len(u) == 4 and isinstance(u[3], (int, float)) for u in units):
        return f"{PLAN} holds an lm-eval run that is not (decoder, suite, seed, temperature)"
    if not all(isinstance(r, dict) and all(f in r for f in KEY) for r in rows):
        return f"records.jsonl holds a row without its {', '.join(KEY)}"
    if not all(isinstance(r, dict) for r in stops):
        return "stops.jsonl holds a row that is not an object"
    return None


KEY = ("candidate", "suite", "item_id", "seed", "temperature")


def incomplete(plan: dict, rows: list[dict], stops: list[dict]) -> str | None:
    """Why the records do not cover the plan (a planned row missing or an error), or None."""
    from harness.run.faults import BROKEN
    have = {tuple(_hashable(r[f]) for f in KEY): r for r in rows}
    # A stop by design (a sequential look, --fail-fast) excuses the rows it skipped; a decoder that
    # broke did not stop by design (a crashed A/A floor is not on trial, yet its rows are missing).
    stopped = {(_hashable(s.get("candidate")), _hashable(s.get("suite"))) for s in stops
               if s.get("reason") not in BROKEN}
    halted = lambda c, suite: (c, "*") in stopped or (c, suite) in stopped  # noqa: E731
    base = {_hashable(b) for b in plan.get("baselines") or ()}
    runs = {}
    for c, suite, *_ in plan.get("rows") or ():
        runs.setdefault(_hashable(suite), set()).add(_hashable(c))
    bad = []
    for key in (tuple(_hashable(x) for x in k) for k in plan.get("rows") or ()):
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


def lmeval_incomplete(plan: dict, rows: list[dict], done: list[dict], stops: list[dict]) -> str | None:
    """Why an lm-eval run the plan asked for is not finished, or None. Finished: its completion
    marker is there and counts exactly the rows the folder holds for that run (lm-eval picks the
    items, so the marker is the only record of how many there were: rows deleted or duplicated
    after it was written, or a marker with no count, are not a finished run), and none is an
    error. A candidate stopped by design on that suite is excused; the baseline only where every
    candidate on that suite stopped (as for the runner's own suites)."""
    from harness.run.faults import BROKEN
    unit = lambda r: tuple(_hashable(r.get(f)) for f in ("candidate", "suite", "seed", "temperature"))  # noqa: E731
    counted = {}
    for m in done:
        if isinstance(m, dict) and type(m.get("rows")) is int:
            counted.setdefault(unit(m), set()).add(m["rows"])
    held, failed = {}, set()
    for r in rows:
        held[unit(r)] = held.get(unit(r), 0) + 1
        if r.get("error"):
            failed.add(unit(r))
    stopped = {(_hashable(s.get("candidate")), _hashable(s.get("suite"))) for s in stops
               if s.get("reason") not in BROKEN}
    halted = lambda c, suite: (c, "*") in stopped or (c, suite) in stopped  # noqa: E731
    planned = [tuple(_hashable(x) for x in u) for u in plan.get("lmeval") or ()]
    base = {_hashable(b) for b in plan.get("baselines") or ()}
    bad = []
    for c, suite, seed, t in planned:
        cands = {u[0] for u in planned if u[1] == suite} - base
        if halted(c, suite) if c not in base else (bool(cands) and all(halted(o, suite) for o in cands)):
            continue
        key = (c, suite, seed, t)
        if key in failed:
            bad.append(f"{c} {suite} seed {seed} T={t:g}: an error row")
        elif counted.get(key) != {held.get(key, 0)}:
            bad.append(f"{c} {suite} seed {seed} T={t:g}: not finished" + (
                f" (its marker counts {', '.join(map(str, sorted(counted[key])))} rows, the folder holds "
                f"{held.get(key, 0)})" if key in counted else ""))
    if not bad:
        return None
    return f"{len(bad)} planned lm-eval run(s) not finished or failed (first: {bad[0]})"


def _hashable(x):
    """A key's part as read from JSON (a list where an item id was one is no key)."""
    return json.dumps(x, sort_keys=True) if isinstance(x, (list, dict, set)) else x
