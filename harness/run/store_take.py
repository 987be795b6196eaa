"""The baseline's store side of a run: which baseline rows are taken from the store, and the
speed sample generated afresh beside the candidates and checked against the store.

No stored row is taken before the whole sample is generated and agreed with its stored rows: a
sample row that differs turns reuse off for the run (`reuse.valid`, harness.run.reuse). A run
without a store (`reuse` None) takes nothing and samples nothing.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from harness.run import speed_sample
from harness.run.records import record_key
from harness.run.reuse import stored_result
from harness.run.work import label, make_request, make_row, runs_on

SAMPLE_FILE = "speed_sample.json"


class StoreTake:
    def __init__(self, config, run_dir: Path, lineup, reuse, first_stage: list, rows: list[dict]):
        """`first_stage`: the work the sample is drawn from (every run reaches it, whatever its
        looks decide later); `rows`: the run folder's records (a resumed run re-checks its sample)."""
        self.config, self.lineup, self.reuse = config, lineup, reuse
        self.base_names = lineup.baseline_names
        self.sample: set = set()
        self.found: dict = {}  # (baseline, work key) -> (store key, key parts, stored row or None)
        self.unchecked: set = set()
        if reuse is None:
            return
        cands = [s for s in lineup.specs if s.name not in self.base_names]
        population = [w for w in first_stage if not cands or any(runs_on(c, w.suite.name) for c in cands)]
        self.sample = _drawn_once(run_dir, lambda: speed_sample.choose(
            population, config.profile.speed_items, reuse.seed, lengths=self._stored_lengths(population)))
        # Before a resumed run's re-check, so that it re-checks this row too.
        self.sample |= _one_stored_row_rechecked(self.sample, population, lineup, self.stored)
        _recheck_resumed(run_dir, rows, reuse, lineup, first_stage, self.sample, self.found)

    def _stored_lengths(self, population: list) -> dict:
        """Each item's baseline output length (tokens) in the store, from the first baseline with a
        row for it, so that the sample is drawn by length (`speed_sample.by_length`); read before
        the run stores anything (a resume reads its sample back, `_drawn_once`)."""
        bases = [s for s in self.lineup.specs if s.name in self.base_names]
        out = {}
        for w in population:
            rows = (self.stored(s, w)[2] for s in bases)
            tokens = next((r["result"]["tokens"] for r in rows if r is not None and r["result"].get("tokens")), None)
            if tokens:
                out[speed_sample.key(w)] = len(tokens)
        return out

    def takes_from(self, spec) -> bool:
        return self.reuse is not None and spec.name in self.base_names

    def in_sample(self, w) -> bool:
        return speed_sample.key(w) in self.sample

    def stored(self, spec, w):
        if (spec.name, w.key(spec.name)) not in self.found:
            key, parts = self.reuse.key(spec, make_request(self.config, self.lineup.targets[spec.name], w))
            self.found[spec.name, w.key(spec.name)] = (key, parts, self.reuse.lookup(spec, key))
        return self.found[spec.name, w.key(spec.name)]

    def order(self, pending: list) -> list:
        """The sample first; then items by which baselines would take a stored row (none first),
        so that the items each baseline generates sit together in whole blocks. Also notes the
        sample rows still to generate: until they are all checked, nothing is taken."""
        if self.reuse is None:
            return pending
        self.unchecked = {w.key(s.name) for w, specs in pending for s in specs
                          if s.name in self.base_names and self.in_sample(w)}

        def order(entry):
            w, specs = entry
            if self.in_sample(w):
                return (0, 0, ())
            takes = tuple(self.stored(s, w)[2] is not None for s in specs if s.name in self.base_names)
            return (1, sum(takes), takes)
        return sorted(pending, key=order)  # stable: work order within each group

    def take(self, spec, items: list, requests: list) -> tuple[list, list, list, list]:
        """A baseline block: the stored rows to write (once the whole sample is checked and agreed)
        as (work item, row), and the items still to generate with their requests and
        (key, parts, stored row or None)."""
        fresh, taken = [], []
        for w, req in zip(items, requests):
            key, parts, hit = self.stored(spec, w)
            if hit is None or self.unchecked or not self.reuse.valid or self.in_sample(w):
                fresh.append((w, req, (key, parts, hit)))
                continue
            source = hit.get("source", {})
            row = {**make_row(spec, w, stored_result(hit)), **self.lineup.fingerprints[spec.name],
                   "reused": {"store": self.reuse.store.label, "key": key, **source, "stored": hit.get("stored")}}
            taken.append((w, row))
            self.reuse.reused += 1
            self.reuse.put(spec, key, parts, row, reused_from=source)
        return [f[0] for f in fresh], [f[1] for f in fresh], [f[2] for f in fresh], taken

    def generated(self, spec, w, row: dict, found) -> None:
        """A baseline row generated in this run: a sample row is checked against its stored row;
        every row goes to the store."""
        if self.reuse is None or found is None:
            return
        key, parts, hit = found
        if self.in_sample(w):
            self.reuse.compare(spec, hit, row, label(w))
        self.unchecked.discard(w.key(spec.name))
        self.reuse.put(spec, key, parts, row)


def _drawn_once(run_dir: Path, draw) -> set:
    """The speed sample, drawn once per run folder (SAMPLE_FILE) and read back on a resume: the
    draw rests on the store, and the store now holds this run's own rows (a suite's lengths all
    known where they were not, or a row overwritten), so a second draw could time other items, and
    the resumed run would re-check rows the first attempt never generated."""
    from harness.run.store import StoreError
    path = run_dir / SAMPLE_FILE
    if path.exists():
        try:
            return {tuple(k) for k in json.loads(path.read_text())}
        except (ValueError, TypeError) as e:
            raise StoreError(f"{path}: the run's speed sample is unreadable ({e}): rerun with a new --run-dir") from e
    sample = draw()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(list(k) for k in sample)))
    os.replace(tmp, path)   # a run killed while writing leaves no half a sample to resume on
    return sample


def _one_stored_row_rechecked(sample: set, population: list, lineup, stored) -> set:
    """The store's re-check compares sample rows with their stored rows. A sample without one
    stored row (`speed_items = 0`, or every sampled item a store miss) re-checked nothing, and
    every other stored row was taken unchecked: add the first item that has one (a set of one
    key), so that no stored row is taken before at least one is reproduced."""
    bases = [s for s in lineup.specs if s.name in lineup.baseline_names]
    hit = lambda w: any(stored(s, w)[2] is not None for s in bases)  # noqa: E731
    if any(hit(w) for w in population if speed_sample.key(w) in sample):
        return set()
    first = next((w for w in population if hit(w)), None)
    return set() if first is None else {speed_sample.key(first)}


def _recheck_resumed(run_dir: Path, rows: list[dict], reuse, lineup, stage: list, sample: set,
                     found: dict) -> None:
    """A resumed run: the sample rows it already generated are checked against the store again
    (the check lives in memory). Should they now differ while rows were already taken from the
    store, those rows cannot be trusted, and the run stops naming the items."""
    from harness.run.store import StoreError
    by_key = {record_key(r): r for r in rows}
    for w in stage:
        if speed_sample.key(w) not in sample:
            continue
        for spec in (s for s in lineup.specs if s.name in lineup.baseline_names):
            row = by_key.get(w.key(spec.name))
            if row is None or row.get("reused"):
                continue
            target = lineup.targets[spec.name]
            key, parts = reuse.key(spec, make_request(lineup.config, target, w))
            hit = reuse.lookup(spec, key)
            found[spec.name, w.key(spec.name)] = (key, parts, hit)
            reuse.compare(spec, hit, row, label(w))
    if not reuse.valid and any(r.get("reused") for r in rows):
        raise StoreError(f"{run_dir}: rows of this run were taken from the baseline store, but {reuse.refusal()}; "
                         f"the rows already taken cannot be trusted: rerun with a new --run-dir")

