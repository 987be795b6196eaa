"""The baseline items timed afresh when the rest of the baseline comes from the store.

Speed is compared only where the baseline ran on the same clock as the candidate. When some
baseline rows are reused, that is a sample of the work, and a biased one would move the
speedup: the first items in work order are one suite (with one look, the first suite only). So
the sample is drawn at random, seeded by the run, and stratified: each suite gets its share of
`speed_items` in proportion to its size (at least one item each), and within a suite each
(temperature, categories) stratum its share. The same sample is re-checked against the store
(harness.run.reuse), so every run re-checks other items.

`rests_on` is the one rule for which baseline rows a speed figure may use: every row where the
whole baseline was generated in this run, else only the sampled ones.
"""
from __future__ import annotations

import random


def allocate(sizes: dict, budget: int, minimum: int = 0) -> dict:
    """`budget` split over strata in proportion to `sizes` (largest remainder), none above its
    size; with `minimum`, each stratum first gets that many (the total grows where it must)."""
    budget = min(max(budget, 0), sum(sizes.values()))
    out = {k: min(minimum, n) if budget else 0 for k, n in sizes.items()}
    left = budget - sum(out.values())
    while left > 0:
        room = {k: sizes[k] - out[k] for k in sizes if sizes[k] > out[k]}
        weight = sum(sizes[k] for k in room)
        exact = {k: left * sizes[k] / weight for k in room}
        add = {k: min(int(x), room[k]) for k, x in exact.items()}
        for k in sorted(room, key=lambda k: (-(exact[k] - int(exact[k])), str(k))):
            if sum(add.values()) >= left:
                break
            if add[k] < room[k]:
                add[k] += 1
        for k, n in add.items():
            out[k] += n
        left -= sum(add.values())
    return out


def stratum(work) -> tuple:
    return (float(work.temperature), tuple(sorted(work.item.categories or ())))


def key(work) -> tuple:
    """The baseline record key of a work item, less the candidate: (suite, item id, seed, temperature)."""
    return (work.suite.name, work.item.id, work.seed, work.temperature)


def key_of_row(row: dict) -> tuple:
    """The same key for a record: (suite, item id, seed, temperature)."""
    return (row["suite"], row["item_id"], row["seed"], row["temperature"])


def choose(works: list, budget: int | None, seed: int) -> set:
    """Keys of the work items to time afresh: `budget` of them, stratified over suites (at least one
    each) and, within a suite, over (temperature, categories); None: all of them."""
    keys = {key(w): w for w in works}
    if budget is None or budget >= len(keys):
        return set(keys)
    by_suite: dict = {}
    for k, w in keys.items():
        by_suite.setdefault(w.suite.name, {}).setdefault(stratum(w), []).append(k)
    quota = allocate({s: sum(map(len, st.values())) for s, st in by_suite.items()}, budget,
                     minimum=1 if budget > 0 else 0)
    picked = set()
    for suite, strata in by_suite.items():
        share = allocate({st: len(ks) for st, ks in strata.items()}, quota[suite])
        for st, ks in sorted(strata.items()):
            rng = random.Random(f"{seed}:{suite}:{st}")   # one stream per stratum: stable under resume
            picked |= set(rng.sample(ks, share[st]))
    return picked


def rests_on(baseline_rows: list[dict]) -> list[dict]:
    """The baseline rows a speed comparison may use: generated in this run (a reused row's clock is
    from another day), and where any row was reused, only the stratified sample."""
    fresh = [r for r in baseline_rows if r.get("tokens") and not r.get("reused")]
    if any(r.get("reused") for r in baseline_rows):
        return [r for r in fresh if r.get("speed_sample")]
    return fresh


def composition(rows: list[dict]) -> dict:
    """How many rows per suite, for the report: {suite: n}."""
    out: dict = {}
    for r in rows:
        out[r["suite"]] = out.get(r["suite"], 0) + 1
    return dict(sorted(out.items()))
