"""The baseline items timed afresh when the rest of the baseline comes from the store.

Speed is compared only where the baseline ran on the same clock as the candidate. When some
baseline rows are reused, that is a sample of the work, and a biased one would move the
speedup: the first items in work order are one suite (with one look, the first suite only). So
the sample is drawn at random, seeded by the run, and stratified: each suite gets its share of
`speed_items` in proportion to its size (at least one item each), and within a suite each
(temperature, categories) stratum its share. The same sample is re-checked against the store
(harness.run.reuse), so every run re-checks other items.

Where the store already holds the baseline row of every work of a suite, their output lengths are
known before the sample is drawn, and the suite's prompts are drawn by length instead (`by_length`,
one work of each): strata of about equal baseline tokens, the ones the suite's bound post-stratifies on
(`analysis.latency.length_strata`), the budget split equally over them, so the long prompts are
timed in proportion to the time they carry. A random sample often missed them, and the suite's bound
(`analysis.latency.suite_bounds`) gives none while prompts much longer than any timed one carry
much of the suite's time (CALIBRATION.md, "The suite's speedup from a timed subset").

`rests_on` is the one rule for which baseline rows a speed figure may use: every row where the
whole baseline was generated in this run, else only the sampled ones.
"""
from __future__ import annotations

import random

import numpy as np

from analysis.latency import length_strata, strata_count


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


def by_length(lengths, budget: int, seed, tokens=None) -> list[int]:
    """Indices of `budget` of the prompts whose baseline output lengths (tokens per pair) are
    `lengths`, drawn in the length strata the suite's bound post-stratifies on
    (`analysis.latency.length_strata` at `strata_count(budget)`: 1, 2 or 4 strata of about equal
    `tokens`, a prompt's baseline tokens over all its pairs, default `lengths`), the budget split
    equally over them (what is left over, or what a stratum has no room for, to the longest
    first). Within a stratum every prompt is equally likely (what the bound's ratio estimator
    takes), drawn systematically along its lengths from a start seeded by `seed`: the picks spread
    over the stratum, so its longest prompts are reached, and the suite's bound needs a timed
    prompt within UNSEEN_FACTOR of them."""
    n = len(lengths)
    budget = min(max(int(budget), 0), n)
    if budget >= n:
        return list(range(n))
    size = np.maximum(np.asarray(lengths, dtype=float), 1.0)
    label = length_strata(size, size if tokens is None else np.asarray(tokens, dtype=float), strata_count(budget))
    order = np.lexsort((np.arange(n), size))
    strata = [[int(i) for i in order if label[i] == k] for k in np.unique(label)]
    share, left = [0] * len(strata), budget
    while left > 0:
        for k in reversed(range(len(strata))):   # round-robin, the longest first
            if left > 0 and share[k] < len(strata[k]):
                share[k], left = share[k] + 1, left - 1
    picked: list[int] = []
    for k, ks in enumerate(strata):
        if share[k]:
            step = len(ks) / share[k]
            start = random.Random(f"{seed}:{k}").random() * step
            picked += [ks[int(start + j * step)] for j in range(share[k])]
    return sorted(picked)


def stratum(work) -> tuple:
    return (float(work.temperature), tuple(sorted(work.item.categories or ())))


def key(work) -> tuple:
    """The baseline record key of a work item, less the candidate: (suite, item id, seed, temperature)."""
    return (work.suite.name, work.item.id, work.seed, work.temperature)


def key_of_row(row: dict) -> tuple:
    """The same key for a record: (suite, item id, seed, temperature)."""
    return (row["suite"], row["item_id"], row["seed"], row["temperature"])


def choose(works: list, budget: int | None, seed: int, lengths: dict | None = None) -> set:
    """Keys of the work items to time afresh: `budget` of them, stratified over suites (at least one
    each) and, within a suite, over (temperature, categories); None: all of them. `lengths`: the
    stored baseline output length (tokens) by key, where the store holds the item before the run:
    a suite whose every work has one is drawn by its prompts' lengths instead (`by_length`)."""
    keys = {key(w): w for w in works}
    if budget is None or budget >= len(keys):
        return set(keys)
    lengths = lengths or {}
    by_suite: dict = {}
    for k, w in keys.items():
        by_suite.setdefault(w.suite.name, []).append(k)
    quota = allocate({s: len(ks) for s, ks in by_suite.items()}, budget, minimum=1 if budget > 0 else 0)
    picked = set()
    for suite, ks in by_suite.items():
        # By length only where every work's length is known: the bound takes the timed prompts of a
        # stratum as one even draw, and a suite drawn half by length and half at random is not one
        # (stored greedy rows, new sampled ones: a slower candidate was bounded above 1).
        if all(lengths.get(k) for k in ks):
            picked |= _by_prompt_length(ks, lengths, quota[suite], f"{seed}:{suite}:length")
        else:
            picked |= _by_category(ks, keys, quota[suite], seed, suite)
    return picked


def _by_prompt_length(ks: list, lengths: dict, n: int, seed: str) -> set:
    """`n` of the keys `ks` (one suite's works, each with its stored baseline length): prompts
    drawn `by_length`, one work of each (the bound's unit is the prompt, and its strata count
    the timed prompts); with room for every prompt, each once and the rest at random."""
    if n >= len(ks):
        return set(ks)
    prompts: dict = {}
    for k in sorted(ks):
        prompts.setdefault(k[:2], []).append(k)   # (suite, item id): a prompt's works
    works = list(prompts.values())
    rng = random.Random(seed)
    if n >= len(works):
        first = [rng.choice(w) for w in works]
        return set(first) | set(rng.sample(sorted(set(ks) - set(first)), n - len(works)))
    tokens = [sum(lengths[k] for k in w) for w in works]
    chosen = by_length([t / len(w) for t, w in zip(tokens, works)], n, seed, tokens=tokens)
    return {rng.choice(works[i]) for i in chosen}


def _by_category(ks: list, works: dict, n: int, seed: int, suite: str) -> set:
    """`n` of a suite's keys `ks` at random, stratified over (temperature, categories)."""
    strata: dict = {}
    for k in ks:
        strata.setdefault(stratum(works[k]), []).append(k)
    share = allocate({st: len(v) for st, v in strata.items()}, n)
    picked = set()
    for st, v in sorted(strata.items()):
        rng = random.Random(f"{seed}:{suite}:{st}")   # one stream per stratum: stable under resume
        picked |= set(rng.sample(v, share[st]))
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
