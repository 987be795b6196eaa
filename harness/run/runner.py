"""Run the baseline and every candidate on each suite item, temperature and seed.

Each result is appended to `records.jsonl` in the run folder the moment it exists (flushed and
fsynced), so a killed run loses at most the generation in flight. A rerun on the same folder
reads what is there and skips it (resume); the analysis then sees the same rows.

Decoders run interleaved per work item (baseline, cand-1, cand-2, baseline, ...) so that machine
noise and thermal drift hit all of them alike: latency comparisons stay paired.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from decoders import GenerationRequest
from decoders.base import DecoderError
from harness.build import build_decoder, get_model
from harness.config import DecoderSpec, RegressConfig
from harness.run.records import RECORDS, RecordWriter, read_records, record_key  # noqa: F401 - re-exported
from harness.run.reuse import stored_result



@dataclass(frozen=True)
class WorkItem:
    suite: object
    item: object
    temperature: float
    seed: int

    def key(self, candidate: str) -> tuple:
        return (candidate, self.suite.name, self.item.id, self.seed, self.temperature)


def load_suites(config: RegressConfig) -> list:
    from suites import load_suite
    out = []
    for name in config.profile.suites:
        if name.startswith("lmeval:"):
            continue  # run through lm-eval: see run_lmeval
        suite = load_suite(config.suites[name].path or name)
        if suite.name != name:
            from harness.config import ConfigError
            raise ConfigError(f"suite file {config.suites[name].path} declares suite {suite.name!r}, "
                              f"but the config calls it {name!r}")
        out.append(suite)
    return out


def expand(config: RegressConfig, suite, item) -> list[WorkItem]:
    """One item's generations: each temperature the profile runs on its suite, each seed."""
    prof = config.profile
    out = []
    for t in (logged(item, "temperature") if prof.as_logged else prof.temperatures):
        if t > 0 and suite.name not in prof.sample_suites:
            continue
        # Greedy does not depend on the seed: one seed is enough.
        for seed in (prof.seeds[:1] if t == 0 else prof.seeds):
            out.append(WorkItem(suite, item, t, seed))
    return out


def work_items(config: RegressConfig, suites: list) -> list[WorkItem]:
    return [w for suite in suites for item in suite.select(config.profile.subset) for w in expand(config, suite, item)]


class Lineup:
    """The baseline and candidates, built once, with their targets. `engines`: started servers
    by name (harness.run.engines.started), for engine decoders."""

    def __init__(self, config: RegressConfig, engines: dict | None = None):
        from harness.run.sweep import all_specs
        self.config = config
        # The baseline and candidates, at each concurrency level, plus the A/A run of an engine
        # baseline (harness.run.sweep); without a sweep and an engine: [baseline, *candidates].
        self.specs: list[DecoderSpec] = all_specs(config)
        self.targets = {}
        self.decoders = {}
        from decoders.engines.server import EngineError
        from harness.config import ConfigError
        from harness.models import ModelError
        for spec in self.specs:
            try:
                target = get_model(spec.target or config.target, config.device)
                self.targets[spec.name] = target
                self.decoders[spec.name] = build_decoder(spec.decoder, target, spec.options, engines)
            except (DecoderError, ModelError) as e:
                if isinstance(e, EngineError):  # an engine's own failure, named by the engine
                    raise
                raise ConfigError(f"{config.path}: {spec.name!r} (decoder {spec.decoder!r}): {e}") from e
        # The plain baseline at each concurrency level (not its A/A rerun): what the store may supply.
        b = config.baseline.name
        self.baseline_names = {s.name for s in self.specs if s.role != "aa-floor"
                               and (s.name == b or s.name.startswith(b + "@c"))}
        from harness.run.reuse import spec_fingerprints
        self.fingerprints = {s.name: spec_fingerprints(self, s) for s in self.specs}

    @property
    def baseline_target(self):
        return self.targets[self.specs[0].name]  # the baseline (at the first concurrency level)

    def block_size(self) -> int:
        """Work items per interleaving block: the most requests any decoder keeps in flight."""
        return max(int(getattr(d, "concurrency", 1)) for d in self.decoders.values())


def runs_on(spec: DecoderSpec, suite: str) -> bool:
    return spec.suites is None or suite in spec.suites


# What an item's logged request used (`suites import`) where it logged nothing: the OpenAI API's defaults.
AS_LOGGED_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


def logged(item, key: str) -> tuple[float]:
    """`temperatures = "as-logged"`: the item's own sampling setting `key`, as a 1-tuple."""
    return (float((item.sampling or {}).get(key, AS_LOGGED_DEFAULTS[key])),)


def make_request(config: RegressConfig, target, work: WorkItem) -> GenerationRequest:
    item = work.item
    prompt = item.messages or item.prompt
    ids = target.encode(prompt, chat=config.chat)
    budget = item.max_new_tokens
    if config.profile.max_new_tokens:
        budget = min(budget, config.profile.max_new_tokens)
    messages = tuple(prompt) if isinstance(prompt, list) else ({"role": "user", "content": prompt},)
    return GenerationRequest(tuple(ids), max_new_tokens=budget, temperature=work.temperature,
                             top_p=(logged(item, "top_p")[0] if config.profile.as_logged else config.top_p)
                             if work.temperature > 0 else 1.0,
                             stop_token_ids=target.stop_token_ids(), stop_strings=tuple(item.stop),
                             seed=work.seed, messages=messages)


def make_row(spec: DecoderSpec, work: WorkItem, result, block: int | None = None) -> dict:
    """One record: the generation (or the error that stopped it) and its grade."""
    from suites.graders import grade
    row = {"candidate": spec.name, "decoder": spec.decoder, "kind": spec.kind,
           "suite": work.suite.name, "suite_version": work.suite.version, "suite_hash": work.suite.hash,
           "item_id": work.item.id, "categories": list(work.item.categories),
           "seed": work.seed, "temperature": work.temperature}
    if block is not None:  # which requests were in flight together, and when this one ended
        row.update(block=block, finished_at=time.time())
    if isinstance(result, DecoderError):
        # One bad item (e.g. a prompt longer than this model's context) is recorded, not fatal.
        return {**row, "error": str(result), "tokens": [], "text": "", "score": 0.0, "passed": False,
                "margins": [], "stats": {}, "timing": {}}
    g = grade(work.item, result.text)
    row.update(tokens=list(result.tokens), text=result.text, finish_reason=result.finish_reason,
               score=g.score, passed=g.passed, grade_detail=g.detail,
               margins=list(result.margins), stats=result.stats, timing=result.timing.as_dict())
    if g.error:  # the grading machinery failed: this fail is no evidence (the quality gate says so)
        row["grade_error"] = g.error
    if result.stats.get("compare_on") == "text":
        row["compare_on"] = "text"  # the engine gave text only: tokens are our re-tokenization
    return row


def run_one(spec: DecoderSpec, decoder, target, config: RegressConfig, work: WorkItem) -> dict:
    try:
        result = decoder.generate(make_request(config, target, work))
    except DecoderError as e:
        result = e
    return make_row(spec, work, result)


STOPS = "stops.jsonl"


def staged_work(config: RegressConfig, suites: list, looks=None) -> list[list[WorkItem]]:
    """The work in stages: one stage (config order) for the fixed design; with a look plan
    (`looks.count` > 1), the items of each suite's k-th look in the plan's order, suites
    interleaved so that every stage spans all of them."""
    if looks is None or looks.count <= 1:
        return [work_items(config, suites)]
    from analysis.sequential import fractions, look_sizes
    fracs = fractions(looks.count)
    per_suite = []
    for suite in suites:
        order = looks.order(suite)
        n, k = len(order), looks.count
        # A suite smaller than the looks goes whole into the first stage (judged by the fixed design).
        cuts = (0, *look_sizes(fracs, n)) if n >= k else (0, *([n] * k))
        per_suite.append([[w for it in order[lo:hi] for w in expand(config, suite, it)]
                          for lo, hi in zip(cuts, cuts[1:])])
    stages = []
    for k in range(looks.count):
        lists = [p[k] for p in per_suite]
        stages.append([w for group in _round_robin(lists) for w in group])
    return stages


def _round_robin(lists: list[list]) -> list[list]:
    out, i = [], 0
    while any(i < len(x) for x in lists):
        out.append([x[i] for x in lists if i < len(x)])
        i += 1
    return out


class Stops:
    """Where the runner stopped a candidate (a suite, or "*": all of them), kept in stops.jsonl
    so that a resumed run and the summary know it."""

    def __init__(self, run_dir: Path):
        self.rows = read_records(run_dir, STOPS)
        self.writer = RecordWriter(run_dir, STOPS)

    def stopped(self, candidate: str, suite: str) -> bool:
        return any(r["candidate"] == candidate and r["suite"] in ("*", suite) for r in self.rows)

    def add(self, **row) -> None:
        self.rows.append(row)
        self.writer.write(row)

    def close(self) -> None:
        self.writer.close()


def _real_divergence(config: RegressConfig, target, base: dict, cand: dict) -> str | None:
    """--fail-fast: the first divergence of an exact candidate that is not a numerical near-tie."""
    from analysis.identity import classify_margin, common_prefix_length, near_tie_epsilon
    if base.get("error") or cand.get("error") or cand.get("compare_on") == "text":
        return None
    bt, ct = base.get("tokens") or [], cand.get("tokens") or []
    pos = common_prefix_length(bt, ct)
    if pos == len(bt) == len(ct):
        return None
    eps = config.gates.near_tie_epsilon
    if eps is None:
        eps = near_tie_epsilon(str(target.dtype).replace("torch.", ""), None)[0]
    margins = base.get("margins") or []
    margin = margins[pos] if pos < len(margins) else None
    if classify_margin(margin, eps) == "near-tie":
        return None
    return (f"first real divergence: {cand['suite']}/{cand['item_id']} T={cand['temperature']:g} at token {pos}, "
            f"baseline margin {margin if margin is not None else 'n/a'} (near-tie epsilon {eps:g})")


def _checks_identity(spec: DecoderSpec, row: dict) -> bool:
    """Rows on which an exact candidate must match the baseline token for token: greedy ones, and
    sampled ones where it samples with the baseline's keyed noise (coupled verification)."""
    from harness.config import sampled_identity_applies
    if spec.kind != "exact" or spec.role == "aa-floor":
        return False
    return row["temperature"] == 0 or sampled_identity_applies(spec.decoder, spec.options)


def run(config: RegressConfig, run_dir: Path, lineup: Lineup, suites: list, progress: bool = True,
        reuse=None, fail_fast: bool = False, looks=None) -> list[dict]:
    """Generate everything not yet in the run folder; return all rows.

    Work goes in stages (one, or one per sequential look) and within a stage in blocks of
    `lineup.block_size()` items (1 for in-process decoders): within a block the baseline runs
    its requests, then each candidate (an engine keeps them in flight at once), so machine noise
    still hits all decoders alike. Every record is written as it finishes.

    `reuse` (harness.run.reuse.Reuse): baseline rows found in the store are taken, not generated,
    except the speed sample (harness.run.speed_sample: `profile.speed_items` items of the first
    stage, stratified over suites and categories, seeded by the run), which is generated afresh
    beside the candidates, so that speed is compared on one clock, and checked against the store.
    The sample runs first, and no stored row is taken before all of it is checked: a sample row
    that differs from its stored row turns reuse off for the run (`reuse.valid`). Within a stage
    the items are ordered so that the baseline's store misses fill whole blocks: an engine
    baseline then runs at the concurrency its candidates run at.

    `looks` (the regress command passes harness.verdict.looks.LookPlan): the stages, and after
    each the question "stop now?" (`looks.decisions(records, stops)`: stop rows of candidates whose
    quality is decided on a suite). None: the fixed design, one stage. With `fail_fast` an exact
    candidate stops at its first real divergence.
    """
    from tqdm import tqdm
    from harness.run import speed_sample
    rows = read_records(run_dir)
    done = {record_key(r) for r in rows}
    base_names = lineup.baseline_names
    base_rows = {record_key(r)[1:]: r for r in rows if r["candidate"] in base_names}
    stops = Stops(run_dir)
    stages = staged_work(config, suites, looks)
    cands = [s for s in lineup.specs if s.name not in base_names]

    def wanted(spec, w) -> bool:
        if w.key(spec.name) in done or not runs_on(spec, w.suite.name):
            return False
        if spec.name in base_names:  # the baseline, wherever a candidate ran or will run
            return any(runs_on(c, w.suite.name) and (w.key(c.name) in done or not stops.stopped(c.name, w.suite.name))
                       for c in cands) or not cands
        return not stops.stopped(spec.name, w.suite.name)

    sample: set = set()
    found: dict = {}  # (baseline, work key) -> (store key, key parts, stored row or None)

    def stored(spec, w):
        if (spec.name, w.key(spec.name)) not in found:
            key, parts = reuse.key(spec, make_request(config, lineup.targets[spec.name], w))
            found[spec.name, w.key(spec.name)] = (key, parts, reuse.lookup(spec, key))
        return found[spec.name, w.key(spec.name)]

    if reuse is not None:
        # Drawn from the first stage: every run reaches it, whatever its looks decide later.
        population = [w for w in stages[0] if not cands or any(runs_on(c, w.suite.name) for c in cands)]
        sample = speed_sample.choose(population, config.profile.speed_items, reuse.seed)
        # Before a resumed run's re-check, so that it re-checks this row too.
        sample |= _one_stored_row_rechecked(sample, population, lineup, stored)
        _recheck_resumed(run_dir, rows, reuse, lineup, stages[0], sample, found)

    def ordered(pending: list) -> list:
        """The sample first; then items by which baselines would take a stored row (none first),
        so that the items each baseline generates sit together in whole blocks."""
        if reuse is None:
            return pending

        def order(entry):
            w, specs = entry
            if speed_sample.key(w) in sample:
                return (0, 0, ())
            takes = tuple(stored(s, w)[2] is not None for s in specs if s.name in base_names)
            return (1, sum(takes), takes)
        return sorted(pending, key=order)  # stable: work order within each group

    def take_stored(spec, items, requests):
        """Write the stored rows of a baseline block (once the whole sample is checked and agreed);
        return the items still to generate, their requests, and (key, parts, stored row or None)."""
        fresh = []
        for w, req in zip(items, requests):
            key, parts, hit = stored(spec, w)
            if hit is None or unchecked or not reuse.valid or speed_sample.key(w) in sample:
                fresh.append((w, req, (key, parts, hit)))
                continue
            source = hit.get("source", {})
            row = {**make_row(spec, w, stored_result(hit)), **lineup.fingerprints[spec.name],
                   "reused": {"store": reuse.store.label, "key": key, **source, "stored": hit.get("stored")}}
            writer.write(row)
            done.add(w.key(spec.name))
            base_rows[record_key(row)[1:]] = row
            reuse.reused += 1
            reuse.put(spec, key, parts, row, reused_from=source)
            bar.update(1)
        return [f[0] for f in fresh], [f[1] for f in fresh], [f[2] for f in fresh]

    writer = RecordWriter(run_dir)
    batches = RecordWriter(run_dir, ENGINE_BATCHES)
    try:
        total = sum(runs_on(s, w.suite.name) for st in stages for w in st for s in lineup.specs)
        bar = tqdm(total=total, initial=sum(1 for st in stages for w in st for s in lineup.specs
                                           if w.key(s.name) in done),
                   desc="generating", unit="gen", disable=not progress, dynamic_ncols=True)
        size = lineup.block_size()
        block_no = 0
        for stage in stages:
            pending = [(w, [s for s in lineup.specs if wanted(s, w)]) for w in stage]
            skipped = sum(runs_on(s, w.suite.name) and w.key(s.name) not in done for w in stage
                          for s in lineup.specs) - sum(len(specs) for _, specs in pending)
            bar.total -= skipped  # stopped candidates: their remaining items will not run
            pending = ordered([(w, specs) for w, specs in pending if specs])
            # Sample rows still to generate: until they are all checked, nothing is taken from the store.
            unchecked = {w.key(s.name) for w, specs in pending for s in specs
                         if s.name in base_names and speed_sample.key(w) in sample}
            for start in range(0, len(pending), size):
                block = pending[start:start + size]
                for spec in lineup.specs:
                    items = [w for w, specs in block if spec in specs and wanted(spec, w)]
                    if not items:
                        continue
                    decoder, target = lineup.decoders[spec.name], lineup.targets[spec.name]
                    requests = [make_request(config, target, w) for w in items]
                    keys = [None] * len(items)
                    if spec.name in base_names and reuse is not None:
                        items, requests, keys = take_stored(spec, items, requests)
                        if not items:
                            continue
                    w0 = items[0]
                    bar.set_postfix_str(f"{spec.name} · {w0.suite.name}/{w0.item.id} · T={w0.temperature:g}"
                                        + (f" (+{len(items) - 1})" if len(items) > 1 else ""), refresh=False)
                    for i, result in decoder.generate_many(requests):
                        w = items[i]
                        row = {**make_row(spec, w, result, block=block_no), **lineup.fingerprints[spec.name]}
                        if spec.name in base_names and speed_sample.key(w) in sample:
                            row["speed_sample"] = True
                        writer.write(row)
                        done.add(w.key(spec.name))
                        bar.update(1)
                        if spec.name in base_names:
                            base_rows[record_key(row)[1:]] = row
                            if reuse is not None and keys[i] is not None:
                                key, parts, hit = keys[i]
                                if speed_sample.key(w) in sample:
                                    reuse.compare(spec, hit, row, _label(w))
                                unchecked.discard(w.key(spec.name))
                                reuse.put(spec, key, parts, row)
                        elif fail_fast and _checks_identity(spec, row) and not stops.stopped(spec.name, "*"):
                            base = base_rows.get(record_key(row)[1:])
                            why = base is not None and _real_divergence(config, target, base, row)
                            if why:
                                stops.add(candidate=spec.name, suite="*", reason="fail-fast", detail=why)
                                print(f"decodegate: {spec.name}: stopped (--fail-fast): {why}", file=sys.stderr)
                    batch = getattr(decoder, "last_batch", None)
                    if batch and batch.get("proposed"):
                        batches.write({"candidate": spec.name, **batch})
                block_no += 1
            for st in (looks.decisions(read_records(run_dir), stops) if looks is not None else ()):
                stops.add(**st)
                print(f"decodegate: {st['candidate']}: {st['detail']}", file=sys.stderr)
        bar.close()
    finally:
        writer.close()
        batches.close()
        stops.close()
    return read_records(run_dir)


def _label(w: WorkItem) -> str:
    return f"{w.suite.name}/{w.item.id} seed={w.seed} T={w.temperature:g}"


def _one_stored_row_rechecked(sample: set, population: list, lineup: Lineup, stored) -> set:
    """The store's re-check compares sample rows with their stored rows. A sample without one
    stored row (`speed_items = 0`, or every sampled item a store miss) re-checked nothing, and
    every other stored row was taken unchecked: add the first item that has one (a set of one
    key), so that no stored row is taken before at least one is reproduced."""
    from harness.run import speed_sample
    bases = [s for s in lineup.specs if s.name in lineup.baseline_names]
    hit = lambda w: any(stored(s, w)[2] is not None for s in bases)  # noqa: E731
    if any(hit(w) for w in population if speed_sample.key(w) in sample):
        return set()
    first = next((w for w in population if hit(w)), None)
    return set() if first is None else {speed_sample.key(first)}


def _recheck_resumed(run_dir: Path, rows: list[dict], reuse, lineup: Lineup, stage: list, sample: set,
                     found: dict) -> None:
    """A resumed run: the sample rows it already generated are checked against the store again
    (the check lives in memory). Should they now differ while rows were already taken from the
    store, those rows cannot be trusted, and the run stops naming the items."""
    from harness.run.speed_sample import key as work_key
    from harness.run.store import StoreError
    by_key = {record_key(r): r for r in rows}
    for w in stage:
        if work_key(w) not in sample:
            continue
        for spec in (s for s in lineup.specs if s.name in lineup.baseline_names):
            row = by_key.get(w.key(spec.name))
            if row is None or row.get("reused"):
                continue
            target = lineup.targets[spec.name]
            key, parts = reuse.key(spec, make_request(lineup.config, target, w))
            hit = reuse.lookup(spec, key)
            found[spec.name, w.key(spec.name)] = (key, parts, hit)
            reuse.compare(spec, hit, row, _label(w))
    if not reuse.valid and any(r.get("reused") for r in rows):
        raise StoreError(f"{run_dir}: rows of this run were taken from the baseline store, but {reuse.refusal()}; "
                         f"the rows already taken cannot be trusted: rerun with a new --run-dir")


ENGINE_BATCHES = "engine_batches.jsonl"


class LmEvalSuite:
    """What the summary needs to know of an lm-eval task run as a suite. `select` gives the item
    ids the records carry ("3", or "subtask:3" in a group), so that look sets
    (harness.verdict.looks) match the pairs; they are plain strings, not prompt items, so the
    checks that rebuild requests from items (harness.run.exactness) pass them by."""

    def __init__(self, name: str, rows: list[dict]):
        self.name = name
        base = rows[0] if rows else {}
        self.version = base.get("suite_version", "?")
        self.hash = base.get("suite_hash", "?")
        self._ids = sorted({str(r["item_id"]) for r in rows})

    def select(self, subset) -> list[str]:
        return list(self._ids)


def check_lmeval(config: RegressConfig) -> None:
    """Pre-flight of the profile's `lmeval:<task>` suites, before any model loads or anything
    generates (they run after every other suite): each task resolves and builds, and one that
    executes generated code runs only where its table says `allow_code = true`. An LmEvalError
    (input error) naming the task otherwise."""
    names = [n for n in config.profile.suites if n.startswith("lmeval:")]
    if not names:
        return
    from harness.run.lmeval import check_task
    for name in names:
        spec_s = config.suites[name]
        check_task(name[len("lmeval:"):], spec_s.include_path, allow_code=spec_s.allow_code)


def run_lmeval(config: RegressConfig, run_dir: Path, lineup: Lineup, progress: bool = True) -> list:
    """`lmeval:<task>` suites: each decoder runs the task through lm-eval (generation through our
    decoder), and its per-sample records join records.jsonl like any other suite's."""
    from harness.run.lmeval import LmEvalEmpty, lmeval_records
    # A task counts as done for a decoder only once its completion marker is written: a run
    # killed inside lm-eval reruns that task from the start (its rows are replaced).
    marks = read_records(run_dir, LMEVAL_DONE)
    done = {(r["candidate"], r["suite"], r["seed"], r["temperature"]) for r in marks}
    suites = []
    marker = RecordWriter(run_dir, LMEVAL_DONE)
    try:
        for name in (n for n in config.profile.suites if n.startswith("lmeval:")):
            spec_s = config.suites[name]
            task = name[len("lmeval:"):]
            for t in config.profile.temperatures:
                if t > 0 and name not in config.profile.sample_suites:
                    continue
                for seed in (config.profile.seeds[:1] if t == 0 else config.profile.seeds):
                    for spec in lineup.specs:
                        if not runs_on(spec, name) or (spec.name, name, seed, t) in done:
                            continue
                        if progress:
                            print(f"decodegate: lm-eval {task} · {spec.name} · T={t:g}", flush=True)
                        try:
                            rows = lmeval_records(task, lineup.targets[spec.name], spec.decoder, dict(spec.options),
                                                  candidate=spec.name, seed=seed, temperature=t, limit=spec_s.limit,
                                                  include_path=spec_s.include_path,
                                                  gen_kwargs={"max_gen_toks": spec_s.max_gen_toks}
                                                  if spec_s.max_gen_toks else None,
                                                  confirm_run_unsafe_code=spec_s.allow_code)
                        except LmEvalEmpty as e:  # no rows: the summary fails its gate with "no items"
                            print(f"decodegate: warning: {e}", file=sys.stderr)
                            rows = []
                        stale = {(spec.name, name, seed, t)}
                        if any(record_key(r)[:2] == (spec.name, name) for r in read_records(run_dir)):
                            _drop_rows(run_dir, lambda r: (r["candidate"], r["suite"], r["seed"], r["temperature"]) in stale)
                        writer = RecordWriter(run_dir)  # opened after any rewrite above
                        for row in rows:
                            row.setdefault("kind", spec.kind)
                            writer.write(row)
                        writer.close()
                        marker.write({"candidate": spec.name, "suite": name, "seed": seed, "temperature": t})
            rows = [r for r in read_records(run_dir) if r["suite"] == name]
            suites.append(LmEvalSuite(name, rows))
    finally:
        marker.close()
    return suites


LMEVAL_DONE = "lmeval_done.jsonl"


def _drop_rows(run_dir: Path, drop) -> None:
    """Rewrite records.jsonl without the rows `drop` selects (a half-finished lm-eval task)."""
    path = Path(run_dir) / RECORDS
    keep = [r for r in read_records(run_dir) if not drop(r)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, path)
